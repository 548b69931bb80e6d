// The built client against a scripted WebSocket peer (client-peer.mjs): the resume position
// table of docs/protocol.md, what each close code does, backoff over failing connections,
// the liveness ping, untrusted replies, retried subscribes and publishes, the buffer bound,
// listeners that throw, timers cleared on close. (The same client against real gateways:
// tests/test_js_client.py.)

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { after, before, test } from "node:test";
import { ConnectionRejected, HubClient, HubUnreachable } from "../../agui_hub/static/agui-hub.js";
import { Peer, WebSocket, sleep, until } from "./client-peer.mjs";

let peer;
before(async () => {
  peer = await Peer.start();
});
after(async () => {
  await peer.stop();
});

function client(options = {}) {
  peer.forget();
  return new HubClient({
    url: peer.url,
    WebSocket,
    encoding: "json",
    backoffMin: 10,
    backoffMax: 100,
    ...options,
  });
}

/** Collects a subscription's items through a listener. */
function collect(sub) {
  const items = [];
  sub.onItem((item) => items.push(item));
  return items;
}

// -- the resume position table --------------------------------------------------------------------

test("position table: from live, start, snapshot, a position; events; snapshots", async () => {
  const hub = client();
  try {
    const conn = await peer.connection();
    const live = hub.subscribe("live");
    const start = hub.subscribe("start", { from: "start" });
    const snap = hub.subscribe("snap", { from: "snapshot" });
    const pos = hub.subscribe("pos", { from: { offset: "5-0", epoch: "E" } });
    const seen = [live, start, snap, pos].map(collect);
    const commands = {};
    for (let i = 0; i < 4; i++) {
      const command = await conn.next("subscribe");
      commands[command.thread] = command;
    }
    assert.equal(commands.live.from, "live");
    assert.equal(commands.start.from, "start");
    assert.equal(commands.snap.from, "snapshot");
    assert.deepEqual(commands.pos.from, { offset: "5-0", epoch: "E" });
    assert.equal(live.position, "live");
    assert.deepEqual(pos.position, { offset: "5-0", epoch: "E" });

    conn.subscribed(commands.live, { epoch: "E", offset: "9-0", recovered: true });
    conn.subscribed(commands.start, { epoch: "E", offset: "9-0", recovered: true });
    conn.subscribed(commands.snap, { epoch: "E", offset: "9-0", recovered: true });
    conn.subscribed(commands.pos, { epoch: "E", offset: "9-0", recovered: true });
    await until(() => seen.every((items) => items.length === 1));
    assert.deepEqual(live.position, { offset: "9-0", epoch: "E" }, "live: the reply's offset");
    assert.deepEqual(start.position, { offset: "0-0", epoch: "E" }, "start: 0-0, not the offset");
    assert.equal(snap.position, "snapshot", "snapshot: nothing until the snapshot");
    assert.deepEqual(pos.position, { offset: "5-0", epoch: "E" }, "a position: the one sent");
    assert.equal(live.recovered, true);
    assert.deepEqual(seen[0][0], {
      kind: "subscribed", thread: "live", epoch: "E", offset: "9-0", recovered: true, resumed: false,
    });

    conn.send({ type: "snapshot", thread: "snap", offset: "9-0", epoch: "E", complete: true, events: [] });
    conn.event("start", "1-0");
    conn.event("start", "1-0"); // repeated: not handed out again
    conn.event("start", "0-5"); // before the position: not handed out
    conn.event("pos", "6-0");
    await until(() => seen[1].length === 2 && seen[2].length === 2 && seen[3].length === 2);
    await sleep(20);
    assert.equal(seen[1].length, 2, "an event at or before the position is not handed out again");
    assert.deepEqual(snap.position, { offset: "9-0", epoch: "E" });
    assert.deepEqual(start.position, { offset: "1-0", epoch: "E" });
    assert.deepEqual(pos.position, { offset: "6-0", epoch: "E" });
  } finally {
    await hub.close();
  }
});

