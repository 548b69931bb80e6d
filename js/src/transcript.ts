// The viewer's model of one thread: AG-UI events (and the hub's snapshots)
// folded into messages, runs, steps and the shared state.
//
// The message list has the shape agui_hub/agui/reducer.py gives it (itself the
// shape of @ag-ui/client's defaultApplyEvents), so that a test can compare
// the page's messages and state with the Python reducer's for the same
// thread. What the Python reducer keeps for the hub's own use (limits,
// compaction) is left out; what a page shows and the reducer does not keep
// (every run's steps, which message came in which run) is added on the side.
//
// Every event is untrusted input: apply() never throws. An event that cannot
// be folded is counted in `problems` and changes nothing; a STATE_DELTA that
// does not apply leaves the state as it was and marks it (`stateProblem`)
// until the next STATE_SNAPSHOT.
//
// Rendering is incremental: apply() records what changed (`takeChanges()`),
// so a view can update only those parts, once per animation frame.

import { applyPatch, type Operation } from "fast-json-patch";

export type AguiEvent = { type: string; [key: string]: unknown };
type Obj = Record<string, unknown>;

export interface ToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
  [key: string]: unknown;
}

export interface Message {
  id: string;
  role: string;
  content?: unknown;
  toolCalls?: ToolCall[];
  toolCallId?: string;
  [key: string]: unknown;
}

export type RunStatus = "running" | "finished" | "error";

export interface Step {
  name: string;
  subagentRunId?: string;
  status: "running" | "finished" | "interrupted";
}

export interface Run {
  runId: string | null;
  parentRunId: string | null;
  status: RunStatus;
  /** The RUN_STARTED event (without input for earlier runs, as the hub keeps it). */
  started: Obj | null;
  /** The RUN_FINISHED or RUN_ERROR event. */
  ended: Obj | null;
  /** Steps in the order they started (not in the Python reducer: it keeps open ones only). */
  steps: Step[];
}

export interface Changes {
  /** Everything is new (a snapshot, a reset): rebuild the view. */
  reset: boolean;
  /** Messages were added, removed or moved. */
  order: boolean;
  /** Messages whose content, tool calls or results changed. */
  messages: Set<Message>;
  /** Runs were added or removed (and so which one is the latest changed). */
  runs: boolean;
  /** Runs whose status, steps or sub-agents changed: only their views need an update. */
  changedRuns: Set<Run>;
  state: boolean;
  /** Which streams (text, tool calls, reasoning) are open changed; the messages
   * concerned are in `messages` too. */
  open: boolean;
}

export interface Problem {
  type: string;
  reason: string;
}

const CLIENT_METADATA_KEY = "@ag-ui/client";
const UNDECLARED = Symbol("undeclared");
const MAX_PROBLEMS = 50;
/** RAW and CUSTOM events kept for the view (the latest); all are counted. */
export const MAX_RAW_KEPT = 50;

