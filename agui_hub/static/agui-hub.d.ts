// agui-hub.d.ts: generated from js/src by `npm run build` (agui-hub); do not edit.
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
export type Encoding = "msgpack" | "json";
/** A place in a thread: the last offset taken in, in the epoch it belongs to. */
export interface Position {
    offset: string;
    epoch: string | null;
}
/** Where a subscription starts (docs/protocol.md, subscribe). */
export type Start = "live" | "start" | "snapshot" | Position;
/** An AG-UI event as published (canonical wire form, unknown fields included). */
export type AguiEvent = {
    type: string;
    [key: string]: unknown;
};
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
export type Item = {
    kind: "subscribed";
    thread: string;
    epoch: string | null;
    offset: string;
    recovered: boolean;
    resumed: boolean;
} | {
    kind: "snapshot";
    thread: string;
    offset: string;
    /** null: the thread has no events (deleted or emptied) and so no epoch yet. */
    epoch: string | null;
    complete: boolean;
    events: AguiEvent[];
} | {
    kind: "event";
    thread: string;
    offset: string;
    event: AguiEvent;
};
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
/** The root of every error this client throws. */
export declare class HubError extends Error {
    constructor(message: string);
}
/** The connection ended for good: closed with 1000, 4403, 4401 without a token provider,
 * refused at the handshake (HTTP 401 / 403, seen in Node only), or refused again and again. */
export declare class ConnectionRejected extends HubError {
    readonly closeCode: number;
    readonly reason: string;
    constructor(closeCode: number, message: string, reason?: string);
}
/** An error frame answering a command (docs/protocol.md, error codes). */
export declare class CommandRejected extends HubError {
    readonly code: string;
    readonly index?: number;
    readonly retryAfter?: number;
    readonly thread?: string;
    constructor(code: string, message: string, details?: {
        index?: number;
        retryAfter?: number;
        thread?: string;
    });
}
/** No connection: reconnecting gave up (giveUpAfter), or a command's timeout passed. */
export declare class HubUnreachable extends HubError {
}
export declare const START_OFFSET = "0-0";
/** Whether *value* is an offset, "<ms>-<seq>" with each part at most 2^64 - 1. */
export declare function isOffset(value: unknown): value is string;
/** -1, 0 or 1 as offset *a* comes before, is, or comes after *b* (a pair of integers, never
 * string order: "999-0" < "1000-0"). Throws HubError for a string that is not an offset. */
export declare function compareOffsets(a: string, b: string): number;
/** Whether *value* is a Position ({offset, epoch} with a valid offset). */
export declare function isPosition(value: unknown): value is Position;
export declare const SUBPROTOCOL_JSON = "agui-hub.v1.json";
export declare const SUBPROTOCOL_MSGPACK = "agui-hub.v1.msgpack";
export declare const BEARER_PREFIX = "agui-hub.bearer.";
type Frame = Record<string, unknown>;
/** Full jitter: uniform in [0, min(max, min * 2^attempt)]. */
export declare function backoffDelay(attempt: number, min: number, max: number): number;
/** The `exp` claim of a JWT in ms since the epoch, read without verifying (the gateway
 * verifies); null when it is not a JWT with a numeric exp. */
export declare function tokenExpiry(token: string): number | null;
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
export declare function checkThread(thread: string): string;
/** Told of every change of a subscription's presence (`sub.onPresence`). */
export type PresenceListener = (presence: PresenceState, change: PresenceChange, sub: Subscription) => void;
/**
 * The items of one thread, in order: iterate it (`for await`), or give listeners
 * (`onItem`). Made by {@link HubClient.subscribe}.
 *
 * `position` is where a new subscription would resume to get exactly what this one has
 * not handed out yet: keep it (JSON) to continue elsewhere.
 */
