// The viewer page the gateway serves at / (agui_hub/static/index.html): it
// follows one thread through HubClient and renders it as it streams.
//
// The page is the hub's own demo of resuming: it shows the connection state,
// every reconnect, and whether each resume was complete. Everything it shows
// of a thread came from an agent, so it is untrusted input: it only ever
// reaches the page as text nodes (textContent / createTextNode), never as
// markup, and the page's Content-Security-Policy runs nothing but viewer.js and
// the client it imports from the gateway (the build turns ./client into ./agui-hub.js).
//
// Rendering is incremental: events are folded into the model (transcript.ts)
// as they arrive, and the DOM is brought up to date at most once per
// animation frame, touching only what changed (a token delta appends to one
// text node). A run of thousands of deltas a second stays smooth.
//
// The thread is subscribed from "start": the page then shows the thread's
// whole history (every run, its steps, every message), the same for a viewer
// that joined late as for one that watched it live, and the gateway itself
// answers with a snapshot when the beginning of the thread was trimmed, so
// "start" costs at most the thread's retention. `#from=snapshot` asks for the
// compact snapshot instead (the current messages and state, not every token
// delta): the choice for very long threads, at the price of finished steps.
//
// The header also says how many are watching the thread ("3 watching", from the
// subscription's presence), with who they are in its tooltip.

import {
  CommandRejected,
  ConnectionRejected,
  HubClient,
  HubError,
  type ConnectionStatus,
  type Encoding,
  type Item,
  type PresenceEntry,
  type PresenceState,
  type RunInfo,
  type Subscription,
} from "./client";
import { Transcript, type Message, type Run, type ToolCall } from "./transcript";

const RECENT_KEY = "agui-hub.viewer.recent";
const TOKEN_KEY = "agui-hub.viewer.token";

/** A token is kept for the one gateway it was typed for: a link with another ?hub= must
 * not carry it there. */
function tokenKey(hub: string): string {
  return `${TOKEN_KEY} ${hub}`;
}
const RECENT_MAX = 12;
/** What the page tells others watching a thread about itself. */
const CLIENT_INFO = { name: "viewer" };
const TREE_CHILDREN_MAX = 500;
const PREVIEW_CHARS = 140;

type From = "start" | "snapshot";

interface Resume {
  /** Every event after the position was delivered (no snapshot). */
  complete: boolean;
  at: number;
}

interface ConnectionModel {
  state: "idle" | "connecting" | "live" | "reconnecting" | "closed";
  attempt: number;
  reconnects: number;
  closeCode: number | null;
  closeReason: string;
  error: string | null;
  hub: string;
  encoding: Encoding;
  thread: string | null;
  from: From;
  /** A `subscribed` reply came for the current thread. */
  subscribed: boolean;
  /** Why the thread is not followed any more while the connection is up (null: it is). */
  stopped: string | null;
  resumes: Resume[];
  /** Snapshots that replaced the model (resumes that were not complete, trimmed history). */
  snapshots: number;
  /** The history was trimmed before the page could see it all (a snapshot with complete: false). */
  trimmed: boolean;
  items: number;
  /** The branch followed (#branch=RUN; null: the whole thread). */
  branch: string | null;
}

/** Who watches the thread, as the header shows it (window.aguiViewer.model().presence). */
interface PresenceModel {
  /** Shown: the gateway sent the list (not before, not when it keeps no presence). */
  shown: boolean;
  count: number;
  /** One per connection listed, in the order they joined ([] when hidden). */
  subjects: string[];
  /** The gateway shows the count only. */
  hidden: boolean;
  /** The gateway keeps no presence: nothing is shown. */
  off: boolean;
}

const NO_PRESENCE: PresenceModel = { shown: false, count: 0, subjects: [], hidden: false, off: false };

/** One watcher for the tooltip: "alice (web · laptop)", and " — this page" on the page's own. */
function watcherLine(entry: PresenceEntry, self: string | null): string {
  const client = entry.client ? Object.values(entry.client).filter((v) => v !== null && v !== "") : [];
  const about = client.length ? ` (${client.map(String).join(" · ")})` : "";
  return `${entry.subject}${about}${entry.connection === self ? " — this page" : ""}`;
}

/** Where the thread branches along what the page shows: a run that has siblings (other
 * runs continuing the same run), the run shown among them. */
interface Fork {
  /** The run shown at this point of the conversation. */
  run: string;
  /** Its siblings, in the order they started (it among them). */
  versions: string[];
  index: number;
  preview: string;
}

/** The last run the page shows of the branch asked for at *tip* (without one, or one not
 * listed: the latest run's); null without runs. */
function branchTip(runs: RunInfo[], tip: string | null): string | null {
  if (runs.length === 0) return null;
  const listed = new Set(runs.map((r) => r.runId));
  // A branch asked for at a run that has continuations goes on along the first of them in
  // start order, as the hub follows it. A parent not listed (trimmed) makes a root.
  const first = new Map<string, string>();
  for (const run of runs) {
    const parent = run.parentRunId;
    if (parent !== null && listed.has(parent) && !first.has(parent)) first.set(parent, run.runId);
  }
  let at = tip !== null && listed.has(tip) ? tip : runs[runs.length - 1].runId;
  const seen = new Set([at]);
  for (let next = first.get(at); next !== undefined && !seen.has(next); next = first.get(at)) {
    seen.add(next);
    at = next;
  }
  return at;
}

/** The forks along the branch that ends with *tip* (or the latest run's, without one). */
function forksOf(runs: RunInfo[], tip: string | null): Fork[] {
  const byId = new Map(runs.map((r) => [r.runId, r]));
  const children = new Map<string | null, string[]>();
  for (const run of runs) {
    const parent = run.parentRunId !== null && byId.has(run.parentRunId) ? run.parentRunId : null;
    const list = children.get(parent) ?? [];
    list.push(run.runId);
    children.set(parent, list);
  }
  let at = branchTip(runs, tip);
  const path: string[] = [];
  const seen = new Set<string>();
  while (at !== null && byId.has(at) && !seen.has(at)) {
    seen.add(at);
    path.push(at);
    const parent: string | null = byId.get(at)?.parentRunId ?? null;
    at = parent !== null && byId.has(parent) ? parent : null;
  }
  path.reverse();
  const forks: Fork[] = [];
  for (const run of path) {
    const info = byId.get(run);
    const parent = info?.parentRunId !== null && info?.parentRunId !== undefined && byId.has(info.parentRunId)
      ? info.parentRunId
      : null;
    const versions = children.get(parent) ?? [];
    if (versions.length > 1) {
      forks.push({ run, versions, index: versions.indexOf(run), preview: info?.preview ?? "" });
    }
  }
  return forks;
}

