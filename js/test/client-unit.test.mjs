// Pure parts of the built client: offsets, backoff, tokens, thread names, arguments.

import assert from "node:assert/strict";
import { test } from "node:test";
import {
  CommandRejected,
  ConnectionRejected,
  HubClient,
  HubError,
  HubUnreachable,
  backoffDelay,
  checkThread,
  compareOffsets,
  isOffset,
  isPosition,
  tokenExpiry,
} from "../../agui_hub/static/agui-hub.js";
import { WebSocket } from "./client-peer.mjs";

test("offsets compare as pairs of integers, never as strings", () => {
  assert.equal(compareOffsets("1764700000123-10", "1764700000123-9"), 1);
  assert.equal(compareOffsets("999-0", "1000-0"), -1);
  assert.equal(compareOffsets("5-5", "5-5"), 0);
  assert.equal(compareOffsets("0-0", "0-1"), -1);
  const sorted = ["1000-0", "999-0", "0-0", "999-10", "999-9"].sort(compareOffsets);
  assert.deepEqual(sorted, ["0-0", "999-0", "999-9", "999-10", "1000-0"]);
});

test("offset parts past 2^53 compare exactly, up to 2^64 - 1", () => {
  // As doubles these are equal: 2^53 + 1 rounds to 2^53.
  assert.equal(compareOffsets("9007199254740993-0", "9007199254740992-0"), 1);
  assert.equal(compareOffsets("1-9007199254740993", "1-9007199254740992"), 1);
  assert.equal(compareOffsets("18446744073709551615-0", "18446744073709551614-0"), 1);
  assert.equal(compareOffsets("1-18446744073709551615", "2-0"), -1);
  assert.ok(isOffset("18446744073709551615-18446744073709551615"));
  assert.ok(!isOffset("18446744073709551616-0"), "2^64 is past the largest part");
});

test("a string that is not an offset is refused with HubError", () => {
  for (const bad of ["", "1", "1-", "-1", "1-2-3", "a-b", " 1-2", "1-2 ", "١-0", "1.5-0", "0x1-0"]) {
    assert.ok(!isOffset(bad), bad);
    assert.throws(() => compareOffsets(bad, "0-0"), HubError, bad);
    assert.throws(() => compareOffsets("0-0", bad), HubError, bad);
  }
  assert.ok(!isOffset(12), "a number is not an offset");
  assert.ok(!isOffset(null));
});

test("positions", () => {
  assert.ok(isPosition({ offset: "1-0", epoch: "e" }));
  assert.ok(isPosition({ offset: "1-0", epoch: null }));
  assert.ok(!isPosition({ offset: "1", epoch: "e" }));
  assert.ok(!isPosition({ offset: "1-0", epoch: 5 }));
  assert.ok(!isPosition("start"));
});

test("backoff: full jitter within [0, min(max, min * 2^n)]", () => {
  for (let attempt = 0; attempt < 40; attempt++) {
    const cap = Math.min(15000, 500 * 2 ** attempt);
    let high = 0;
    for (let i = 0; i < 200; i++) {
      const delay = backoffDelay(attempt, 500, 15000);
      assert.ok(delay >= 0 && delay <= cap, `attempt ${attempt}: ${delay} outside [0, ${cap}]`);
      high = Math.max(high, delay);
    }
    // Full jitter spreads over the whole range, not a fixed fraction of it.
    assert.ok(high > cap / 2, `attempt ${attempt}: 200 draws all below half the cap`);
  }
});

test("a JWT's exp is read without verifying; anything else has none", () => {
  const part = (claims) => Buffer.from(JSON.stringify(claims)).toString("base64url");
  assert.equal(tokenExpiry(`${part({ alg: "HS256" })}.${part({ exp: 1764703600 })}.sig`), 1764703600000);
  assert.equal(tokenExpiry(`${part({})}.${part({ sub: "a" })}.sig`), null);
  assert.equal(tokenExpiry(`${part({})}.${part({ exp: "soon" })}.sig`), null);
  assert.equal(tokenExpiry("opaque-token"), null);
  assert.equal(tokenExpiry("a.%%%.c"), null);
});

test("thread names: 1 to 256 characters, no control characters, no outer whitespace", () => {
  assert.equal(checkThread("tenant-42/run-1"), "tenant-42/run-1");
  assert.equal(checkThread("🙂".repeat(256)), "🙂".repeat(256), "characters, not UTF-16 units");
  const c1 = ["csi\u009b2J", "nel\u0085x", "a\u0080b"]; // C1 controls, refused like C0 and DEL
  for (const bad of ["", "x".repeat(257), "a\nb", "a\u007fb", ...c1, "demo ", " demo", "   "]) {
    assert.throws(() => checkThread(bad), HubError, JSON.stringify(bad));
  }
});

test("errors: one root, with their fields", () => {
  const rejected = new ConnectionRejected(4403, "revoked", "credentials revoked");
  assert.ok(rejected instanceof HubError && rejected instanceof Error);
  assert.equal(rejected.name, "ConnectionRejected");
  assert.equal(rejected.closeCode, 4403);
  assert.equal(rejected.reason, "credentials revoked");
  const refused = new CommandRejected("sequence_error", "bad", { index: 2, thread: "t" });
  assert.ok(refused instanceof HubError);
  assert.equal(refused.code, "sequence_error");
  assert.equal(refused.index, 2);
  assert.equal(refused.retryAfter, undefined);
  assert.ok(new HubUnreachable("x") instanceof HubError);
});

test("bad arguments are refused at once, with HubError", async () => {
  assert.throws(() => new HubClient({ url: "http://127.0.0.1:1", WebSocket }), HubError);
  assert.throws(() => new HubClient({ url: "not a url", WebSocket }), HubError);
  assert.throws(() => new HubClient({ url: "ws://127.0.0.1:1" }), /WebSocket/, "Node 20 has none");
  assert.throws(() => new HubClient({ url: "ws://127.0.0.1:1", WebSocket, encoding: "xml" }), HubError);
  assert.throws(() => new HubClient({ url: "ws://127.0.0.1:1", WebSocket, token: "" }), HubError);
  // Nothing listens on port 1: the client keeps trying until closed.
  const hub = new HubClient({ url: "ws://127.0.0.1:1", WebSocket });
  try {
    assert.throws(() => hub.subscribe("demo "), HubError);
    assert.throws(() => hub.subscribe("t", { from: "middle" }), HubError);
    assert.throws(() => hub.subscribe("t", { from: { offset: "x", epoch: null } }), HubError);
    assert.throws(() => hub.subscribe("t", { maxBuffer: 1 }), HubError);
    hub.subscribe("t");
    assert.throws(() => hub.subscribe("t"), /already subscribed/);
    await assert.rejects(hub.publish("t", [{ notype: 1 }]), HubError);
    await assert.rejects(hub.publish("t", [{ type: "A" }], { eventIds: ["a", "b"] }), HubError);
    await assert.rejects(
      hub.publish("t", [{ type: "A" }, { type: "B" }], { eventIds: ["a", "a"] }),
      /all be different/,
    );
    await assert.rejects(hub.publish("t", new Array(1001).fill({ type: "A" })), /at most 1000/);
    assert.deepEqual(await hub.publish("t", []), []);
    const ids = hub.newEventIds(3);
    assert.equal(new Set(ids).size, 3);
    assert.match(ids[0], /^[0-9a-f]{16}-\d+$/);
  } finally {
    await hub.close();
  }
  await assert.rejects(hub.publish("t", [{ type: "A" }]), /closed/);
  assert.throws(() => hub.subscribe("u"), /closed/);
});