export declare class Subscription implements AsyncIterable<Item> {
    #private;
    readonly thread: string;
    /** The branch followed: its latest run as received (undefined: no branch). */
    branch: string | undefined;
    /** The resume position after the last item handed out (the start until one is known). */
    get position(): Position | "live" | "start" | "snapshot";
    /** The `recovered` flag of the latest `subscribed` item handed out. */
    get recovered(): boolean | null;
    /** With `presence: true`, who watches the thread now (a new frozen object at every
     * change, as `hub.status`); null without. */
    get presence(): PresenceState | null;
    /** Call *listener* with `sub.presence` and what changed at every change, as the gateway's
     * frame arrives (not queued behind the items an iterator has not taken yet); returns the
     * unsubscribe. Only with `presence: true`. A listener that throws is reported with
     * console.error; the others still run. */
    onPresence(listener: PresenceListener): () => void;
    /** Why the subscription ended (null while it runs, or after a plain close). */
    get error(): HubError | null;
    get closed(): boolean;
    /** Call *listener* synchronously with each item from now on; returns the unsubscribe.
     * A listener that throws is reported with console.error; the others still run. */
    onItem(listener: (item: Item, sub: Subscription) => void): () => void;
    /** Call *listener* once when the subscription ends: with the error, or null after close(). */
    onEnd(listener: (error: HubError | null) => void): () => void;
    [Symbol.asyncIterator](): AsyncIterator<Item>;
    /** Unsubscribe; iterators end (what was buffered is discarded). */
    close(): Promise<void>;
}
/**
 * One connection to a gateway, shared by subscriptions and publishes; reconnects and
 * resumes by itself until close(), or until the gateway refuses it for good
 * (ConnectionRejected) or giveUpAfter passed (HubUnreachable).
 */
export declare class HubClient {
    #private;
    readonly url: string;
    readonly encoding: Encoding;
    constructor(options: HubClientOptions);
    /** Where the connection is; a new object at every change. */
    get status(): ConnectionStatus;
    /** Call *listener* with the status at every transition; returns the unsubscribe. */
    onStatus(listener: (status: ConnectionStatus) => void): () => void;
    /** Follow *thread*; the subscribe command goes out at once (or when connected). One
     * subscription per thread and client. */
    subscribe(thread: string, options?: SubscribeOptions): Subscription;
    /** Publish *events* into *thread*; resolves with one offset per event.
     *
     * Calls about one thread are sent in call order without waiting for each other's
     * replies (pipelined); those unanswered when the connection drops are sent again after
     * the reconnect, with the same event ids and before any later one, so a drop never
     * reorders nor duplicates a thread's events. A refusal rejects with CommandRejected
     * (its `code`, and `index` for the event at fault). */
    publish(thread: string, events: AguiEvent[], options?: PublishOptions): Promise<string[]>;
    /** Round trip of a protocol ping, in ms (waits for a connection up to *timeout*). */
    ping(options?: {
        timeout?: number;
    }): Promise<number>;
    /** The runs of *thread* in the order they started: its newest *limit* (default 1000,
     * at most 4096), `more` when older ones were left out. Each run names the run it
     * continues (`parentRunId`: its own, or the run before it), so they form a tree
     * (docs/protocol.md, "runs"). Rejects with a HubError `forbidden` without the read
     * grant. */
    runs(thread: string, options?: {
        limit?: number;
        timeout?: number;
    }): Promise<{
        runs: RunInfo[];
        more: boolean;
        agents: string[];
    }>;
    /** Who watches *thread* now, on every gateway of the store: `count`, the first *limit*
     * (default 100, at most 1000) `entries` by the time they joined, `more` when some were left
     * out, `hidden` when the gateway shows the count only. Rejects with CommandRejected
     * `presence_off` (the gateway keeps no presence) or `forbidden` (no read grant). To follow
     * the changes, subscribe with `presence: true` instead. */
    presence(thread: string, options?: {
        limit?: number;
        timeout?: number;
    }): Promise<Presence>;
    /** Ask the gateway to run upstream agent *agent* in *thread* (docs/bridge.md): its input
     * is built from the thread, or with `parentRunId` from the branch that ends with that run
     * (regenerate, edit), plus `messages`. Resolves with the `running` reply once the run is
     * going; its events come in the thread. Needs the publish and run grants. */
    run(thread: string, agent: string, options?: {
        messages?: unknown[];
        parentRunId?: string;
        runId?: string;
        timeout?: number;
    }): Promise<Frame>;
    /** Fresh event ids, unique to this client: "<random prefix>-<counter>". */
    newEventIds(count: number): string[];
    /** Close the connection; iterators end after what they buffered, commands in flight
     * reject, every timer is cleared. */
    close(): Promise<void>;
}
export {};
