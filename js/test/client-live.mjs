// The BUILT client (agui_hub/static/agui-hub.js) against a real gateway, driven by
// tests/test_js_client.py. Every stdout line is one JSON document: progress lines while it
// runs ({"progress": ...}, {"ready": ...}), the result last ({"result": ...}).
//
//   node test/client-live.mjs follow  --url URL --thread T [--encoding E] [--from F]
//        [--until finished:N|snapshot|events:N|time:MS|error] [--mode iterate|listen]
//        [--max-buffer N] [--slow MS] [--backoff-min MS] [--backoff-max MS]
//        [--token JWT | --secret-file F --ttl S] [--deadline MS]
//   node test/client-live.mjs publish --url URL --thread T [--encoding E] --count N
//        [--marker TEXT] [--run-id R] [--deadline MS]
//   node test/client-live.mjs runs --url URL --thread T [--limit N]
//   node test/client-live.mjs presence --url URL --thread T [--client JSON] [--deadline MS]
//        (follows who watches T, one {"presence": ...} line per change, until one left)
//
// F is start, live, snapshot or OFFSET@EPOCH. The exit status is 0 when the run ended as
// asked (stop condition met, or for --until error an error), 3 when --deadline passed.

import { createHmac } from "node:crypto";
import { readFileSync } from "node:fs";
import WebSocket from "ws";
import { HubClient } from "../../agui_hub/static/agui-hub.js";

function parse(argv) {
  const [scenario, ...rest] = argv;
  const options = { scenario };
  for (let i = 0; i < rest.length; i += 2) {
    if (!rest[i].startsWith("--") || i + 1 >= rest.length) {
      throw new Error(`bad argument ${rest[i]}`);
    }
    options[rest[i].slice(2)] = rest[i + 1];
  }
  return options;
}

const opts = parse(process.argv.slice(2));
const deadlineMs = Number(opts.deadline ?? 30000);
const emit = (doc) => process.stdout.write(`${JSON.stringify(doc)}\n`);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function base64url(data) {
  return Buffer.from(data).toString("base64url");
}

/** An HS256 token granting every thread, as `agui-hub token` mints them. */
function mint(secret, ttl) {
  const now = Math.floor(Date.now() / 1000);
  const header = base64url(JSON.stringify({ alg: "HS256", typ: "JWT" }));
  const claims = base64url(
    JSON.stringify({
      sub: "js-live",
      iat: now,
      exp: now + ttl,
      agui: { subscribe: ["*"], publish: ["*"] },
    }),
  );
  const signature = createHmac("sha256", secret).update(`${header}.${claims}`).digest("base64url");
  return `${header}.${claims}.${signature}`;
}

function tokenOption() {
  if (opts.token) return opts.token;
  if (opts["secret-file"]) {
    const secret = readFileSync(opts["secret-file"], "utf8").trim();
    const ttl = Number(opts.ttl ?? 60);
    let minted = 0;
    return () => {
      minted++;
      emit({ progress: "token", minted });
      return mint(secret, ttl);
    };
  }
  return undefined;
}

function startOption(value) {
  if (value === undefined || ["start", "live", "snapshot"].includes(value)) return value ?? "start";
  const [offset, epoch] = value.split("@");
  return { offset, epoch: epoch ?? null };
}

function errorDoc(error) {
  return error
    ? { name: error.name, message: error.message, closeCode: error.closeCode ?? null, code: error.code ?? null }
    : null;
}

function makeClient(statuses) {
  const hub = new HubClient({
    url: opts.url,
    encoding: opts.encoding ?? "msgpack",
    WebSocket,
    token: tokenOption(),
    backoffMin: Number(opts["backoff-min"] ?? 50),
    backoffMax: Number(opts["backoff-max"] ?? 500),
    client: opts.client ? JSON.parse(opts.client) : undefined,
  });
  statuses.push({ ...hub.status });
  hub.onStatus((status) => {
    const doc = { ...status };
    if (status.error) doc.error = errorDoc(status.error);
    statuses.push(doc);
    emit({ progress: "status", status: doc });
  });
  return hub;
}

