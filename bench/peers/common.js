// What both Node peers share with bench_gateway.py: the workload, the fake
// offsets, the thread names and the event frames, byte for byte where it
// matters (the viewers count frames by their first bytes).
"use strict";

const { encode } = require("@msgpack/msgpack");

const MESSAGE_LEN = 500;
const SUBPROTOCOL_JSON = "agui-hub.v1.json";
const SUBPROTOCOL_MSGPACK = "agui-hub.v1.msgpack";

// bench_gateway.workload: messages of MESSAGE_LEN events (START, deltas, END).
function workload(count) {
  const out = [];
  for (let i = 0; i < count; i++) {
    const k = Math.floor(i / MESSAGE_LEN);
    const j = i % MESSAGE_LEN;
    const messageId = `msg-${k}`;
    const timestamp = 1764700000000 + i;
    if (j === 0) {
      out.push({ type: "TEXT_MESSAGE_START", messageId, role: "assistant", timestamp });
    } else if (j === MESSAGE_LEN - 1) {
      out.push({ type: "TEXT_MESSAGE_END", messageId, timestamp });
    } else {
      out.push({ type: "TEXT_MESSAGE_CONTENT", messageId, delta: ` token${i % 50}`, timestamp });
    }
  }
  return out;
}

function fakeOffset(k) {
  return `${1764700000000 + Math.floor(k / 8)}-${k % 8}`;
}

function threadNames(prefix, count) {
  if (count === 1) return [prefix];
  return Array.from({ length: count }, (_, i) => `${prefix}-${i}`);
}

// The event frame, encoded once and sent to every subscriber as it is.
function eventFrame(thread, offset, event, binary) {
  const frame = { type: "event", thread, offset, event };
  return binary ? Buffer.from(encode(frame)) : Buffer.from(JSON.stringify(frame));
}

function option(name, fallback) {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : fallback;
}

// Let the loop flush the sockets now and then during a long broadcast.
function yieldToLoop() {
  return new Promise((resolve) => setImmediate(resolve));
}

module.exports = {
  SUBPROTOCOL_JSON,
  SUBPROTOCOL_MSGPACK,
  workload,
  fakeOffset,
  threadNames,
  eventFrame,
  option,
  yieldToLoop,
};