// -- small DOM helpers (text only: never markup) ---------------------------------------------------

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className?: string,
  text?: string,
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function byId<T extends HTMLElement>(id: string): T {
  const node = document.getElementById(id);
  if (!node) throw new Error(`the page has no #${id}`);
  return node as T;
}

function testId<T extends HTMLElement>(id: string): T {
  const node = document.querySelector(`[data-testid="${id}"]`);
  if (!node) throw new Error(`the page has no [data-testid=${id}]`);
  return node as T;
}

const COMPACT_JSON = 120;

/** JSON on one line when short, indented when long. */
function prettyJson(value: unknown): string {
  const line = oneLine(value, { left: COMPACT_JSON });
  return line ?? JSON.stringify(value, null, 2);
}

/** `{"a": 1, "b": [2]}`, or null once longer than the budget. */
function oneLine(value: unknown, budget: { left: number }): string | null {
  let text: string;
  if (Array.isArray(value)) {
    budget.left -= 2;
    const parts: string[] = [];
    for (const item of value) {
      if (budget.left < 0) return null;
      const part = oneLine(item, budget);
      if (part === null) return null;
      parts.push(part);
      budget.left -= 2;
    }
    text = `[${parts.join(", ")}]`;
  } else if (value !== null && typeof value === "object") {
    budget.left -= 2;
    const parts: string[] = [];
    for (const [key, item] of Object.entries(value)) {
      if (item === undefined) continue;
      const name = JSON.stringify(key);
      budget.left -= name.length + 4;
      if (budget.left < 0) return null;
      const part = oneLine(item, budget);
      if (part === null) return null;
      parts.push(`${name}: ${part}`);
    }
    text = `{${parts.join(", ")}}`;
  } else {
    text = JSON.stringify(value) ?? "null";
    budget.left -= text.length;
  }
  return budget.left < 0 ? null : text;
}

/** Pretty JSON when *text* is a JSON object or array, else the text itself. */
function prettyText(text: string): string {
  const trimmed = text.trim();
  if (!trimmed || !"{[".includes(trimmed[0])) return text;
  try {
    return prettyJson(JSON.parse(trimmed));
  } catch {
    return text;
  }
}

function shown(value: unknown): string {
  if (typeof value === "string") return value;
  if (value === undefined) return "";
  try {
    return prettyJson(value);
  } catch {
    return String(value);
  }
}

