/**
 * agui-hub client for browsers and Node (docs/protocol.md is the wire contract,
 * agui_hub/client/ the reference behaviour this mirrors).
 *
 * One HubClient is one WebSocket (msgpack or JSON) carrying any number of
 * subscriptions, one per thread, and publishes. When the connection drops the
 * client reconnects by itself (full-jitter backoff) and resubscribes every
 * thread from the position after the last item it took in, so a consumer sees
 * every event exactly once and in order; unanswered publishes are sent again,
 * in call order, with the same event ids, so nothing is stored twice.
 *
 * ```js
 * import { HubClient } from "./agui-hub.js";
 * const hub = new HubClient({ url: "ws://127.0.0.1:8765" });
 * for await (const item of hub.subscribe("demo", { from: "start" })) {
 *   if (item.kind === "event") console.log(item.offset, item.event.type);
 * }
 * ```
 *
 * In Node 20 (no global WebSocket) pass `WebSocket` from the `ws` package.
 */

import { Decoder, Encoder } from "@msgpack/msgpack";

// -- public types ------------------------------------------------------------------------------

export type Encoding = "msgpack" | "json";

/** A place in a thread: the last offset taken in, in the epoch it belongs to. */
export interface Position {
  offset: string;
  epoch: string | null;
}

/** Where a subscription starts (docs/protocol.md, subscribe). */
export type Start = "live" | "start" | "snapshot" | Position;

/** An AG-UI event as published (canonical wire form, unknown fields included). */
export type AguiEvent = { type: string; [key: string]: unknown };

/** What a connection tells the others watching a thread about itself (presence): a flat
 * map, keys of 1 to 32 characters, at most 256 bytes of JSON, e.g. `{name: "web"}`. */
export type ClientInfo = Record<string, string | number | boolean | null>;

/** One connection subscribed to a thread, on any gateway of the store (presence). */
export interface PresenceEntry {
  /** Its id, unique across gateways (a new one for each connection). */
  connection: string;
  /** The subject of its token, or "anonymous". */
  subject: string;
  /** When it subscribed, ms since the Unix epoch; absent only in a "left" change about a
   * connection this subscription never saw join. */
  joined?: number;
  /** What it announced of itself (the `client` option), when it did. */
  client?: ClientInfo;
}

/** Who watches a thread now: the answer to {@link HubClient.presence}. */
export interface Presence {
  /** Everyone watching, on every gateway. */
  count: number;
  /** The first ones by the time they joined (at most the limit asked; [] when hidden). */
  entries: PresenceEntry[];
  /** Some were left out of `entries`. */
  more: boolean;
  /** The gateway shows the count only (`--presence count`). */
  hidden: boolean;
}

/** Who watches a subscribed thread (`sub.presence`, with `presence: true`): a new frozen
 * object at every change. */
export interface PresenceState extends Presence {
  /** This connection's own id (its entry is among `entries`); null before the first list,
   * in count-only mode, and when presence is off. */
  self: string | null;
  /** The gateway keeps no presence (`--presence off`): nothing will change. */
  off: boolean;
  /** The gateway sent the list: the fields above mean something. */
  known: boolean;
}

/** What changed, as `onPresence` listeners are told: the whole list ("presence": after
 * every (re)subscribe, and in count-only mode at each change; replace what you had), who
 * "joined" (`entries`: them) or who "left" (`entries`: them, with what was known of them).
 * `count` is everyone watching now, also when `entries` could not name them all. */
export interface PresenceChange {
  change: "presence" | "joined" | "left";
  count: number;
  entries: PresenceEntry[];
}

export type Item =
  | {
      kind: "subscribed";
      thread: string;
      epoch: string | null;
      offset: string;
      recovered: boolean;
      resumed: boolean;
    }
  | {
      kind: "snapshot";
      thread: string;
      offset: string;
      /** null: the thread has no events (deleted or emptied) and so no epoch yet. */
      epoch: string | null;
      complete: boolean;
      events: AguiEvent[];
    }
  | { kind: "event"; thread: string; offset: string; event: AguiEvent };

export type ConnectionState = "connecting" | "open" | "reconnecting" | "closed";

export interface ConnectionStatus {
  /** "connecting" until the first connection opened, "reconnecting" after a drop. */
  state: ConnectionState;
  /** How many times the connection was re-established. */
  reconnects: number;
  /** The connection attempt under way or last made since the last open (0 while open). */
  attempt: number;
  /** The close code of the last lost connection (1006: it ended without a close frame). */
  closeCode: number | null;
  closeReason: string;
  /** Why the last attempt failed, or why the client stopped. */
  error?: Error;
}

/** A token, or a function asked for one at each (re)connection and refresh. */
export type TokenProvider = () => string | Promise<string>;

export interface HubClientOptions {
  /** ws:// or wss:// URL of the gateway. */
  url: string;
  /** Subprotocol: "msgpack" (default, binary frames) or "json" (text frames). */
  encoding?: Encoding;
  /** Sent as the subprotocol entry "agui-hub.bearer.<token>"; a provider is asked again
   * at each (re)connect, on 4401, and before the token's exp (an `auth` command). */
  token?: string | TokenProvider;
  /** WebSocket constructor; default globalThis.WebSocket (Node 20: the `ws` package's). */
  WebSocket?: unknown;
  /** Reconnect pauses in ms: full jitter up to min(backoffMax, backoffMin * 2^n); n is reset
   * once a connection proved healthy. Defaults 500 / 15000. */
  backoffMin?: number;
  backoffMax?: number;
  /** ms without a frame before an app-level ping (default 15000); no frame pingTimeout ms
   * after it (default 10000) and the connection is treated as dead. */
  pingInterval?: number;
  pingTimeout?: number;
  /** ms a WebSocket handshake may take (default 10000). */
  openTimeout?: number;
  /** ms without a connection before every subscription and command fails with
   * HubUnreachable; default null: never. */
  giveUpAfter?: number | null;
  /** Largest frame this client sends (default 1 MiB, the gateway's default limit). */
  maxFrameBytes?: number;
  /** At most this many publish() calls wait for their reply at once (default 1000); one
   * more is refused with HubError, so an app publishing into an outage sees it at once
   * instead of queueing without bound. */
  maxPendingPublishes?: number;
  /** What this client tells the others watching a thread about itself (presence), sent
   * with every subscribe (reconnects keep it) and every `auth`. */
  client?: ClientInfo;
}

export interface SubscribeOptions {
  from?: Start;
  /** Only this run's events (snapshots are not filtered). */
  run?: string;
  /** Only the branch of the thread's tree of runs that ends with this run, then the runs
   * that continue it (snapshots fold that branch only). `sub.branch` follows its latest
   * run, and a resume asks for it. Not with `run`. */
  branch?: string;
  /** Called synchronously with each item, in order. With it, items are not buffered for an
   * iterator unless one is created. */
  onItem?: (item: Item, sub: Subscription) => void;
  /** At most this many items wait for a slow iterator (default 10000, at least 2). */
  maxBuffer?: number;
  /** Keep who watches the thread in `sub.presence`, and tell `onPresence` listeners of
   * each change: the whole list first (again after every reconnect), then who joined and
   * who left, at most once per the gateway's presence interval (1 s by default). */
  presence?: boolean;
  /** Replaces the client's `client` option for this thread. */
  client?: ClientInfo;
}

export interface PublishOptions {
  /** Idempotency keys, one per event, all different; made up when not given. */
  eventIds?: string[];
  /** ms from the call until the publish gives up with HubUnreachable, connected or not
   * (default: giveUpAfter; null: never). After that it may still have been stored: publish
   * again with the same eventIds to find out without duplicating. */
  timeout?: number | null;
}

// -- errors -------------------------------------------------------------------------------------

/** The root of every error this client throws. */
export class HubError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** The connection ended for good: closed with 1000, 4403, 4401 without a token provider,
 * refused at the handshake (HTTP 401 / 403, seen in Node only), or refused again and again. */
export class ConnectionRejected extends HubError {
  readonly closeCode: number;
  readonly reason: string;
  constructor(closeCode: number, message: string, reason = "") {
    super(message);
    this.closeCode = closeCode;
    this.reason = reason;
  }
}

/** An error frame answering a command (docs/protocol.md, error codes). */
export class CommandRejected extends HubError {
  readonly code: string;
  readonly index?: number;
  readonly retryAfter?: number;
  readonly thread?: string;
  constructor(
    code: string,
    message: string,
    details: { index?: number; retryAfter?: number; thread?: string } = {},
  ) {
    super(`${code}: ${message}`);
    this.code = code;
    if (details.index !== undefined) this.index = details.index;
    if (details.retryAfter !== undefined) this.retryAfter = details.retryAfter;
    if (details.thread !== undefined) this.thread = details.thread;
  }
}

/** No connection: reconnecting gave up (giveUpAfter), or a command's timeout passed. */
export class HubUnreachable extends HubError {}

// -- offsets ------------------------------------------------------------------------------------

const OFFSET_RE = /^([0-9]{1,20})-([0-9]{1,20})$/;
const MAX_PART = (1n << 64n) - 1n;
export const START_OFFSET = "0-0";

function offsetKey(offset: string): [bigint, bigint] {
  const match = typeof offset === "string" ? OFFSET_RE.exec(offset) : null;
  if (match !== null) {
    const ms = BigInt(match[1] as string);
    const seq = BigInt(match[2] as string);
    if (ms <= MAX_PART && seq <= MAX_PART) return [ms, seq];
  }
  throw new HubError(`invalid offset ${JSON.stringify(offset)}: expected "<ms>-<seq>", e.g. "0-0"`);
}

/** Whether *value* is an offset, "<ms>-<seq>" with each part at most 2^64 - 1. */
export function isOffset(value: unknown): value is string {
  try {
    offsetKey(value as string);
    return true;
  } catch {
    return false;
  }
}

/** -1, 0 or 1 as offset *a* comes before, is, or comes after *b* (a pair of integers, never
 * string order: "999-0" < "1000-0"). Throws HubError for a string that is not an offset. */
export function compareOffsets(a: string, b: string): number {
  return compareKeys(offsetKey(a), offsetKey(b));
}

function compareKeys(a: [bigint, bigint], b: [bigint, bigint]): number {
  if (a[0] !== b[0]) return a[0] < b[0] ? -1 : 1;
  if (a[1] !== b[1]) return a[1] < b[1] ? -1 : 1;
  return 0;
}

