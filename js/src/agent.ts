/**
 * HubAgent: the official `@ag-ui/client` on top of an agui-hub thread.
 *
 * An `AbstractAgent` whose `connect()` streams a hub thread (its history from
 * where this agent stopped, then the live tail) and whose `run()` follows one
 * run that the application starts itself (`startRun`). Everything the official
 * pipeline does (chunk expansion, the verifier, the default reducer,
 * subscribers, middleware) runs unchanged on what the hub delivers.
 *
 * The hub client reconnects and resumes by itself, so a dropped connection is
 * invisible here: the pipeline sees one uninterrupted stream. Only when the
 * hub cannot resume (events trimmed away, the thread re-created) does a
 * snapshot replace part of the stream; {@link translateSnapshot} turns it into
 * events the official verifier accepts at that point of the stream.
 */

import { AbstractAgent } from "@ag-ui/client";
import type { AgentConfig, BaseEvent, RunAgentInput } from "@ag-ui/client";
import { Observable, throwError } from "rxjs";
import type { Subscriber } from "rxjs";

import { HubClient, HubError, compareOffsets } from "./client.js";
import { CLOSE_OWN_LANE } from "./transcript.js";
import type {
  AguiEvent,
  ConnectionStatus,
  Encoding,
  HubClientOptions,
  Item,
  Position,
  Subscription,
} from "./client.js";

export type Follow = "run" | "forever";

/** Where a {@link HubAgent} resumes: a position, or where its first attach starts. */
export type AgentPosition = Position | "start" | "snapshot";

export interface HubAgentConfig extends AgentConfig {
  /** The hub thread this agent follows (required). */
  threadId: string;
  /** A client to share (it stays open); without it the agent opens one per stream. */
  client?: HubClient;
  /** The gateway's ws:// or wss:// URL, for the agent's own client. */
  url?: string;
  encoding?: Encoding;
  token?: HubClientOptions["token"];
  /** A WebSocket constructor (Node 20: `ws`'s). */
  WebSocket?: unknown;
  /** More options for the agent's own client (backoff, pings, giveUpAfter). */
  clientOptions?: Omit<Partial<HubClientOptions>, "url" | "encoding" | "token" | "WebSocket">;
  /** Status changes of the agent's own clients (not of a shared one). */
  onStatus?: (status: ConnectionStatus) => void;
  /** Where the first connect() starts: the whole thread ("start", default) or a snapshot. */
  from?: "start" | "snapshot";
  /** Follow one branch of the thread's tree of runs: the one that ends with this run,
   * then the runs that continue it (the hub's `branch` subscription). */
  branch?: string;
  /**
   * "run" (default): connect() completes once the thread is caught up and no
   * run is active (attached to a running run: at its end). "forever": it
   * follows the thread until detachActiveRun() or unsubscription.
   */
  follow?: Follow;
  /**
   * Starts the agent behind the hub for run(): called once HubAgent follows the
   * thread, so that none of the run's events can be missed. The agent publishes
   * the run into the thread with `runId` = `input.runId` (and, on a branch, its
   * RUN_STARTED's `parentRunId` = `input.parentRunId`: the branch's latest run).
   */
  startRun?: (input: RunAgentInput) => Promise<void> | void;
}

/** What happened to the streams of a {@link HubAgent} (for dashboards and tests). */
export interface HubAgentStats {
  /** Resubscriptions after a dropped connection that lost nothing. */
  resumes: number;
  /** Snapshots that replaced part of what the agent had (events trimmed, thread re-created). */
  resyncs: number;
  /** Snapshots received, the ones a "snapshot" attach asks for included. */
  snapshots: number;
  /** Snapshots that said they were incomplete (history trimmed before the hub folded it). */
  incomplete: number;
}

type Ev = AguiEvent;

/** Events HubAgent makes up (never published into the hub). */
const MADE_UP = new WeakSet<Ev>();

function madeUp(event: Ev): Ev {
  MADE_UP.add(event);
  return event;
}