test("position table: announcements of a created and a re-created thread", async () => {
  const hub = client();
  try {
    const conn = await peer.connection();
    const sub = hub.subscribe("t", { from: "start" });
    const items = collect(sub);
    const command = await conn.next("subscribe");
    conn.subscribed(command, { epoch: null, offset: "0-0", recovered: true });
    await until(() => items.length === 1);
    assert.deepEqual(sub.position, { offset: "0-0", epoch: null });
    // The thread's first event creates its epoch.
    conn.send({ type: "subscribed", thread: "t", epoch: "E1", offset: "0-0", recovered: true });
    conn.event("t", "3-0");
    await until(() => items.length === 3);
    assert.deepEqual(sub.position, { offset: "3-0", epoch: "E1" });
    // The thread is re-created: nothing moves until the snapshot.
    conn.send({ type: "subscribed", thread: "t", epoch: "E2", offset: "0-0", recovered: false });
    await until(() => items.length === 4);
    assert.deepEqual(sub.position, { offset: "3-0", epoch: "E1" });
    assert.equal(sub.recovered, false);
    conn.send({ type: "snapshot", thread: "t", offset: "1-0", epoch: "E2", complete: true, events: [] });
    conn.event("t", "2-0"); // after the snapshot's offset, in the new epoch
    await until(() => items.length === 6);
    assert.deepEqual(sub.position, { offset: "2-0", epoch: "E2" });
  } finally {
    await hub.close();
  }
});

test("after a drop each subscription resumes from its position (resumed: true)", async () => {
  const hub = client();
  try {
    let conn = await peer.connection();
    const fresh = hub.subscribe("fresh", { from: "start" }); // drops before its first event
    const empty = hub.subscribe("empty", { from: "start" }); // a thread with no epoch yet
    const snap = hub.subscribe("snap", { from: "snapshot" }); // drops before its snapshot
    const moved = hub.subscribe("moved", { from: "live" }); // has events
    const items = [fresh, empty, snap, moved].map(collect);
    const replies = { fresh: "E", empty: null, snap: "E", moved: "E" };
    for (let i = 0; i < 4; i++) {
      const command = await conn.next("subscribe");
      conn.subscribed(command, { epoch: replies[command.thread], offset: "7-0", recovered: true });
    }
    conn.event("moved", "8-0");
    await until(() => items[3].length === 2);
    conn.close(1012, "restart");
    conn = await peer.connection();
    const from = {};
    for (let i = 0; i < 4; i++) {
      const command = await conn.next("subscribe");
      from[command.thread] = command.from;
      conn.subscribed(command, { epoch: "E", offset: "8-0", recovered: true });
    }
    assert.deepEqual(from.fresh, { offset: "0-0", epoch: "E" });
    assert.equal(from.empty, "start");
    assert.equal(from.snap, "snapshot");
    assert.deepEqual(from.moved, { offset: "8-0", epoch: "E" });
    await until(() => items.every((list) => list.length >= 2) && items[3].length === 3);
    for (const list of items) {
      const last = list.at(-1);
      assert.equal(last.kind, "subscribed");
      assert.equal(last.resumed, true);
    }
    assert.equal(hub.status.reconnects, 1);
    assert.equal(hub.status.closeCode, 1012);
  } finally {
    await hub.close();
  }
});

test("a recovered: true in another epoch is not trusted: resubscribe from a snapshot", async () => {
  const hub = client();
  const warn = console.warn;
  const warnings = [];
  console.warn = (...args) => warnings.push(args.join(" "));
  try {
    const conn = await peer.connection();
    const sub = hub.subscribe("t", { from: { offset: "5-0", epoch: "OLD" } });
    const items = collect(sub);
    const first = await conn.next("subscribe");
    conn.subscribed(first, { epoch: "NEW", offset: "9-0", recovered: true });
    conn.event("t", "6-0"); // of the untrusted reply: dropped
    const again = await conn.next("subscribe");
    assert.equal(again.from, "snapshot");
    conn.subscribed(again, { epoch: "NEW", offset: "9-0", recovered: true });
    conn.send({ type: "snapshot", thread: "t", offset: "9-0", epoch: "NEW", complete: true, events: [] });
    await until(() => items.length === 2);
    assert.equal(items[0].kind, "subscribed");
    assert.equal(items[0].recovered, false, "what the consumer built recovered nothing");
    assert.equal(items[1].kind, "snapshot");
    assert.deepEqual(sub.position, { offset: "9-0", epoch: "NEW" });
    assert.ok(warnings.some((w) => w.includes("not trusted")));
  } finally {
    console.warn = warn;
    await hub.close();
  }
});

