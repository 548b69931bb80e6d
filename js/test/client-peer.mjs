// A scripted WebSocket peer for the client's protocol tests: a real ws server on a loopback
// port that speaks the agui-hub subprotocols and does what each test tells it, so a test
// can produce what a real gateway does only by accident (a reply in another epoch, a
// store_unavailable, a close code, silence) and check the frames the client sends.

import { decode, encode } from "@msgpack/msgpack";
import { WebSocketServer } from "ws";

export { default as WebSocket } from "ws";

const SUBPROTOCOLS = ["agui-hub.v1.json", "agui-hub.v1.msgpack"];

/** Resolves with the next value pushed; values pushed with nobody waiting are queued. */
class Queue {
  #items = [];
  #waiters = [];
  push(item) {
    const waiter = this.#waiters.shift();
    if (waiter) waiter(item);
    else this.#items.push(item);
  }
  next(timeout = 5000, what = "an item") {
    if (this.#items.length > 0) return Promise.resolve(this.#items.shift());
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#waiters.splice(this.#waiters.indexOf(done), 1);
        reject(new Error(`no ${what} in ${timeout} ms`));
      }, timeout);
      const done = (item) => {
        clearTimeout(timer);
        resolve(item);
      };
      this.#waiters.push(done);
    });
  }
  get length() {
    return this.#items.length;
  }
  clear() {
    this.#items = [];
  }
}

export class PeerConnection {
  constructor(socket, request) {
    this.socket = socket;
    this.protocol = socket.protocol;
    this.offered = (request.headers["sec-websocket-protocol"] ?? "").split(",").map((p) => p.trim());
    this.frames = new Queue();
    this.closed = new Promise((resolve) => socket.on("close", (code) => resolve(code)));
    socket.on("message", (data, isBinary) => {
      const frame = isBinary ? decode(data) : JSON.parse(data.toString());
      this.frames.push(frame);
    });
  }

  /** The next frame the client sent (of *type*, skipping others, when given). */
  async next(type, timeout = 5000) {
    for (;;) {
      const frame = await this.frames.next(timeout, type ? `${type} frame` : "frame");
      if (!type || frame.type === type) return frame;
    }
  }

  send(frame) {
    if (this.protocol === "agui-hub.v1.msgpack") this.socket.send(encode(frame));
    else this.socket.send(JSON.stringify(frame));
  }

  close(code, reason = "") {
    this.socket.close(code, reason);
  }

  /** Drop the TCP connection without a close frame. */
  abort() {
    this.socket.terminate();
  }

  /** Answer a subscribe command. */
  subscribed(command, fields) {
    this.send({ type: "subscribed", id: command.id, thread: command.thread, ...fields });
  }

  event(thread, offset, event = { type: "CUSTOM", name: "x", value: offset }) {
    this.send({ type: "event", thread, offset, event });
  }
}

export class Peer {
  #connections = new Queue();
  all = [];

  static async start(options = {}) {
    const peer = new Peer();
    peer.server = new WebSocketServer({
      host: "127.0.0.1",
      port: 0,
      handleProtocols: (protocols) => SUBPROTOCOLS.find((p) => protocols.has(p)) ?? false,
      ...options,
    });
    peer.server.on("connection", (socket, request) => {
      const connection = new PeerConnection(socket, request);
      peer.all.push(connection);
      peer.#connections.push(connection);
    });
    await new Promise((resolve) => peer.server.on("listening", resolve));
    peer.url = `ws://127.0.0.1:${peer.server.address().port}`;
    return peer;
  }

  /** Forget the connections not taken yet (those of an earlier test's clients). */
  forget() {
    this.#connections.clear();
  }

  /** The next connection the client opens. */
  connection(timeout = 5000) {
    return this.#connections.next(timeout, "connection");
  }

  async stop() {
    for (const connection of this.all) connection.socket.terminate();
    await new Promise((resolve) => this.server.close(resolve));
  }
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Resolves when *predicate* holds (checked every 5 ms), rejects after *timeout* ms. */
export async function until(predicate, timeout = 5000, what = "the condition") {
  const deadline = Date.now() + timeout;
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`${what} did not hold in ${timeout} ms`);
    await sleep(5);
  }
}
