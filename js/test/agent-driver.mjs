// Drives a HubAgent (js/dist/agent.js) through the official @ag-ui/client for
// tests/test_official_client.py.
//
//   node test/agent-driver.mjs '<config JSON>'
//
// config: {url, thread, encoding?, from?, follow?, clientOptions?, shared?, steps: [...]}; steps:
//   {op: "connect", follow?}          await agent.connectAgent()
//   {op: "detached"}                  connectAgent() with follow "forever"; on a stdin line,
//                                     detachActiveRun() and await it
//   {op: "run", command: [...]}       runAgent() with a startRun that runs *command* (in
//                                     config.commandCwd; RUN_ID in it becomes input.runId,
//                                     PARENT_RUN_ID input.parentRunId, or "")
//                                     and waits for it to exit 0
//   {op: "runWithoutStartRun"}        runAgent() on an agent without startRun (must fail)
//   {op: "wait", label}               print {"waiting": label}, go on at the next stdin line
//
// stdout: one JSON line per event the official pipeline applied ({"n", "type"}), per
// snapshot the agent received ({"snapshot": n}), per RUN_FINISHED ({"finished": runId}),
// per status of its own client
// ({"status"}), and last the result: {"messages", "state", "stats", "steps", "warnings"}.
// Everything the official client logs with console.warn / console.error is in "warnings".

import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";
import WebSocket from "ws";

const config = JSON.parse(process.argv[2]);
const modulePath = process.env.AGUI_HUB_AGENT_MODULE;
const { HubAgent, HubClient } = await import(
  modulePath ? pathToFileURL(modulePath).href : new URL("../dist/agent.js", import.meta.url).href
);

const warnings = [];
for (const level of ["warn", "error"]) {
  const original = console[level].bind(console);
  console[level] = (...args) => {
    warnings.push(args.map((a) => (a instanceof Error ? a.message : String(a))).join(" "));
    original(...args);
  };
}

function say(line) {
  process.stdout.write(`${JSON.stringify(line)}\n`);
}

const lines = createInterface({ input: process.stdin });
const pending = [];
const waiting = [];
lines.on("line", (line) => {
  const waiter = waiting.shift();
  if (waiter) waiter(line);
  else pending.push(line);
});
function nextLine() {
  if (pending.length > 0) return Promise.resolve(pending.shift());
  return new Promise((resolve) => waiting.push(resolve));
}

function runCommand(argv, input) {
  const [command, ...args] = argv.map((part) =>
    part
      .replaceAll("PARENT_RUN_ID", input.parentRunId ?? "")
      .replaceAll("RUN_ID", input.runId),
  );
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, {
      cwd: config.commandCwd,
      stdio: ["ignore", "ignore", "inherit"],
    });
    child.on("error", reject);
    child.on("exit", (code) =>
      code === 0 ? resolve() : reject(new Error(`${argv[0]} exited ${code}`)),
    );
  });
}

let applied = 0;
const eventTypes = [];
const logger = {
  onEvent({ event }) {
    applied += 1;
    eventTypes.push(event.type);
    // AGENT_DRIVER_VERBOSE=1: the events themselves too (for debugging a test).
    const line = { n: applied, type: event.type };
    say(process.env.AGENT_DRIVER_VERBOSE ? { ...line, event } : line);
  },
  onMessagesSnapshotEvent() {
    say({ snapshot: agent.stats.snapshots });
  },
  onRunFinishedEvent({ event }) {
    say({ finished: event.runId });
  },
};

// config.shared: the agent gets a HubClient of the driver's, which it must leave open.
const shared = config.shared
  ? new HubClient({ url: config.url, encoding: config.encoding, WebSocket, backoffMin: 50 })
  : undefined;
const agent = new HubAgent({
  threadId: config.thread,
  client: shared,
  url: config.url,
  encoding: config.encoding ?? "msgpack",
  WebSocket,
  from: config.from ?? "start",
  branch: config.branch,
  follow: config.follow ?? "run",
  clientOptions: config.clientOptions ?? { backoffMin: 50, backoffMax: 300 },
  onStatus: (status) => say({ status: status.state, reconnects: status.reconnects }),
  startRun: (input) => runCommand(config.command ?? [], input),
});
agent.subscribe(logger);

function summary(result) {
  return {
    newMessages: result.newMessages.map((m) => m.id),
    result: result.result ?? null,
  };
}

const steps = [];
for (const step of config.steps) {
  const record = { op: step.op };
  steps.push(record);
  try {
    if (step.op === "connect") {
      agent.follow = step.follow ?? config.follow ?? "run";
      Object.assign(record, summary(await agent.connectAgent()));
    } else if (step.op === "detached") {
      agent.follow = "forever";
      const done = agent.connectAgent();
      say({ waiting: step.label ?? "detach" });
      await nextLine();
      await agent.detachActiveRun();
      Object.assign(record, summary(await done));
    } else if (step.op === "run") {
      config.command = step.command;
      Object.assign(record, summary(await agent.runAgent({})));
    } else if (step.op === "runWithoutStartRun") {
      const bare = new HubAgent({ threadId: config.thread, url: config.url, WebSocket });
      await bare.runAgent({});
      record.error = null;
    } else if (step.op === "wait") {
      say({ waiting: step.label });
      await nextLine();
    } else {
      throw new Error(`unknown step ${step.op}`);
    }
  } catch (error) {
    record.error = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
  }
  record.position = agent.position;
  record.messages = agent.messages.length;
}

const sharedStatus = shared?.status.state ?? null;
await shared?.close();
say({
  sharedStatus,
  messages: agent.messages,
  state: agent.state,
  stats: agent.stats,
  steps,
  eventTypes,
  position: agent.position,
  warnings,
});
process.exit(0);