test("malformed frames: resubscribe from a snapshot; a second one in a row ends it", async () => {
  const hub = client();
  const warn = console.warn;
  const warnings = [];
  console.warn = (...args) => warnings.push(args.join(" "));
  try {
    const conn = await peer.connection();
    const sub = hub.subscribe("t", { from: "start" });
    const items = collect(sub);
    let ended;
    sub.onEnd((error) => (ended = error));
    // An offset that is not one: never becomes the resume position (nor throws).
    conn.subscribed(await conn.next("subscribe"), { epoch: "E", offset: "not-an-offset" });
    let again = await conn.next("subscribe");
    assert.equal(again.from, "snapshot");
    conn.subscribed(again, { epoch: "E", offset: "2-0", recovered: true });
    conn.send({ type: "snapshot", thread: "t", offset: "2-0", epoch: "E", events: [] });
    conn.event("t", "3-0");
    await until(() => items.length === 3);
    assert.deepEqual(sub.position, { offset: "3-0", epoch: "E" });
    // An event frame it cannot read is a lost event, not one to skip.
    conn.event("t", "18446744073709551616-0"); // past 2^64 - 1
    again = await conn.next("subscribe");
    assert.equal(again.from, "snapshot");
    conn.subscribed(again, { epoch: "E", offset: "4-0", recovered: true });
    conn.send({ type: "snapshot", thread: "t", offset: "4-0", epoch: "E", events: [] });
    await until(() => items.length === 5);
    assert.deepEqual(sub.position, { offset: "4-0", epoch: "E" });
    // Malformed again after that good snapshot: one more resync; and once more before any
    // good frame: the subscription ends, loudly.
    conn.event("t", "5-0", "not an event");
    again = await conn.next("subscribe");
    conn.subscribed(again, { epoch: "E", offset: "5-0", recovered: true });
    conn.send({ type: "snapshot", thread: "t", offset: { no: 1 }, epoch: "E", events: [] });
    await until(() => ended !== undefined);
    assert.match(ended.message, /malformed snapshot frame again/);
    assert.equal(sub.closed, true);
    assert.deepEqual(sub.position, { offset: "4-0", epoch: "E" });
    assert.equal((await conn.next("unsubscribe")).thread, "t");
    assert.equal(warnings.filter((w) => w.includes("resubscribing from a snapshot")).length, 3);
    assert.equal(hub.status.state, "open", "the connection and other threads go on");
  } finally {
    console.warn = warn;
    await hub.close();
  }
});

test("an undecodable msgpack frame: reconnect, every subscription from a snapshot", async () => {
  const hub = client({ encoding: "msgpack" });
  const warn = console.warn;
  console.warn = () => undefined;
  try {
    const conn = await peer.connection();
    const sub = hub.subscribe("t", { from: "start" });
    const items = collect(sub);
    conn.subscribed(await conn.next("subscribe"), { epoch: "E", offset: "0-0", recovered: true });
    conn.event("t", "1-0");
    await until(() => items.length === 2);
    // @msgpack/msgpack refuses a "__proto__" key (the gateway refuses to store one): which
    // thread's frame it was is unknown, so every subscription may have lost an event.
    conn.event("t", "2-0", JSON.parse('{"type": "CUSTOM", "name": "x", "value": {"__proto__": 1}}'));
    const second = await peer.connection();
    const again = await second.next("subscribe");
    assert.equal(again.from, "snapshot");
    second.subscribed(again, { epoch: "E", offset: "2-0", recovered: true });
    second.send({ type: "snapshot", thread: "t", offset: "2-0", epoch: "E", events: [] });
    await until(() => items.length === 4);
    assert.deepEqual(sub.position, { offset: "2-0", epoch: "E" });
    assert.equal(hub.status.reconnects, 1);
  } finally {
    console.warn = warn;
    await hub.close();
  }
});