const RUN_ENDS = new Set(["RUN_FINISHED", "RUN_ERROR"]);
/** Openers and closers of the bracketed entities the official verifier tracks. */
const OPENERS: Record<string, string> = {
  TEXT_MESSAGE_START: "text",
  TOOL_CALL_START: "tool",
  REASONING_MESSAGE_START: "reasoning",
  REASONING_START: "span",
  STEP_STARTED: "step",
  SUBAGENT_STARTED: "subagent",
};
const CLOSERS: Record<string, string> = {
  TEXT_MESSAGE_END: "text",
  TOOL_CALL_END: "tool",
  REASONING_MESSAGE_END: "reasoning",
  REASONING_END: "span",
  STEP_FINISHED: "step",
  SUBAGENT_FINISHED: "subagent",
  SUBAGENT_ERROR: "subagent",
};
/** Events that continue an open entity without closing it. */
const CONTINUERS: Record<string, string> = {
  TEXT_MESSAGE_CONTENT: "text",
  TOOL_CALL_ARGS: "tool",
  REASONING_MESSAGE_CONTENT: "reasoning",
};
/** Innermost first: the order in which open entities are closed. */
const CLOSE_ORDER = ["tool", "text", "reasoning", "span", "step", "subagent"];
/** Outermost first: the order in which they are reopened (the hub's snapshots use it too). */
const REOPEN_ORDER = ["subagent", "step", "span", "text", "tool", "reasoning"];
const CHUNK_KINDS: Record<string, ChunkKind> = {
  TEXT_MESSAGE_CHUNK: "text",
  TOOL_CALL_CHUNK: "tool",
  REASONING_MESSAGE_CHUNK: "reasoning",
};

type ChunkKind = "text" | "tool" | "reasoning";

interface Lane {
  kind: ChunkKind;
  id: string;
  /** A chunk without content that opens the same stream again. */
  opener: Ev;
}

function str(value: unknown): string | undefined {
  return typeof value === "string" ? value : undefined;
}

/** The key of the entity an opener, closer or continuation names (`text:m1`, `step:[null,"x"]`). */
function entityKey(event: Ev): string | undefined {
  const kind = OPENERS[event.type] ?? CLOSERS[event.type] ?? CONTINUERS[event.type];
  if (kind === undefined) return undefined;
  switch (kind) {
    case "tool":
      return `tool:${String(event.toolCallId)}`;
    case "step":
      return `step:${JSON.stringify([str(event.subagentRunId) ?? null, String(event.stepName)])}`;
    case "subagent":
      return `subagent:${String(event.subagentRunId)}`;
    default:
      return `${kind}:${String(event.messageId)}`;
  }
}

function only(fields: Record<string, unknown>): Ev {
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(fields)) if (value !== undefined) out[key] = value;
  return out as Ev;
}

/** The event that closes what *opener* opened. */
function closerOf(opener: Ev): Ev {
  const tag = str(opener.subagentRunId);
  switch (OPENERS[opener.type]) {
    case "text":
      return only({ type: "TEXT_MESSAGE_END", messageId: opener.messageId, subagentRunId: tag });
    case "tool":
      return only({ type: "TOOL_CALL_END", toolCallId: opener.toolCallId, subagentRunId: tag });
    case "reasoning":
      return only({
        type: "REASONING_MESSAGE_END",
        messageId: opener.messageId,
        subagentRunId: tag,
      });
    case "span":
      return only({ type: "REASONING_END", messageId: opener.messageId, subagentRunId: tag });
    case "step":
      return only({ type: "STEP_FINISHED", stepName: opener.stepName, subagentRunId: tag });
    default:
      return { type: "SUBAGENT_FINISHED", subagentRunId: opener.subagentRunId };
  }
}

/**
 * What the official pipeline has open after the events a stream emitted: the
 * run, the bracketed entities its verifier tracks, and the chunk streams its
 * transformChunks is assembling (one per lane: the subagent a chunk belongs
 * to, `undefined` for the parent agent), mirrored rule for rule.
 */
export class StreamState {
  run: Ev | null = null;
  /** The open run was made up by HubAgent (around a snapshot that had no started run). */
  synthetic = false;
  /** Entity key -> the event that opened it, for explicitly opened entities. */
  readonly open = new Map<string, Ev>();
  readonly lanes = new Map<string | undefined, Lane>();