/** Whether *value* is a Position ({offset, epoch} with a valid offset). */
export function isPosition(value: unknown): value is Position {
  if (typeof value !== "object" || value === null) return false;
  const { offset, epoch } = value as { offset?: unknown; epoch?: unknown };
  return isOffset(offset) && (epoch === null || epoch === undefined || typeof epoch === "string");
}

/** A `subscribed` or `snapshot` frame's offset and epoch are usable (absent, or the right
 * kind): a position is never built from what a gateway sent without checking it. */
function wellFormed(frame: Frame): boolean {
  const { offset, epoch } = frame;
  return (
    (offset === undefined || isOffset(offset)) &&
    (epoch === undefined || epoch === null || typeof epoch === "string")
  );
}

function isEventLike(value: unknown): boolean {
  return (
    typeof value === "object" &&
    value !== null &&
    !Array.isArray(value) &&
    typeof (value as { type?: unknown }).type === "string"
  );
}

// -- constants ----------------------------------------------------------------------------------

export const SUBPROTOCOL_JSON = "agui-hub.v1.json";
export const SUBPROTOCOL_MSGPACK = "agui-hub.v1.msgpack";
export const BEARER_PREFIX = "agui-hub.bearer.";
const MAX_EVENTS_PER_PUBLISH = 1000;
const MAX_THREAD_LENGTH = 256;
const DEFAULT_MAX_BUFFER = 10_000;
const MAX_RETRY_AFTER = 300_000;
const REFRESH_SHARE = 0.2;
const REFRESH_LEAD_MAX = 60_000;
const LONGEST_TIMER = 2 ** 31 - 1;
/** Close codes after which the client stops (4401 only without a token provider). */
const NO_RESUME = new Set([1000, 4401, 4403]);
/** Close codes that say one side could not take the other's frame ("fix the client"). */
const CLIENT_FAULTS = new Map([
  [1002, "protocol error"],
  [1007, "invalid data"],
  [1009, "message too big"],
]);
const OPEN = 1; // WebSocket.OPEN
// RFC 7230 token characters: what a Sec-WebSocket-Protocol entry may hold.
const TOKEN_CHARS = /^[A-Za-z0-9!#$%&'*+.^_`|~-]+$/;

// -- helpers ------------------------------------------------------------------------------------

type Frame = Record<string, unknown>;
type Timer = ReturnType<typeof setTimeout>;

/** The part of the WebSocket interface used here: browsers' and the `ws` package's. */
interface Socket {
  readonly readyState: number;
  readonly protocol: string;
  binaryType: string;
  onopen: ((event: unknown) => void) | null;
  onmessage: ((event: { data: unknown }) => void) | null;
  onerror: ((event: unknown) => void) | null;
  onclose: ((event: { code: number; reason: string }) => void) | null;
  send(data: string | Uint8Array): void;
  close(code?: number, reason?: string): void;
  terminate?: () => void;
}
type SocketConstructor = new (url: string, protocols: string[]) => Socket;

const now = (): number => (typeof performance !== "undefined" ? performance.now() : Date.now());

function describe(error: unknown): string {
  if (error instanceof Error) return error.message || error.name;
  return String(error);
}

function report(what: string, error: unknown): void {
  console.error(`agui-hub client: ${what}:`, error);
}

/** Full jitter: uniform in [0, min(max, min * 2^attempt)]. */
export function backoffDelay(attempt: number, min: number, max: number): number {
  return Math.random() * Math.min(max, min * 2 ** Math.min(attempt, 30));
}

/** A rate_limited frame's retryAfter (seconds on the wire) in ms, sane or 0. */
function retryAfterMs(frame: Frame): number {
  const value = frame.retryAfter;
  if (typeof value === "number" && Number.isFinite(value)) {
    return Math.min(Math.max(value * 1000, 0), MAX_RETRY_AFTER);
  }
  return 0;
}

function jittered(wait: number): number {
  return wait + Math.random() * (50 + 0.2 * wait);
}

/** The `exp` claim of a JWT in ms since the epoch, read without verifying (the gateway
 * verifies); null when it is not a JWT with a numeric exp. */
export function tokenExpiry(token: string): number | null {
  const parts = token.split(".");
  if (parts.length !== 3) return null;
  try {
    const base64 = (parts[1] as string).replace(/-/g, "+").replace(/_/g, "/");
    const padded = base64 + "=".repeat((4 - (base64.length % 4)) % 4);
    const bytes = Uint8Array.from(atob(padded), (c) => c.charCodeAt(0));
    const claims: unknown = JSON.parse(new TextDecoder().decode(bytes));
    if (typeof claims === "object" && claims !== null) {
      const exp = (claims as { exp?: unknown }).exp;
      if (typeof exp === "number" && Number.isFinite(exp)) return exp * 1000;
    }
  } catch {
    // not a JWT: nothing to schedule
  }
  return null;
}

/** Throws HubError when *thread* is not a valid thread name (docs/protocol.md). */
/** One run of a thread, as the `runs` command lists it. */
export interface RunInfo {
  runId: string;
  /** The run it continues (null: the first of its tree). */
  parentRunId: string | null;
  status: "running" | "finished" | "error" | "cancelled";
  /** Offset of its RUN_STARTED. */
  first: string;
  /** Offset of its RUN_FINISHED / RUN_ERROR; while it runs, the thread's newest (when it
   * is the thread's current run), else null. */
  last: string | null;
  /** The start of the last user message of its input ("" without one). */
  preview: string;
}

export function checkThread(thread: string): string {
  if (typeof thread !== "string") throw new HubError("a thread name is a string");
  const length = [...thread].length;
  if (length < 1 || length > MAX_THREAD_LENGTH) {
    throw new HubError(`a thread name is a string of 1 to ${MAX_THREAD_LENGTH} characters`);
  }
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u001f\u007f-\u009f]/.test(thread)) {
    throw new HubError(`thread name ${JSON.stringify(thread)} contains control characters`);
  }
  if (thread.trim() !== thread) {
    throw new HubError(
      `thread name ${JSON.stringify(thread)} begins or ends with whitespace: remove it`,
    );
  }
  return thread;
}

function randomHex(bytes: number): string {
  const data = new Uint8Array(bytes);
  const crypto = (globalThis as { crypto?: { getRandomValues?: (a: Uint8Array) => void } })
    .crypto;
  if (crypto?.getRandomValues) crypto.getRandomValues(data);
  else for (let i = 0; i < bytes; i++) data[i] = Math.floor(Math.random() * 256);
  return Array.from(data, (b) => b.toString(16).padStart(2, "0")).join("");
}

const MAX_CLIENT_BYTES = 256;
const MAX_CLIENT_KEY_CHARS = 32;
const MAX_PRESENCE_LIMIT = 1000;

/** A copy of *client* as it goes on the wire; throws HubError when the gateway would refuse
 * it (not a flat map, a key empty or over 32 characters, over 256 bytes of JSON). */
function checkClientInfo(client: unknown): ClientInfo | undefined {
  if (client === undefined || client === null) return undefined;
  if (typeof client !== "object" || Array.isArray(client)) {
    throw new HubError('client is a flat object, e.g. {name: "web"}');
  }
  const copy: ClientInfo = {};
  for (const [key, value] of Object.entries(client as Record<string, unknown>)) {
    if (key.length < 1 || key.length > MAX_CLIENT_KEY_CHARS) {
      throw new HubError(`client keys have 1 to ${MAX_CLIENT_KEY_CHARS} characters`);
    }
    const plain =
      value === null ||
      typeof value === "string" ||
      typeof value === "boolean" ||
      (typeof value === "number" && Number.isFinite(value));
    if (!plain) {
      throw new HubError(
        `client.${key}: client is a flat object of strings, finite numbers, booleans and null`,
      );
    }
    copy[key] = value as string | number | boolean | null;
  }
  const size = new TextEncoder().encode(JSON.stringify(copy)).length;
  if (size > MAX_CLIENT_BYTES) {
    throw new HubError(`client is ${size} bytes of JSON, over ${MAX_CLIENT_BYTES}`);
  }
  return copy;
}

function presenceEntry(value: unknown): PresenceEntry | null {
  if (typeof value !== "object" || value === null) return null;
  const { connection, subject, joined, client } = value as Frame;
  if (typeof connection !== "string" || typeof subject !== "string") return null;
  const entry: PresenceEntry = { connection, subject };
  if (typeof joined === "number" && Number.isFinite(joined)) entry.joined = joined;
  if (typeof client === "object" && client !== null && !Array.isArray(client)) {
    entry.client = client as ClientInfo;
  }
  return entry;
}

function presenceEntries(value: unknown): PresenceEntry[] {
  if (!Array.isArray(value)) return [];
  return value.map(presenceEntry).filter((e): e is PresenceEntry => e !== null);
}

function presenceCount(frame: Frame): number {
  const count = frame.count;
  return typeof count === "number" && Number.isInteger(count) && count >= 0 ? count : 0;
}

/** Told of every change of a subscription's presence (`sub.onPresence`). */
export type PresenceListener = (
  presence: PresenceState,
  change: PresenceChange,
  sub: Subscription,
) => void;

const NO_PRESENCE: PresenceState = Object.freeze({
  count: 0,
  entries: [],
  more: false,
  hidden: false,
  self: null,
  off: false,
  known: false,
});

function startValue(start: Start): unknown {
  return typeof start === "string" ? start : { offset: start.offset, epoch: start.epoch };
}

// -- subscriptions ------------------------------------------------------------------------------

interface Buffered {
  item: Item;
  /** The position once the item is handed out (null: unchanged). */
  position: Position | null;
}

interface Waiter {
  resolve: (result: IteratorResult<Item>) => void;
  reject: (error: unknown) => void;
}

/**
 * The items of one thread, in order: iterate it (`for await`), or give listeners
 * (`onItem`). Made by {@link HubClient.subscribe}.
 *
 * `position` is where a new subscription would resume to get exactly what this one has
 * not handed out yet: keep it (JSON) to continue elsewhere.
 */