function isObject(value: unknown): value is Obj {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** Python's truthiness, for the places where the reducer relies on it (`x or {}`). */
function pyTruthy(value: unknown): boolean {
  if (value === null || value === undefined || value === false || value === 0 || value === "") {
    return false;
  }
  if (Array.isArray(value)) return value.length > 0;
  if (isObject(value)) return Object.keys(value).length > 0;
  return true;
}

/** *table*'s own entry for *key*: an event type such as "constructor" names nothing. */
function own<T>(table: Record<string, T>, key: unknown): T | undefined {
  return typeof key === "string" && Object.hasOwn(table, key) ? table[key] : undefined;
}

function isKey(value: unknown): value is string | number | boolean | null {
  return value === null || ["string", "number", "boolean"].includes(typeof value);
}

function pick(event: Obj, ...keys: string[]): Obj {
  const out: Obj = {};
  for (const key of keys) if (key in event) out[key] = event[key];
  return out;
}

function mergeMetadata(target: Obj | null | undefined, event: Obj): void {
  if (!target || !("metadata" in event)) return;
  const existing = target.metadata;
  const incoming = event.metadata as Obj;
  target.metadata =
    isObject(existing) && Object.keys(existing).length > 0
      ? { ...existing, ...incoming }
      : { ...incoming };
}

/** A copy of a message that can be changed without touching the event it came in. */
function ownMessage(message: unknown): Message {
  if (!isObject(message)) throw new TypeError("a message is not an object");
  const owned = { ...message } as Message;
  const calls = owned.toolCalls;
  if (calls !== undefined && calls !== null) {
    if (!Array.isArray(calls)) throw new TypeError("toolCalls is not a list");
    owned.toolCalls = calls.map((c) => {
      const call: Obj = isObject(c) ? c : {};
      return { ...call, function: { ...(isObject(call.function) ? call.function : {}) } } as ToolCall;
    });
  }
  return owned;
}

function clone<T>(value: T): T {
  return value === undefined ? value : structuredClone(value);
}

class Malformed extends Error {}

function need<T>(event: Obj, key: string, check: (v: unknown) => boolean, what: string): T {
  if (!(key in event)) throw new Malformed(`missing field ${key}`);
  const value = event[key];
  if (!check(value)) throw new Malformed(`${key} is not ${what}`);
  return value as T;
}
const str = (e: Obj, key: string): string =>
  need<string>(e, key, (v) => typeof v === "string", "a string");
const anyKey = (e: Obj, key: string): string =>
  need<string>(e, key, isKey, "a string");

// -- chunk events (agui_hub/agui/chunks.py, the official client's rules) -------------------------

interface ChunkKind {
  name: "text" | "tool" | "reasoning";
  chunk: string;
  idField: "messageId" | "toolCallId";
  start: string;
  content: string;
  end: string;
  declared: Set<string>;
}

const BASE_FIELDS = ["type", "timestamp", "rawEvent"];
const KINDS: Record<string, ChunkKind> = {
  TEXT_MESSAGE_CHUNK: {
    name: "text",
    chunk: "TEXT_MESSAGE_CHUNK",
    idField: "messageId",
    start: "TEXT_MESSAGE_START",
    content: "TEXT_MESSAGE_CONTENT",
    end: "TEXT_MESSAGE_END",
    declared: new Set([...BASE_FIELDS, "messageId", "role", "delta", "name", "subagentRunId", "metadata"]),
  },
  TOOL_CALL_CHUNK: {
    name: "tool",
    chunk: "TOOL_CALL_CHUNK",
    idField: "toolCallId",
    start: "TOOL_CALL_START",
    content: "TOOL_CALL_ARGS",
    end: "TOOL_CALL_END",
    declared: new Set([
      ...BASE_FIELDS,
      "toolCallId",
      "toolCallName",
      "parentMessageId",
      "delta",
      "subagentRunId",
      "metadata",
    ]),
  },
  REASONING_MESSAGE_CHUNK: {
    name: "reasoning",
    chunk: "REASONING_MESSAGE_CHUNK",
    idField: "messageId",
    start: "REASONING_MESSAGE_START",
    content: "REASONING_MESSAGE_CONTENT",
    end: "REASONING_MESSAGE_END",
    declared: new Set([...BASE_FIELDS, "messageId", "delta", "subagentRunId", "metadata"]),
  },
};

/** Events after which the official transformChunks closes the chunk stream of their lane
 * (HubAgent tracks the same lanes). */
export const CLOSE_OWN_LANE: ReadonlySet<string> = new Set([
  "TEXT_MESSAGE_START",
  "TEXT_MESSAGE_CONTENT",
  "TEXT_MESSAGE_END",
  "TOOL_CALL_START",
  "TOOL_CALL_ARGS",
  "TOOL_CALL_END",
  "TOOL_CALL_RESULT",
  "STATE_SNAPSHOT",
  "STATE_DELTA",
  "CUSTOM",
  "STEP_STARTED",
  "STEP_FINISHED",
  "REASONING_START",
  "REASONING_MESSAGE_START",
  "REASONING_MESSAGE_CONTENT",
  "REASONING_MESSAGE_END",
  "REASONING_END",
]);
const CLOSE_ALL_LANES = new Set(["RUN_STARTED", "RUN_FINISHED", "RUN_ERROR", "MESSAGES_SNAPSHOT"]);
const CLOSE_SUBAGENT_LANE = new Set(["SUBAGENT_FINISHED", "SUBAGENT_ERROR"]);

interface ChunkStream {
  kind: ChunkKind;
  id: string;
  lane: string | null;
  established: [string, unknown][];
}

class ChunkExpander {
  private lanes = new Map<string | null, ChunkStream>();

  expand(event: Obj): Obj[] {
    const type = event.type as string;
    const kind = own(KINDS, type);
    if (kind) return this.expandChunk(kind, event);
    if (this.lanes.size === 0) return [event];
    let ends: Obj[];
    if (CLOSE_ALL_LANES.has(type)) {
      ends = this.flush();
    } else if (CLOSE_OWN_LANE.has(type) || CLOSE_SUBAGENT_LANE.has(type)) {
      const lane = (event.subagentRunId as string | undefined) ?? null;
      if (lane === null && CLOSE_SUBAGENT_LANE.has(type)) return [event];
      ends = this.close(lane);
    } else {
      return [event];
    }
    ends.push(event);
    return ends;
  }

  flush(): Obj[] {
    const ends = [...this.lanes.values()].map(endEvent);
    this.lanes.clear();
    return ends;
  }

  private close(lane: string | null): Obj[] {
    const stream = this.lanes.get(lane);
    if (!stream) return [];
    this.lanes.delete(lane);
    return [endEvent(stream)];
  }

  private resolveLane(kind: ChunkKind, id: string | null, tag: string | null): string | null {
    if (id !== null) {
      for (const [lane, stream] of this.lanes) {
        if (stream.kind === kind && stream.id === id) {
          if (tag !== null && tag !== lane) throw new Malformed(`chunk for ${id} in another lane`);
          return lane;
        }
      }
      return tag;
    }
    if (tag !== null) return tag;
    const parent = this.lanes.get(null);
    if (parent && parent.kind === kind) return null;
    const candidates = [...this.lanes].filter(([, s]) => s.kind === kind).map(([lane]) => lane);
    if (candidates.length > 1) throw new Malformed("a chunk without id could continue several streams");
    return candidates.length ? candidates[0] : null;
  }

  private expandChunk(kind: ChunkKind, chunk: Obj): Obj[] {
    const id = (chunk[kind.idField] as string | undefined) ?? null;
    const lane = this.resolveLane(kind, id, (chunk.subagentRunId as string | undefined) ?? null);
    const current = this.lanes.get(lane);
    const out: Obj[] = [];
    let stream: ChunkStream;
    if (current && current.kind === kind && (id === null || id === current.id)) {
      for (const [field, value] of current.established) {
        const repeated = chunk[field] ?? null;
        if (repeated !== null && repeated !== value) {
          throw new Malformed(`a continuation chunk changes ${field}`);
        }
      }
      stream = current;
    } else {
      if (id === null) throw new Malformed(`the first ${kind.chunk} has no ${kind.idField}`);
      if (kind.name === "tool" && (chunk.toolCallName ?? null) === null) {
        throw new Malformed("the first TOOL_CALL_CHUNK has no toolCallName");
      }
      if (current) {
        this.lanes.delete(lane);
        out.push(endEvent(current));
      }
      const start: Obj = { type: kind.start, [kind.idField]: id };
      let established: [string, unknown][] = [];
      if (kind.name === "text") {
        const role = chunk.role ?? "assistant";
        const name = chunk.name ?? null;
        start.role = role;
        if (name !== null) start.name = name;
        established = [
          ["role", role],
          ["name", name],
        ];
      } else if (kind.name === "tool") {
        const parent = chunk.parentMessageId ?? null;
        start.toolCallName = chunk.toolCallName;
        if (parent !== null) start.parentMessageId = parent;
        established = [
          ["toolCallName", chunk.toolCallName],
          ["parentMessageId", parent],
        ];
      } else {
        start.role = "reasoning";
      }
      carry(start, chunk, lane);
      stream = { kind, id, lane, established };
      this.lanes.set(lane, stream);
      out.push(start);
    }
    const extra: Obj = {};
    for (const [key, value] of Object.entries(chunk)) if (!kind.declared.has(key)) extra[key] = value;
    const delta = chunk.delta ?? null;
    const rawEvent = chunk.rawEvent ?? null;
    const hasExtra = Object.keys(extra).length > 0;
    if (delta !== null || rawEvent !== null || (!out.length && ((chunk.metadata ?? null) !== null || hasExtra))) {
      const content: Obj = { ...extra, type: kind.content, [kind.idField]: stream.id, delta: delta ?? "" };
      carry(content, chunk, stream.lane);
      if (rawEvent !== null) content.rawEvent = rawEvent;
      out.push(content);
    } else if (hasExtra && out.length) {
      out[out.length - 1] = { ...extra, ...out[out.length - 1] };
    }
    return out;
  }
}

function carry(event: Obj, chunk: Obj, lane: string | null): void {
  if (lane !== null) event.subagentRunId = lane;
  if ((chunk.timestamp ?? null) !== null) event.timestamp = chunk.timestamp;
  if ((chunk.metadata ?? null) !== null) event.metadata = chunk.metadata;
}

function endEvent(stream: ChunkStream): Obj {
  const end: Obj = { type: stream.kind.end, [stream.kind.idField]: stream.id };
  if (stream.lane !== null) end.subagentRunId = stream.lane;
  return end;
}

// -- the model ----------------------------------------------------------------------------------

function freshChanges(reset: boolean): Changes {
  return {
    reset,
    order: reset,
    messages: new Set(),
    runs: reset,
    changedRuns: new Set(),
    state: reset,
    open: reset,
  };
}

export class Transcript {
  messages: Message[] = [];
  state: unknown = {};
  /** Why the shown state may be wrong (a STATE_DELTA that did not apply), else null. */
  stateProblem: string | null = null;
  runs: Run[] = [];
  /** Streams still open, by id: text and reasoning messages, tool calls. */
  openMessages = new Set<string>();
  openToolCalls = new Set<string>();
  openReasoning = new Set<string>();
  openReasoningSpans = new Set<string>();
  activeSubagents = new Map<string, Obj>();
  /** Events that could not be folded (the latest few). */
  problems: Problem[] = [];
  problemCount = 0;
  /** Events folded since the last reset. */
  eventCount = 0;
  /** RAW and CUSTOM events since the last reset (they change nothing the transcript
   * shows: an agent framework's own events, an application's), their JSON size, and
   * the latest MAX_RAW_KEPT of them, for a view that shows them. */
  rawCount = 0;
  rawBytes = 0;
  rawEvents: Obj[] = [];

  private chunks = new ChunkExpander();
  private byId = new Map<unknown, Message>();
  private calls = new Map<unknown, [Message, ToolCall]>();
  private assistantCalls = new Map<unknown, [Message, ToolCall]>();
  /** Tool results by the tool call they answer (the first one), for the view. */
  private results = new Map<unknown, Message>();
  /** The run a message was first seen in (for the view's grouping). */
  private runOf = new WeakMap<Message, Run | null>();
  private changes: Changes = freshChanges(true);

  /** Start over (before a snapshot's events: they replace everything). */
  reset(): void {
    this.messages = [];
    this.state = {};
    this.stateProblem = null;
    this.runs = [];
    this.openMessages.clear();
    this.openToolCalls.clear();
    this.openReasoning.clear();
    this.openReasoningSpans.clear();
    this.activeSubagents.clear();
    this.problems = [];
    this.problemCount = 0;
    this.eventCount = 0;
    this.rawCount = 0;
    this.rawBytes = 0;
    this.rawEvents = [];
    this.chunks = new ChunkExpander();
    this.reindex();
    this.changes = freshChanges(true);
  }

  /** What changed since the last call. */
  takeChanges(): Changes {
    const changes = this.changes;
    this.changes = freshChanges(false);
    return changes;
  }

  applyAll(events: Iterable<unknown>): void {
    for (const event of events) this.apply(event);
  }

  /** Fold one event; never throws. Returns false when the event was not folded. */
  apply(event: unknown): boolean {
    this.eventCount += 1;
    const type = isObject(event) && typeof event.type === "string" ? event.type : "event";
    try {
      if (!isObject(event)) throw new Malformed("an event is not an object");
      if ("metadata" in event && !isObject(event.metadata)) throw new Malformed("metadata is not an object");
      if (own(KINDS, type) && "delta" in event && typeof event.delta !== "string" && event.delta !== null) {
        throw new Malformed("delta is not a string");
      }
      for (const expanded of this.chunks.expand(event)) {
        const handler = own(HANDLERS, expanded.type);
        if (handler) handler(this, expanded);
      }
      return true;
    } catch (error) {
      this.problem(type, error instanceof Error ? error.message : String(error));
      return false;
    }
  }

  private problem(type: string, reason: string): void {
    this.problemCount += 1;
    this.problems.push({ type, reason });
    if (this.problems.length > MAX_PROBLEMS) this.problems.shift();
  }

  // -- queries for the view ------------------------------------------------------------------

  message(id: string): Message | undefined {
    return this.byId.get(id);
  }

  /** The tool message answering a tool call. */
  resultOf(toolCallId: string): Message | undefined {
    return this.results.get(toolCallId);
  }

  /** Whether a tool message is shown with its call (so not on its own). */
  isAttachedResult(message: Message): boolean {
    if (message.role !== "tool" || message.toolCallId === undefined) return false;
    return this.results.get(message.toolCallId) === message && this.calls.has(message.toolCallId);
  }

  /** The owner message of a tool call. */
  callOwner(toolCallId: string): Message | undefined {
    return this.calls.get(toolCallId)?.[0];
  }

  runFor(message: Message): Run | null {
    return this.runOf.get(message) ?? null;
  }

  get currentRun(): Run | null {
    return this.runs.length ? this.runs[this.runs.length - 1] : null;
  }

  /** A plain copy: what window.aguiViewer.model() hands out. */
  snapshot(): { messages: Message[]; state: unknown; runs: Run[]; stateProblem: string | null } {
    return {
      messages: clone(this.messages),
      state: clone(this.state),
      runs: clone(this.runs),
      stateProblem: this.stateProblem,
    };
  }

  // -- internals ------------------------------------------------------------------------------

  touch(message: Message | null | undefined): void {
    if (message) this.changes.messages.add(message);
  }

  add(message: Message): void {
    this.messages.push(message);
    this.index(message);
    this.runOf.set(message, this.currentRun);
    this.changes.order = true;
    this.touch(message);
  }

  insert(at: number, message: Message): void {
    this.messages.splice(at, 0, message);
    this.runOf.set(message, this.currentRun);
    this.changes.order = true;
    this.touch(message);
  }

  /** A message that came in a snapshot: it belongs to the run current now, unless known. */
  adopt(message: Message): void {
    if (!this.runOf.has(message)) this.runOf.set(message, this.currentRun);
    this.touch(message);
  }

  private index(message: Message): void {
    const id = message.id;
    if (isKey(id) && !this.byId.has(id)) this.byId.set(id, message);
    if (message.role === "tool" && isKey(message.toolCallId) && !this.results.has(message.toolCallId)) {
      this.results.set(message.toolCallId, message);
    }
    const calls = message.toolCalls;
    if (!Array.isArray(calls)) return;
    for (const call of calls) {
      if (!isObject(call) || !isKey(call.id)) continue;
      if (!this.calls.has(call.id)) this.calls.set(call.id, [message, call]);
      if (message.role === "assistant" && !this.assistantCalls.has(call.id)) {
        this.assistantCalls.set(call.id, [message, call]);
      }
    }
  }

  reindex(): void {
    this.byId = new Map();
    this.calls = new Map();
    this.assistantCalls = new Map();
    this.results = new Map();
    for (const message of this.messages) this.index(message);
    this.changes.order = true;
  }

  indexCall(owner: Message, call: ToolCall): void {
    if (!this.calls.has(call.id)) this.calls.set(call.id, [owner, call]);
    if (!this.assistantCalls.has(call.id)) this.assistantCalls.set(call.id, [owner, call]);
  }

  indexResult(message: Message): void {
    const first = this.byId.get(message.id);
    if (first === undefined) this.byId.set(message.id, message);
    else if (first !== message && this.messages.indexOf(first) > this.messages.indexOf(message)) {
      this.byId.set(message.id, message); // inserted before the one indexed so far
    }
    const key = message.toolCallId;
    if (isKey(key)) {
      const known = this.results.get(key);
      if (known === undefined || this.messages.indexOf(known) > this.messages.indexOf(message)) {
        this.results.set(key, message);
      }
    }
  }

  findCall(id: unknown): [Message, ToolCall] | undefined {
    return this.calls.get(id);
  }

  findAssistantCall(id: unknown): [Message, ToolCall] | undefined {
    return this.assistantCalls.get(id);
  }

  closeEverything(): void {
    // The messages that were streaming are shown as done now.
    for (const id of [...this.openMessages, ...this.openReasoning]) this.touch(this.byId.get(id));
    for (const id of this.openToolCalls) this.touch(this.calls.get(id)?.[0]);
    this.openMessages.clear();
    this.openToolCalls.clear();
    this.openReasoning.clear();
    this.openReasoningSpans.clear();
    this.activeSubagents.clear();
    const run = this.currentRun;
    if (run) {
      for (const step of run.steps) if (step.status === "running") step.status = "interrupted";
      this.changes.changedRuns.add(run);
    }
    this.changes.open = true;
  }

  forgetRemoved(): void {
    const ids = new Set(this.messages.filter((m) => m.role !== "activity").map((m) => m.id));
    for (const tracked of [this.openMessages, this.openReasoning]) {
      for (const id of [...tracked]) if (!ids.has(id)) tracked.delete(id);
    }
    for (const id of [...this.openToolCalls]) if (!this.calls.has(id)) this.openToolCalls.delete(id);
    this.changes.open = true;
  }

  /** A RAW or CUSTOM event: counted, and kept among the latest. */
  noteRaw(e: Obj): void {
    this.rawCount += 1;
    try {
      this.rawBytes += JSON.stringify(e).length;
    } catch {
      // a value JSON cannot hold: counted, not measured
    }
    this.rawEvents.push(e);
    if (this.rawEvents.length > MAX_RAW_KEPT) this.rawEvents.shift();
  }

  changed(part: "runs" | "state" | "open"): void {
    this.changes[part] = true;
  }

  /** *run* changed (its status, steps, or the sub-agents shown with it). */
  runChanged(run: Run | null | undefined): void {
    if (run) this.changes.changedRuns.add(run);
  }

  stepsRun(): Run {
    let run = this.currentRun;
    if (!run) {
      // Steps outside any run still show, under a run without id.
      run = { runId: null, parentRunId: null, status: "running", started: null, ended: null, steps: [] };
      this.runs.push(run);
      this.changes.runs = true;
    }
    return run;
  }
}

// -- handlers, one per event type (as in agui_hub/agui/reducer.py) ------------------------------------

type Handler = (t: Transcript, e: Obj) => void;

function textStart(t: Transcript, e: Obj, roleDefault: string): Message | undefined {
  const id = anyKey(e, "messageId");
  let message = t.message(id);
  if (message && message.role === "activity") return undefined;
  if (!message) {
    message = { id, role: ("role" in e ? e.role : roleDefault) as string, content: "" };
    Object.assign(message, pick(e, "name", "subagentRunId"));
    t.add(message);
  }
  mergeMetadata(message, e);
  t.touch(message);
  return message;
}

function textContent(t: Transcript, e: Obj): void {
  const message = t.message(anyKey(e, "messageId"));
  if (!("delta" in e)) throw new Malformed("missing field delta");
  if (!message || message.role === "activity") return;
  if (typeof e.delta !== "string") throw new Malformed("delta is not a string");
  const current = message.content;
  message.content = (typeof current === "string" ? current : "") + e.delta;
  mergeMetadata(message, e);
  t.touch(message);
}

function textEnd(t: Transcript, e: Obj): void {
  const message = t.message(anyKey(e, "messageId"));
  if (message && message.role !== "activity") {
    mergeMetadata(message, e);
    t.touch(message);
  }
}

function toolParent(t: Transcript, parentId: unknown, toolCallId: string): [Message, boolean] {
  let newId: string;
  if (parentId !== undefined && parentId !== null) {
    const existing = t.message(parentId as string);
    if (existing && existing.role === "assistant") return [existing, false];
    newId = existing ? toolCallId : (parentId as string);
  } else {
    newId = toolCallId;
  }
  const parent: Message = { id: newId, role: "assistant", toolCalls: [] };
  t.add(parent);
  return [parent, true];
}

function endRun(t: Transcript, e: Obj, status: RunStatus): void {
  t.closeEverything();
  const run = t.currentRun;
  if (run && run.status === "running") {
    run.status = status;
    run.ended = { ...e };
    t.runChanged(run);
  } else {
    t.runs.push({
      runId: (e.runId as string | undefined) ?? null,
      parentRunId: null,
      status,
      started: null,
      ended: { ...e },
      steps: [],
    });
    t.changed("runs");
  }
}

function authoritativeTypes(e: Obj): typeof UNDECLARED | string[] | null {
  const metadata = e.metadata;
  if (!isObject(metadata) || !(CLIENT_METADATA_KEY in metadata)) return UNDECLARED;
  const declared = metadata[CLIENT_METADATA_KEY];
  if (!isObject(declared)) return [];
  if (!("authoritativeActivityTypes" in declared)) return UNDECLARED;
  const types = declared.authoritativeActivityTypes;
  if (types === null) return null;
  if (Array.isArray(types) && types.every((x) => typeof x === "string")) return types as string[];
  return [];
}

function patched(document: unknown, patch: unknown): unknown {
  if (!Array.isArray(patch)) throw new Malformed("a JSON Patch is a list of operations");
  // On a copy: a patch that fails half-way must leave what is shown intact.
  return applyPatch(clone(document), patch as Operation[], true, true).newDocument;
}

function patchReason(error: unknown): string {
  const message = error instanceof Error ? error.message.split("\n")[0] : String(error);
  return `JSON Patch does not apply: ${message}`;
}

const HANDLERS: Record<string, Handler> = {
  TEXT_MESSAGE_START(t, e) {
    const message = textStart(t, e, "assistant");
    if (message) {
      t.openMessages.add(message.id);
      t.changed("open");
    }
  },
  TEXT_MESSAGE_CONTENT: textContent,
  TEXT_MESSAGE_END(t, e) {
    textEnd(t, e);
    t.openMessages.delete(e.messageId as string);
    t.changed("open");
  },
  TOOL_CALL_START(t, e) {
    const id = anyKey(e, "toolCallId");
    const name = str(e, "toolCallName");
    const found = t.findCall(id);
    let owner: Message;
    if (found) {
      let call: ToolCall;
      [owner, call] = found;
      call.function.name = name;
      mergeMetadata(call, e);
    } else {
      let isNew: boolean;
      [owner, isNew] = toolParent(t, e.parentMessageId, id);
      if (isNew && (e.subagentRunId ?? null) !== null && !("subagentRunId" in owner)) {
        owner.subagentRunId = e.subagentRunId;
      }
      if (owner.toolCalls === undefined || owner.toolCalls === null) owner.toolCalls = [];
      const call: ToolCall = { id, type: "function", function: { name, arguments: "" } };
      owner.toolCalls.push(call);
      t.indexCall(owner, call);
      mergeMetadata(call, e);
    }
    t.openToolCalls.add(id);
    t.changed("open");
    t.touch(owner);
  },
  TOOL_CALL_ARGS(t, e) {
    const found = t.findCall(anyKey(e, "toolCallId"));
    if (!("delta" in e)) throw new Malformed("missing field delta");
    if (!found) return;
    if (typeof e.delta !== "string") throw new Malformed("delta is not a string");
    const [owner, call] = found;
    call.function.arguments = (call.function.arguments ?? "") + e.delta;
    mergeMetadata(call, e);
    t.touch(owner);
  },
  TOOL_CALL_END(t, e) {
    const id = anyKey(e, "toolCallId");
    const found = t.findCall(id);
    if (found) {
      mergeMetadata(found[1], e);
      t.touch(found[0]);
    }
    t.openToolCalls.delete(id);
    t.changed("open");
  },
  TOOL_CALL_RESULT(t, e) {
    const toolCallId = anyKey(e, "toolCallId");
    const id = anyKey(e, "messageId");
    if (!("content" in e)) throw new Malformed("missing field content");
    const message: Message = {
      id,
      toolCallId,
      role: (pyTruthy(e.role) ? e.role : "tool") as string,
      content: e.content,
      ...pick(e, "subagentRunId"),
    };
    mergeMetadata(message, e);
    const found = t.findAssistantCall(toolCallId);
    if (!found) {
      t.add(message);
      return;
    }
    const messages = t.messages;
    let at = messages.indexOf(found[0]) + 1;
    while (at < messages.length && messages[at].role === "tool") at += 1;
    t.insert(at, message);
    t.indexResult(message);
    t.touch(found[0]);
  },
  STATE_SNAPSHOT(t, e) {
    if (!("snapshot" in e)) throw new Malformed("missing field snapshot");
    t.state = e.snapshot;
    t.stateProblem = null;
    t.changed("state");
  },
  STATE_DELTA(t, e) {
    if (!("delta" in e)) throw new Malformed("missing field delta");
    try {
      t.state = patched(t.state, e.delta);
    } catch (error) {
      t.stateProblem = patchReason(error);
      t.changed("state");
      throw new Malformed(t.stateProblem);
    }
    t.changed("state");
  },
  MESSAGES_SNAPSHOT(t, e) {
    const raw = need<unknown[]>(e, "messages", Array.isArray, "a list");
    const incoming = raw.map(ownMessage);
    for (const m of incoming) if (!isKey(m.id)) throw new Malformed("a message id is not a string");
    const byId = new Map<unknown, Message>();
    for (const m of incoming) byId.set(m.id, m);
    const owned = authoritativeTypes(e);
    const hasActivity = incoming.some((m) => m.role === "activity");
    const hasReasoning = incoming.some((m) => m.role === "reasoning");
    const preserved = (m: Message): boolean => {
      if (m.role === "activity") {
        if (Array.isArray(owned)) return !owned.includes(m.activityType as string);
        return owned === UNDECLARED && !hasActivity;
      }
      return m.role === "reasoning" && !hasReasoning;
    };
    const kept = t.messages
      .filter((m) => byId.has(m.id) || preserved(m))
      .map((m) => byId.get(m.id) ?? m);
    const keptIds = new Set(kept.map((m) => m.id));
    for (const m of incoming) if (!keptIds.has(m.id)) kept.push(m);
    t.messages = kept;
    t.reindex();
    for (const m of kept) t.adopt(m);
    t.forgetRemoved();
  },
  ACTIVITY_SNAPSHOT(t, e) {
    const id = anyKey(e, "messageId");
    const activityType = need<unknown>(e, "activityType", () => true, "");
    const content = need<unknown>(e, "content", () => true, "");
    const existing = t.message(id);
    const replace = "replace" in e ? pyTruthy(e.replace) : true;
    const fresh: Message = { id, role: "activity", activityType, content, ...pick(e, "subagentRunId") };
    let target: Message | null;
    if (!existing) {
      t.add(fresh);
      target = fresh;
    } else if (existing.role === "activity") {
      target = existing;
      if (replace) {
        target.activityType = activityType;
        target.content = content;
        delete target.subagentRunId;
        Object.assign(target, pick(e, "subagentRunId"));
      }
    } else if (replace) {
      t.messages[t.messages.indexOf(existing)] = target = fresh;
      t.adopt(fresh);
      t.reindex();
      t.forgetRemoved();
    } else {
      target = null;
    }
    mergeMetadata(target, e);
    t.touch(target);
  },
  ACTIVITY_DELTA(t, e) {
    const id = anyKey(e, "messageId");
    const patch = need<unknown>(e, "patch", () => true, "");
    const activityType = need<unknown>(e, "activityType", () => true, "");
    const current = t.message(id);
    if (!current || current.role !== "activity") return;
    const base = pyTruthy(current.content) ? current.content : {};
    try {
      current.content = patched(base, patch);
    } catch (error) {
      throw new Malformed(patchReason(error));
    }
    current.activityType = activityType;
    mergeMetadata(current, e);
    t.touch(current);
  },
  RUN_STARTED(t, e) {
    const input = e.input;
    let inputMessages: Message[] = [];
    if (isObject(input) && input.messages !== undefined && input.messages !== null) {
      if (!Array.isArray(input.messages)) throw new Malformed("input.messages is not a list");
      inputMessages = input.messages.map(ownMessage);
      if (!inputMessages.every((m) => isKey(m.id))) throw new Malformed("a message id is not a string");
    }
    t.closeEverything();
    for (const earlier of t.runs) {
      if (earlier.started && "input" in earlier.started) {
        const { input: _dropped, ...rest } = earlier.started;
        earlier.started = rest;
      }
    }
    const started: Obj = { ...e };
    if (isObject(input) && pyTruthy(input.messages)) started.input = { ...input, messages: [] };
    t.runs.push({
      runId: (e.runId as string | undefined) ?? null,
      parentRunId: (e.parentRunId as string | undefined) ?? null,
      status: "running",
      started,
      ended: null,
      steps: [],
    });
    t.changed("runs");
    for (const message of inputMessages) if (!t.message(message.id)) t.add(message);
  },
  RUN_FINISHED(t, e) {
    endRun(t, e, "finished");
  },
  RAW(t, e) {
    t.noteRaw(e);
  },
  CUSTOM(t, e) {
    t.noteRaw(e);
  },
  RUN_ERROR(t, e) {
    endRun(t, e, "error");
  },
  STEP_STARTED(t, e) {
    const name = str(e, "stepName");
    const step: Step = { name, status: "running" };
    if (typeof e.subagentRunId === "string") step.subagentRunId = e.subagentRunId;
    const run = t.stepsRun();
    run.steps.push(step);
    t.runChanged(run);
  },
  STEP_FINISHED(t, e) {
    const name = str(e, "stepName");
    const lane = (e.subagentRunId as string | undefined) ?? undefined;
    const run = t.currentRun;
    const step = run?.steps
      .slice()
      .reverse()
      .find((s) => s.name === name && s.subagentRunId === lane && s.status === "running");
    if (step) step.status = "finished";
    t.runChanged(run);
  },
  REASONING_START(t, e) {
    t.openReasoningSpans.add(anyKey(e, "messageId"));
    t.changed("open");
  },
  REASONING_END(t, e) {
    t.openReasoningSpans.delete(anyKey(e, "messageId"));
    t.changed("open");
  },
  REASONING_MESSAGE_START(t, e) {
    const message = textStart(t, { ...e, role: "reasoning" }, "reasoning");
    if (message) {
      t.openReasoning.add(message.id);
      t.changed("open");
    }
  },
  REASONING_MESSAGE_CONTENT: textContent,
  REASONING_MESSAGE_END(t, e) {
    textEnd(t, e);
    t.openReasoning.delete(e.messageId as string);
    t.changed("open");
  },
  REASONING_ENCRYPTED_VALUE(t, e) {
    const entity = anyKey(e, "entityId");
    const value = need<unknown>(e, "encryptedValue", () => true, "");
    if (e.subtype === "tool-call") {
      const found = t.findAssistantCall(entity);
      if (found) found[1].encryptedValue = value;
      return;
    }
    const target = t.message(entity);
    if (target && target.role !== "activity") target.encryptedValue = value;
  },
  SUBAGENT_STARTED(t, e) {
    t.activeSubagents.set(anyKey(e, "subagentRunId"), { ...e });
    t.runChanged(t.currentRun); // the active sub-agents show with the latest run
  },
  SUBAGENT_FINISHED(t, e) {
    t.activeSubagents.delete(anyKey(e, "subagentRunId"));
    t.runChanged(t.currentRun);
  },
  SUBAGENT_ERROR(t, e) {
    t.activeSubagents.delete(anyKey(e, "subagentRunId"));
    t.runChanged(t.currentRun);
  },
};