  apply(event: Ev): void {
    const type = event.type;
    if (type === "RUN_STARTED" || RUN_ENDS.has(type)) {
      this.open.clear();
      this.lanes.clear();
      this.run = type === "RUN_STARTED" ? event : null;
      this.synthetic = type === "RUN_STARTED" && MADE_UP.has(event);
      return;
    }
    if (type === "MESSAGES_SNAPSHOT") {
      this.lanes.clear();
      return;
    }
    const chunk = CHUNK_KINDS[type];
    if (chunk !== undefined) {
      this.chunk(chunk, event);
      return;
    }
    if (CLOSE_OWN_LANE.has(type)) this.lanes.delete(str(event.subagentRunId));
    if ((type === "SUBAGENT_FINISHED" || type === "SUBAGENT_ERROR") && str(event.subagentRunId)) {
      this.lanes.delete(str(event.subagentRunId));
    }
    if (OPENERS[type] !== undefined) this.open.set(entityKey(event) as string, event);
    else if (CLOSERS[type] !== undefined) this.open.delete(entityKey(event) as string);
  }

  private chunk(kind: ChunkKind, event: Ev): void {
    const id = str(kind === "tool" ? event.toolCallId : event.messageId);
    const tag = str(event.subagentRunId);
    const lane = this.resolveLane(kind, id, tag);
    const current = this.lanes.get(lane);
    if (current?.kind === kind && (id === undefined || id === current.id)) return; // continues
    if (id === undefined) return; // the official transform refuses it (so does the hub)
    let opener: Ev;
    if (kind === "text") {
      opener = only({
        type: "TEXT_MESSAGE_CHUNK",
        messageId: id,
        role: event.role,
        name: event.name,
        subagentRunId: tag,
      });
    } else if (kind === "tool") {
      opener = only({
        type: "TOOL_CALL_CHUNK",
        toolCallId: id,
        toolCallName: event.toolCallName,
        parentMessageId: event.parentMessageId,
        subagentRunId: tag,
      });
    } else {
      opener = only({ type: "REASONING_MESSAGE_CHUNK", messageId: id, subagentRunId: tag });
    }
    this.lanes.set(lane, { kind, id, opener });
  }

  /** transformChunks' lane resolution (a chunk may leave out its id and its tag). */
  private resolveLane(kind: ChunkKind, id: string | undefined, tag: string | undefined) {
    if (id !== undefined) {
      for (const [owner, lane] of this.lanes) {
        if (lane.kind === kind && lane.id === id) return owner;
      }
      return tag;
    }
    if (tag !== undefined) return tag;
    if (this.lanes.get(undefined)?.kind === kind) return undefined;
    const candidates = [...this.lanes].filter(([, lane]) => lane.kind === kind);
    return candidates.length === 1 ? candidates[0][0] : undefined;
  }

  isOpen(key: string): boolean {
    return this.open.has(key);
  }

  /** Events closing the open entities *which* selects, innermost first. */
  closers(which: (key: string) => boolean = () => true): Ev[] {
    const out: Ev[] = [];
    for (const kind of CLOSE_ORDER) {
      const entries = [...this.open].filter(([key]) => key.startsWith(`${kind}:`) && which(key));
      for (const [, opener] of entries.reverse()) out.push(closerOf(opener));
    }
    return out;
  }

  /** Events that open, in a fresh pipeline, everything open here (the run first). */
  reopeners(): Ev[] {
    if (this.run === null) return [];
    const out: Ev[] = [this.run];
    for (const kind of REOPEN_ORDER) {
      for (const [key, opener] of this.open) if (key.startsWith(`${kind}:`)) out.push(opener);
    }
    // Last: an explicit event in a lane would end that lane's chunk stream again.
    for (const lane of this.lanes.values()) out.push(lane.opener);
    return out;
  }
}

/** The RUN_FINISHED / RUN_ERROR of run *runId* in a snapshot's run markers, if it ended. */
function endOf(runId: unknown, events: Ev[]): Ev | undefined {
  const at = events.findIndex((e) => e.type === "RUN_STARTED" && e.runId === runId);
  const next = at >= 0 ? events[at + 1] : undefined;
  return next !== undefined && RUN_ENDS.has(next.type) ? next : undefined;
}

function isEmptyObject(value: unknown): boolean {
  return (
    value === null ||
    value === undefined ||
    (typeof value === "object" && !Array.isArray(value) && Object.keys(value).length === 0)
  );
}