export class Subscription implements AsyncIterable<Item> {
  readonly thread: string;
  readonly #client: HubClient;
  readonly #start: Start;
  readonly #run: string | undefined;
  /** The branch followed: its latest run as received (undefined: no branch). */
  branch: string | undefined;
  readonly #maxBuffer: number;
  readonly #wantsPresence: boolean;
  readonly #clientInfo: ClientInfo | undefined;
  #handed: Position | null;
  #recovered: boolean | null = null;
  #presence: PresenceState | null;
  // The watchers by connection id (a `left` frame names only connection and subject: the
  // rest is here).
  #watchers = new Map<string, PresenceEntry>();
  #presenceListeners = new Set<PresenceListener>();
  #listeners = new Set<(item: Item, sub: Subscription) => void>();
  #endListeners = new Set<(error: HubError | null) => void>();
  #buffer: Buffered[] = [];
  #head = 0;
  #waiters: Waiter[] = [];
  #iterating = false; // items are buffered for iterators
  #iteratorMade = false;
  #switchPending = false;
  #closed = false;
  #ended = false;
  #error: HubError | null = null;
  #errorThrown = false;

  // Receiving side, driven by the client: the position after the last item taken in,
  // the id of the subscribe whose reply is awaited (frames before it are stale), ...
  /** @internal */ received: Position | null;
  #receivedKeyOf: Position | null = null;
  #receivedKey: [bigint, bigint] = [0n, 0n];
  /** @internal */ awaiting: number | null = null;
  /** @internal */ sentOn: unknown = null;
  /** @internal */ lagged = false;
  /** @internal */ retries = 0;
  /** @internal */ retryTimer: Timer | null = null;
  #subscribedOnce = false;
  // Resubscribe from "snapshot": the gateway claimed a recovery it cannot have made
  // (another epoch), or sent a frame this subscription could not read; cleared by the
  // reply to that subscribe.
  #resync = false;
  // Frames this subscription could not read since its last good event or snapshot.
  #malformed = 0;

  /** @internal */
  constructor(client: HubClient, thread: string, options: SubscribeOptions) {
    const start = options.from ?? "live";
    if (!["live", "start", "snapshot"].includes(start as string) && !isPosition(start)) {
      throw new HubError('from is "live", "start", "snapshot" or {offset, epoch}');
    }
    const maxBuffer = options.maxBuffer ?? DEFAULT_MAX_BUFFER;
    if (!Number.isInteger(maxBuffer) || maxBuffer < 2) {
      throw new HubError("maxBuffer must be an integer of at least 2");
    }
    if (options.run !== undefined && typeof options.run !== "string") {
      throw new HubError("run is a string");
    }
    if (options.branch !== undefined && (typeof options.branch !== "string" || !options.branch)) {
      throw new HubError("branch is a run id");
    }
    if (options.run !== undefined && options.branch !== undefined) {
      throw new HubError("run and branch do not go together");
    }
    if (options.presence !== undefined && typeof options.presence !== "boolean") {
      throw new HubError("presence is true or false");
    }
    this.#wantsPresence = options.presence === true;
    this.#presence = this.#wantsPresence ? NO_PRESENCE : null;
    this.#clientInfo =
      options.client !== undefined ? checkClientInfo(options.client) : client._clientInfo;
    this.#client = client;
    this.thread = thread;
    this.#start =
      typeof start === "string" ? start : { offset: start.offset, epoch: start.epoch ?? null };
    this.#run = options.run;
    this.branch = options.branch;
    this.#maxBuffer = maxBuffer;
    this.#handed = typeof this.#start === "string" ? null : this.#start;
    this.received = this.#handed;
    if (options.onItem !== undefined) this.#listeners.add(options.onItem);
    else this.#iterating = true;
  }