test("a subscribe answered store_unavailable is sent again after a pause", async () => {
  const hub = client();
  try {
    const conn = await peer.connection();
    const sub = hub.subscribe("t", { from: "start" });
    const items = collect(sub);
    const first = await conn.next("subscribe");
    const refused = Date.now();
    conn.send({ type: "error", id: first.id, thread: "t", code: "store_unavailable", message: "x" });
    const second = await conn.next("subscribe");
    assert.ok(Date.now() - refused >= 5, "sent again at once");
    assert.notEqual(second.id, first.id);
    assert.equal(second.from, "start");
    conn.subscribed(second, { epoch: "E", offset: "0-0", recovered: true });
    await until(() => items.length === 1);
    assert.equal(items[0].resumed, false);
  } finally {
    await hub.close();
  }
});

test("a subscribe refused for good ends the subscription with CommandRejected", async () => {
  const hub = client();
  try {
    const conn = await peer.connection();
    const sub = hub.subscribe("t");
    const command = await conn.next("subscribe");
    conn.send({ type: "error", id: command.id, thread: "t", code: "forbidden", message: "no grant" });
    await assert.rejects(sub[Symbol.asyncIterator]().next(), (e) => e.code === "forbidden");
    assert.equal(sub.error.code, "forbidden");
    hub.subscribe("t"); // the thread is free again
  } finally {
    await hub.close();
  }
});

// -- close codes ----------------------------------------------------------------------------------

for (const [code, why] of [
  [1000, "normal"],
  [4403, "credentials revoked"],
  [4401, "credentials expired"],
]) {
  test(`close ${code} stops the client with ConnectionRejected`, async () => {
    const hub = client();
    const conn = await peer.connection();
    const sub = hub.subscribe("t");
    const publishing = hub.publish("t", [{ type: "CUSTOM", name: "x", value: 1 }]);
    await conn.next("publish");
    conn.close(code, why);
    await assert.rejects(publishing, (e) => e instanceof ConnectionRejected && e.closeCode === code);
    await assert.rejects(
      sub[Symbol.asyncIterator]().next(),
      (e) => e instanceof ConnectionRejected && e.closeCode === code && e.reason === why,
    );
    assert.equal(hub.status.state, "closed");
    assert.equal(hub.status.closeCode, code);
    await assert.rejects(peer.connection(300), /no connection/, "it reconnected");
    await hub.close();
  });
}

test("close 4401 with a token provider: reconnect with a new token", async () => {
  let minted = 0;
  const hub = client({ token: () => `token-${++minted}` });
  try {
    const first = await peer.connection();
    assert.deepEqual(first.offered, ["agui-hub.v1.json", "agui-hub.bearer.token-1"]);
    first.close(4401, "expired");
    const second = await peer.connection();
    assert.deepEqual(second.offered, ["agui-hub.v1.json", "agui-hub.bearer.token-2"]);
    await until(() => hub.status.state === "open");
    assert.equal(hub.status.reconnects, 1);
  } finally {
    await hub.close();
  }
});

for (const code of [1001, 1011, 1012, 1013, 4000, 4001, 4999]) {
  test(`close ${code}: reconnect and resume`, async () => {
    const hub = client();
    const states = [];
    hub.onStatus((s) => states.push(s.state));
    try {
      const conn = await peer.connection();
      await until(() => hub.status.state === "open");
      conn.close(code, "bye");
      await peer.connection();
      await until(() => hub.status.state === "open" && hub.status.reconnects === 1);
      assert.deepEqual(states, ["open", "reconnecting", "reconnecting", "open"]);
      assert.equal(hub.status.closeCode, code);
    } finally {
      await hub.close();
    }
  });
}

test("close 1009 fails the commands in flight; twice without an answer stops", async () => {
  const hub = client();
  const conn = await peer.connection();
  const publishing = hub.publish("t", [{ type: "CUSTOM", name: "x", value: 1 }]);
  await conn.next("publish");
  conn.close(1009, "too big");
  await assert.rejects(publishing, (e) => e.code === "payload_too_large");
  const again = await peer.connection();
  await until(() => hub.status.state === "open");
  again.close(1009, "too big");
  await until(() => hub.status.state === "closed");
  assert.ok(hub.status.error instanceof ConnectionRejected);
  assert.equal(hub.status.error.closeCode, 1009);
  await hub.close();
});