export const LOST_RUN_CODE = "AGUI_HUB_EVENTS_LOST";

/**
 * The events to emit for a hub snapshot that replaces part of a stream
 * (`recovered: false`: events trimmed away, or the thread re-created), given
 * what the stream has open (*state*), so that the official verifier accepts
 * them at this point and the default reducer ends up with the snapshot's state.
 *
 * A hub snapshot is the thread's runs as RUN_STARTED / RUN_FINISHED pairs; in
 * its latest started run (L) a MESSAGES_SNAPSHOT, a STATE_SNAPSHOT and one
 * opening event per message, tool call, reasoning span or message, step and
 * subagent still streaming, then L's end if it ended. The rule:
 *
 * 1. The stream is inside run R and L is R: R goes on. Entities open on both
 *    sides stay open (the snapshot's opener for them is dropped: no second
 *    SUBAGENT_STARTED, no spurious end); the ones open only in the stream are
 *    closed (TEXT_MESSAGE_END, TOOL_CALL_END, ..., SUBAGENT_FINISHED,
 *    innermost first); then MESSAGES_SNAPSHOT, STATE_SNAPSHOT, the other
 *    openers, and R's end if the snapshot has it. (MESSAGES_SNAPSHOT ends every
 *    stream the official transformChunks assembles from chunks, so the
 *    snapshot's chunk openers are always emitted.)
 * 2. The stream is inside run R and L is another run: everything open is
 *    closed, then R ends with its own RUN_FINISHED / RUN_ERROR when the
 *    snapshot has it (R ended while the stream was away), else with a
 *    RUN_ERROR of code {@link LOST_RUN_CODE} (its end is gone: the thread was
 *    re-created or R trimmed away). Then as 3.
 * 3. The stream is between runs: L's RUN_STARTED, MESSAGES_SNAPSHOT,
 *    STATE_SNAPSHOT, the openers and L's end if it ended (a run the stream
 *    already ended is thus stated again).
 *
 * Runs before L are not replayed: MESSAGES_SNAPSHOT holds their messages.
 *
 * A snapshot without a started run (an empty thread, or one whose RUN_STARTED
 * was trimmed before the hub folded it) gets a RUN_STARTED made up by HubAgent
 * (runId `agui-hub-snapshot-<offset>`), closed at once by the snapshot's own
 * run end or, for an empty thread, by a made-up RUN_FINISHED; else it stays
 * open: the live events continue a run whose start is gone. Inside such a run
 * the snapshot reopened nothing, so a live event that continues a message, a
 * reasoning message or a tool call the stream never opened gets a made-up
 * opener first when the last MESSAGES_SNAPSHOT has it (its role, its tool name
 * and parent message), and is dropped otherwise, as the hub's reducer ignores
 * it (so are the ends of steps, reasoning spans and subagents opened before
 * the snapshot). A run that starts, or a later snapshot, ends such a run with
 * a made-up RUN_FINISHED. An empty snapshot when the agent holds nothing
 * either is dropped.
 */