  /** The resume position after the last item handed out (the start until one is known). */
  get position(): Position | "live" | "start" | "snapshot" {
    if (this.#handed !== null) return { ...this.#handed };
    return this.#start as "live" | "start" | "snapshot";
  }

  /** The `recovered` flag of the latest `subscribed` item handed out. */
  get recovered(): boolean | null {
    return this.#recovered;
  }

  /** With `presence: true`, who watches the thread now (a new frozen object at every
   * change, as `hub.status`); null without. */
  get presence(): PresenceState | null {
    return this.#presence;
  }

  /** Call *listener* with `sub.presence` and what changed at every change, as the gateway's
   * frame arrives (not queued behind the items an iterator has not taken yet); returns the
   * unsubscribe. Only with `presence: true`. A listener that throws is reported with
   * console.error; the others still run. */
  onPresence(listener: PresenceListener): () => void {
    this.#presenceListeners.add(listener);
    return () => this.#presenceListeners.delete(listener);
  }

  /** Why the subscription ended (null while it runs, or after a plain close). */
  get error(): HubError | null {
    return this.#error;
  }

  get closed(): boolean {
    return this.#closed || this.#ended;
  }

  /** Call *listener* synchronously with each item from now on; returns the unsubscribe.
   * A listener that throws is reported with console.error; the others still run. */
  onItem(listener: (item: Item, sub: Subscription) => void): () => void {
    this.#listeners.add(listener);
    if (this.#iterating && !this.#switchPending && !this.#iteratorMade) {
      // Listeners and no iterator: hand out what was buffered since subscribe() to the
      // listeners at the end of this tick (before any frame can arrive), then stop buffering.
      this.#switchPending = true;
      queueMicrotask(() => {
        this.#switchPending = false;
        if (this.#iteratorMade || !this.#iterating) return;
        this.#iterating = false;
        while (this.#head < this.#buffer.length) this.#handOut(this.#take(), true);
        this.#resumeIfDrained();
      });
    }
    return () => this.#listeners.delete(listener);
  }

  /** Call *listener* once when the subscription ends: with the error, or null after close(). */
  onEnd(listener: (error: HubError | null) => void): () => void {
    if (this.#ended || this.#closed) {
      const error = this.#error;
      queueMicrotask(() => this.#callEnd(listener, error));
      return () => undefined;
    }
    this.#endListeners.add(listener);
    return () => this.#endListeners.delete(listener);
  }

  [Symbol.asyncIterator](): AsyncIterator<Item> {
    this.#iteratorMade = true;
    this.#iterating = true;
    return {
      next: () => this.#next(),
      return: async () => {
        await this.close();
        return { done: true, value: undefined };
      },
    };
  }

  /** Unsubscribe; iterators end (what was buffered is discarded). */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#buffer = [];
    this.#head = 0;
    this.#client._remove(this);
    this.#finish(null);
  }

  // -- consumer side ----------------------------------------------------------------------------

  #next(): Promise<IteratorResult<Item>> {
    if (this.#head < this.#buffer.length) {
      const entry = this.#take();
      this.#resumeIfDrained();
      return Promise.resolve({ done: false, value: this.#handOut(entry, false) });
    }
    if (this.#error !== null && !this.#errorThrown && !this.#closed) {
      this.#errorThrown = true;
      return Promise.reject(this.#error);
    }
    if (this.#ended || this.#closed) return Promise.resolve({ done: true, value: undefined });
    return new Promise((resolve, reject) => this.#waiters.push({ resolve, reject }));
  }

  #take(): Buffered {
    const entry = this.#buffer[this.#head] as Buffered;
    this.#buffer[this.#head] = undefined as unknown as Buffered;
    this.#head++;
    if (this.#head === this.#buffer.length) {
      this.#buffer = [];
      this.#head = 0;
    } else if (this.#head > 1024 && this.#head * 2 > this.#buffer.length) {
      this.#buffer = this.#buffer.slice(this.#head);
      this.#head = 0;
    }
    return entry;
  }

  get #buffered(): number {
    return this.#buffer.length - this.#head;
  }

  #handOut(entry: Buffered, toListeners: boolean): Item {
    if (entry.position !== null) this.#handed = entry.position;
    if (entry.item.kind === "subscribed") this.#recovered = entry.item.recovered;
    if (toListeners) this.#callListeners(entry.item);
    return entry.item;
  }

  #callPresenceListeners(presence: PresenceState, change: PresenceChange): void {
    for (const listener of [...this.#presenceListeners]) {
      try {
        listener(presence, change, this);
      } catch (error) {
        report(`an onPresence listener of thread ${JSON.stringify(this.thread)} threw`, error);
      }
    }
  }

  #callListeners(item: Item): void {
    for (const listener of [...this.#listeners]) {
      try {
        listener(item, this);
      } catch (error) {
        report(`an onItem listener of thread ${JSON.stringify(this.thread)} threw`, error);
      }
    }
  }

  #callEnd(listener: (error: HubError | null) => void, error: HubError | null): void {
    try {
      listener(error);
    } catch (thrown) {
      report(`an onEnd listener of thread ${JSON.stringify(this.thread)} threw`, thrown);
    }
  }

  #resumeIfDrained(): void {
    if (this.lagged && this.#buffered <= Math.floor(this.#maxBuffer / 2)) {
      this.lagged = false;
      this.#client._resubscribe(this);
    }
  }

  #finish(error: HubError | null): void {
    if (this.#ended) return;
    this.#ended = true;
    if (error !== null && this.#error === null) this.#error = error;
    if (this.retryTimer !== null) this.#client._clearTimer(this.retryTimer);
    this.retryTimer = null;
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const waiter of waiters) {
      if (this.#error !== null && !this.#errorThrown && !this.#closed) {
        this.#errorThrown = true;
        waiter.reject(this.#error);
      } else {
        waiter.resolve({ done: true, value: undefined });
      }
    }
    const listeners = [...this.#endListeners];
    this.#endListeners.clear();
    for (const listener of listeners) this.#callEnd(listener, this.#error);
  }

  // -- receiving side (called by the client) ----------------------------------------------------

  /** @internal The subscription ended: with *error*, or the client closed (null). */
  _end(error: HubError | null): void {
    this.#finish(error);
  }

  #push(item: Item, position: Position | null): void {
    if (position !== null) this.received = position;
    const entry = { item, position };
    if (!this.#iterating) {
      this.#handOut(entry, true);
      return;
    }
    const waiter = this.#waiters.shift();
    if (waiter !== undefined) {
      this.#callListeners(item);
      waiter.resolve({ done: false, value: this.#handOut(entry, false) });
      return;
    }
    this.#buffer.push(entry);
    this.#callListeners(item);
  }

  /** @internal The subscribe command to send now (from where it must resume). */
  _subscribeCommand(id: number): Frame {
    this.awaiting = id;
    this.lagged = false;
    const received = this.received;
    let start: unknown;
    if (this.#resync) start = "snapshot";
    else if (received === null) start = startValue(this.#start);
    else if (received.epoch === null && received.offset === START_OFFSET) start = "start";
    else start = { offset: received.offset, epoch: received.epoch };
    const command: Frame = { type: "subscribe", id, thread: this.thread, from: start };
    if (this.#run !== undefined) command.run = this.#run;
    if (this.branch !== undefined) command.branch = this.branch;
    // On every resubscribe: a new connection is a new entry, and the gateway then sends the
    // whole list again.
    if (this.#wantsPresence) command.presence = true;
    if (this.#clientInfo !== undefined) command.client = this.#clientInfo;
    return command;
  }

  /** @internal A frame of this thread could not be read (a malformed frame, or one the
   * decoder refused): what it carried is lost, so resubscribe from a snapshot rather than go
   * on silently short. A second one before a good event or snapshot ends the subscription
   * with a HubError: the gateway keeps sending what this client cannot read. */
  _malformed(what: string): void {
    if (this.#ended || this.#closed) return;
    if (++this.#malformed > 1) {
      this.#client._remove(this);
      this.#finish(
        new HubError(
          `thread ${JSON.stringify(this.thread)}: the gateway sent ${what} again after a ` +
            "resync from a snapshot; the subscription stopped rather than go on with a gap",
        ),
      );
      return;
    }
    console.warn(
      `agui-hub client: thread ${JSON.stringify(this.thread)}: ${what}; ` +
        "resubscribing from a snapshot",
    );
    this.#resync = true;
    this.awaiting = 0; // no reply has this id: frames are dropped until the resubscribe's
    this.#client._resubscribe(this);
  }

  /** A `recovered: true` across epochs (a gateway bug, a race): offsets of one epoch mean
   * nothing in another, so resubscribe from a snapshot instead of believing it. */
  #untrusted(epoch: unknown, recovered: boolean): boolean {
    const received = this.received;
    if (!recovered || this.#resync || received === null || received.epoch === null) return false;
    if (epoch === received.epoch) return false;
    console.warn(
      `agui-hub client: thread ${JSON.stringify(this.thread)}: the gateway answered ` +
        `recovered=true in epoch ${String(epoch)} to a resume from epoch ${received.epoch}; ` +
        "not trusted: resubscribing from a snapshot",
    );
    this.#resync = true;
    this.awaiting = 0; // no reply has this id: frames are dropped until the resubscribe's
    this.#client._resubscribe(this);
    return true;
  }

  /** @internal */
  _onSubscribed(frame: Frame): void {
    if (this.lagged) return;
    const id = frame.id ?? null;
    if (id !== null && id !== this.awaiting) return; // the reply to a subscribe this one replaced
    if (id === null && this.awaiting !== null) return; // about a subscription this one replaced
    if (!wellFormed(frame)) {
      this.awaiting = null;
      this._malformed("a malformed subscribed frame");
      return;
    }
    const epoch = typeof frame.epoch === "string" ? frame.epoch : null;
    const offset = typeof frame.offset === "string" ? frame.offset : START_OFFSET;
    let recovered = frame.recovered === true;
    const received = this.received;
    let resumed: boolean;
    let position: Position | null;
    if (id !== null) {
      this.awaiting = null;
      this.retries = 0;
      if (this.#untrusted(epoch, recovered)) return;
      resumed = this.#subscribedOnce;
      this.#subscribedOnce = true;
      if (this.#resync) {
        // The reply to the "snapshot" resubscribe: a snapshot follows and replaces what
        // the consumer built, which recovered nothing.
        this.#resync = false;
        recovered = false;
      }
      if (!recovered) position = null;
      else if (received !== null) position = { offset: received.offset, epoch };
      else if (this.#start === "live") position = { offset, epoch };
      else if (this.#start === "start") position = { offset: START_OFFSET, epoch };
      else position = null;
    } else if (this.#untrusted(epoch, recovered)) {
      return;
    } else {
      // An announcement: the thread's first event created its epoch, or the thread was
      // re-created (recovered false: a snapshot follows and sets the position).
      resumed = false;
      position = recovered ? { offset: received !== null ? received.offset : offset, epoch } : null;
    }
    this.#push(
      { kind: "subscribed", thread: this.thread, epoch, offset, recovered, resumed },
      position,
    );
  }

  /** @internal */
  _onSnapshot(frame: Frame): void {
    if (this.awaiting !== null || this.lagged) return;
    const events = frame.events;
    if (
      !wellFormed(frame) ||
      !Array.isArray(events) ||
      !events.every((event) => isEventLike(event))
    ) {
      this._malformed("a malformed snapshot frame");
      return;
    }
    this.#malformed = 0;
    const offset = typeof frame.offset === "string" ? frame.offset : START_OFFSET;
    const epoch = typeof frame.epoch === "string" ? frame.epoch : null;
    const complete = frame.complete !== false;
    this.#push(
      {
        kind: "snapshot",
        thread: this.thread,
        offset,
        epoch,
        complete,
        events: events as AguiEvent[],
      },
      { offset, epoch },
    );
  }

  /** @internal Returns false when the frame could not be taken (the buffer is full). */
  _onEvent(frame: Frame): boolean {
    if (this.awaiting !== null || this.lagged) return true;
    const offset = frame.offset;
    const event = frame.event;
    let key: [bigint, bigint] | null = null;
    try {
      if (typeof offset === "string" && isEventLike(event)) key = offsetKey(offset);
    } catch {
      // not an offset: malformed
    }
    if (key === null) {
      this._malformed("a malformed event frame");
      return true;
    }
    const received = this.received;
    if (received !== null) {
      if (received !== this.#receivedKeyOf) {
        this.#receivedKeyOf = received;
        this.#receivedKey = offsetKey(received.offset);
      }
      if (compareKeys(key, this.#receivedKey) <= 0) return true; // delivered already
    }
    if (this.#iterating && this.#buffered >= this.#maxBuffer) {
      // Not read fast enough: stop taking frames; once the iterator drained half the
      // buffer, resubscribe from the last buffered item (nothing lost, nothing repeated).
      this.lagged = true;
      return false;
    }
    this.#malformed = 0;
    if (this.branch !== undefined && (event as Frame).type === "RUN_STARTED") {
      const runId = (event as Frame).runId;
      // Sent on the branch, so it continues it: resume with it from now on.
      if (typeof runId === "string" && runId) this.branch = runId;
    }
    const position = { offset: offset as string, epoch: received !== null ? received.epoch : null };
    this.#push(
      { kind: "event", thread: this.thread, offset: offset as string, event: event as AguiEvent },
      position,
    );
    this.#receivedKeyOf = position;
    this.#receivedKey = key;
    return true;
  }

  /** @internal A `presence` frame without id, or a `joined` or `left` frame. */
  _onPresence(frame: Frame): void {
    // Not asked for; or about a subscription this one replaced, or dropped until the
    // resubscribe, after which the gateway sends the whole list again.
    if (this.#presence === null || this.awaiting !== null || this.lagged) return;
    if (this.#ended || this.#closed) return;
    const type = frame.type;
    if (type !== "presence" && type !== "joined" && type !== "left") return;
    const watchers = this.#watchers;
    const count = presenceCount(frame);
    let entries = presenceEntries(frame.entries);
    let next: PresenceState;
    if (type === "presence") {
      watchers.clear();
      const off = frame.off === true;
      if (off) entries = [];
      for (const entry of entries) watchers.set(entry.connection, entry);
      next = {
        count: off ? 0 : count,
        entries: [...watchers.values()],
        // (Count only: nobody is named, and that is not "more".)
        more: !off && frame.hidden !== true && (frame.more === true || count > watchers.size),
        hidden: frame.hidden === true,
        self: !off && typeof frame.connection === "string" ? frame.connection : null,
        off,
        known: true,
      };
    } else {
      if (type === "joined") {
        for (const entry of entries) watchers.set(entry.connection, entry);
      } else {
        entries = entries.map((entry) => {
          const kept = watchers.get(entry.connection);
          watchers.delete(entry.connection);
          return kept ?? entry;
        });
      }
      const entriesNow = [...watchers.values()];
      next = { ...this.#presence, count, entries: entriesNow, more: count > watchers.size };
    }
    this.#presence = Object.freeze(next);
    this.#callPresenceListeners(this.#presence, { change: type, count: next.count, entries });
  }
}

// -- the client ---------------------------------------------------------------------------------

/** One command that waits for its reply: sent again after a reconnect while unanswered. */
interface Outgoing {
  command: Frame;
  id: number;
  sentOn: unknown;
  /** A request (ping, auth) is sent again after a reconnect, a publish goes again with its
   * lane, a probe (the liveness ping) is not sent again. */
  kind: "request" | "publish" | "probe";
  reply: (frame: Frame) => void;
  error: (frame: Frame) => void;
  fail: (error: unknown) => void;
}

/** One publish: waits its turn in its thread's lane. */
interface PublishEntry extends Outgoing {
  thread: string;
  held: boolean; // paused (rate_limited, store_unavailable): the ones behind it wait
  done: boolean;
  attempts: number;
  deadline: number | null;
  timer: Timer | null;
  resolve: (offsets: string[]) => void;
}

/**
 * One connection to a gateway, shared by subscriptions and publishes; reconnects and
 * resumes by itself until close(), or until the gateway refuses it for good
 * (ConnectionRejected) or giveUpAfter passed (HubUnreachable).
 */
export class HubClient {
  readonly url: string;
  readonly encoding: Encoding;
  readonly #subprotocol: string;
  readonly #WebSocket: SocketConstructor;
  #token: string | null;
  readonly #provider: TokenProvider | null;
  readonly #backoffMin: number;
  readonly #backoffMax: number;
  readonly #pingInterval: number;
  readonly #pingTimeout: number;
  readonly #openTimeout: number;
  readonly #giveUpAfter: number | null;
  readonly #maxFrameBytes: number;
  readonly #maxPendingPublishes: number;
  /** @internal The `client` option, checked: what subscriptions and `auth` send. */
  readonly _clientInfo: ClientInfo | undefined;
  readonly #encoder = new Encoder({ ignoreUndefined: true });
  readonly #decoder = new Decoder({ useBigInt64: false });
  readonly #textEncoder = new TextEncoder();

  #status: ConnectionStatus;
  #statusListeners = new Set<(status: ConnectionStatus) => void>();
  #ws: Socket | null = null;
  #open = false;
  #everOpened = false;
  #openedAt = 0;
  #lostAt: number;
  #lastError: string | null = null; // the socket's error event, for a failed handshake
  #backoffAttempt = 0; // grows over connections until one proves healthy
  #faulted = false; // a CLIENT_FAULTS close since the gateway last answered
  #refused = false; // the provider's last token got a 401
  #kicked = false; // a command cut a reconnect pause short since the gateway last answered
  #pendingPublishes = 0;
  #failure: HubError | null = null;
  #closed = false;
  #closing: Promise<void> | null = null;
  #timers = new Set<Timer>();
  #retryTimer: Timer | null = null;
  #openTimer: Timer | null = null;
  #watchdog: Timer | null = null;
  #lastFrameAt = 0;
  #pingSentAt = -1;
  #refreshTimer: Timer | null = null;
  #refreshAt: number | null = null; // ms since the epoch
  #expires: number | null = null;
  #nextId = 1;
  #eventPrefix = randomHex(8);
  #eventCounter = 0;
  #subs = new Map<string, Subscription>();
  #inflight = new Map<number, Outgoing>(); // sent, awaiting a reply, by id
  #waiting = new Set<Outgoing>(); // requests (ping, auth) waiting for a connection
  #lanes = new Map<string, PublishEntry[]>();
  #unsubscribes = new Map<number, string>();

  constructor(options: HubClientOptions) {
    if (typeof options !== "object" || options === null) {
      throw new HubError("new HubClient({url, ...}): the options object is missing");
    }
    let parsed: URL;
    try {
      parsed = new URL(options.url);
    } catch {
      throw new HubError(`not a WebSocket URL: ${JSON.stringify(options.url)}`);
    }
    if (parsed.protocol !== "ws:" && parsed.protocol !== "wss:") {
      throw new HubError(`not a WebSocket URL (ws:// or wss://): ${options.url}`);
    }
    this.url = options.url;
    const encoding = options.encoding ?? "msgpack";
    if (encoding !== "msgpack" && encoding !== "json") {
      throw new HubError('encoding is "msgpack" or "json"');
    }
    this.encoding = encoding;
    this.#subprotocol = encoding === "msgpack" ? SUBPROTOCOL_MSGPACK : SUBPROTOCOL_JSON;
    const constructor =
      options.WebSocket ?? (globalThis as { WebSocket?: unknown }).WebSocket ?? null;
    if (typeof constructor !== "function") {
      throw new HubError(
        "no WebSocket here: pass options.WebSocket (in Node 20: WebSocket from the ws package)",
      );
    }
    this.#WebSocket = constructor as SocketConstructor;
    const token = options.token;
    const badToken = typeof token !== "function" && (typeof token !== "string" || !token);
    if (token !== undefined && badToken) {
      throw new HubError("token is a non-empty string or a function that returns one");
    }
    this.#token = typeof token === "string" ? token : null;
    this.#provider = typeof token === "function" ? token : null;
    const ms = (name: string, value: number | undefined, fallback: number): number => {
      const chosen = value ?? fallback;
      if (typeof chosen !== "number" || !Number.isFinite(chosen) || chosen < 0) {
        throw new HubError(`${name} is a number of ms, at least 0`);
      }
      return chosen;
    };
    this.#backoffMin = ms("backoffMin", options.backoffMin, 500);
    this.#backoffMax = Math.max(this.#backoffMin, ms("backoffMax", options.backoffMax, 15_000));
    this.#pingInterval = Math.max(1, ms("pingInterval", options.pingInterval, 15_000));
    this.#pingTimeout = Math.max(1, ms("pingTimeout", options.pingTimeout, 10_000));
    this.#openTimeout = Math.max(1, ms("openTimeout", options.openTimeout, 10_000));
    this.#giveUpAfter =
      options.giveUpAfter === null || options.giveUpAfter === undefined
        ? null
        : ms("giveUpAfter", options.giveUpAfter, 0);
    this.#maxFrameBytes = ms("maxFrameBytes", options.maxFrameBytes, 1024 * 1024);
    const pending = options.maxPendingPublishes ?? 1000;
    if (!Number.isInteger(pending) || pending < 1) {
      throw new HubError("maxPendingPublishes is an integer of at least 1");
    }
    this.#maxPendingPublishes = pending;
    this._clientInfo = checkClientInfo(options.client);
    this.#status = Object.freeze({
      state: "connecting" as ConnectionState,
      reconnects: 0,
      attempt: 0,
      closeCode: null,
      closeReason: "",
    });
    this.#lostAt = now();
    void this.#connect();
  }

  // -- status -----------------------------------------------------------------------------------

  /** Where the connection is; a new object at every change. */
  get status(): ConnectionStatus {
    return this.#status;
  }

  /** Call *listener* with the status at every transition; returns the unsubscribe. */
  onStatus(listener: (status: ConnectionStatus) => void): () => void {
    this.#statusListeners.add(listener);
    return () => this.#statusListeners.delete(listener);
  }

  #setStatus(patch: Partial<ConnectionStatus>): void {
    const next: ConnectionStatus = { ...this.#status, ...patch };
    if (!("error" in patch) && next.state === "open") delete next.error;
    if ("error" in patch && patch.error === undefined) delete next.error;
    this.#status = Object.freeze(next);
    for (const listener of [...this.#statusListeners]) {
      try {
        listener(this.#status);
      } catch (error) {
        report("a status listener threw", error);
      }
    }
  }

  // -- commands ---------------------------------------------------------------------------------

  /** Follow *thread*; the subscribe command goes out at once (or when connected). One
   * subscription per thread and client. */
  subscribe(thread: string, options: SubscribeOptions = {}): Subscription {
    checkThread(thread);
    this.#usable();
    if (this.#subs.has(thread)) {
      throw new HubError(`already subscribed to thread ${JSON.stringify(thread)} on this client`);
    }
    const sub = new Subscription(this, thread, options);
    this.#subs.set(thread, sub);
    this._resubscribe(sub);
    return sub;
  }

  /** Publish *events* into *thread*; resolves with one offset per event.
   *
   * Calls about one thread are sent in call order without waiting for each other's
   * replies (pipelined); those unanswered when the connection drops are sent again after
   * the reconnect, with the same event ids and before any later one, so a drop never
   * reorders nor duplicates a thread's events. A refusal rejects with CommandRejected
   * (its `code`, and `index` for the event at fault). */
  publish(thread: string, events: AguiEvent[], options: PublishOptions = {}): Promise<string[]> {
    try {
      checkThread(thread);
      this.#usable();
      if (!Array.isArray(events)) throw new HubError("events is an array of AG-UI events");
      if (events.length > MAX_EVENTS_PER_PUBLISH) {
        throw new HubError(`at most ${MAX_EVENTS_PER_PUBLISH} events per publish`);
      }
      events.forEach((event, index) => {
        if (typeof event !== "object" || event === null || typeof event.type !== "string") {
          throw new HubError(`events[${index}] is not an AG-UI event (an object with a type)`);
        }
      });
      let ids = options.eventIds;
      if (ids !== undefined) {
        if (!Array.isArray(ids) || ids.length !== events.length) {
          throw new HubError("eventIds must hold one id per event");
        }
        if (!ids.every((id) => typeof id === "string" && id.length > 0)) {
          throw new HubError("event ids are non-empty strings");
        }
        if (new Set(ids).size !== ids.length) {
          throw new HubError("eventIds must all be different (each event needs its own id)");
        }
        ids = [...ids];
      }
      if (events.length === 0) return Promise.resolve([]);
      if (this.#pendingPublishes >= this.#maxPendingPublishes) {
        const why = this.#open ? "" : " (the client is not connected)";
        throw new HubError(
          `${this.#pendingPublishes} publishes are waiting for their reply${why}, the ` +
            `maxPendingPublishes limit: wait for some to settle before publishing more`,
        );
      }
      ids ??= this.newEventIds(events.length);
      const timeout = options.timeout === undefined ? this.#giveUpAfter : options.timeout;
      return this.#enqueuePublish(thread, [...events], ids, timeout);
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** Round trip of a protocol ping, in ms (waits for a connection up to *timeout*). */
  async ping(options: { timeout?: number } = {}): Promise<number> {
    const began = now();
    await this.#request({ type: "ping" }, options.timeout ?? this.#openTimeout);
    return now() - began;
  }

  /** The runs of *thread* in the order they started: its newest *limit* (default 1000,
   * at most 4096), `more` when older ones were left out. Each run names the run it
   * continues (`parentRunId`: its own, or the run before it), so they form a tree
   * (docs/protocol.md, "runs"). Rejects with a HubError `forbidden` without the read
   * grant. */
  async runs(
    thread: string,
    options: { limit?: number; timeout?: number } = {},
  ): Promise<{ runs: RunInfo[]; more: boolean; agents: string[] }> {
    checkThread(thread);
    const command: Frame = { type: "runs", thread, limit: options.limit ?? 1000 };
    const reply = await this.#request(command, options.timeout ?? this.#openTimeout);
    return {
      runs: Array.isArray(reply.runs) ? (reply.runs as RunInfo[]) : [],
      more: reply.more === true,
      agents: Array.isArray(reply.agents) ? (reply.agents as string[]) : [],
    };
  }

  /** Who watches *thread* now, on every gateway of the store: `count`, the first *limit*
   * (default 100, at most 1000) `entries` by the time they joined, `more` when some were left
   * out, `hidden` when the gateway shows the count only. Rejects with CommandRejected
   * `presence_off` (the gateway keeps no presence) or `forbidden` (no read grant). To follow
   * the changes, subscribe with `presence: true` instead. */
  async presence(
    thread: string,
    options: { limit?: number; timeout?: number } = {},
  ): Promise<Presence> {
    checkThread(thread);
    const limit = options.limit ?? 100;
    if (!Number.isInteger(limit) || limit < 1 || limit > MAX_PRESENCE_LIMIT) {
      throw new HubError(`limit is an integer from 1 to ${MAX_PRESENCE_LIMIT}`);
    }
    const command: Frame = { type: "presence", thread, limit };
    const reply = await this.#request(command, options.timeout ?? this.#openTimeout);
    return {
      count: presenceCount(reply),
      entries: presenceEntries(reply.entries),
      more: reply.more === true,
      hidden: reply.hidden === true,
    };
  }

  /** Ask the gateway to run upstream agent *agent* in *thread* (docs/bridge.md): its input
   * is built from the thread, or with `parentRunId` from the branch that ends with that run
   * (regenerate, edit), plus `messages`. Resolves with the `running` reply once the run is
   * going; its events come in the thread. Needs the publish and run grants. */
  async run(
    thread: string,
    agent: string,
    options: { messages?: unknown[]; parentRunId?: string; runId?: string; timeout?: number } = {},
  ): Promise<Frame> {
    checkThread(thread);
    const command: Frame = { type: "run", thread, agent, messages: options.messages ?? [] };
    if (options.parentRunId !== undefined) command.parentRunId = options.parentRunId;
    if (options.runId !== undefined) command.runId = options.runId;
    return this.#request(command, options.timeout ?? this.#openTimeout);
  }

  /** Fresh event ids, unique to this client: "<random prefix>-<counter>". */
  newEventIds(count: number): string[] {
    const ids: string[] = [];
    for (let i = 0; i < count; i++) ids.push(`${this.#eventPrefix}-${++this.#eventCounter}`);
    return ids;
  }

  /** Close the connection; iterators end after what they buffered, commands in flight
   * reject, every timer is cleared. */
  close(): Promise<void> {
    if (this.#closing !== null) return this.#closing;
    this.#closed = true;
    this.#clearAllTimers();
    const ws = this.#ws;
    this.#ws = null;
    this.#open = false;
    const closed = new HubError("the client was closed");
    this.#rejectAll(closed);
    const subs = [...this.#subs.values()];
    this.#subs.clear();
    for (const sub of subs) sub._end(null);
    this.#setStatus({ state: "closed", attempt: 0 });
    this.#closing = ws === null ? Promise.resolve() : this.#shut(ws);
    return this.#closing;
  }

  // -- internals: requests ----------------------------------------------------------------------

  #usable(): void {
    if (this.#failure !== null) throw this.#failure;
    if (this.#closed) throw new HubError("the client is closed");
  }

  #id(): number {
    return this.#nextId++;
  }

  #send(ws: Socket, frame: Frame): number {
    const data: string | Uint8Array =
      this.encoding === "msgpack" ? this.#encoder.encode(frame) : JSON.stringify(frame);
    // A UTF-16 unit is at most 3 UTF-8 bytes: most frames need no measuring.
    const size =
      typeof data !== "string"
        ? data.length
        : data.length * 3 <= this.#maxFrameBytes
          ? 0
          : this.#textEncoder.encode(data).length;
    if (size > this.#maxFrameBytes) return size;
    try {
      ws.send(data);
    } catch (error) {
      // The socket is closing: its close event brings the reconnect that resends.
      console.warn(`agui-hub client: send failed: ${describe(error)}`);
    }
    return 0;
  }

  /** Send *out* on the open connection with a fresh id; 0, or the frame's size when it is
   * over maxFrameBytes (nothing sent). */
  #sendOutgoing(out: Outgoing): number {
    const ws = this.#ws as Socket;
    if (out.sentOn !== null) this.#inflight.delete(out.id);
    out.id = this.#id();
    const size = this.#send(ws, { ...out.command, id: out.id });
    if (size > 0) return size;
    out.sentOn = ws;
    this.#inflight.set(out.id, out);
    return 0;
  }

  #request(command: Frame, timeout: number): Promise<Frame> {
    this.#usable();
    return new Promise((resolve, reject) => {
      const deadline = now() + timeout;
      let done = false;
      const finish = (): boolean => {
        if (done) return false;
        done = true;
        this.#clearTimer(timer);
        this.#waiting.delete(out);
        if (this.#inflight.get(out.id) === out) this.#inflight.delete(out.id);
        return true;
      };
      const out: Outgoing = {
        command,
        id: 0,
        sentOn: null,
        kind: "request",
        reply: (frame) => {
          if (finish()) resolve(frame);
        },
        error: (frame) => {
          const error = this.#commandError(frame);
          const wait = jittered(retryAfterMs(frame));
          if (error.code === "rate_limited" && now() + wait < deadline) {
            // Not carried out: the same command again once the gateway allows it.
            out.sentOn = null;
            this.#timer(() => {
              if (!done) this.#sendOrWait(out);
            }, wait);
            return;
          }
          if (finish()) reject(error);
        },
        fail: (error) => {
          if (finish()) reject(error);
        },
      };
      const timer = this.#timer(() => {
        out.fail(new HubUnreachable(`no reply from ${this.url} in ${timeout} ms`));
      }, timeout);
      this.#sendOrWait(out);
    });
  }

  #sendOrWait(out: Outgoing): void {
    if (this.#closed || this.#failure !== null) return;
    if (this.#open) {
      this.#waiting.delete(out);
      this.#sendOutgoing(out);
    } else {
      this.#waiting.add(out);
      this.#kick();
    }
  }

  #commandError(frame: Frame): CommandRejected {
    const code = typeof frame.code === "string" ? frame.code : "error";
    const message = typeof frame.message === "string" ? frame.message : "";
    const details: { index?: number; retryAfter?: number; thread?: string } = {};
    if (typeof frame.index === "number" && Number.isInteger(frame.index)) {
      details.index = frame.index;
    }
    if (code === "rate_limited") details.retryAfter = retryAfterMs(frame) / 1000;
    if (typeof frame.thread === "string") details.thread = frame.thread;
    return new CommandRejected(code, message, details);
  }

  // -- internals: publishing --------------------------------------------------------------------

  #enqueuePublish(
    thread: string,
    events: AguiEvent[],
    ids: string[],
    timeout: number | null,
  ): Promise<string[]> {
    return new Promise((resolve, reject) => {
      const command: Frame = { type: "publish", thread, events, eventIds: ids };
      let lane = this.#lanes.get(thread);
      if (lane === undefined) {
        lane = [];
        this.#lanes.set(thread, lane);
      }
      const theLane = lane;
      const finish = (): void => {
        if (entry.done) return;
        entry.done = true;
        this.#pendingPublishes--;
        if (entry.timer !== null) this.#clearTimer(entry.timer);
        entry.timer = null;
        this.#inflight.delete(entry.id);
        const index = theLane.indexOf(entry);
        if (index >= 0) theLane.splice(index, 1);
        if (theLane.length === 0 && this.#lanes.get(thread) === theLane) this.#lanes.delete(thread);
        else this.#pump(theLane);
      };
      const entry: PublishEntry = {
        command,
        id: 0,
        sentOn: null,
        kind: "publish",
        thread,
        held: false,
        done: false,
        attempts: 0,
        deadline: timeout === null ? null : now() + timeout,
        timer: null,
        resolve: (offsets) => {
          if (entry.done) return;
          finish();
          resolve(offsets);
        },
        fail: (error) => {
          if (entry.done) return;
          finish();
          reject(error);
        },
        reply: (frame) => {
          const offsets = frame.offsets;
          if (!Array.isArray(offsets) || offsets.length !== events.length) {
            const what = JSON.stringify(frame);
            entry.fail(new HubError(`the gateway answered a publish with ${what}`));
          } else {
            entry.resolve(offsets as string[]);
          }
        },
        error: (frame) => this.#publishRefused(entry, theLane, frame),
      };
      if (entry.deadline !== null) {
        entry.timer = this.#timer(() => {
          entry.timer = null;
          entry.fail(
            new HubUnreachable(
              `publish to ${this.url} gave up after ${timeout} ms without a reply`,
            ),
          );
        }, timeout as number);
      }
      lane.push(entry);
      this.#pendingPublishes++;
      if (this.#open) this.#pump(lane);
      else this.#kick();
    });
  }

  /** Send the lane's entries that are not sent on this connection, in order, stopping at
   * one that is paused: the gateway then receives a thread's publishes in call order. */
  #pump(lane: PublishEntry[]): void {
    if (!this.#open) return;
    const ws = this.#ws;
    for (const entry of [...lane]) {
      if (entry.done || entry.sentOn === ws) continue;
      if (entry.held) return;
      const size = this.#sendOutgoing(entry);
      if (size > 0) {
        entry.fail(
          new CommandRejected(
            "payload_too_large",
            `the publish frame is ${size} bytes, over maxFrameBytes (${this.#maxFrameBytes})`,
            { thread: entry.thread },
          ),
        );
      }
    }
  }

  #publishRefused(entry: PublishEntry, lane: PublishEntry[], frame: Frame): void {
    const error = this.#commandError(frame);
    if (error.code !== "rate_limited" && error.code !== "store_unavailable") {
      entry.fail(error);
      return;
    }
    // Not stored (rate_limited) or maybe not (store_unavailable): send it again, the same
    // event ids, before the publishes behind it that are not sent yet.
    const delay =
      error.code === "rate_limited"
        ? jittered(retryAfterMs(frame))
        : backoffDelay(entry.attempts++, this.#backoffMin, this.#backoffMax);
    if (entry.deadline !== null && now() + delay > entry.deadline) {
      entry.fail(error);
      return;
    }
    this.#inflight.delete(entry.id);
    entry.sentOn = null;
    entry.held = true;
    this.#timer(() => {
      entry.held = false;
      this.#pump(lane);
    }, delay);
  }

  // -- internals: subscriptions -----------------------------------------------------------------

  /** @internal Subscribe *sub* again from what it took in (on the open connection). */
  _resubscribe(sub: Subscription): void {
    if (sub.retryTimer !== null) this.#clearTimer(sub.retryTimer);
    sub.retryTimer = null;
    if (!this.#open || this.#subs.get(sub.thread) !== sub || sub.lagged) return;
    const ws = this.#ws as Socket;
    sub.sentOn = ws;
    this.#send(ws, sub._subscribeCommand(this.#id()));
  }

  /** @internal */
  _remove(sub: Subscription): void {
    if (sub.retryTimer !== null) this.#clearTimer(sub.retryTimer);
    sub.retryTimer = null;
    if (this.#subs.get(sub.thread) !== sub) return;
    this.#subs.delete(sub.thread);
    if (this.#open && sub.sentOn === this.#ws) this.#unsubscribe(sub.thread);
  }

  #unsubscribe(thread: string): void {
    const id = this.#id();
    this.#unsubscribes.set(id, thread);
    this.#send(this.#ws as Socket, { type: "unsubscribe", id, thread });
  }

  // -- internals: timers ------------------------------------------------------------------------

  #timer(callback: () => void, delay: number): Timer {
    const timer = setTimeout(
      () => {
        this.#timers.delete(timer);
        try {
          callback();
        } catch (error) {
          report("internal error", error);
        }
      },
      Math.min(Math.max(delay, 0), LONGEST_TIMER),
    );
    this.#timers.add(timer);
    return timer;
  }

  /** @internal */
  _clearTimer(timer: Timer): void {
    this.#clearTimer(timer);
  }

  #clearTimer(timer: Timer): void {
    clearTimeout(timer);
    this.#timers.delete(timer);
  }

  #clearAllTimers(): void {
    for (const timer of this.#timers) clearTimeout(timer);
    this.#timers.clear();
    this.#retryTimer = this.#openTimer = this.#watchdog = this.#refreshTimer = null;
    for (const sub of this.#subs.values()) sub.retryTimer = null;
  }

  // -- internals: the connection ----------------------------------------------------------------

  async #connect(): Promise<void> {
    this.#retryTimer = null;
    if (this.#closed || this.#failure !== null) return;
    this.#setStatus({
      state: this.#everOpened ? "reconnecting" : "connecting",
      attempt: this.#status.attempt + 1,
    });
    let token: string | null;
    try {
      token = await this.#tokenNow();
    } catch (error) {
      if (this.#closed || this.#failure !== null) return;
      console.warn(`agui-hub client: the token provider failed: ${describe(error)}`);
      this.#setStatus({ error: error instanceof Error ? error : new HubError(describe(error)) });
      this.#scheduleAttempt();
      return;
    }
    if (this.#closed || this.#failure !== null) return;
    const protocols = [this.#subprotocol];
    if (token !== null) {
      if (!TOKEN_CHARS.test(token)) {
        this.#fail(
          new ConnectionRejected(
            4401,
            "the token has characters a WebSocket subprotocol cannot carry",
          ),
        );
        return;
      }
      protocols.push(BEARER_PREFIX + token);
    }
    let ws: Socket;
    try {
      ws = new this.#WebSocket(this.url, protocols);
    } catch (error) {
      this.#fail(new HubUnreachable(`cannot open a WebSocket to ${this.url}: ${describe(error)}`));
      return;
    }
    this.#ws = ws;
    this.#lastError = null;
    ws.binaryType = "arraybuffer";
    ws.onopen = () => this.#onOpen(ws, token);
    ws.onmessage = (event) => this.#onMessage(ws, event.data);
    ws.onerror = (event) => {
      if (ws !== this.#ws) return;
      const { message, error } = (event ?? {}) as { message?: unknown; error?: unknown };
      if (typeof message === "string" && message) this.#lastError = message;
      else this.#lastError = error instanceof Error ? error.message : null;
    };
    ws.onclose = (event) => this.#lost(ws, event.code, event.reason ?? "");
    this.#openTimer = this.#timer(() => {
      this.#openTimer = null;
      if (ws === this.#ws && !this.#open) {
        this.#lastError = `no WebSocket handshake in ${this.#openTimeout} ms`;
        this.#drop(ws, 1006, this.#lastError);
      }
    }, this.#openTimeout);
  }

  async #tokenNow(): Promise<string | null> {
    if (this.#provider === null) return this.#token;
    const token = await this.#provider();
    if (typeof token !== "string" || !token) {
      throw new HubError(`the token provider returned ${typeof token}, not a non-empty string`);
    }
    return token;
  }

  #onOpen(ws: Socket, token: string | null): void {
    if (ws !== this.#ws || this.#closed) return;
    if (this.#openTimer !== null) this.#clearTimer(this.#openTimer);
    this.#openTimer = null;
    if (ws.protocol !== this.#subprotocol) {
      this.#lastError = `${this.url} did not accept the ${this.#subprotocol} subprotocol`;
      this.#drop(ws, 1006, this.#lastError);
      return;
    }
    const reconnect = this.#everOpened;
    this.#open = true;
    this.#everOpened = true;
    this.#openedAt = now();
    this.#refused = false;
    this.#lastFrameAt = now();
    this.#pingSentAt = -1;
    this.#adopt(token, null);
    this.#setStatus({
      state: "open",
      attempt: 0,
      reconnects: this.#status.reconnects + (reconnect ? 1 : 0),
      error: undefined,
    });
    if (ws !== this.#ws || !this.#open) return; // a status listener closed the client
    // Subscribes first: a publish sent after a subscribe to the same thread is carried
    // out after it, so the subscription gets the event.
    for (const sub of [...this.#subs.values()]) {
      if (sub.sentOn !== ws) this._resubscribe(sub);
    }
    for (const lane of [...this.#lanes.values()]) this.#pump(lane);
    for (const out of [...this.#waiting]) this.#sendOrWait(out);
    this.#scheduleWatchdog(this.#pingInterval);
  }

  #onMessage(ws: Socket, data: unknown): void {
    if (ws !== this.#ws || !this.#open) return;
    this.#lastFrameAt = now();
    let frame: unknown;
    try {
      if (this.encoding === "msgpack") {
        if (typeof data === "string") {
          console.warn("agui-hub client: a text frame on a msgpack connection ignored");
          return;
        }
        const bytes =
          data instanceof ArrayBuffer
            ? new Uint8Array(data)
            : ArrayBuffer.isView(data)
              ? new Uint8Array(data.buffer, data.byteOffset, data.byteLength)
              : null;
        if (bytes === null) {
          console.warn("agui-hub client: a frame of an unknown kind ignored");
          return;
        }
        frame = this.#decoder.decode(bytes);
      } else {
        if (typeof data !== "string") {
          console.warn("agui-hub client: a binary frame on a JSON connection ignored");
          return;
        }
        frame = JSON.parse(data);
      }
    } catch (error) {
      // Which thread's frame it was is unknown: every subscription may have lost an event.
      // Reconnect, and resubscribe each from a snapshot (publishes go again with their ids).
      const why = `an undecodable frame (${describe(error)})`;
      this.#drop(ws, 1006, why);
      for (const sub of [...this.#subs.values()]) sub._malformed(why);
      return;
    }
    if (typeof frame !== "object" || frame === null || Array.isArray(frame)) return;
    try {
      this.#dispatch(frame as Frame);
    } catch (error) {
      report(`internal error handling a ${JSON.stringify((frame as Frame).type)} frame`, error);
    }
  }

  #dispatch(frame: Frame): void {
    const kind = frame.type;
    const thread = frame.thread;
    const sub = typeof thread === "string" ? this.#subs.get(thread) : undefined;
    const id = typeof frame.id === "number" ? frame.id : null;
    switch (kind) {
      case "event":
        if (sub !== undefined && !sub._onEvent(frame)) {
          // The subscription's buffer is full: unsubscribe until its iterator drained it.
          if (sub.sentOn === this.#ws) this.#unsubscribe(sub.thread);
          sub.sentOn = null;
        }
        return;
      case "snapshot":
        sub?._onSnapshot(frame);
        return;
      case "joined":
      case "left":
        sub?._onPresence(frame);
        return;
      case "subscribed":
        if (sub !== undefined) {
          if (id !== null && id === sub.awaiting) this.#healthy(); // the gateway serves it
          sub._onSubscribed(frame);
        }
        return;
      case "error":
        this.#onError(frame, sub, id);
        return;
      case "unsubscribed":
        if (id !== null) this.#unsubscribes.delete(id);
        return;
      case "presence":
        if (id === null) {
          sub?._onPresence(frame);
          return;
        }
      // falls through: the reply to a presence command
      default: {
        // published, pong, authenticated, and the replies to other commands
        const out = id === null ? undefined : this.#inflight.get(id);
        if (out !== undefined) {
          this.#inflight.delete(id as number);
          this.#healthy();
          out.reply(frame);
        }
      }
    }
  }

  #onError(frame: Frame, sub: Subscription | undefined, id: number | null): void {
    const code = String(frame.code);
    const message = String(frame.message ?? "");
    const out = id === null ? undefined : this.#inflight.get(id);
    if (out !== undefined) {
      this.#inflight.delete(id as number);
      out.error(frame);
      return;
    }
    if (sub !== undefined && id !== null && id === sub.awaiting) {
      if (code === "store_unavailable") {
        // Not the subscription's fault: ask again after doubling pauses from about 1 s.
        const low = this.#backoffMin;
        const cap = Math.max(
          low,
          Math.min(this.#backoffMax, Math.max(low, 1000) * 2 ** Math.min(sub.retries, 30)),
        );
        sub.retries++;
        this.#retrySubscribe(sub, low + Math.random() * (cap - low));
        return;
      }
      if (code === "rate_limited") {
        this.#retrySubscribe(sub, jittered(retryAfterMs(frame)));
        return;
      }
      this.#subs.delete(sub.thread);
      sub._end(this.#commandError(frame));
      return;
    }
    if (id !== null && this.#unsubscribes.has(id)) {
      const thread = this.#unsubscribes.get(id) as string;
      this.#unsubscribes.delete(id);
      if (code === "rate_limited") {
        // Not carried out: the gateway would go on sending the thread's frames.
        this.#timer(() => {
          const current = this.#subs.get(thread);
          if (this.#open && (current === undefined || current.sentOn !== this.#ws)) {
            this.#unsubscribe(thread);
          }
        }, jittered(retryAfterMs(frame)));
      }
      return; // not_subscribed: it was done already
    }
    if (id === null && (code === "forbidden" || code === "unknown_run") && sub !== undefined) {
      // The gateway ended the subscription: the connection's grants (after a refresh) no
      // longer cover the thread, or the branch it followed is gone (the thread was
      // re-created). Not resubscribed on reconnect.
      this.#subs.delete(sub.thread);
      sub._end(this.#commandError(frame));
      return;
    }
    console.warn(`agui-hub client: error from the gateway: ${code} ${message}`);
  }

  #retrySubscribe(sub: Subscription, delay: number): void {
    if (sub.retryTimer !== null) this.#clearTimer(sub.retryTimer);
    sub.retryTimer = this.#timer(() => {
      sub.retryTimer = null;
      this._resubscribe(sub);
    }, delay);
  }

  /** The connection works: the next reconnect starts from the shortest pause. */
  #healthy(): void {
    this.#backoffAttempt = 0;
    this.#faulted = false;
    this.#kicked = false;
  }

  // -- internals: liveness ----------------------------------------------------------------------

  #scheduleWatchdog(delay: number): void {
    if (this.#watchdog !== null) this.#clearTimer(this.#watchdog);
    this.#watchdog = this.#timer(() => {
      this.#watchdog = null;
      this.#watch();
    }, delay);
  }

  /** Browsers cannot see WebSocket pings: an app-level ping after pingInterval ms without a
   * frame, and no frame pingTimeout ms after it means the connection is dead. */
  #watch(): void {
    const ws = this.#ws;
    if (ws === null || !this.#open) return;
    const at = now();
    const idle = at - this.#lastFrameAt;
    const pinged = this.#pingSentAt >= this.#lastFrameAt;
    if (pinged && at - this.#pingSentAt >= this.#pingTimeout) {
      this.#drop(ws, 1006, `no frame from the gateway for ${Math.round(idle)} ms`);
      return;
    }
    if (pinged) {
      this.#scheduleWatchdog(this.#pingSentAt + this.#pingTimeout - at);
      return;
    }
    if (idle >= this.#pingInterval) {
      const id = this.#id();
      // Answered or not, any frame counts: the reply itself needs no handling.
      const noop = (): void => undefined;
      const probe: Outgoing = {
        command: {},
        id,
        sentOn: ws,
        kind: "probe",
        reply: noop,
        error: noop,
        fail: noop,
      };
      this.#inflight.set(id, probe);
      this.#send(ws, { type: "ping", id });
      this.#pingSentAt = at;
      this.#scheduleWatchdog(this.#pingTimeout);
      return;
    }
    this.#scheduleWatchdog(this.#pingInterval - idle);
  }

  /** Give up on *ws* now (dead, or a handshake that failed), without waiting for its close. */
  #drop(ws: Socket, code: number, reason: string): void {
    ws.onopen = ws.onmessage = ws.onclose = null;
    // Never without an error listener: the ws package throws an unheard error event
    // (closing a socket still connecting emits one).
    ws.onerror = () => undefined;
    try {
      ws.close();
    } catch {
      // closing a socket that never opened may throw: it is given up anyway
    }
    ws.terminate?.();
    this.#lost(ws, code, reason);
  }

  #lost(ws: Socket, code: number, reason: string): void {
    if (ws !== this.#ws) return;
    const wasOpen = this.#open;
    this.#ws = null;
    this.#open = false;
    for (const timer of [this.#openTimer, this.#watchdog, this.#refreshTimer]) {
      if (timer !== null) this.#clearTimer(timer);
    }
    this.#openTimer = this.#watchdog = this.#refreshTimer = null;
    if (this.#closed || this.#failure !== null) return;
    if (!wasOpen) {
      this.#attemptFailed();
      return;
    }
    this.#lostAt = now();
    if (this.#lostAt - this.#openedAt >= this.#backoffMax) {
      // Lasted as long as the longest pause: reconnecting at once costs no more.
      this.#healthy();
    }
    const fault = CLIENT_FAULTS.get(code);
    // Nothing sent on it counts any more: all of it goes again after the reconnect.
    const sent = [...this.#inflight.values()];
    this.#inflight.clear();
    this.#unsubscribes.clear();
    for (const sub of this.#subs.values()) sub.sentOn = null;
    for (const out of sent) {
      out.sentOn = null;
      if (fault !== undefined) {
        // Sending the same command again would be refused again.
        const why = reason ? `: ${reason}` : "";
        out.error({
          type: "error",
          code: code === 1009 ? "payload_too_large" : "bad_frame",
          message:
            `the gateway closed the connection (${code} ${fault}${why}): ` +
            "it could not take a frame of this client",
        });
      } else if (out.kind === "request") {
        this.#waiting.add(out);
      }
    }
    const closed = { closeCode: code, closeReason: reason };
    if (NO_RESUME.has(code) && !(code === 4401 && this.#provider !== null)) {
      this.#fail(this.#rejected(code, reason), closed);
      return;
    }
    if (fault !== undefined) {
      if (this.#faulted) {
        this.#fail(
          new ConnectionRejected(
            code,
            `the gateway closed the connection with ${code} (${fault}) twice without answering ` +
              "anything in between: it refuses this client's frames; fix the client (e.g. " +
              "maxFrameBytes) rather than reconnect",
            reason,
          ),
          closed,
        );
        return;
      }
      this.#faulted = true;
    }
    this.#setStatus({ ...closed, state: "reconnecting", attempt: 0, error: undefined });
    this.#scheduleAttempt();
  }

  #rejected(code: number, reason: string): ConnectionRejected {
    const why = reason ? ` (${reason})` : "";
    let message = `the gateway closed the connection with ${code}${why}`;
    if (code === 4401) {
      message +=
        ": its credentials expired (or never came); pass token a function that returns fresh " +
        "tokens, so that the client renews them and reconnects by itself";
    } else if (code === 4403) {
      message += ": its credentials were revoked; do not reconnect with them";
    } else {
      message += ": it asked the client to stop";
    }
    return new ConnectionRejected(code, message, reason);
  }

  /** A connection attempt failed before the WebSocket opened. */
  #attemptFailed(): void {
    const why = this.#lastError ?? "the WebSocket closed before it opened";
    // Node's ws names the HTTP status of a refused handshake; browsers do not tell.
    const status = /Unexpected server response: (\d{3})/.exec(why)?.[1];
    if (status === "401") {
      // A provider's token may have expired on its way: one more, fresh one.
      if (this.#provider === null || this.#refused) {
        this.#fail(
          new ConnectionRejected(
            4401,
            this.#token === null && this.#provider === null
              ? `the gateway requires a token (HTTP 401); pass the token option`
              : "the gateway refused the token (HTTP 401); get a new token",
            why,
          ),
        );
        return;
      }
      this.#refused = true;
    } else if (status === "403") {
      this.#fail(
        new ConnectionRejected(
          4403,
          "the gateway refused the connection (HTTP 403): the credentials were revoked or " +
            "this Origin is not allowed; do not retry with them",
          why,
        ),
      );
      return;
    }
    this.#setStatus({ error: new HubUnreachable(`cannot connect to ${this.url}: ${why}`) });
    this.#scheduleAttempt();
  }

  #scheduleAttempt(): void {
    if (this.#closed || this.#failure !== null) return;
    let delay = backoffDelay(this.#backoffAttempt++, this.#backoffMin, this.#backoffMax);
    if (this.#giveUpAfter !== null) {
      const left = this.#lostAt + this.#giveUpAfter - now();
      if (left <= 0) {
        const last = this.#status.error ? `: ${this.#status.error.message}` : "";
        this.#fail(
          new HubUnreachable(
            `no connection to ${this.url} for ${this.#giveUpAfter} ms; gave up${last}`,
          ),
        );
        return;
      }
      delay = Math.min(delay, left);
    }
    this.#retryTimer = this.#timer(() => void this.#connect(), delay);
  }

  /** A command waits for the connection: cut the reconnect pause short (backoff spares a
   * gateway nobody needs right now, not one that is wanted), once per outage: commands
   * issued in a loop must not turn the backoff into a handshake storm. */
  #kick(): void {
    if (this.#retryTimer === null || this.#kicked || this.#refused) return;
    this.#kicked = true;
    this.#clearTimer(this.#retryTimer);
    this.#retryTimer = null;
    void this.#connect();
  }

  // -- internals: credentials -------------------------------------------------------------------

  /** The connection's credentials are now *token* (valid until *expires*, else its exp):
   * with a provider, renew them with an `auth` command before they expire. */
  #adopt(token: string | null, expires: number | null): void {
    this.#expires = expires ?? (token === null ? null : tokenExpiry(token));
    if (this.#refreshTimer !== null) this.#clearTimer(this.#refreshTimer);
    this.#refreshTimer = null;
    if (this.#expires === null || this.#provider === null) {
      this.#refreshAt = null;
      return;
    }
    const left = Math.max(0, this.#expires - Date.now());
    this.#refreshAt = this.#expires - Math.min(left * REFRESH_SHARE, REFRESH_LEAD_MAX);
    this.#scheduleRefresh();
  }

  #scheduleRefresh(): void {
    if (this.#refreshAt === null || !this.#open) return;
    const due = this.#refreshAt;
    this.#refreshTimer = this.#timer(() => {
      this.#refreshTimer = null;
      if (Date.now() < due) this.#scheduleRefresh(); // a timer is capped at ~24.8 days
      else void this.#refresh();
    }, due - Date.now());
  }

  async #refresh(): Promise<void> {
    const expires = this.#expires;
    const ws = this.#ws;
    try {
      const token = (await this.#tokenNow()) as string;
      const command: Frame = { type: "auth", token };
      if (this._clientInfo !== undefined) command.client = this._clientInfo;
      const reply = await this.#request(command, this.#openTimeout);
      if (reply.type !== "authenticated") throw new HubError(`auth answered ${String(reply.type)}`);
      if (this.#ws !== ws) return; // a reconnect brought its own token meanwhile
      const until = typeof reply.expires === "number" ? reply.expires * 1000 : null;
      this.#adopt(token, until);
    } catch (error) {
      if (this.#closed || this.#failure !== null || this.#ws !== ws) return;
      console.warn(
        `agui-hub client: renewing the credentials failed (${describe(error)}); ` +
          "trying again shortly",
      );
      const left = expires === null ? 0 : expires - Date.now();
      // Often enough to renew before the expiry; past it, until the gateway closes (4401)
      // and the reconnect brings a new token.
      const pause = left > 0 ? Math.min(10_000, Math.max(250, left / 4)) : 2000;
      this.#refreshAt = Date.now() + pause;
      this.#scheduleRefresh();
    }
  }

  // -- internals: the end -----------------------------------------------------------------------

  /** Stop for good: everything waiting fails with *error*. */
  #fail(error: HubError, patch: Partial<ConnectionStatus> = {}): void {
    if (this.#failure !== null || this.#closed) return;
    this.#failure = error;
    this.#clearAllTimers();
    const ws = this.#ws;
    this.#ws = null;
    this.#open = false;
    this.#rejectAll(error);
    const subs = [...this.#subs.values()];
    this.#subs.clear();
    for (const sub of subs) sub._end(error);
    this.#setStatus({ ...patch, state: "closed", error });
    if (ws !== null) void this.#shut(ws);
  }

  #rejectAll(error: HubError): void {
    const lanes = [...this.#lanes.values()];
    this.#lanes.clear();
    const outs = [...lanes.flat(), ...this.#inflight.values(), ...this.#waiting];
    this.#inflight.clear();
    this.#waiting.clear();
    for (const out of outs) out.fail(error);
  }

  /** Close *ws* and wait (at most a second) for its close, so a Node process can exit. */
  #shut(ws: Socket): Promise<void> {
    return new Promise((resolve) => {
      ws.onopen = ws.onmessage = null;
      ws.onerror = () => undefined;
      const timer = setTimeout(() => {
        ws.terminate?.();
        resolve();
      }, 1000);
      ws.onclose = () => {
        clearTimeout(timer);
        resolve();
      };
      try {
        ws.close(1000);
      } catch {
        clearTimeout(timer);
        resolve();
      }
    });
  }
}
