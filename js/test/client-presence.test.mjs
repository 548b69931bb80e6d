// Presence in the built client, against the scripted peer (client-peer.mjs): what a
// subscription with `presence: true` keeps (`sub.presence`) and tells (`onPresence`) from
// the gateway's presence / joined / left frames, the list replaced after a reconnect,
// presence off and count-only, the `client` map on every subscribe and `auth`, the
// presence() command, and subscriptions that did not ask seeing nothing of it. (Against
// real gateways: tests/test_js_client.py.)

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { CommandRejected, HubClient, HubError } from "../../agui_hub/static/agui-hub.js";
import { Peer, WebSocket, until } from "./client-peer.mjs";

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

const ALICE = { connection: "g-1", subject: "alice", joined: 1000, client: { name: "web" } };
const BOB = { connection: "g-2", subject: "bob", joined: 2000, client: { name: "cli" } };
const CAROL = { connection: "g-3", subject: "carol", joined: 3000 };

test("presence: the list, who joined, who left; sub.presence and onPresence in step", async () => {
  const hub = client({ client: { name: "web" } });
  try {
    const conn = await peer.connection();
    const sub = hub.subscribe("t", { presence: true });
    const plain = hub.subscribe("u");
    const told = [];
    sub.onPresence((presence, change, which) => {
      assert.equal(which, sub);
      told.push({ presence, change });
    });
    const items = [];
    sub.onItem((item) => items.push(item));
    assert.deepEqual(sub.presence, {
      count: 0, entries: [], more: false, hidden: false, self: null, off: false, known: false,
    });
    assert.equal(plain.presence, null);
    const command = await conn.next("subscribe");
    assert.equal(command.presence, true);
    assert.deepEqual(command.client, { name: "web" });
    const other = await conn.next("subscribe");
    assert.equal(other.presence, undefined, "not asked: not sent");
    assert.deepEqual(other.client, { name: "web" }, "the client map goes with every subscribe");

    // Before the subscribed reply: about a subscription this one replaced, ignored.
    conn.send({ type: "joined", thread: "t", count: 9, entries: [CAROL] });
    conn.subscribed(command, { epoch: null, offset: "0-0", recovered: true });
    conn.subscribed(other, { epoch: null, offset: "0-0", recovered: true });
    conn.send({ type: "presence", thread: "t", count: 2, more: false, entries: [ALICE, BOB], connection: "g-1" });
    conn.send({ type: "presence", thread: "u", count: 2, more: false, entries: [ALICE, BOB], connection: "g-1" });
    await until(() => told.length === 1);
    assert.deepEqual(told[0].change, { change: "presence", count: 2, entries: [ALICE, BOB] });
    assert.equal(told[0].presence, sub.presence);
    assert.ok(Object.isFrozen(sub.presence));
    assert.deepEqual(sub.presence, {
      count: 2, entries: [ALICE, BOB], more: false, hidden: false, self: "g-1", off: false, known: true,
    });

    conn.send({ type: "joined", thread: "t", count: 3, entries: [CAROL] });
    await until(() => told.length === 2);
    assert.deepEqual(told[1].change, { change: "joined", count: 3, entries: [CAROL] });
    assert.deepEqual(sub.presence.entries, [ALICE, BOB, CAROL]);
    assert.notEqual(told[1].presence, told[0].presence, "a new object at every change");

    // A left frame names connection and subject only: the rest is what was known.
    conn.send({ type: "left", thread: "t", count: 2, entries: [{ connection: "g-2", subject: "bob" }] });
    await until(() => told.length === 3);
    assert.deepEqual(told[2].change, { change: "left", count: 2, entries: [BOB] });
    assert.deepEqual(sub.presence.entries, [ALICE, CAROL]);
    assert.equal(sub.presence.count, 2);

    // More watching than named: the count is the truth.
    conn.send({ type: "joined", thread: "t", count: 5, entries: [], more: true });
    await until(() => told.length === 4);
    assert.equal(sub.presence.count, 5);
    assert.equal(sub.presence.more, true);

    assert.deepEqual(items.map((item) => item.kind), ["subscribed"], "no presence items");
    assert.equal(plain.presence, null);
  } finally {
    await hub.close();
  }
});