// -- backoff, liveness, giving up -------------------------------------------------------------------

test("backoff grows over connections that fail at once, and resets once healthy", async () => {
  const failing = await Peer.start();
  failing.server.on("connection", (socket) => socket.close(1011, "internal error"));
  const hub = new HubClient({ url: failing.url, WebSocket, backoffMin: 20, backoffMax: 2000 });
  try {
    await sleep(1000);
    // Without growth: a connection every ~10 ms. With it: about 8 in the first second.
    assert.ok(failing.all.length >= 2 && failing.all.length < 20, `${failing.all.length} connections`);
  } finally {
    await hub.close();
    await failing.stop();
  }
});

test("commands during an outage cut the reconnect pause short once, not each time", async () => {
  const failing = await Peer.start();
  failing.server.on("connection", (socket) => socket.close(1011, "internal error"));
  const hub = new HubClient({ url: failing.url, WebSocket, backoffMin: 200, backoffMax: 2000 });
  const pending = [];
  try {
    await until(() => failing.all.length >= 1);
    // A loop of publishes and pings into the outage: each used to start a handshake.
    const deadline = Date.now() + 1000;
    for (let i = 0; i < 200 && Date.now() < deadline; i++) {
      pending.push(hub.publish("t", [{ type: "CUSTOM", name: "x", value: i }]).catch(() => null));
      pending.push(hub.ping({ timeout: 1500 }).catch(() => null));
      await sleep(5);
    }
    // Backoff alone: about 5 in the first second; one kick adds one.
    assert.ok(failing.all.length <= 10, `${failing.all.length} handshakes in a second`);
  } finally {
    await hub.close();
    await Promise.all(pending);
    await failing.stop();
  }
});

test("maxPendingPublishes: one publish more than that waiting is refused at once", async () => {
  const hub = new HubClient({
    url: "ws://127.0.0.1:1", WebSocket, backoffMin: 10, backoffMax: 50, maxPendingPublishes: 3,
  });
  const waiting = [0, 1, 2].map((i) => hub.publish("t", [{ type: "CUSTOM", name: "x", value: i }]));
  waiting.forEach((promise) => promise.catch(() => null));
  await assert.rejects(
    hub.publish("t", [{ type: "CUSTOM", name: "x", value: 3 }]),
    /3 publishes are waiting for their reply \(the client is not connected\)/,
  );
  assert.throws(() => new HubClient({ url: peer.url, WebSocket, maxPendingPublishes: 0 }));
  await hub.close();
  for (const promise of waiting) await assert.rejects(promise, /closed/);
});

test("no frame after a ping: the connection is dead, the client reconnects", async () => {
  const hub = client({ pingInterval: 100, pingTimeout: 100 });
  try {
    const conn = await peer.connection();
    const ping = await conn.next("ping", 1000); // sent after pingInterval of silence
    assert.equal(typeof ping.id, "number");
    // Not answered: the gateway looks alive to TCP but is not.
    const second = await peer.connection(1000);
    await until(() => hub.status.state === "open" && hub.status.reconnects === 1);
    assert.equal(hub.status.closeCode, 1006);
    // Answered pings keep a connection.
    for (let i = 0; i < 3; i++) {
      const next = await second.next("ping", 1000);
      second.send({ type: "pong", id: next.id });
    }
    assert.equal(hub.status.reconnects, 1);
  } finally {
    await hub.close();
  }
});

test("giveUpAfter: without a connection for that long everything fails", async () => {
  const hub = new HubClient({
    url: "ws://127.0.0.1:1", WebSocket, backoffMin: 10, backoffMax: 50, giveUpAfter: 300,
  });
  const sub = hub.subscribe("t");
  const began = Date.now();
  await assert.rejects(sub[Symbol.asyncIterator]().next(), HubUnreachable);
  assert.ok(Date.now() - began >= 250);
  assert.equal(hub.status.state, "closed");
  assert.ok(hub.status.attempt > 1);
  await assert.rejects(hub.publish("t", [{ type: "A" }]), HubUnreachable);
  await hub.close();
});

// -- publishing -------------------------------------------------------------------------------------

