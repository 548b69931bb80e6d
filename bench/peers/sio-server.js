// The Socket.IO 4 peer, with @socket.io/redis-streams-adapter on the
// benchmark's Redis: every room emit is an XADD to the adapter's stream (so
// that other nodes, and reconnecting clients, can have it), then a local
// broadcast. It speaks the gateway's frames inside Socket.IO events: commands
// come as ["c", {...}], frames go out as ["m", {...}], JSON only.
"use strict";

const http = require("http");
const { Server } = require("socket.io");
const { createClient } = require("redis");
const { createAdapter } = require("@socket.io/redis-streams-adapter");
const { workload, fakeOffset, threadNames, option, yieldToLoop } = require("./common");

async function main() {
  const port = Number(option("--port", "0"));
  const redisUrl = option("--redis", "redis://127.0.0.1:6379/0");
  const redisClient = createClient({ url: redisUrl });
  redisClient.on("error", (err) => console.error("redis:", err.message));
  await redisClient.connect();

  const httpServer = http.createServer();
  const io = new Server(httpServer, {
    adapter: createAdapter(redisClient, { streamName: `agui-bench-sio-${process.pid}` }),
    transports: ["websocket"],
    perMessageDeflate: false,
    serveClient: false,
    maxHttpBufferSize: 64 * 1024 * 1024,
  });
  const published = new Map();
  let plan = [];

  async function blast() {
    let sent = 0;
    for (const [thread, frame] of plan) {
      io.to(thread).emit("m", frame);
      if (++sent % 4096 === 0) await yieldToLoop();
    }
  }

  io.on("connection", (socket) => {
    socket.on("c", (cmd) => {
      if (cmd.type === "subscribe") {
        socket.join(cmd.thread);
        socket.emit("m", {
          type: "subscribed", id: cmd.id, thread: cmd.thread, epoch: "sio", offset: "0-0",
          recovered: true,
        });
      } else if (cmd.type === "publish") {
        const thread = cmd.thread;
        const offsets = [];
        for (const event of cmd.events) {
          const n = published.get(thread) || 0;
          published.set(thread, n + 1);
          const offset = fakeOffset(n);
          offsets.push(offset);
          io.to(thread).emit("m", { type: "event", thread, offset, event });
        }
        // Answered at once: an emit has no "stored" to wait for.
        socket.emit("m", { type: "published", id: cmd.id, thread, offsets });
      } else if (cmd.type === "prepare") {
        const names = threadNames(cmd.prefix, cmd.threads);
        const events = typeof cmd.events === "number" ? workload(cmd.events) : cmd.events;
        plan = [];
        events.forEach((event, k) => {
          for (const t of names) plan.push([t, { type: "event", thread: t, offset: fakeOffset(k), event }]);
        });
        socket.emit("m", { type: "prepared", frames: plan.length });
      } else if (cmd.type === "go") {
        blast();
      }
    });
  });

  httpServer.listen(port, "127.0.0.1");
  for (const sig of ["SIGTERM", "SIGINT"]) {
    process.on(sig, () => {
      io.close();
      redisClient.quit().finally(() => process.exit(0));
    });
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
