// The viewer's reducer (src/transcript.ts), bundled on the fly with esbuild.
//
// `node --test test/` runs the unit tests below. With a file argument,
// `node test/viewer-transcript.test.mjs CASES.json` folds each case of
// {"cases": {name: {"events": [...], "snapshot": [...]?}}} (the events, or a
// snapshot's events then the events that follow it) and prints
// {name: model} as one JSON line: tests/test_viewer.py compares the models
// with agui_hub/agui/reducer.py's fold of the same events.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));

async function loadTranscript() {
  const out = await build({
    entryPoints: [join(here, "..", "src", "transcript.ts")],
    bundle: true,
    format: "esm",
    platform: "neutral",
    write: false,
    logLevel: "error",
  });
  const code = out.outputFiles[0].text;
  return import("data:text/javascript;base64," + Buffer.from(code).toString("base64"));
}

const { Transcript } = await loadTranscript();

function fold(events) {
  const t = new Transcript();
  t.applyAll(events);
  return t;
}

if (process.argv[2]) {
  const { cases } = JSON.parse(readFileSync(process.argv[2], "utf8"));
  const results = {};
  for (const [name, input] of Object.entries(cases)) {
    const t = new Transcript();
    t.applyAll(input.before ?? []);
    if (input.snapshot) {
      t.reset(); // a snapshot replaces what came before it, as the page does
      t.applyAll(input.snapshot);
    }
    t.applyAll(input.events ?? []);
    const model = t.snapshot();
    results[name] = {
      messages: model.messages,
      state: model.state,
      runs: model.runs.map((r) => ({ runId: r.runId, status: r.status })),
      problems: t.problemCount,
      stateProblem: model.stateProblem,
      open: {
        messages: [...t.openMessages],
        toolCalls: [...t.openToolCalls],
        reasoning: [...t.openReasoning],
      },
    };
  }
  console.log(JSON.stringify(results));
} else {
  const { test } = await import("node:test");

  test("text, tool calls with results, reasoning and state", () => {
    const t = fold([
      { type: "RUN_STARTED", threadId: "t", runId: "r1" },
      { type: "TEXT_MESSAGE_START", messageId: "m1", role: "assistant" },
      { type: "TEXT_MESSAGE_CONTENT", messageId: "m1", delta: "Hello" },
      { type: "TEXT_MESSAGE_CONTENT", messageId: "m1", delta: " world" },
      { type: "TEXT_MESSAGE_END", messageId: "m1" },
      { type: "TOOL_CALL_START", toolCallId: "c1", toolCallName: "f", parentMessageId: "m1" },
      { type: "TOOL_CALL_ARGS", toolCallId: "c1", delta: '{"a": ' },
      { type: "TOOL_CALL_ARGS", toolCallId: "c1", delta: "1}" },
      { type: "TOOL_CALL_END", toolCallId: "c1" },
      { type: "TOOL_CALL_RESULT", messageId: "r", toolCallId: "c1", content: "ok", role: "tool" },
      { type: "STATE_SNAPSHOT", snapshot: { n: 1, list: [] } },
      { type: "STATE_DELTA", delta: [{ op: "add", path: "/list/-", value: "x" }] },
      { type: "RUN_FINISHED", threadId: "t", runId: "r1" },
    ]);
    assert.deepEqual(t.messages, [
      {
        id: "m1",
        role: "assistant",
        content: "Hello world",
        toolCalls: [{ id: "c1", type: "function", function: { name: "f", arguments: '{"a": 1}' } }],
      },
      { id: "r", toolCallId: "c1", role: "tool", content: "ok" },
    ]);
    assert.deepEqual(t.state, { n: 1, list: ["x"] });
    assert.equal(t.runs[0].status, "finished");
    assert.equal(t.resultOf("c1").content, "ok");
    assert.equal(t.problemCount, 0);
  });

  test("a patch that does not apply changes nothing and marks the state", () => {
    const t = fold([
      { type: "STATE_SNAPSHOT", snapshot: { a: 1 } },
      { type: "STATE_DELTA", delta: [{ op: "replace", path: "/a", value: 2 }, { op: "remove", path: "/nope" }] },
      { type: "STATE_DELTA", delta: "not a patch" },
      { type: "STATE_DELTA", delta: [{ op: "replace", path: "/a", value: 3 }] },
    ]);
    assert.deepEqual(t.state, { a: 3 });
    assert.match(t.stateProblem, /does not apply/);
    assert.equal(t.problemCount, 2);
    t.apply({ type: "STATE_SNAPSHOT", snapshot: { b: 1 } });
    assert.equal(t.stateProblem, null);
  });

  test("RAW and CUSTOM events are counted, the latest kept, and change nothing else", () => {
    const events = [{ type: "RUN_STARTED", threadId: "t", runId: "r1" }];
    for (let i = 0; i < 60; i++) events.push({ type: "RAW", event: { i } });
    events.push({ type: "CUSTOM", name: "n", value: 1 });
    const t = fold(events);
    assert.equal(t.rawCount, 61);
    assert.equal(t.rawEvents.length, 50);
    assert.deepEqual(t.rawEvents.at(-1), { type: "CUSTOM", name: "n", value: 1 });
    assert.deepEqual(t.rawEvents[0], { type: "RAW", event: { i: 11 } });
    assert.ok(t.rawBytes > 60 * 20);
    assert.equal(t.messages.length, 0);
    assert.equal(t.problemCount, 0);
    t.reset();
    assert.equal(t.rawCount + t.rawBytes + t.rawEvents.length, 0);
  });

  test("untrusted input never throws", () => {
    const t = new Transcript();
    for (const bad of [null, 1, "x", [], {}, { type: 5 }, { type: "TEXT_MESSAGE_CONTENT" },
      { type: "TEXT_MESSAGE_CONTENT", messageId: "m", delta: 5 }, { type: "TOOL_CALL_START" },
      { type: "MESSAGES_SNAPSHOT", messages: [1] }, { type: "RUN_STARTED", input: { messages: 3 } },
      { type: "TEXT_MESSAGE_CHUNK" }, { type: "TEXT_MESSAGE_START", messageId: "m", metadata: 3 },
      { type: "constructor" }, { type: "__defineGetter__" }, { type: "toString" }, { type: "hasOwnProperty" }]) {
      assert.doesNotThrow(() => t.apply(bad));
    }
    // Not counted, as in the Python reducer: {}, {type: 5} and the names of Object's
    // properties (no known type), and a
    // delta, however wrong, for a message that does not exist.
    assert.equal(t.problemCount, 10);
    assert.deepEqual(t.messages, []);
  });

  test("chunks expand like the hub's ChunkExpander", () => {
    const t = fold([
      { type: "TEXT_MESSAGE_CHUNK", messageId: "m1", delta: "a" },
      { type: "TEXT_MESSAGE_CHUNK", delta: "b" },
      { type: "TOOL_CALL_CHUNK", toolCallId: "c1", toolCallName: "f", delta: "{}" },
    ]);
    assert.deepEqual(t.messages.map((m) => [m.id, m.role, m.content ?? null]), [
      ["m1", "assistant", "ab"],
      ["c1", "assistant", null],
    ]);
    assert.deepEqual([...t.openMessages], []);
    assert.deepEqual([...t.openToolCalls], ["c1"]);
  });

  test("changes are recorded for incremental rendering", () => {
    const t = new Transcript();
    t.takeChanges();
    t.apply({ type: "TEXT_MESSAGE_START", messageId: "m1", role: "user" });
    let changes = t.takeChanges();
    const m1 = t.message("m1");
    assert.ok(changes.order && changes.messages.has(m1) && !changes.reset);
    t.apply({ type: "TEXT_MESSAGE_CONTENT", messageId: "m1", delta: "x" });
    changes = t.takeChanges();
    assert.ok(!changes.order && changes.messages.has(m1) && !changes.state);
  });

  test("a step or an end marks only its run changed, a new run the list", () => {
    const t = new Transcript();
    for (let i = 1; i <= 3; i++) {
      t.apply({ type: "RUN_STARTED", threadId: "t", runId: `r${i}` });
      t.apply({ type: "RUN_FINISHED", threadId: "t", runId: `r${i}` });
    }
    t.apply({ type: "RUN_STARTED", threadId: "t", runId: "r4" });
    let changes = t.takeChanges();
    assert.ok(changes.runs, "runs came: every run view is updated once");
    const [r1, , , r4] = t.runs;
    for (const event of [
      { type: "STEP_STARTED", stepName: "s" },
      { type: "STEP_FINISHED", stepName: "s" },
      { type: "RUN_FINISHED", threadId: "t", runId: "r4" },
    ]) {
      t.apply(event);
      changes = t.takeChanges();
      assert.ok(!changes.runs, event.type);
      assert.deepEqual([...changes.changedRuns], [r4], event.type);
    }
    // A problem (an event that could not be folded) changes no run.
    t.apply({ type: "STEP_STARTED" });
    changes = t.takeChanges();
    assert.equal(t.problemCount, 1);
    assert.ok(!changes.runs && changes.changedRuns.size === 0);
    assert.equal(r1.status, "finished");
  });
}