test("unanswered publishes go again after a reconnect: same ids, same order, first", async () => {
  const hub = client();
  try {
    const conn = await peer.connection();
    const calls = [1, 2, 3].map((n) => hub.publish("t", [{ type: "CUSTOM", name: "n", value: n }]));
    const sent = [await conn.next("publish"), await conn.next("publish"), await conn.next("publish")];
    conn.send({ type: "published", id: sent[0].id, thread: "t", offsets: ["1-0"] });
    assert.deepEqual(await calls[0], ["1-0"]);
    let later;
    hub.onStatus((status) => {
      // Made while the connection is down.
      if (status.state === "reconnecting" && later === undefined) {
        later = hub.publish("t", [{ type: "CUSTOM", name: "n", value: 4 }]);
      }
    });
    conn.abort();
    const again = await peer.connection();
    const resent = [await again.next("publish"), await again.next("publish"), await again.next("publish")];
    assert.deepEqual(resent.map((f) => f.events[0].value), [2, 3, 4]);
    assert.deepEqual(resent[0].eventIds, sent[1].eventIds);
    assert.deepEqual(resent[1].eventIds, sent[2].eventIds);
    resent.forEach((f, i) => again.send({ type: "published", id: f.id, thread: "t", offsets: [`${i + 2}-0`] }));
    assert.deepEqual(await Promise.all([calls[1], calls[2], later]), [["2-0"], ["3-0"], ["4-0"]]);
  } finally {
    await hub.close();
  }
});

test("rate_limited: the publish goes again after retryAfter, before the later ones", async () => {
  const hub = client();
  try {
    const conn = await peer.connection();
    const first = hub.publish("t", [{ type: "A" }], { eventIds: ["a"] });
    const sent = await conn.next("publish");
    const refused = Date.now();
    conn.send({ type: "error", id: sent.id, thread: "t", code: "rate_limited", message: "slow", retryAfter: 0.2 });
    await sleep(20);
    const second = hub.publish("t", [{ type: "B" }], { eventIds: ["b"] });
    const again = await conn.next("publish");
    assert.ok(Date.now() - refused >= 190, "sent again before retryAfter");
    assert.deepEqual(again.eventIds, ["a"]);
    const then = await conn.next("publish");
    assert.deepEqual(then.eventIds, ["b"]);
    conn.send({ type: "published", id: again.id, thread: "t", offsets: ["1-0"] });
    conn.send({ type: "published", id: then.id, thread: "t", offsets: ["2-0"] });
    assert.deepEqual(await first, ["1-0"]);
    assert.deepEqual(await second, ["2-0"]);
  } finally {
    await hub.close();
  }
});

test("a refused publish rejects with its code and index", async () => {
  const hub = client();
  try {
    const conn = await peer.connection();
    const call = hub.publish("t", [{ type: "A" }, { type: "B" }]);
    const sent = await conn.next("publish");
    conn.send({ type: "error", id: sent.id, thread: "t", code: "sequence_error", message: "no", index: 1 });
    await assert.rejects(call, (e) => e.code === "sequence_error" && e.index === 1);
    const big = hub.publish("t", [{ type: "A", blob: "x".repeat(2 * 1024 * 1024) }]);
    await assert.rejects(big, (e) => e.code === "payload_too_large");
  } finally {
    await hub.close();
  }
});

// -- iterators and listeners ---------------------------------------------------------------------------

test("the iterator's buffer is bounded: unsubscribe, then resume where it stopped", async () => {
  const hub = client();
  try {
    const conn = await peer.connection();
    const sub = hub.subscribe("t", { from: "start", maxBuffer: 4 });
    // A thread of 10 events: each subscribe gets every event after its position.
    const commands = [];
    const serve = (async () => {
      for (;;) {
        const command = await conn.next(undefined, 2000).catch(() => null);
        if (command === null) return;
        commands.push(command);
        if (command.type !== "subscribe") continue;
        const after = command.from === "start" ? 0 : Number(command.from.offset.split("-")[0]);
        conn.subscribed(command, { epoch: "E", offset: "10-0", recovered: true });
        for (let i = after + 1; i <= 10; i++) conn.event("t", `${i}-0`);
      }
    })();
    await until(() => commands.some((c) => c.type === "unsubscribe"));
    await sleep(50); // the frames after the overflow arrived, and were not taken
    const got = [];
    for await (const item of sub) {
      got.push(item);
      await sleep(5); // a slow consumer
      if (item.kind === "event" && item.offset === "10-0") break;
    }
    await serve;
    const offsets = got.filter((i) => i.kind === "event").map((i) => i.offset);
    assert.deepEqual(offsets, Array.from({ length: 10 }, (_, i) => `${i + 1}-0`));
    const subscribes = commands.filter((c) => c.type === "subscribe");
    assert.ok(subscribes.length >= 2);
    assert.deepEqual(subscribes[1].from, { offset: "3-0", epoch: "E" }, "the last buffered item");
    const resumed = got.filter((i) => i.kind === "subscribed" && i.resumed);
    assert.equal(resumed.length, subscribes.length - 1);
  } finally {
    await hub.close();
  }
});