test("presence: after a reconnect the gateway's new list replaces the kept one", async () => {
  const hub = client();
  try {
    let conn = await peer.connection();
    const sub = hub.subscribe("t", { presence: true, client: { name: "tab 2" } });
    let command = await conn.next("subscribe");
    assert.deepEqual(command.client, { name: "tab 2" }, "a subscribe's own client map");
    conn.subscribed(command, { epoch: null, offset: "0-0", recovered: true });
    conn.send({ type: "presence", thread: "t", count: 2, entries: [ALICE, BOB], connection: "g-2" });
    await until(() => sub.presence.known);
    conn.close(1012, "restart");
    conn = await peer.connection();
    command = await conn.next("subscribe");
    assert.equal(command.presence, true, "asked again on the new connection");
    assert.deepEqual(command.client, { name: "tab 2" });
    assert.equal(sub.presence.self, "g-2", "kept until the new list comes");
    conn.subscribed(command, { epoch: null, offset: "0-0", recovered: true });
    const newSelf = { connection: "g-7", subject: "bob", joined: 7000 };
    conn.send({ type: "presence", thread: "t", count: 2, entries: [ALICE, newSelf], connection: "g-7" });
    await until(() => sub.presence.self === "g-7");
    assert.deepEqual(sub.presence.entries, [ALICE, newSelf]);
  } finally {
    await hub.close();
  }
});

test("presence: off, and count only", async () => {
  const hub = client();
  try {
    const conn = await peer.connection();
    const off = hub.subscribe("off", { presence: true });
    const counted = hub.subscribe("counted", { presence: true });
    for (let i = 0; i < 2; i++) {
      const command = await conn.next("subscribe");
      conn.subscribed(command, { epoch: null, offset: "0-0", recovered: true });
    }
    conn.send({ type: "presence", thread: "off", off: true });
    conn.send({ type: "presence", thread: "counted", count: 4, more: false, entries: [], hidden: true });
    await until(() => off.presence.known && counted.presence.known);
    assert.deepEqual(off.presence, {
      count: 0, entries: [], more: false, hidden: false, self: null, off: true, known: true,
    });
    assert.deepEqual(counted.presence, {
      count: 4, entries: [], more: false, hidden: true, self: null, off: false, known: true,
    });
  } finally {
    await hub.close();
  }
});

test("presence(): the command and its refusal", async () => {
  const hub = client();
  try {
    const conn = await peer.connection();
    const asked = hub.presence("t", { limit: 5 });
    const command = await conn.next("presence");
    assert.deepEqual({ ...command, id: 0 }, { type: "presence", id: 0, thread: "t", limit: 5 });
    conn.send({ type: "presence", id: command.id, thread: "t", count: 7, more: true, entries: [ALICE] });
    assert.deepEqual(await asked, { count: 7, entries: [ALICE], more: true, hidden: false });

    const refused = hub.presence("t");
    const second = await conn.next("presence");
    assert.equal(second.limit, 100);
    conn.send({ type: "error", id: second.id, thread: "t", code: "presence_off", message: "off" });
    await assert.rejects(refused, (e) => e instanceof CommandRejected && e.code === "presence_off");
    await assert.rejects(hub.presence("t", { limit: 0 }), HubError);
  } finally {
    await hub.close();
  }
});

test("the client map: checked at once, sent with auth", async () => {
  for (const bad of [{ nested: { a: 1 } }, { list: [] }, { "": 1 }, { ["k".repeat(33)]: 1 },
    { big: "x".repeat(300) }, { n: Number.NaN }, ["a"]]) {
    assert.throws(() => client({ client: bad }), HubError, JSON.stringify(bad));
  }
  const hub = client();
  try {
    assert.throws(() => hub.subscribe("t", { client: { nested: {} } }), HubError);
  } finally {
    await hub.close();
  }
  // A token that expires soon: the client renews it with an auth command, map and all.
  const exp = Math.floor(Date.now() / 1000) + 1;
  const payload = Buffer.from(JSON.stringify({ sub: "a", exp })).toString("base64url");
  const renewing = client({ token: () => `h.${payload}.s`, client: { name: "web" } });
  try {
    const conn = await peer.connection();
    const auth = await conn.next("auth", 5000);
    assert.deepEqual(auth.client, { name: "web" });
  } finally {
    await renewing.close();
  }
});