export function translateSnapshot(
  snapshot: Ev[],
  state: StreamState,
  context: { threadId: string; offset: string; agentEmpty: boolean },
): Ev[] {
  const out: Ev[] = [];
  const at = snapshot.findIndex((e) => e.type === "MESSAGES_SNAPSHOT");
  if (at < 0) return out; // no snapshot of anything: nothing to replace
  const latest = at > 0 && snapshot[at - 1].type === "RUN_STARTED" ? snapshot[at - 1] : undefined;
  const body = snapshot.slice(at);
  const run = state.run;
  if (run !== null && latest !== undefined && !state.synthetic && latest.runId === run.runId) {
    const reopened = new Set<string>();
    for (const event of body) {
      const key = OPENERS[event.type] !== undefined ? entityKey(event) : undefined;
      if (key !== undefined && state.isOpen(key)) reopened.add(key);
    }
    out.push(...state.closers((key) => !reopened.has(key)));
    for (const event of body) {
      const key = OPENERS[event.type] !== undefined ? entityKey(event) : undefined;
      if (key === undefined || !reopened.has(key)) out.push(event);
    }
    return out;
  }
  if (run !== null) {
    out.push(...state.closers());
    if (state.synthetic) {
      out.push(madeUp({ type: "RUN_FINISHED", threadId: context.threadId, runId: run.runId }));
    } else {
      out.push(
        endOf(run.runId, snapshot) ??
          madeUp({
            type: "RUN_ERROR",
            message:
              "agui-hub: the rest of this run was lost (its events were trimmed or the thread " +
              "was re-created while the stream was away); the stream continues from a snapshot",
            code: LOST_RUN_CODE,
          }),
      );
    }
  }
  if (latest !== undefined) {
    out.push(latest, ...body);
    return out;
  }
  // No started run: an empty thread, or one whose RUN_STARTED was trimmed before the hub
  // could fold it.
  const messages = body[0].messages;
  const snapshotState = body.find((e) => e.type === "STATE_SNAPSHOT")?.snapshot;
  const empty = Array.isArray(messages) && messages.length === 0 && isEmptyObject(snapshotState);
  if (empty && context.agentEmpty && run === null) return out;
  const runId = `agui-hub-snapshot-${context.offset}`;
  out.push(madeUp({ type: "RUN_STARTED", threadId: context.threadId, runId }));
  out.push(...body.filter((e) => !RUN_ENDS.has(e.type) && e.type !== "RUN_STARTED"));
  const ends = body.filter((e) => RUN_ENDS.has(e.type));
  if (ends.length > 0) {
    out.push(...ends); // the run whose start was trimmed ended
  } else if (empty) {
    out.push(madeUp({ type: "RUN_FINISHED", threadId: context.threadId, runId }));
  }
  // Otherwise the events folded were inside a run that goes on: it stays open, and the
  // live events continue it (see Feed.repair).
  return out;
}

/** The text roles a TEXT_MESSAGE_START may carry. */
const TEXT_ROLES = new Set(["developer", "system", "assistant", "user"]);

/**
 * The opener of the entity *event* continues, made up from the messages of the last
 * MESSAGES_SNAPSHOT, when the snapshot could not reopen it (it had no started run).
 */
function openerFor(event: Ev, messages: Ev[]): Ev | undefined {
  const tag = str(event.subagentRunId);
  switch (event.type) {
    case "TEXT_MESSAGE_CONTENT":
    case "TEXT_MESSAGE_END": {
      const found = messages.find((m) => m.id === event.messageId);
      const role = str(found?.role);
      if (role === undefined || !TEXT_ROLES.has(role)) return undefined;
      return only({
        type: "TEXT_MESSAGE_START",
        messageId: event.messageId,
        role,
        subagentRunId: tag,
      });
    }
    case "REASONING_MESSAGE_CONTENT":
    case "REASONING_MESSAGE_END": {
      const found = messages.find((m) => m.id === event.messageId);
      if (found?.role !== "reasoning") return undefined;
      return only({
        type: "REASONING_MESSAGE_START",
        messageId: event.messageId,
        role: "reasoning",
        subagentRunId: tag,
      });
    }
    case "TOOL_CALL_ARGS":
    case "TOOL_CALL_END":
      for (const message of messages) {
        const calls = Array.isArray(message.toolCalls) ? (message.toolCalls as Ev[]) : [];
        const call = calls.find((c) => c.id === event.toolCallId);
        const name = str((call?.function as { name?: unknown } | undefined)?.name);
        if (name !== undefined) {
          return only({
            type: "TOOL_CALL_START",
            toolCallId: event.toolCallId,
            toolCallName: name,
            parentMessageId: message.id,
            subagentRunId: tag,
          });
        }
      }
      return undefined;
    default:
      // Steps, reasoning spans and subagents are not in a snapshot's messages: their ends
      // have nothing to end.
      return undefined;
  }
}

interface Target {
  offset: string;
  epoch: string | null;
}

/** One stream of a HubAgent (a connect() or a run()), fed the subscription's items in order. */
class Feed {
  /** What the official pipeline has open after what this stream emitted. */
  readonly state = new StreamState();
  private first = true;
  private target: Target | null = null;
  private caughtUp = false;
  private awaitingSnapshot = false;
  /** A run this agent already streamed whole (in run()), skipped on replay. */
  private skipping: unknown = undefined;
  private emitted = 0;
  /** The messages of the last MESSAGES_SNAPSHOT emitted (to make up openers from). */
  private snapshotMessages: Ev[] = [];
  // run() only:
  private ownRunStarted = false;
  private contiguous = false;
  finished = false;