test("a listener that throws is reported and the others still get every item", async () => {
  const hub = client();
  const error = console.error;
  const reported = [];
  console.error = (...args) => reported.push(args);
  try {
    const conn = await peer.connection();
    const good = [];
    const sub = hub.subscribe("t", {
      onItem: () => {
        throw new Error("boom");
      },
    });
    sub.onItem((item) => good.push(item));
    hub.onStatus(() => {
      throw new Error("status boom");
    });
    const command = await conn.next("subscribe");
    conn.subscribed(command, { epoch: "E", offset: "0-0", recovered: true });
    conn.event("t", "1-0");
    conn.event("t", "2-0");
    await until(() => good.length === 3);
    const fromItems = reported.filter((r) => String(r[0]).includes("onItem listener"));
    assert.equal(fromItems.length, 3);
    assert.ok(fromItems.every((r) => String(r[1]).includes("boom")));
    conn.close(1012);
    await until(() => hub.status.state === "open" && hub.status.reconnects === 1);
    assert.ok(reported.some((r) => String(r[1]).includes("status boom")));
  } finally {
    console.error = error;
    await hub.close();
  }
});

test("items buffered before the first listener are handed to it (no iterator)", async () => {
  const hub = client();
  try {
    const conn = await peer.connection();
    const sub = hub.subscribe("t");
    const command = await conn.next("subscribe");
    conn.subscribed(command, { epoch: "E", offset: "0-0", recovered: true });
    conn.event("t", "1-0");
    await sleep(50);
    const items = collect(sub);
    assert.equal(items.length, 0, "handed out at the end of the tick, not inside onItem()");
    await sleep(0);
    assert.deepEqual(items.map((i) => i.kind), ["subscribed", "event"]);
    assert.deepEqual(sub.position, { offset: "1-0", epoch: "E" });
  } finally {
    await hub.close();
  }
});

test("close(): iterators end, and no timer or socket keeps Node alive", async () => {
  const hub = client();
  const conn = await peer.connection();
  const sub = hub.subscribe("t");
  const iterator = sub[Symbol.asyncIterator]();
  const waiting = iterator.next();
  await conn.next("subscribe");
  await hub.close();
  assert.deepEqual(await waiting, { done: true, value: undefined });
  assert.equal(hub.status.state, "closed");

  // In a process of its own: a client with a subscription, a publish waiting for a
  // gateway that is not there, a ping; close() must leave nothing to wait for.
  const script = `
    import WebSocket from "ws";
    import { HubClient } from "../agui_hub/static/agui-hub.js";
    const hub = new HubClient({ url: "ws://127.0.0.1:1", WebSocket, pingInterval: 50 });
    hub.subscribe("t", { onItem: () => {} });
    hub.publish("t", [{ type: "A" }]).catch(() => {});
    hub.ping({ timeout: 60000 }).catch(() => {});
    await new Promise((r) => setTimeout(r, 200));
    await hub.close();
    console.log("closed");
  `;
  const began = Date.now();
  const done = spawnSync(process.execPath, ["--input-type=module", "-e", script], {
    cwd: new URL("..", import.meta.url),
    timeout: 10000,
    encoding: "utf8",
  });
  assert.equal(done.status, 0, done.stderr);
  assert.equal(done.stdout.trim(), "closed");
  assert.ok(Date.now() - began < 5000, "a timer kept the process alive");
});
