// Runs the official HttpAgent of @ag-ui/client once, for tests/bridge/test_web_httpagent.py.
//
//   node test/httpagent-driver.mjs '<input JSON>'     (or the JSON on stdin)
//
// input: {url, headers?, threadId, runId, messages?, state?, tools?, context?,
//         forwardedProps?}
// The agent is `new HttpAgent({url, headers, threadId, initialMessages, initialState})` and
// runs once: `await agent.runAgent({runId, tools, context, forwardedProps}, subscriber)`.
//
// stdout, one JSON line: {events, messages, state, error, runErrors, failures, newMessages,
// warnings}: every event the client's pipeline applied (onEvent, after its own chunk
// expansion and verification), the agent's messages and state afterwards, the error
// runAgent rejected with (null when it resolved), the RUN_ERROR events its
// onRunErrorEvent saw, the errors its onRunFailed saw, the newMessages runAgent
// resolved with, and what the client logged with console.warn / console.error.

import { HttpAgent } from "@ag-ui/client";

const warnings = [];
for (const level of ["warn", "error"]) {
  const original = console[level].bind(console);
  console[level] = (...args) => {
    warnings.push(args.map((a) => (a instanceof Error ? a.message : String(a))).join(" "));
    original(...args);
  };
}

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return Buffer.concat(chunks).toString("utf8");
}

const input = JSON.parse(process.argv[2] ?? (await readStdin()));

const agent = new HttpAgent({
  url: input.url,
  headers: input.headers ?? {},
  threadId: input.threadId,
  initialMessages: input.messages ?? [],
  initialState: input.state ?? {},
});

const events = [];
const runErrors = [];
const failures = [];
let error = null;
let newMessages = null;
try {
  const result = await agent.runAgent(
    {
      runId: input.runId,
      tools: input.tools ?? [],
      context: input.context ?? [],
      forwardedProps: input.forwardedProps ?? {},
    },
    {
      onEvent({ event }) {
        events.push(structuredClone(event));
      },
      onRunErrorEvent({ event }) {
        runErrors.push(structuredClone(event));
      },
      onRunFailed({ error: failed }) {
        failures.push(String(failed?.message ?? failed));
      },
    },
  );
  newMessages = result.newMessages;
} catch (caught) {
  error = {
    name: caught?.name ?? null,
    message: String(caught?.message ?? caught),
    status: caught?.status ?? null,
  };
}

process.stdout.write(
  `${JSON.stringify({
    events,
    messages: agent.messages,
    state: agent.state,
    error,
    runErrors,
    failures,
    newMessages,
    warnings,
  })}\n`,
);