  constructor(
    private readonly agent: HubAgent,
    private readonly out: Subscriber<BaseEvent>,
    private readonly mode: "connect" | "run",
    private readonly from: AgentPosition | "live",
    private readonly input: RunAgentInput,
    private readonly onSubscribed: () => void,
  ) {}

  private emit(event: Ev): void {
    if (event.type === "MESSAGES_SNAPSHOT" && Array.isArray(event.messages)) {
      this.snapshotMessages = event.messages as Ev[];
    }
    this.state.apply(event);
    this.emitted += 1;
    if (this.mode === "run" && this.ownRunStarted && RUN_ENDS.has(event.type)) {
      this.finished = true;
    }
    this.out.next(event as unknown as BaseEvent);
  }

  take(item: Item, sub: Subscription): void {
    if (this.mode === "run") this.takeForRun(item, sub);
    else this.takeForConnect(item, sub);
  }

  private takeForConnect(item: Item, sub: Subscription): void {
    const stats = this.agent.stats;
    if (item.kind === "subscribed") {
      if (this.first) {
        this.first = false;
        this.target = { offset: item.offset, epoch: item.epoch };
        this.awaitingSnapshot = this.from === "snapshot" || !item.recovered;
        if (item.recovered && typeof this.from === "object") {
          // The pipeline is new; the agent may have stopped inside a run: open
          // again what was open, so that the events to come continue it.
          for (const event of this.agent.carried.reopeners()) this.emit(event);
        }
      } else if (item.recovered) {
        if (item.resumed) stats.resumes += 1;
      } else {
        this.awaitingSnapshot = true;
      }
    } else if (item.kind === "snapshot") {
      stats.snapshots += 1;
      if (!item.complete) stats.incomplete += 1;
      const replacing = this.emitted > 0 || typeof this.from === "object";
      if (replacing) stats.resyncs += 1;
      this.awaitingSnapshot = false;
      this.skipping = undefined;
      const agentEmpty = this.agent.messages.length === 0 && isEmptyObject(this.agent.state);
      const events = translateSnapshot(item.events, this.state, {
        threadId: this.agent.threadId,
        offset: item.offset,
        agentEmpty,
      });
      for (const event of events) this.emit(event);
      // The head it was compared with belongs to another epoch: this is the thread now.
      if (this.target !== null && item.epoch !== this.target.epoch) this.caughtUp = true;
    } else {
      this.relay(item.event);
    }
    const position = sub.position;
    this.agent.savePosition(position, this.state);
    if (
      typeof position === "object" &&
      this.target !== null &&
      compareOffsets(position.offset, this.target.offset) >= 0
    ) {
      this.caughtUp = true; // everything up to the head at subscribe time is in
    }
    if (
      this.agent.follow === "run" &&
      this.caughtUp &&
      !this.awaitingSnapshot &&
      this.state.run === null &&
      this.skipping === undefined
    ) {
      this.finished = true;
    }
  }

  /** A live event of the thread, in a connect() stream. */
  private relay(event: Ev): void {
    if (this.skipping !== undefined) {
      if (RUN_ENDS.has(event.type)) this.skipping = undefined;
      return;
    }
    if (event.type === "RUN_STARTED" && this.state.run === null) {
      if (this.agent.streamedRuns.has(String(event.runId))) {
        // run() delivered this run whole already: applying it again would
        // append its text a second time.
        this.skipping = event.runId;
        return;
      }
    }
    if (this.state.synthetic && !this.repair(event)) return;
    this.emit(event);
  }

  /**
   * Inside a run HubAgent made up (see translateSnapshot): emits what *event* needs
   * before it; false when *event* continues something the hub's snapshot does not know
   * either, which is dropped (the hub's reducer ignores it the same way).
   */
  private repair(event: Ev): boolean {
    const run = this.state.run;
    if (run === null) return true;
    if (event.type === "RUN_STARTED") {
      for (const closer of this.state.closers()) this.emit(closer);
      this.emit(madeUp({ type: "RUN_FINISHED", threadId: this.agent.threadId, runId: run.runId }));
      return true;
    }
    if (OPENERS[event.type] !== undefined) return true;
    const key = entityKey(event);
    if (key === undefined || this.state.isOpen(key)) return true;
    const opener = openerFor(event, this.snapshotMessages);
    if (opener === undefined) return false;
    this.emit(madeUp(opener));
    return true;
  }

