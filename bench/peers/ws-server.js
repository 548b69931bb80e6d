// The bare Node peer: bench_gateway.py's --bare-server on the ws package.
// subscribe (a set per thread), publish (broadcast at once, then answer),
// prepare / go (pre-encoded frames, broadcast), nothing else: no storage.
"use strict";

const { WebSocketServer } = require("ws");
const { encode, decode } = require("@msgpack/msgpack");
const {
  SUBPROTOCOL_JSON,
  SUBPROTOCOL_MSGPACK,
  workload,
  fakeOffset,
  threadNames,
  eventFrame,
  option,
  yieldToLoop,
} = require("./common");

const port = Number(option("--port", "0"));
const subscribers = new Map();
const published = new Map();
let plan = [];

const wss = new WebSocketServer({
  host: "127.0.0.1",
  port,
  perMessageDeflate: false,
  maxPayload: 64 * 1024 * 1024,
  handleProtocols(protocols) {
    for (const p of protocols) {
      if (p === SUBPROTOCOL_JSON || p === SUBPROTOCOL_MSGPACK) return p;
    }
    return false;
  },
});

async function blast(binary) {
  let sent = 0;
  for (const [thread, frame] of plan) {
    const conns = subscribers.get(thread);
    if (!conns) continue;
    for (const ws of conns) ws.send(frame, { binary });
    sent += conns.size;
    if (sent >= 4096) {
      sent = 0;
      await yieldToLoop();
    }
  }
}

wss.on("connection", (ws) => {
  const binary = ws.protocol === SUBPROTOCOL_MSGPACK;
  const reply = (frame) =>
    ws.send(binary ? Buffer.from(encode(frame)) : JSON.stringify(frame), { binary });
  const joined = [];
  ws.on("message", (data) => {
    const cmd = binary ? decode(data) : JSON.parse(data.toString());
    if (cmd.type === "subscribe") {
      const thread = cmd.thread;
      if (!subscribers.has(thread)) subscribers.set(thread, new Set());
      subscribers.get(thread).add(ws);
      joined.push(thread);
      reply({ type: "subscribed", id: cmd.id, thread, epoch: "bare", offset: "0-0", recovered: true });
    } else if (cmd.type === "publish") {
      const thread = cmd.thread;
      const out = (cmd.encoding || (binary ? "msgpack" : "json")) === "msgpack";
      const conns = subscribers.get(thread);
      const offsets = [];
      for (const event of cmd.events) {
        const n = published.get(thread) || 0;
        published.set(thread, n + 1);
        const offset = fakeOffset(n);
        offsets.push(offset);
        if (conns && conns.size) {
          const frame = eventFrame(thread, offset, event, out);
          for (const c of conns) c.send(frame, { binary: out });
        }
      }
      reply({ type: "published", id: cmd.id, thread, offsets });
    } else if (cmd.type === "prepare") {
      const names = threadNames(cmd.prefix, cmd.threads);
      const events = typeof cmd.events === "number" ? workload(cmd.events) : cmd.events;
      plan = [];
      events.forEach((event, k) => {
        for (const t of names) plan.push([t, eventFrame(t, fakeOffset(k), event, binary)]);
      });
      reply({ type: "prepared", frames: plan.length });
    } else if (cmd.type === "go") {
      blast(binary);
    }
  });
  ws.on("close", () => {
    for (const thread of joined) {
      const conns = subscribers.get(thread);
      if (conns) {
        conns.delete(ws);
        if (!conns.size) subscribers.delete(thread);
      }
    }
  });
  ws.on("error", () => {});
});

for (const sig of ["SIGTERM", "SIGINT"]) {
  process.on(sig, () => {
    wss.close();
    process.exit(0);
  });
}