/** A text node kept in step with a growing string: a delta appends, anything else replaces. */
class LiveText {
  readonly node = document.createTextNode("");
  #text = "";
  set(text: string): void {
    if (text === this.#text) return;
    if (text.startsWith(this.#text)) this.node.appendData(text.slice(this.#text.length));
    else this.node.data = text;
    this.#text = text;
  }
}

// -- JSON tree (the state, activity contents) ---------------------------------------------------------

/** A collapsible JSON tree; which nodes are open survives re-rendering (by path). */
class JsonTree {
  readonly root: HTMLElement;
  readonly #closed = new Set<string>();
  readonly #opened = new Set<string>();
  readonly #openDepth: number;

  constructor(root: HTMLElement, openDepth = 2) {
    this.root = root;
    this.#openDepth = openDepth;
  }

  render(value: unknown): void {
    const fragment = document.createDocumentFragment();
    fragment.append(this.#node(value, null, "", 0));
    this.root.replaceChildren(fragment);
  }

  #isOpen(path: string, depth: number): boolean {
    if (this.#closed.has(path)) return false;
    return depth < this.#openDepth || this.#opened.has(path);
  }

  #node(value: unknown, key: string | null, path: string, depth: number): HTMLElement {
    if (value === null || typeof value !== "object") {
      const leaf = el("div", "leaf");
      if (key !== null) leaf.append(el("span", "key", key), ": ");
      const type = value === null ? "null" : typeof value;
      leaf.append(el("span", type, type === "string" ? JSON.stringify(value) : String(value)));
      return leaf;
    }
    const entries: [string, unknown][] = Array.isArray(value)
      ? value.map((item, index) => [String(index), item])
      : Object.entries(value as Record<string, unknown>);
    const details = el("details");
    const summary = el("summary");
    if (key !== null) summary.append(el("span", "key", key), ": ");
    const brackets = Array.isArray(value) ? ["[", "]"] : ["{", "}"];
    summary.append(el("span", "count", `${brackets[0]}${entries.length}${brackets[1]}`));
    details.append(summary);
    const fill = (): void => {
      if (details.childElementCount > 1) return;
      const shownEntries = entries.slice(0, TREE_CHILDREN_MAX);
      for (const [childKey, child] of shownEntries) {
        details.append(this.#node(child, childKey, `${path}/${childKey}`, depth + 1));
      }
      if (entries.length > shownEntries.length) {
        details.append(el("div", "more", `… ${entries.length - shownEntries.length} more`));
      }
    };
    // Children are built when first opened: a large state costs only its open part.
    if (this.#isOpen(path, depth)) {
      details.open = true;
      fill();
    }
    details.addEventListener("toggle", () => {
      if (details.open) {
        this.#closed.delete(path);
        this.#opened.add(path);
        fill();
      } else {
        this.#opened.delete(path);
        this.#closed.add(path);
      }
    });
    return details;
  }
}

// -- the transcript's view ----------------------------------------------------------------------------

class CallView {
  readonly el = el("div", "call");
  readonly #name = el("span", "call-name");
  readonly #state = el("span", "call-state");
  readonly #args = el("pre", "args");
  readonly #argsText = new LiveText();
  readonly #result = el("div", "result");
  readonly #resultBody = el("pre", "result-body");
  #pretty = false;
  #shown: unknown[] | null = null;

  constructor() {
    const head = el("div", "call-head");
    head.append(el("span", "call-icon", "tool call"), this.#name, this.#state);
    this.#args.append(this.#argsText.node);
    this.#result.append(el("span", "result-label", "result"), this.#resultBody);
    this.#result.hidden = true;
    this.el.append(head, this.#args, this.#result);
  }

  update(call: ToolCall, open: boolean, result: Message | undefined): void {
    const name = call.function?.name;
    this.#name.textContent = typeof name === "string" ? name : "tool";
    const args = typeof call.function?.arguments === "string" ? call.function.arguments : "";
    const done = result !== undefined;
    const shownNow = [args, open, done, result?.content];
    if (this.#shown && this.#shown.every((part, i) => part === shownNow[i])) return;
    this.#shown = shownNow;
    this.el.dataset.open = String(open);
    this.el.dataset.done = String(done);
    this.#state.textContent = open ? "streaming arguments…" : done ? "done" : "waiting for the result…";
    if (open) {
      if (this.#pretty) {
        this.#args.replaceChildren(this.#argsText.node);
        this.#pretty = false;
      }
      this.#argsText.set(args);
    } else {
      // Complete: shown as pretty JSON (the arguments are a JSON document by the protocol).
      this.#args.textContent = prettyText(args);
      this.#pretty = true;
    }
    this.#result.hidden = !done;
    if (done) this.#resultBody.textContent = prettyText(shown(result.content));
  }
}

class MessageView {
  readonly el: HTMLElement;
  readonly #content = el("div", "content");
  readonly #text = new LiveText();
  readonly #who = el("div", "who");
  readonly #calls = el("div", "calls");
  readonly #preview: HTMLElement | null = null;
  readonly #callViews = new Map<ToolCall, CallView>();
  readonly #tree: JsonTree | null = null;

  constructor(message: Message) {
    const role = typeof message.role === "string" ? message.role : "message";
    if (role === "reasoning") {
      // Collapsed by default: a model's thinking is there to look into, not to read first.
      const details = el("details", "msg reasoning");
      const summary = el("summary");
      this.#who.textContent = "reasoning";
      this.#preview = el("span", "preview");
      this.#preview.dataset.noText = "";
      summary.append(this.#who, this.#preview);
      details.append(summary, this.#content);
      this.el = details;
    } else {
      this.el = el("article", "msg");
      this.el.append(this.#who, this.#content);
      if (role === "activity") {
        this.el.classList.add("activity");
        this.#tree = new JsonTree(this.#content, 3);
      } else if (role === "tool") {
        this.el.classList.add("tool");
      }
      this.el.append(this.#calls);
    }
    this.el.dataset.role = role;
    this.#content.append(this.#text.node);
  }

  update(message: Message, model: Transcript): void {
    const role = typeof message.role === "string" ? message.role : "message";
    const id = message.id;
    const name = typeof message.name === "string" ? ` · ${message.name}` : "";
    const subagent = typeof message.subagentRunId === "string" ? ` · ${message.subagentRunId}` : "";
    if (role === "activity") {
      this.#who.textContent = `activity · ${shown(message.activityType)}${subagent}`;
      this.#tree?.render(message.content ?? {});
      return;
    }
    if (role === "tool") {
      this.#who.textContent = `tool result${name}${subagent}`;
      this.#text.set(prettyText(shown(message.content)));
      return;
    }
    if (role !== "reasoning") this.#who.textContent = `${role}${name}${subagent}`;
    const streaming = model.openMessages.has(id) || model.openReasoning.has(id);
    this.el.dataset.streaming = String(streaming);
    const text = shown(message.content);
    this.#text.set(text);
    if (this.#preview) {
      this.#who.textContent = streaming ? "reasoning…" : "reasoning";
      this.#preview.textContent = text.length > PREVIEW_CHARS ? `…${text.slice(-PREVIEW_CHARS)}` : text;
    }
    const calls = Array.isArray(message.toolCalls) ? message.toolCalls : [];
    const seen = new Set<ToolCall>();
    const order: HTMLElement[] = [];
    for (const call of calls) {
      if (call === null || typeof call !== "object" || seen.has(call)) continue;
      seen.add(call);
      let view = this.#callViews.get(call);
      if (!view) {
        view = new CallView();
        this.#callViews.set(call, view);
      }
      order.push(view.el);
      view.update(call, model.openToolCalls.has(call.id), model.resultOf(call.id));
    }
    for (const call of [...this.#callViews.keys()]) if (!seen.has(call)) this.#callViews.delete(call);
    reorder(this.#calls, order);
  }
}

class RunView {
  readonly el = el("section", "run");
  readonly body = el("div", "run-body");
  readonly #title = el("span", "run-title");
  readonly #status = el("span", "run-status");
  readonly #steps = el("span", "steps");
  readonly #error = el("div", "run-error");
  readonly #result = el("details", "run-result");
  readonly #resultTree: JsonTree;

  constructor() {
    const head = el("div", "run-head");
    head.append(this.#title, this.#status, this.#steps, this.#error);
    const summary = el("summary", undefined, "result");
    const tree = el("div", "json-tree");
    this.#result.append(summary, tree);
    this.#resultTree = new JsonTree(tree, 1);
    this.el.append(head, this.body, this.#result);
  }

  update(run: Run | null, active: Map<string, Record<string, unknown>>, latest: boolean): void {
    if (run === null) {
      this.el.dataset.status = "none";
      this.#title.textContent = "before any run";
      this.#status.hidden = true;
      this.#error.hidden = true;
      this.#result.hidden = true;
      return;
    }
    this.el.dataset.status = run.status;
    const parent = run.parentRunId ? ` (from ${run.parentRunId})` : "";
    this.#title.textContent = `run ${run.runId ?? "?"}${parent}`;
    this.#status.hidden = false;
    this.#status.textContent = run.status;
    const chips = run.steps.map((step) => {
      const chip = el("span", "step", step.subagentRunId ? `${step.subagentRunId}: ${step.name}` : step.name);
      chip.dataset.status = step.status;
      chip.title = `step ${step.status}`;
      return chip;
    });
    if (latest) {
      for (const id of active.keys()) {
        const chip = el("span", "step", `subagent ${id}`);
        chip.dataset.status = "running";
        chips.push(chip);
      }
    }
    this.#steps.replaceChildren(...chips);
    const ended = run.ended ?? {};
    const message = run.status === "error" ? shown(ended.message ?? "the run failed") : "";
    this.#error.hidden = !message;
    this.#error.textContent = message ? `error: ${message}${ended.code ? ` (${shown(ended.code)})` : ""}` : "";
    const hasResult = run.status === "finished" && ended.result !== undefined;
    this.#result.hidden = !hasResult;
    if (hasResult) this.#resultTree.render(ended.result);
  }
}

class TranscriptView {
  readonly root: HTMLElement;
  #messages = new Map<Message, MessageView>();
  #runs = new Map<Run | null, RunView>();
  #newRuns: (Run | null)[] = []; // views #layout made, not filled in yet
  #latest: Run | null = null; // the latest run at the last render
  #empty: HTMLElement;
  /** The "‹ 2 of 3 ›" switches, by the run each is a version of. */
  #forks = new Map<string, HTMLElement>();
  /** The switches of runs the transcript does not show (trimmed, or not arrived yet). */
  readonly #unplaced = el("div", "forks-unplaced");
  /** The id of the question a run answered, if known. */
  readonly #questionOf: (run: string) => string | null;
  /** Each message id's view, as of the last layout. */
  #messageById = new Map<string, HTMLElement>();

  constructor(root: HTMLElement, questionOf: (run: string) => string | null) {
    this.root = root;
    this.#questionOf = questionOf;
    this.#empty = el("div", "empty");
    this.root.replaceChildren(this.#unplaced, this.#empty);
  }

  setEmptyText(parts: (string | HTMLElement)[]): void {
    this.#empty.replaceChildren(...parts);
  }

  clear(): void {
    this.#messages.clear();
    this.#runs.clear();
    this.root.replaceChildren(this.#unplaced, this.#empty);
  }

  setForks(forks: Map<string, HTMLElement>): void {
    for (const [run, fork] of this.#forks) if (forks.get(run) !== fork) fork.remove();
    this.#forks = forks;
    this.#placeForks();
  }

  /** Each switch where the versions differ: on its run's question when the run's section
   * shows it, else over the section's first message; at the top of the transcript while
   * the run has no section. */
  #placeForks(): void {
    const sections = new Map<string, RunView>();
    for (const [run, view] of this.#runs) {
      if (run?.runId && !sections.has(run.runId)) sections.set(run.runId, view);
    }
    const unplaced: HTMLElement[] = [];
    for (const [run, fork] of this.#forks) {
      const view = sections.get(run);
      const question = this.#questionOf(run);
      // Not "the section's first message": a snapshot's messages all go to its latest run,
      // and a regenerated answer's question was shown with the version before it.
      const on = question !== null ? this.#messageById.get(question) : undefined;
      if (!view) {
        unplaced.push(fork);
      } else if (on && on.parentNode === view.body && on.dataset.role === "user") {
        if (fork.parentNode !== on || fork.nextSibling) on.append(fork);
      } else if (fork.parentNode !== view.el || fork.nextSibling !== view.body) {
        view.el.insertBefore(fork, view.body);
      }
    }
    reorder(this.#unplaced, unplaced);
  }

  render(model: Transcript): void {
    const changes = model.takeChanges();
    if (changes.reset) this.clear();
    const created = changes.reset || changes.order || changes.runs ? this.#layout(model) : [];
    // Only what changed (and what is new): a token costs one message's update.
    const updated = changes.reset ? new Set(model.messages) : changes.messages;
    for (const message of created) updated.add(message);
    for (const message of updated) {
      const view = this.#messages.get(message);
      if (view) view.update(message, model);
      else if (model.isAttachedResult(message)) {
        const owner = model.callOwner(message.toolCallId as string);
        if (owner) this.#messages.get(owner)?.update(owner, model);
      }
    }
    // Only the runs that changed, never all of a long thread's at every frame: new ones,
    // those with a new step or end, and the latest one before and after (it shows the
    // active sub-agents).
    const latest = model.currentRun;
    const runs = new Set<Run | null>([...this.#newRuns, ...changes.changedRuns]);
    if (changes.runs || changes.open || changes.reset) {
      runs.add(this.#latest);
      runs.add(latest);
    }
    for (const run of runs) this.#runs.get(run)?.update(run, model.activeSubagents, run === latest);
    this.#newRuns = [];
    this.#latest = latest;
  }

  /** Put every message's view in its run's section, in the model's order; returns the
   * messages whose views are new. */
  #layout(model: Transcript): Message[] {
    const created: Message[] = [];
    const wanted = new Map<Run | null, HTMLElement[]>();
    for (const run of model.runs) wanted.set(run, []);
    const alive = new Set<Message>();
    this.#messageById = new Map();
    for (const message of model.messages) {
      if (model.isAttachedResult(message)) continue; // shown with its tool call
      let view = this.#messages.get(message);
      if (!view) {
        view = new MessageView(message);
        this.#messages.set(message, view);
        created.push(message);
      }
      alive.add(message);
      this.#messageById.set(message.id, view.el);
      const run = model.runFor(message);
      const key = run !== null && wanted.has(run) ? run : null;
      if (!wanted.has(key)) wanted.set(key, []);
      wanted.get(key)!.push(view.el);
    }
    for (const message of [...this.#messages.keys()]) {
      if (!alive.has(message)) this.#messages.delete(message);
    }
    const sections: HTMLElement[] = [];
    const order: (Run | null)[] = wanted.has(null) ? [null, ...model.runs] : [...model.runs];
    for (const run of order) {
      let view = this.#runs.get(run);
      if (!view) {
        view = new RunView();
        this.#runs.set(run, view);
        this.#newRuns.push(run);
      }
      reorder(view.body, wanted.get(run) ?? []);
      sections.push(view.el);
    }
    for (const run of [...this.#runs.keys()]) if (!wanted.has(run)) this.#runs.delete(run);
    if (!sections.length) sections.push(this.#empty);
    reorder(this.root, [this.#unplaced, ...sections]);
    // A run's question, or its section, may have come or gone.
    this.#placeForks();
    return created;
  }
}

/** Make *parent*'s children exactly *children*, moving only what is out of place. */
function reorder(parent: HTMLElement, children: HTMLElement[]): void {
  let cursor = parent.firstChild;
  for (const child of children) {
    if (cursor === child) {
      cursor = cursor.nextSibling;
    } else {
      parent.insertBefore(child, cursor);
    }
  }
  while (cursor) {
    const next = cursor.nextSibling;
    parent.removeChild(cursor);
    cursor = next;
  }
}

/** The text of a subtree, one line per block, hidden parts (collapsed reasoning) included. */
function kilobytes(size: number): string {
  return size < 1000 ? `${size} B` : `${(size / 1000).toFixed(1)} kB`;
}

function safeJson(value: unknown): string {
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}

function textOf(root: Node): string {
  const lines: string[] = [];
  let line = "";
  const blocks = new Set(["DIV", "SECTION", "ARTICLE", "DETAILS", "SUMMARY", "PRE", "HEADER", "P"]);
  const walk = (node: Node): void => {
    if (node.nodeType === Node.TEXT_NODE) {
      line += (node as Text).data;
      return;
    }
    if (node.nodeType !== Node.ELEMENT_NODE) return;
    const element = node as HTMLElement;
    if ("noText" in element.dataset) return;
    if (element.hidden) return;
    const block = blocks.has(element.tagName);
    if (block && line) {
      lines.push(line);
      line = "";
    }
    for (let child = element.firstChild; child; child = child.nextSibling) walk(child);
    if (block && line) {
      lines.push(line);
      line = "";
    } else if (!block && line && !line.endsWith(" ")) {
      line += " ";
    }
  };
  walk(root);
  if (line) lines.push(line);
  return lines.map((l) => l.trimEnd()).filter((l) => l).join("\n");
}

// -- the page --------------------------------------------------------------------------------------------

function hubUrl(): string {
  const param = new URLSearchParams(location.search).get("hub");
  if (param) {
    const url = new URL(param, location.href);
    if (url.protocol === "http:") url.protocol = "ws:";
    if (url.protocol === "https:") url.protocol = "wss:";
    return url.href;
  }
  // The gateway that served the page, at the page's own path (behind a proxy
  // that mounts the gateway under a prefix, that is where it listens).
  const url = new URL(".", location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  url.search = "";
  url.hash = "";
  return url.href;
}

function readHash(): URLSearchParams {
  return new URLSearchParams(location.hash.replace(/^#/, ""));
}

function storage(kind: "local" | "session"): Storage | null {
  try {
    return kind === "local" ? window.localStorage : window.sessionStorage;
  } catch {
    return null; // storage disabled: the page works without remembering
  }
}

function recentThreads(): string[] {
  try {
    const list = JSON.parse(storage("local")?.getItem(RECENT_KEY) ?? "[]");
    return Array.isArray(list) ? list.filter((t): t is string => typeof t === "string") : [];
  } catch {
    return [];
  }
}

function rememberThread(thread: string): void {
  const list = [thread, ...recentThreads().filter((t) => t !== thread)].slice(0, RECENT_MAX);
  try {
    storage("local")?.setItem(RECENT_KEY, JSON.stringify(list));
  } catch {
    // full or disabled: not remembering is fine
  }
}

function threadProblem(thread: string): string | null {
  if (!thread) return "type a thread id";
  if (thread.length > 256) return "a thread id has at most 256 characters";
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u001f\u007f-\u009f]/.test(thread)) return "a thread id has no control characters";
  return null;
}

class Viewer {
  readonly model = new Transcript();
  readonly connection: ConnectionModel;
  readonly #view: TranscriptView;
  readonly #state: JsonTree;
  #client: HubClient | null = null;
  #sub: Subscription | null = null;
  #frame = 0;
  #generation = 0;
  #stateShown: unknown = undefined;
  #presence: PresenceModel = NO_PRESENCE;

  readonly #threadInput = byId<HTMLInputElement>("thread");
  readonly #encoding = byId<HTMLSelectElement>("encoding");
  readonly #token = byId<HTMLInputElement>("token");
  readonly #recent = byId<HTMLDataListElement>("recent-threads");
  readonly #indicator = byId<HTMLElement>("connection");
  readonly #status = testId<HTMLElement>("status");
  readonly #reconnects = testId<HTMLElement>("reconnects");
  readonly #resume = testId<HTMLElement>("resume");
  readonly #watching = testId<HTMLElement>("watching");
  readonly #notice = byId<HTMLElement>("notice");
  readonly #stateProblem = byId<HTMLElement>("state-problem");
  readonly #eventsLine = byId<HTMLElement>("events-line");
  readonly #rawPanel = byId<HTMLElement>("raw-events");
  readonly #rawList = byId<HTMLOListElement>("raw-list");
  /** RAW and CUSTOM events: "short" (counted on the events line), "hide", "full" (listed). */
  #rawMode: "short" | "hide" | "full" = "short";
  #rawShown = -1;
  /** The thread's runs (the runs command), refreshed when a run starts or ends. */
  #runs: RunInfo[] = [];
  #forks: Fork[] = [];
  #runsAsked = 0;
  /** The agents this page may run in the thread (the runs reply): regenerate and edit. */
  #agents: string[] = [];
  /** Each run's RUN_STARTED as received (its input holds the question it answered). */
  readonly #starts = new Map<string, Record<string, unknown>>();
  readonly #actions = byId<HTMLElement>("run-actions");

  constructor() {
    this.#view = new TranscriptView(testId("transcript"), (run) => {
      const id = this.#question(run)?.id;
      return typeof id === "string" ? id : null;
    });
    this.#state = new JsonTree(byId("state"), 3);
    this.connection = {
      state: "idle",
      attempt: 0,
      reconnects: 0,
      closeCode: null,
      closeReason: "",
      error: null,
      hub: "",
      encoding: "msgpack",
      thread: null,
      from: "start",
      subscribed: false,
      stopped: null,
      resumes: [],
      snapshots: 0,
      trimmed: false,
      items: 0,
      branch: null,
    };
    try {
      this.connection.hub = hubUrl();
    } catch {
      this.#notify("error", "the hub parameter is not a URL: use ?hub=ws://host:port/");
    }
    if (new URLSearchParams(location.search).has("hub") && this.connection.hub) {
      // Another gateway than the page's: say which, since the token goes there.
      const hub = byId<HTMLElement>("hub");
      hub.textContent = `hub ${new URL(this.connection.hub).host}`;
      hub.title = this.connection.hub;
      hub.hidden = false;
    }
    this.#token.value = storage("session")?.getItem(tokenKey(this.connection.hub)) ?? "";
    this.#fillRecent();
    byId<HTMLFormElement>("thread-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.#setHash({ thread: this.#threadInput.value.trim() });
    });
    this.#encoding.addEventListener("change", () => this.#setHash({ encoding: this.#encoding.value }));
    byId<HTMLFormElement>("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const token = this.#token.value.trim();
      const key = tokenKey(this.connection.hub);
      if (token) storage("session")?.setItem(key, token);
      else storage("session")?.removeItem(key);
      byId<HTMLDetailsElement>("token-box").open = false;
      this.#connect();
    });
    window.addEventListener("hashchange", () => this.#fromHash());
    this.#showEmpty();
    this.#fromHash();
  }

  // -- what tests (and curious people) can read: window.aguiViewer ----------------------------

  snapshot(): Record<string, unknown> {
    return {
      ...this.model.snapshot(),
      connection: structuredClone(this.connection),
      forks: structuredClone(this.#forks),
      presence: structuredClone(this.#presence),
    };
  }

  transcriptText(): string {
    this.#render();
    return textOf(this.#view.root);
  }

  // -- settings --------------------------------------------------------------------------------------

  #setHash(changes: Record<string, string>): void {
    const params = readHash();
    for (const [key, value] of Object.entries(changes)) {
      if (value) params.set(key, value);
      else params.delete(key);
    }
    if (params.get("encoding") === "msgpack") params.delete("encoding");
    const hash = `#${params.toString()}`;
    if (hash !== location.hash) location.hash = hash;
    else this.#fromHash();
  }

  #fromHash(): void {
    const params = readHash();
    const encoding: Encoding = params.get("encoding") === "json" ? "json" : "msgpack";
    const from: From = params.get("from") === "snapshot" ? "snapshot" : "start";
    const thread = (params.get("thread") ?? "").trim();
    const branch = (params.get("branch") ?? "").trim() || null;
    const raw = params.get("raw");
    this.#rawMode = raw === "hide" || raw === "full" ? raw : "short";
    this.#rawShown = -1;
    this.#schedule();
    this.#encoding.value = encoding;
    if (document.activeElement !== this.#threadInput || !this.#threadInput.value) {
      this.#threadInput.value = thread;
    }
    const changedClient = encoding !== this.connection.encoding;
    const changedThread =
      thread !== (this.connection.thread ?? "") ||
      from !== this.connection.from ||
      branch !== this.connection.branch;
    this.connection.encoding = encoding;
    this.connection.from = from;
    this.connection.branch = branch;
    if (!thread) {
      this.connection.thread = null;
      this.#closeSubscription();
      this.#closeClient();
      this.#runs = [];
      this.#renderBranches();
      this.#showEmpty();
      this.#setStatus("idle");
      return;
    }
    const problem = threadProblem(thread);
    if (problem) {
      this.#notify("error", problem);
      return;
    }
    if (!changedClient && !changedThread && this.#client) return;
    // Another thread's runs would put its switches in this one's transcript.
    if (thread !== this.connection.thread) this.#runs = [];
    this.connection.thread = thread;
    document.title = `${thread} · agui-hub viewer`;
    rememberThread(thread);
    this.#fillRecent();
    if (changedClient || !this.#client) this.#connect();
    else this.#subscribe();
  }

  #fillRecent(): void {
    this.#recent.replaceChildren(
      ...recentThreads().map((thread) => {
        const option = el("option");
        option.value = thread;
        return option;
      }),
    );
  }

  // -- connection ------------------------------------------------------------------------------------

  #connect(): void {
    if (!this.connection.thread || !this.connection.hub) return;
    this.#closeSubscription();
    this.#closeClient();
    const token = storage("session")?.getItem(tokenKey(this.connection.hub)) || undefined;
    try {
      this.#client = new HubClient({
        url: this.connection.hub,
        encoding: this.connection.encoding,
        token,
        client: CLIENT_INFO,
      });
    } catch (error) {
      this.#notify("error", `cannot connect: ${(error as Error).message}`);
      return;
    }
    this.connection.reconnects = 0;
    this.connection.resumes = [];
    const client = this.#client;
    client.onStatus((status) => {
      if (client === this.#client) this.#onStatus(status);
    });
    this.#onStatus(client.status);
    this.#subscribe();
  }

  #closeClient(): void {
    const client = this.#client;
    this.#client = null;
    if (client) void client.close().catch(() => undefined);
  }

  #closeSubscription(): void {
    const sub = this.#sub;
    this.#sub = null;
    this.#generation += 1;
    this.#showPresence(null);
    if (sub) void sub.close().catch(() => undefined);
  }

  #subscribe(): void {
    const client = this.#client;
    const thread = this.connection.thread;
    if (!client || !thread) return;
    this.#closeSubscription();
    const generation = this.#generation;
    this.model.reset();
    this.#stateShown = undefined;
    this.connection.subscribed = false;
    const wasStopped = this.connection.stopped !== null;
    this.connection.stopped = null;
    if (wasStopped) this.#setStatus(this.connection.state);
    this.connection.resumes = [];
    this.connection.snapshots = 0;
    this.connection.trimmed = false;
    this.connection.items = 0;
    this.#notify(null);
    this.#showWaiting(thread);
    this.#forks = [];
    this.#starts.clear();
    this.#renderBranches();
    this.#askRuns(generation);
    try {
      this.#sub = client.subscribe(thread, {
        from: this.connection.from,
        ...(this.connection.branch !== null ? { branch: this.connection.branch } : {}),
        presence: true,
        onItem: (item) => {
          if (generation === this.#generation) this.#onItem(item);
        },
      });
      this.#sub.onPresence((presence) => {
        if (generation === this.#generation) this.#showPresence(presence);
      });
    } catch (error) {
      this.#notify("error", (error as Error).message);
      return;
    }
    this.#sub.onEnd((error) => {
      if (generation !== this.#generation || !error) return;
      // The connection may well be up: it is this thread that is not followed any more.
      this.connection.subscribed = false;
      this.#showPresence(null); // not watching it either
      this.connection.error = describe(error);
      this.connection.stopped = this.connection.error;
      this.#notify("error", this.connection.error);
      this.#setStatus(this.connection.state);
      if (error instanceof CommandRejected && error.code === "unauthorized") {
        byId<HTMLDetailsElement>("token-box").open = true;
        this.#token.focus();
      }
    });
    this.#schedule();
  }

  #onStatus(status: ConnectionStatus): void {
    const c = this.connection;
    c.attempt = status.attempt;
    c.reconnects = status.reconnects;
    c.closeCode = status.closeCode;
    c.closeReason = status.closeReason;
    c.error = status.error ? status.error.message : null;
    const state = status.state === "open" ? "live" : status.state;
    if (state === "closed" && status.error) {
      this.#notify("error", describe(status.error));
    } else if (state !== "live" && status.attempt >= 3) {
      // A browser is not told why a handshake failed (a refused token, a wrong
      // origin, nothing listening): say what is tried, and that it goes on.
      const why = status.error?.message ?? `cannot connect to ${this.connection.hub}`;
      const token = storage("session")?.getItem(tokenKey(this.connection.hub))
        ? " (is the token still valid?)"
        : "";
      this.#notify("error", `${why}${token}; retrying`, true);
    } else if (state === "live") {
      this.#clearConnectionNotice();
    }
    this.#setStatus(state);
  }

  #onItem(item: Item): void {
    const c = this.connection;
    c.items += 1;
    if (item.kind === "event") {
      this.model.apply(item.event);
      const type = item.event.type;
      if (type === "RUN_STARTED") this.#rememberStart(item.event as Record<string, unknown>);
      if (type === "RUN_STARTED" || type === "RUN_FINISHED" || type === "RUN_ERROR") {
        this.#askRuns(this.#generation);
      }
    } else if (item.kind === "snapshot") {
      // The snapshot replaces what was built: fold its events into a fresh model.
      c.snapshots += 1;
      if (!item.complete) c.trimmed = true;
      this.model.reset();
      this.#stateShown = undefined;
      this.model.applyAll(item.events);
      for (const event of item.events) {
        if (event.type === "RUN_STARTED") this.#rememberStart(event as Record<string, unknown>);
      }
    } else {
      c.subscribed = true;
      if (item.resumed) {
        c.resumes.push({ complete: item.recovered, at: Date.now() });
        this.#showResume();
      } else if (!item.recovered && c.items > 1) {
        this.#notify("info", "the thread was re-created: showing its new history");
      }
    }
    this.#schedule();
  }

  // -- branches --------------------------------------------------------------------------------------

  /** Ask for the thread's runs (at most one request at a time; the latest answer wins). */
  #askRuns(generation: number): void {
    const client = this.#client;
    const thread = this.connection.thread;
    if (!client || !thread) return;
    const asked = ++this.#runsAsked;
    client
      .runs(thread)
      .then(({ runs, agents }) => {
        if (generation !== this.#generation || asked !== this.#runsAsked) return;
        this.#runs = runs;
        this.#agents = agents;
        this.#renderBranches();
      })
      .catch(() => undefined); // an older gateway, or no grant: no branch switch
  }

  /** "‹ 2 of 3 ›" for each place where the conversation shown has other versions, in the
   * transcript where they begin to differ. */
  #renderBranches(): void {
    const tip = this.#sub?.branch ?? this.connection.branch;
    this.#forks = this.connection.thread ? forksOf(this.#runs, tip ?? null) : [];
    const rows = new Map(
      this.#forks.map((fork) => {
        const row = el("div", "fork");
        row.dataset.testid = "fork";
        // A control, not what was said: the transcript's text leaves it out.
        row.dataset.noText = "";
        row.setAttribute("role", "group");
        row.setAttribute("aria-label", "versions of the conversation");
        const go = (step: number) => {
          const target = fork.versions[(fork.index + step + fork.versions.length) % fork.versions.length];
          this.#setHash({ branch: target });
        };
        const previous = el("button", "fork-step", "‹");
        previous.type = "button";
        previous.title = "the previous version";
        previous.dataset.testid = "fork-previous";
        previous.addEventListener("click", () => go(-1));
        const next = el("button", "fork-step", "›");
        next.type = "button";
        next.title = "the next version";
        next.dataset.testid = "fork-next";
        next.addEventListener("click", () => go(1));
        const label = el("span", "fork-label", `${fork.index + 1} of ${fork.versions.length}`);
        const what = el("span", "fork-preview", fork.preview ? fork.preview : fork.run);
        what.title = `run ${fork.run}`;
        row.append(previous, label, next, what);
        return [fork.run, row] as const;
      }),
    );
    this.#view.setForks(rows);
    this.#renderActions();
  }

  #rememberStart(event: Record<string, unknown>): void {
    if (typeof event.runId === "string") this.#starts.set(event.runId, event);
  }

  /** The latest run shown, and the question it answered (the last user message of its
   * input), when this page may run an agent from its parent: regenerate, edit. */
  #latest(): { run: RunInfo; question: Record<string, unknown> } | null {
    if (this.#agents.length === 0 || this.#runs.length === 0) return null;
    const tip = branchTip(this.#runs, this.#sub?.branch ?? this.connection.branch ?? null);
    const run = this.#runs.find((r) => r.runId === tip);
    if (!run || run.parentRunId === null || run.status === "running") return null;
    const question = this.#question(run.runId);
    return question ? { run, question } : null;
  }

  /** The question *run* answered: the last user message of its input, if that came. */
  #question(run: string): Record<string, unknown> | null {
    const input = this.#starts.get(run)?.input as { messages?: unknown[] } | undefined;
    const messages = Array.isArray(input?.messages) ? input.messages : [];
    for (let i = messages.length - 1; i >= 0; i--) {
      const message = messages[i] as Record<string, unknown>;
      if (message && message.role === "user") return message;
    }
    return null;
  }

  /** "regenerate" and "edit" for the latest run shown, when an agent may be run here. */
  #renderActions(): void {
    const latest = this.#latest();
    this.#actions.hidden = latest === null;
    if (latest === null) {
      this.#actions.replaceChildren();
      return;
    }
    const agent = this.#agents[0];
    const regenerate = el("button", "run-action", "regenerate");
    regenerate.type = "button";
    regenerate.dataset.testid = "regenerate";
    regenerate.title = `${agent} answers the last question again (a new version)`;
    regenerate.addEventListener("click", () => {
      void this.#runFrom(latest.run, [latest.question]);
    });
    const edit = el("button", "run-action", "edit");
    edit.type = "button";
    edit.dataset.testid = "edit";
    edit.title = `change the last question; ${agent} answers it (a new version)`;
    edit.addEventListener("click", () => {
      const before = typeof latest.question.content === "string" ? latest.question.content : "";
      const text = window.prompt("Edit the question", before);
      if (text === null || !text.trim()) return;
      const id = `edit-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
      void this.#runFrom(latest.run, [{ id, role: "user", content: text }]);
    });
    this.#actions.replaceChildren(regenerate, edit);
  }

  /** A new version of *run*: the agent runs from *run*'s parent with *messages*; the page
   * follows it once the hub lists it. */
  async #runFrom(run: RunInfo, messages: unknown[]): Promise<void> {
    const client = this.#client;
    const thread = this.connection.thread;
    if (!client || !thread || run.parentRunId === null) return;
    try {
      const reply = await client.run(thread, this.#agents[0], {
        parentRunId: run.parentRunId,
        messages,
      });
      const runId = reply.runId;
      if (typeof runId !== "string") return;
      // Followed as a branch once the hub's index has it (its RUN_STARTED is stored).
      for (let tries = 0; tries < 50; tries++) {
        const { runs } = await client.runs(thread);
        if (runs.some((r) => r.runId === runId)) {
          this.#setHash({ branch: runId });
          return;
        }
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    } catch (error) {
      this.#notify("error", `the agent could not be run: ${describe(error)}`);
    }
  }

  // -- rendering --------------------------------------------------------------------------------------

  #schedule(): void {
    if (!this.#frame) this.#frame = requestAnimationFrame(() => this.#render());
  }

  #render(): void {
    if (this.#frame) cancelAnimationFrame(this.#frame);
    this.#frame = 0;
    this.#view.render(this.model);
    if (this.model.state !== this.#stateShown) {
      this.#stateShown = this.model.state;
      this.#state.render(this.model.state);
    }
    const problem = this.model.stateProblem;
    this.#stateProblem.hidden = !problem;
    this.#stateProblem.textContent = problem ? "could not apply an update" : "";
    this.#stateProblem.title = problem ?? "";
    const skipped = this.model.problemCount;
    const raw = this.model.rawCount;
    this.#eventsLine.textContent =
      `${this.model.eventCount} events` +
      (raw && this.#rawMode === "short"
        ? ` · ${raw} RAW/CUSTOM (${kilobytes(this.model.rawBytes)}) not shown`
        : "") +
      (skipped ? ` · ${skipped} could not be shown (${this.model.problems.at(-1)?.reason ?? ""})` : "") +
      (this.connection.trimmed ? " · the beginning of the thread was trimmed" : "");
    this.#renderRaw();
  }

  /** The latest RAW and CUSTOM events, whole, when the page is told to show them
   * (#raw=full): one line of JSON each, newest last. */
  #renderRaw(): void {
    const full = this.#rawMode === "full" && this.model.rawCount > 0;
    this.#rawPanel.hidden = !full;
    if (!full || this.#rawShown === this.model.rawCount) return;
    this.#rawShown = this.model.rawCount;
    const items = this.model.rawEvents.map((event) => {
      const item = document.createElement("li");
      item.textContent = safeJson(event);
      return item;
    });
    this.#rawList.replaceChildren(...items);
    const older = this.model.rawCount - this.model.rawEvents.length;
    byId<HTMLElement>("raw-head").textContent =
      `RAW and CUSTOM events: ${this.model.rawCount}` + (older ? ` (the latest ${items.length})` : "");
  }

  #setStatus(state: ConnectionModel["state"]): void {
    const c = this.connection;
    c.state = state;
    // Connected, but this thread is not followed any more (refused, or unreadable): the
    // indicator must not say "live" over a transcript that no longer moves.
    const stopped = state === "live" && c.stopped !== null;
    this.#indicator.dataset.state = stopped ? "stopped" : state;
    let label: string = stopped ? "not following" : state;
    if (state === "reconnecting") label = `reconnecting (attempt ${Math.max(c.attempt, 1)})`;
    if (state === "connecting" && c.attempt > 1) label = `connecting (attempt ${c.attempt})`;
    if (state === "closed" && c.closeCode !== null) label = `closed (${c.closeCode})`;
    this.#status.textContent = label;
    this.#indicator.title = (stopped ? c.stopped : c.error) ?? c.closeReason ?? "";
    this.#reconnects.textContent = String(c.reconnects);
  }

  #showResume(): void {
    const last = this.connection.resumes.at(-1);
    if (!last) {
      this.#resume.textContent = "";
      return;
    }
    const resumes = this.connection.resumes;
    const complete = resumes.filter((r) => r.complete).length;
    this.#resume.title = `${resumes.length} resumes: ${complete} complete, ${resumes.length - complete} from a snapshot`;
    this.#resume.dataset.complete = String(last.complete);
    this.#resume.textContent = last.complete
      ? "resumed, nothing missed"
      : "resumed from a snapshot: events between were trimmed";
  }

  /** "N watching" in the header, who in its tooltip; hidden until the gateway sent the
   * list, and when it keeps no presence. */
  #showPresence(presence: PresenceState | null): void {
    if (presence === null || !presence.known || presence.off) {
      this.#presence = { ...NO_PRESENCE, off: presence?.off ?? false };
      this.#watching.hidden = true;
      this.#watching.textContent = "";
      this.#watching.title = "";
      return;
    }
    const entries = presence.hidden ? [] : presence.entries;
    this.#presence = {
      shown: true,
      count: presence.count,
      subjects: entries.map((entry) => entry.subject),
      hidden: presence.hidden,
      off: false,
    };
    this.#watching.hidden = false;
    this.#watching.textContent = `${presence.count} watching`;
    const lines = entries.map((entry) => watcherLine(entry, presence.self));
    const unlisted = presence.count - entries.length;
    if (presence.hidden) lines.push("this hub shows how many, not who");
    else if (unlisted > 0) lines.push(`and ${unlisted} more`);
    this.#watching.title = lines.join("\n");
  }

  #showWaiting(thread: string): void {
    this.#resume.textContent = "";
    const code = el("code", undefined, thread);
    this.#view.setEmptyText(["Waiting for events on ", code, "…"]);
  }

  #showEmpty(): void {
    const link = el("a");
    link.href = "#thread=demo"; // a constant: no event data ever becomes a URL
    link.append(el("code", undefined, "#thread=demo"));
    this.model.reset();
    this.#stateShown = undefined;
    this.#view.setEmptyText([
      "Type a thread id above to follow it. To see one stream, run ",
      el("code", undefined, "agui-hub demo demo"),
      " and open ",
      link,
      ".",
    ]);
    this.#schedule();
  }

  #connectionNotice = false;

  #notify(kind: "error" | "info" | null, text = "", aboutConnection = false): void {
    this.#notice.hidden = kind === null;
    this.#notice.dataset.kind = kind ?? "";
    this.#notice.textContent = text;
    this.#connectionNotice = aboutConnection;
  }

  #clearConnectionNotice(): void {
    if (this.#connectionNotice) this.#notify(null);
  }
}

function describe(error: unknown): string {
  if (error instanceof ConnectionRejected) {
    const what = error.closeCode === 4401 ? "the token was refused" : "the gateway refused the connection";
    return `${what} (${error.closeCode}): ${error.message}`;
  }
  if (error instanceof CommandRejected) {
    if (error.code === "unauthorized") return `this gateway wants a token (under Token): ${error.message}`;
    if (error.code === "forbidden") return `not allowed to read this thread: ${error.message}`;
    return error.message.startsWith(error.code) ? error.message : `${error.code}: ${error.message}`;
  }
  if (error instanceof HubError) return error.message;
  return String(error);
}

declare global {
  interface Window {
    aguiViewer: {
      model(): Record<string, unknown>;
      transcriptText(): string;
    };
  }
}

function start(): void {
  const viewer = new Viewer();
  window.aguiViewer = {
    model: () => viewer.snapshot(),
    transcriptText: () => viewer.transcriptText(),
  };
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
else start();