  private takeForRun(item: Item, sub: Subscription): void {
    const runId = this.input.runId;
    if (item.kind === "subscribed") {
      if (this.first) {
        this.first = false;
        this.contiguous = item.recovered && samePosition(this.agent.position, item);
        this.onSubscribed();
      } else if (!item.recovered) {
        this.contiguous = false;
      } else if (item.resumed) {
        this.agent.stats.resumes += 1;
      }
      return;
    }
    if (item.kind === "snapshot") {
      this.contiguous = false;
      this.agent.stats.snapshots += 1;
      this.agent.stats.resyncs += 1;
      if (!item.complete) this.agent.stats.incomplete += 1;
      for (const event of this.runSnapshot(item.events, item.offset)) this.emit(event);
    } else if (this.ownRunStarted) {
      this.emit(item.event);
    } else if (item.event.type === "RUN_STARTED" && item.event.runId === runId) {
      this.ownRunStarted = true;
      this.emit(item.event);
    } else {
      this.contiguous = false; // another run's event: the agent did not take it in
    }
    if (this.finished) {
      this.agent.streamedRuns.add(runId);
      if (this.contiguous) this.agent.savePosition(sub.position, this.state);
    }
  }

  /** translateSnapshot for a run() stream: only its own run matters. */
  private runSnapshot(events: Ev[], offset: string): Ev[] {
    const runId = this.input.runId;
    if (this.ownRunStarted) {
      const out = translateSnapshot(events, this.state, {
        threadId: this.agent.threadId,
        offset,
        agentEmpty: false,
      });
      // Stop at the end of this run (rule 2 goes on into the next one).
      const end = out.findIndex((e) => RUN_ENDS.has(e.type));
      return end >= 0 ? out.slice(0, end + 1) : out;
    }
    const at = events.findIndex((e) => e.type === "RUN_STARTED" && e.runId === runId);
    if (at < 0) return []; // not started yet (or gone with a re-created thread)
    this.ownRunStarted = true;
    const snapshots = events.filter(
      (e) => e.type === "MESSAGES_SNAPSHOT" || e.type === "STATE_SNAPSHOT",
    );
    if (events[at + 1]?.type === "MESSAGES_SNAPSHOT") return events.slice(at);
    // It ended before a later run: its end, with the thread's state as it is now.
    const end = endOf(runId, events);
    return [events[at], ...snapshots, ...(end ? [end] : [])];
  }
}

function samePosition(position: AgentPosition, reply: { offset: string; epoch: string | null }) {
  if (position === "start") return reply.offset === "0-0";
  if (position === "snapshot") return false;
  return position.offset === reply.offset && position.epoch === reply.epoch;
}

/**
 * An AG-UI agent whose events come from an agui-hub thread.
 *
 * `connectAgent()` attaches to the thread: the first time from its start (or
 * a compact snapshot, `from: "snapshot"`), later from where the previous
 * stream stopped, so agent.messages never gets anything twice. `runAgent()`
 * follows one run that `startRun` makes the application's agent publish.
 *
 * ```js
 * import WebSocket from "ws"; // Node 20; browsers have their own
 * const agent = new HubAgent({ url: "ws://127.0.0.1:8765", threadId: "demo", WebSocket,
 *   startRun: (input) => fetch("/agent/run", { method: "POST", body: JSON.stringify(input) }) });
 * await agent.connectAgent();              // the thread so far (and a running run to its end)
 * const { newMessages } = await agent.runAgent(); // one more run, by runId = input.runId
 * ```
 *
 * One client carries one subscription per thread: an agent given a shared
 * `client` must be the only one following its thread on that client.
 */
export class HubAgent extends AbstractAgent {
  follow: Follow;
  /** Where the next connect() resumes; save it (with messages and state) to continue later. */
  position: AgentPosition;
  readonly stats: HubAgentStats = { resumes: 0, resyncs: 0, snapshots: 0, incomplete: 0 };
  /** Runs that run() streamed whole; a connect() that replays them skips them. */
  streamedRuns = new Set<string>();
  /** What the pipeline had open when the last stream stopped at `position`. */
  carried = new StreamState();
  private hub: HubAgentConfig;