async function follow() {
  const statuses = [];
  const hub = makeClient(statuses);
  const items = [];
  const [kind, arg] = (opts.until ?? "finished:1").split(":");
  const limit = Number(arg ?? 1);
  const slow = Number(opts.slow ?? 0);
  let finished = 0;
  let events = 0;
  let failure = null;
  let met = false;

  // Whether the run should stop after this item.
  const take = (item) => {
    items.push(item);
    if (item.kind === "subscribed") emit({ ready: item });
    if (item.kind === "event") {
      events++;
      emit({ progress: events, offset: item.offset, type: item.event.type });
      if (item.event.type === "RUN_FINISHED" || item.event.type === "RUN_ERROR") finished++;
    }
    if (kind === "finished") return finished >= limit;
    if (kind === "events") return events >= limit;
    if (kind === "snapshot") return item.kind === "snapshot";
    return false;
  };

  const sub = hub.subscribe(opts.thread, {
    from: startOption(opts.from),
    maxBuffer: opts["max-buffer"] ? Number(opts["max-buffer"]) : undefined,
    ...(opts.mode === "listen" ? { onItem: (item) => take(item) && stop() } : {}),
  });
  let stop;
  const stopped = new Promise((resolve) => {
    stop = () => {
      met = true;
      resolve();
    };
  });
  if (kind === "time") setTimeout(stop, limit);
  if (opts.mode === "listen") {
    sub.onEnd((error) => {
      failure = error;
      if (kind === "error" && error) stop();
    });
  } else {
    const iterate = async () => {
      try {
        for await (const item of sub) {
          if (slow) await sleep(slow);
          if (take(item)) {
            stop();
            break;
          }
          if (met) break;
        }
      } catch (error) {
        failure = error;
        if (kind === "error") stop();
      }
    };
    void iterate();
  }
  const timer = setTimeout(() => {
    emit({ result: { timedOut: true, items, statuses, error: errorDoc(failure) } });
    process.exit(3);
  }, deadlineMs);
  await stopped;
  let pingMs = null;
  if (kind === "time" && !failure) pingMs = await hub.ping();
  const result = {
    items,
    statuses,
    position: sub.position,
    recovered: sub.recovered,
    reconnects: hub.status.reconnects,
    status: { ...hub.status, error: errorDoc(hub.status.error) },
    error: errorDoc(failure),
    pingMs,
  };
  await sub.close();
  await hub.close();
  clearTimeout(timer);
  emit({ result });
}

async function publish() {
  const statuses = [];
  const hub = makeClient(statuses);
  const thread = opts.thread;
  const runId = opts["run-id"] ?? "js-run";
  const count = Number(opts.count ?? 10);
  const marker = opts.marker ?? null;
  const events = [
    { type: "RUN_STARTED", threadId: thread, runId },
    { type: "TEXT_MESSAGE_START", messageId: "m1", role: "assistant" },
  ];
  for (let i = 0; i < count; i++) {
    const delta = marker !== null && i === Math.floor(count / 2) ? ` ${marker}` : ` d${i}`;
    events.push({ type: "TEXT_MESSAGE_CONTENT", messageId: "m1", delta });
  }
  events.push({ type: "TEXT_MESSAGE_END", messageId: "m1" });
  events.push({ type: "RUN_FINISHED", threadId: thread, runId });
  const timer = setTimeout(() => {
    emit({ result: { timedOut: true, statuses } });
    process.exit(3);
  }, deadlineMs);
  // Pipelined: one call per event, none awaiting another.
  const offsets = await Promise.all(events.map((event) => hub.publish(thread, [event])));
  clearTimeout(timer);
  const result = { events, offsets: offsets.map((o) => o[0]), statuses, reconnects: hub.status.reconnects };
  await hub.close();
  emit({ result });
}

async function runs() {
  const statuses = [];
  const hub = makeClient(statuses);
  const options = opts.limit === undefined ? {} : { limit: Number(opts.limit) };
  let result;
  try {
    result = await hub.runs(opts.thread, options);
  } catch (error) {
    result = { error: errorDoc(error) };
  }
  await hub.close();
  emit({ result });
}

async function presence() {
  const statuses = [];
  const hub = makeClient(statuses);
  const sub = hub.subscribe(opts.thread, { presence: true });
  const changes = [];
  const timer = setTimeout(() => {
    emit({ result: { timedOut: true, changes, statuses } });
    process.exit(3);
  }, deadlineMs);
  await new Promise((resolve) => {
    sub.onPresence((state, change) => {
      changes.push(change);
      emit({ presence: change.change, change, state });
      if (change.change === "left") resolve();
    });
  });
  const listed = await hub.presence(opts.thread);
  clearTimeout(timer);
  const result = { changes, presence: sub.presence, listed };
  await hub.close();
  emit({ result });
}

const scenarios = { follow, publish, runs, presence };
if (!(opts.scenario in scenarios)) {
  console.error(`unknown scenario ${opts.scenario}: one of ${Object.keys(scenarios).join(", ")}`);
  process.exit(2);
}
await scenarios[opts.scenario]();