  constructor(config: HubAgentConfig) {
    super(config);
    if (!config.threadId) throw new TypeError("HubAgent needs a threadId: the hub thread");
    if (config.client === undefined && !config.url) {
      throw new TypeError("HubAgent needs a url (or a HubClient to share)");
    }
    this.hub = config;
    this.follow = config.follow ?? "run";
    this.position = config.from ?? "start";
    this.branch = config.branch;
  }

  /** The branch followed (its latest run as received), when the config asked for one. */
  branch: string | undefined;

  /** @internal */
  savePosition(position: Subscription["position"], state: StreamState): void {
    if (typeof position === "object" || position === "start" || position === "snapshot") {
      this.position = position;
    }
    this.carried = state;
  }

  protected connect(input: RunAgentInput): Observable<BaseEvent> {
    return this.stream("connect", input);
  }

  run(input: RunAgentInput): Observable<BaseEvent> {
    if (this.hub.startRun === undefined) {
      return throwError(
        () =>
          new HubError(
            "HubAgent.run(): the hub relays runs, it does not start them. Use connectAgent() " +
              "to follow the thread, or pass startRun to trigger the agent that publishes " +
              "the run into the hub.",
          ),
      );
    }
    // On a branch, the new run continues its latest run (a new version there),
    // unless the application chose another parent.
    const parentRunId = input.parentRunId ?? this.branch;
    return this.stream("run", parentRunId === undefined ? input : { ...input, parentRunId });
  }

  /** Detaches the active run or connection (the hub has nothing to abort). */
  abortRun(): void {
    void this.detachActiveRun();
  }

  clone(): HubAgent {
    const copy = super.clone() as HubAgent;
    copy.hub = this.hub;
    copy.follow = this.follow;
    copy.position = typeof this.position === "object" ? { ...this.position } : this.position;
    copy.streamedRuns = new Set(this.streamedRuns);
    copy.carried = this.carried;
    (copy as { stats: HubAgentStats }).stats = { ...this.stats };
    return copy;
  }

  private openClient(): HubClient {
    const { url, encoding, token, WebSocket, clientOptions, onStatus } = this.hub;
    const options: Record<string, unknown> = { ...clientOptions, url };
    if (encoding !== undefined) options.encoding = encoding;
    if (token !== undefined) options.token = token;
    if (WebSocket !== undefined) options.WebSocket = WebSocket;
    const client = new HubClient(options as unknown as HubClientOptions);
    if (onStatus !== undefined) client.onStatus(onStatus);
    return client;
  }

  private stream(mode: "connect" | "run", input: RunAgentInput): Observable<BaseEvent> {
    return new Observable<BaseEvent>((out) => {
      const own = this.hub.client === undefined;
      const client = this.hub.client ?? this.openClient();
      const from = mode === "run" ? "live" : this.position;
      let stopped = false;
      const fail = (error: unknown) => {
        if (stopped) return;
        stopped = true;
        out.error(error);
      };
      const onSubscribed = () => {
        const startRun = this.hub.startRun;
        if (startRun === undefined) return;
        Promise.resolve()
          .then(() => startRun(input))
          .catch(fail);
      };
      const feed = new Feed(this, out, mode, from, input, onSubscribed);
      let sub: Subscription;
      try {
        sub = client.subscribe(
          this.threadId,
          this.branch === undefined ? { from } : { from, branch: this.branch },
        );
      } catch (error) {
        if (own) void client.close().catch(() => undefined);
        out.error(error);
        return undefined;
      }
      const pump = async () => {
        try {
          for await (const item of sub) {
            if (stopped) return;
            feed.take(item, sub);
            if (sub.branch !== undefined) this.branch = sub.branch; // resume on its latest run
            if (feed.finished) {
              stopped = true;
              out.complete();
              return;
            }
          }
          fail(new HubError(`the subscription to thread '${this.threadId}' ended (client closed)`));
        } catch (error) {
          fail(error);
        }
      };
      void pump();
      return () => {
        stopped = true;
        void sub
          .close()
          .catch(() => undefined)
          .then(() => (own ? client.close() : undefined))
          .catch(() => undefined);
      };
    });
  }
}

export { HubClient, HubError } from "./client.js";
