"""Runs of existing AG-UI agents through the hub: the upstream side of the HTTP bridge.

Most AG-UI agents are one HTTP endpoint: POST a ``RunAgentInput``, read an SSE
stream of events. :class:`Bridge` runs such an agent for a thread: it builds
or takes the input, POSTs it, parses the response with
:class:`~agui_hub.wire.sse.SseParser`, and publishes every event into the thread
through the hub's :class:`~agui_hub.gateway.writer.ThreadWriter` (validated, sequence
checked, idempotent), so every viewer of the thread follows the run live and
can resume it. The run belongs to the gateway, not to whoever asked for it:
when every viewer leaves, it goes on and is stored to the end.

A run always ends in the thread. The agent's own RUN_FINISHED or RUN_ERROR
ends it; otherwise the bridge appends a RUN_ERROR saying what happened, with
a ``code`` starting ``AGUI_HUB_`` (docs/bridge.md lists them): the agent could
not be reached, answered an HTTP error, sent something that is not SSE or not
JSON, sent an event the hub refuses (the events before it are stored, the
refused one is not, and the message names it), went silent for longer than
its idle timeout, or closed its response before the run ended; or somebody
cancelled the run, or the gateway stopped. When the agent failed before its
RUN_STARTED, the bridge stores a RUN_STARTED of its own with the RUN_ERROR, in
one append: the failed attempt is a run like any other, and the append is
refused whole if another run took the thread meanwhile (a RUN_ERROR alone
would end that other run).

Messages that the input holds and the thread does not (the user's new
message) are recorded in the stored RUN_STARTED's ``input`` when the agent's
RUN_STARTED has none, and ``parentRunId`` is filled in the same way, so the
thread's history, and the input of its next run, include them. An HTTP client
that started the run gets the agent's RUN_STARTED as the agent sent it.

Exceptions are :class:`~agui_hub.errors.BridgeError` subclasses
(:class:`~agui_hub.errors.UnknownAgent`, :class:`~agui_hub.errors.RunActive`,
:class:`~agui_hub.errors.TooManyRuns`, :class:`~agui_hub.errors.NoActiveRun`)
raised when a run cannot start or be cancelled; failures after the start are
in the thread, as RUN_ERROR events.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import enum
import json
import logging
import re
import time
import tomllib
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from ..agui.events import RunAgentInput, parse_message, to_wire
from ..errors import (
    InvalidEvent,
    NoActiveRun,
    ProtocolError,
    RunActive,
    SequenceError,
    StoreError,
    StoreUnavailable,
    TooManyRuns,
    UnknownAgent,
    UpstreamError,
)
from ..store.urls import redact_url
from ..wire.offsets import Offset
from ..wire.sse import SseParser, SseTooLarge

if TYPE_CHECKING:
    from ..gateway.channels import Hub

__all__ = [
    "AgentEndpoint",
    "Bridge",
    "BridgedRun",
    "RunState",
    "load_agents",
    "parse_agents",
]

log = logging.getLogger("agui_hub.bridge")

DEFAULT_CONNECT_TIMEOUT = 10.0
"""Seconds to connect to an upstream agent."""

DEFAULT_IDLE_TIMEOUT = 300.0
"""Seconds an upstream agent may send nothing (its response headers, then its events:
models think, tools run) before its run ends with ``AGUI_HUB_UPSTREAM_TIMEOUT``."""

DEFAULT_MAX_RUNS = 64
"""Upstream runs one gateway process has going at once."""

STORE_RETRY_SECONDS = 30.0
"""How long the bridge retries an append the store could not take (the upstream
response is not read meanwhile) before the run ends."""

UPSTREAM_KEEPALIVE = 16
"""Idle connections to upstream agents kept open for the next run."""

BATCH_EVENTS = 256
"""Most upstream events stored in one append (a burst of token deltas goes together)."""

ERROR_BODY_CHARS = 300
"""How much of an upstream error response's body a RUN_ERROR message quotes."""

TERMINAL = frozenset({"RUN_FINISHED", "RUN_ERROR"})

_THREAD_CHANGED = frozenset({"run_not_started", "run_already_finished", "run_already_errored"})
"""Sequence rules an agent's event breaks when its run is no longer the thread's."""

_AGENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


# -- configuration ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AgentEndpoint:
    """An upstream agent: where to POST its runs, and with which headers."""

    name: str
    url: str
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _AGENT_NAME.fullmatch(self.name):
            raise ValueError(
                f"agent name {self.name!r}: 1 to 64 letters, digits, '_', '.' or '-' "
                "(starting with a letter or digit)"
            )
        try:
            url = httpx.URL(self.url) if isinstance(self.url, str) else None
        except httpx.InvalidURL:
            url = None
        if url is None or url.scheme not in ("http", "https") or not url.host:
            shown = redact_url(self.url) if isinstance(self.url, str) else repr(self.url)
            raise ValueError(f"agent {self.name!r}: url {shown!r} is not an http(s) URL")
        if url.userinfo:
            # Credentials in the URL become a Basic Authorization header: the URL is
            # shown in RUN_ERROR messages and logs (httpx logs each request's URL).
            secret = base64.b64encode(f"{url.username}:{url.password}".encode()).decode()
            object.__setattr__(self, "url", str(url.copy_with(username=None, password=None)))
            if not any(name.lower() == "authorization" for name, _ in self.headers):
                object.__setattr__(
                    self, "headers", (*self.headers, ("Authorization", f"Basic {secret}"))
                )
        for what, value in (("connect_timeout", self.connect_timeout),
                            ("idle_timeout", self.idle_timeout)):  # fmt: skip
            if not isinstance(value, int | float) or not 0 < value <= 86400:
                raise ValueError(f"agent {self.name!r}: {what} is seconds in (0, 86400]")


def parse_agents(spec: str) -> dict[str, AgentEndpoint]:
    """Agents from ``name=url,name=url`` (the ``--agent`` flag, ``AGUI_HUB_AGENTS``).

    Raises :class:`ValueError` naming the entry at fault. Agents that need
    headers (an API key) or their own timeouts go in a file (:func:`load_agents`).
    """
    agents: dict[str, AgentEndpoint] = {}
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, equals, url = item.partition("=")
        if not equals:
            raise ValueError(f"agent {item!r}: write NAME=URL, e.g. support=http://127.0.0.1:8000/")
        _add(agents, AgentEndpoint(name.strip(), url.strip()))
    return agents


def load_agents(path: str) -> dict[str, AgentEndpoint]:
    """Agents from a TOML or JSON file (the ``agents_file`` setting)::

        [agents.support]
        url = "https://agents.internal/support"
        headers = { Authorization = "Bearer ..." }
        connect_timeout = 10
        idle_timeout = 300

    (JSON: ``{"agents": {"support": {"url": ..., "headers": {...}}}}``). Keep the
    file readable by the gateway only: it holds the agents' credentials.
    Raises :class:`ValueError` saying what is wrong where.
    """
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"cannot read agents_file {path}: {exc.strerror}") from None
    try:
        data = json.loads(text) if path.endswith(".json") else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"agents_file {path}: {exc}") from None
    table = data.get("agents") if isinstance(data, dict) else None
    if not isinstance(table, dict):
        raise ValueError(f"agents_file {path}: expected an 'agents' table of NAME = {{url = ...}}")
    agents: dict[str, AgentEndpoint] = {}
    for name, entry in table.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("url"), str):
            raise ValueError(f"agents_file {path}: agent {name!r} needs a url")
        unknown = set(entry) - {"url", "headers", "connect_timeout", "idle_timeout"}
        if unknown:
            raise ValueError(
                f"agents_file {path}: agent {name!r}: unknown key {sorted(unknown)[0]!r} "
                "(use url, headers, connect_timeout, idle_timeout)"
            )
        headers = entry.get("headers", {})
        if not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise ValueError(f'agents_file {path}: agent {name!r}: headers are name = "value"')
        try:
            _add(
                agents,
                AgentEndpoint(
                    name,
                    entry["url"],
                    tuple(headers.items()),
                    entry.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT),
                    entry.get("idle_timeout", DEFAULT_IDLE_TIMEOUT),
                ),
            )
        except ValueError as exc:
            raise ValueError(f"agents_file {path}: {exc}") from None
    return agents


def _add(agents: dict[str, AgentEndpoint], agent: AgentEndpoint) -> None:
    if agent.name in agents:
        raise ValueError(f"agent {agent.name!r} is configured twice")
    agents[agent.name] = agent


# -- runs --------------------------------------------------------------------------------


class RunState(enum.Enum):
    STARTING = "starting"
    """Accepted; the thread is being read and the agent called."""
    STREAMING = "streaming"
    """The run's first event is stored; the agent's events follow."""
    ENDED = "ended"
    """Its RUN_FINISHED or RUN_ERROR is stored (or nothing could be stored)."""


@dataclass(eq=False)
class BridgedRun:
    """One run of an upstream agent in one thread, owned by a :class:`Bridge`."""

    thread: str
    agent: AgentEndpoint
    run_id: str
    """The runId the input asked for (the agent's RUN_STARTED may name another)."""
    parent_run_id: str | None
    input: dict[str, Any] = field(repr=False)
    new_messages: list[dict[str, Any]] = field(repr=False)
    """The input's messages that the thread did not hold when the run started."""
    subject: str
    epoch: str | None = None
    """The thread's epoch when the run started."""
    state: RunState = RunState.STARTING
    key: str = field(default_factory=lambda: uuid.uuid4().hex)
    """Makes the run's event ids (``bridge:<key>:<n>``): a retried append stores nothing twice."""
    first_offset: Offset | None = None
    """Offset of the run's first stored event (its RUN_STARTED)."""
    first_event: dict[str, Any] | None = field(default=None, repr=False)
    """The agent's first event as it sent it, when the stored one was amended."""
    last_offset: Offset | None = None
    outcome: dict[str, Any] | None = field(default=None, repr=False)
    """The stored RUN_FINISHED or RUN_ERROR."""
    events: int = 0
    """Events of the agent stored so far."""
    cancel_reason: tuple[str, str] | None = None
    """(RUN_ERROR code, message) once somebody asked to stop it."""
    started: asyncio.Future[Offset] = field(init=False, repr=False)
    """Resolves to :attr:`first_offset`; fails when nothing could be stored."""
    done: asyncio.Event = field(init=False, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    _inflight: asyncio.Task[list[Offset]] | None = field(default=None, init=False, repr=False)
    _next_id: int = field(default=0, init=False, repr=False)
    _driving: bool = field(default=False, init=False, repr=False)
    """Its task has begun (a cancel before that is only recorded: see Bridge._drive)."""
    _ending: bool = field(default=False, init=False, repr=False)
    """Its end is being stored: a cancel now would only interrupt that."""
    _released: bool = field(default=False, init=False, repr=False)
    """Counted as ended and its thread free (see Bridge._release)."""

    def __post_init__(self) -> None:
        self.started = asyncio.get_running_loop().create_future()
        self.done = asyncio.Event()

    def as_json(self) -> dict[str, Any]:
        """What a ``run`` reply and ``agui-hub run`` report about it."""
        record: dict[str, Any] = {
            "thread": self.thread,
            "agent": self.agent.name,
            "runId": self.run_id,
            "status": self.state.value,
        }
        if self.parent_run_id is not None:
            record["parentRunId"] = self.parent_run_id
        return record

    def event_ids(self, count: int) -> list[str]:
        first = self._next_id
        self._next_id += count
        return [f"bridge:{self.key}:{n}" for n in range(first, first + count)]


class Bridge:
    """The upstream runs of one gateway process.

    *agents* are the agents it may call by name. At most *max_runs* runs go
    at once, one per thread. Close it with :meth:`close`, which ends every
    run still going with a RUN_ERROR.
    """

    def __init__(
        self,
        hub: Hub,
        agents: Mapping[str, AgentEndpoint],
        *,
        max_runs: int = DEFAULT_MAX_RUNS,
        max_event_bytes: int | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if max_runs < 1:
            raise ValueError("max_runs must be at least 1")
        self.hub = hub
        self.agents = dict(agents)
        self.max_runs = max_runs
        # JSON from the agent is larger than the msgpack the hub stores: the
        # writer judges the stored size, the parser only stops runaway buffers.
        self.max_sse_bytes = 2 * (max_event_bytes or hub.writer.max_event_bytes) + 4096
        self.runs: dict[str, BridgedRun] = {}
        """Runs going, by thread."""
        self._tasks: set[asyncio.Task[None]] = set()
        """Every run's task, until it returns (a run released at its end may still be
        closing its upstream response)."""
        self._reserved: set[str] = set()
        """Threads whose run is being prepared (counted against ``max_runs``)."""
        self.started_total = 0
        self.ended: dict[str, int] = {}
        """Ended runs by how they ended (``finished``, ``error``, or a RUN_ERROR code of ours)."""
        self._closing = False
        self._client = httpx.AsyncClient(
            transport=transport,
            follow_redirects=False,
            # Per request timeouts come from each agent; no pool limit beyond max_runs.
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=UPSTREAM_KEEPALIVE),
            trust_env=False,
        )

    # -- starting and cancelling --------------------------------------------------------

    async def start(
        self,
        agent: str,
        thread: str,
        *,
        subject: str,
        input: Mapping[str, Any] | None = None,
        messages: list[Any] | None = None,
        state: Any = None,
        tools: list[Any] | None = None,
        context: list[Any] | None = None,
        forwarded_props: Any = None,
        run_id: str | None = None,
    ) -> BridgedRun:
        """Start a run of *agent* in *thread*; returns once it is going.

        With *input* (a whole RunAgentInput, as an HTTP client sends it) that
        input goes to the agent as it is. Without, the hub builds it: the
        thread's messages (but activity messages, as the TypeScript client
        does) followed by *messages*, the thread's state unless *state* is
        given, *tools*, *context* and *forwarded_props*, and ``parentRunId``
        set to the thread's latest run. Raises
        :class:`~agui_hub.errors.UnknownAgent`,
        :class:`~agui_hub.errors.RunActive` (this gateway, or the thread's
        stored events, have a run going), :class:`~agui_hub.errors.TooManyRuns`,
        :class:`~agui_hub.errors.InvalidEvent` (an input or message that is not
        AG-UI) or a :class:`~agui_hub.errors.StoreError`. Await
        :attr:`BridgedRun.started` for the offset of its RUN_STARTED, and
        :attr:`BridgedRun.done` for its end.
        """
        endpoint = self.agents.get(agent)
        if endpoint is None:
            known = ", ".join(sorted(self.agents)) or "none is configured"
            raise UnknownAgent(f"no upstream agent named {agent!r} (agents: {known})")
        if self._closing:
            raise TooManyRuns("the gateway is shutting down: start the run on another one")
        if thread in self.runs or thread in self._reserved:
            raise RunActive(
                f"thread {thread!r} has a run going on this gateway: cancel it or wait for its end"
            )
        if len(self.runs) + len(self._reserved) >= self.max_runs:
            raise TooManyRuns(
                f"this gateway has {len(self.runs)} upstream runs going, its maximum: retry later"
            )
        # Reserved before the first await: a second start for the thread is refused.
        self._reserved.add(thread)
        try:
            run = await self._prepare(
                endpoint, thread, subject, input, messages, state, tools, context,
                forwarded_props, run_id,
            )  # fmt: skip
        finally:
            self._reserved.discard(thread)
        if self._closing:
            # close() ran while the thread was read: nothing was started.
            raise TooManyRuns("the gateway is shutting down: start the run on another one")
        self.runs[thread] = run
        self.started_total += 1
        run._task = task = asyncio.create_task(self._drive(run), name=f"agui-hub run {thread}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return run

    async def _prepare(
        self,
        endpoint: AgentEndpoint,
        thread: str,
        subject: str,
        given: Mapping[str, Any] | None,
        messages: list[Any] | None,
        state: Any,
        tools: list[Any] | None,
        context: list[Any] | None,
        forwarded_props: Any,
        run_id: str | None,
    ) -> BridgedRun:
        folded, epoch, _cursor = await self.hub.fold(thread)
        if folded.run_active:
            current = folded.current_run
            raise RunActive(
                f"thread {thread!r} has run {current.run_id if current else None!r} going "
                "(its RUN_FINISHED or RUN_ERROR is not stored yet): cancel it or wait; if the "
                "gateway relaying it crashed, end it with `agui-hub cancel THREAD --abandoned`"
            )
        known = {m.get("id") for m in folded.messages}
        if given is not None:
            try:
                model = RunAgentInput.model_validate(dict(given))
            except ValueError as exc:
                raise InvalidEvent(f"not a RunAgentInput: {exc}") from None
            wire = to_wire(model)
            if wire["threadId"] != thread:
                raise InvalidEvent(f"the input's threadId {wire['threadId']!r} is not {thread!r}")
        else:
            history = [dict(m) for m in folded.messages if m.get("role") != "activity"]
            extra = [to_wire(parse_message(m)) for m in messages or []]
            last = folded.current_run
            wire = {
                "threadId": thread,
                "runId": run_id or str(uuid.uuid4()),
                "state": folded.state if state is None else state,
                "messages": history + extra,
                "tools": tools or [],
                "context": context or [],
                "forwardedProps": forwarded_props if forwarded_props is not None else {},
            }
            if last is not None and last.run_id is not None:
                wire["parentRunId"] = last.run_id
            try:
                wire = to_wire(RunAgentInput.model_validate(wire))
            except ValueError as exc:
                raise InvalidEvent(f"the run's input is not a RunAgentInput: {exc}") from None
        new = [
            m for m in wire["messages"] if m.get("id") not in known and m.get("role") != "activity"
        ]
        return BridgedRun(
            thread=thread,
            agent=endpoint,
            run_id=wire["runId"],
            parent_run_id=wire.get("parentRunId"),
            input=wire,
            new_messages=new,
            subject=subject,
            epoch=epoch,
        )

    def cancel(self, thread: str, *, by: str, run_id: str | None = None) -> BridgedRun:
        """Ask the run going in *thread* to stop; await its :attr:`~BridgedRun.done`.

        Its upstream request is closed and it ends with a RUN_ERROR
        ``AGUI_HUB_RUN_CANCELLED`` naming *by*. Raises
        :class:`~agui_hub.errors.NoActiveRun` when this gateway has no run in
        *thread* (or not *run_id*).
        """
        run = self.runs.get(thread)
        if run is None or (run_id is not None and run_id != run.run_id):
            which = f"run {run_id!r}" if run_id is not None else "a run"
            raise NoActiveRun(
                f"this gateway has no bridged {which} going in thread {thread!r} "
                "(runs are cancelled on the gateway that started them)"
            )
        self._stop(run, "AGUI_HUB_RUN_CANCELLED", f"the run was cancelled by {by}")
        return run

    async def end_abandoned(self, thread: str, *, by: str, run_id: str | None = None) -> str:
        """End a run that the thread holds open and no gateway relays any more.

        A gateway that crashed in the middle of a run (SIGKILL, a lost machine)
        leaves its RUN_STARTED without an end, and every later ``run`` in the
        thread is refused ``run_active``. This appends the missing RUN_ERROR
        (``AGUI_HUB_RUN_ABANDONED``, naming *by*) and returns the run's id. The
        caller decides that nobody relays the run: a run still relayed by
        another gateway would end there too (its next event is refused).
        Raises :class:`~agui_hub.errors.NoActiveRun` when the thread has no run
        open (or not *run_id*), and :class:`~agui_hub.errors.RunActive` when this
        gateway relays it (cancel it instead).
        """
        if thread in self.runs or thread in self._reserved:
            raise RunActive(f"this gateway relays the run in thread {thread!r}: cancel it instead")
        folded, _epoch, cursor = await self.hub.fold(thread)
        current = folded.current_run
        if (
            not folded.run_active
            or current is None
            or (run_id is not None and current.run_id != run_id)
        ):
            raise NoActiveRun(f"thread {thread!r} has no run open" + (
                f" with id {run_id!r}" if run_id is not None else ""))  # fmt: skip
        error = {
            "type": "RUN_ERROR",
            "code": "AGUI_HUB_RUN_ABANDONED",
            "message": f"run {current.run_id} was ended by {by}: no gateway relays it any more",
        }
        # Unique to this occurrence of the run (run ids can repeat), the same for a
        # retry of this request (nothing was stored after `cursor` meanwhile).
        await self.hub.publish(thread, [error], [f"abandoned:{current.run_id}:{cursor}"])
        return current.run_id or ""

    def _stop(self, run: BridgedRun, code: str, message: str) -> None:
        if run.cancel_reason is None and not run._ending:
            run.cancel_reason = (code, message)
            if run._task is not None and run._driving:
                run._task.cancel()

    async def close(self, timeout: float = 10.0) -> dict[str, Offset]:
        """Stop every run (RUN_ERROR ``AGUI_HUB_GATEWAY_STOPPING``) and the HTTP client.

        Returns where each stopped run ended (thread: offset of its stored end),
        so that the viewers of those threads can be given their end before
        their streams close.
        """
        self._closing = True
        runs = list(self.runs.values())
        for run in runs:
            self._stop(run, "AGUI_HUB_GATEWAY_STOPPING", "the gateway running the run stopped")
        tasks = list(self._tasks)
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=timeout)
            for task in pending:
                # Still retrying a store that does not answer: the gateway stops anyway.
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
        await self._client.aclose()
        return {
            run.thread: run.last_offset
            for run in runs
            if run.outcome is not None and run.last_offset is not None
        }

    # -- driving a run --------------------------------------------------------------------

    async def _drive(self, run: BridgedRun) -> None:
        """The run's task: stream the agent, then make sure the run ends in the thread."""
        failure: tuple[str, str] | None = None
        refused: RunActive | None = None
        run._driving = True
        try:
            if run.cancel_reason is not None:
                # Stopped before this task first ran (its cancel() was not sent: a
                # task cancelled before it starts would never run this cleanup).
                failure = run.cancel_reason
            else:
                await self._stream(run)
        except RunActive as exc:
            refused = exc  # another run took the thread: this one never started, store nothing
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # taken: what follows (storing the RUN_ERROR) runs as usual
            failure = run.cancel_reason or ("AGUI_HUB_RUN_CANCELLED", "the run was cancelled")
        except UpstreamError as exc:
            failure = (exc.run_error_code, str(exc))
        except StoreError as exc:
            failure = ("AGUI_HUB_STORE_UNAVAILABLE", f"the hub could not store the run: {exc}")
        except Exception as exc:  # last resort: the run still ends, the gateway goes on
            if run._released:
                # Its end is stored: only closing the agent's response failed.
                log.debug("run %s in thread %s: closing the response failed", run.run_id,
                          run.thread, exc_info=True)  # fmt: skip
            else:
                log.exception("run %s in thread %s failed", run.run_id, run.thread)
            failure = ("AGUI_HUB_INTERNAL_ERROR", f"the hub failed relaying the run: {exc!r}")
        run._ending = True
        try:
            if failure is not None:
                await self._fail(run, *failure)
        except Exception:
            log.exception(
                "run %s in thread %s: its RUN_ERROR was not stored", run.run_id, run.thread
            )
        finally:
            already = run._released  # then what failed was closing the response: not news
            self._release(run, failure, refused)
            if failure is not None and not already:
                log.info("run %s in thread %s ended: %s %s", run.run_id, run.thread, *failure)

    def _release(
        self,
        run: BridgedRun,
        failure: tuple[str, str] | None = None,
        refused: RunActive | None = None,
    ) -> None:
        """Count *run* as ended, free its thread and wake who waits for it (once).

        Called as soon as the run's end is stored, before its upstream response
        is closed (which takes a few turns of the loop): a client that starts
        the next run right after seeing the RUN_FINISHED is not refused
        ``run_active`` by a run that is over.
        """
        if run._released:
            return
        run._released = True
        run._ending = True
        outcome = run.outcome
        if refused is not None:
            kind = "refused"  # another run took the thread first: nothing stored
        elif outcome is None:
            kind = failure[0] if failure is not None else "error"
        elif outcome["type"] == "RUN_FINISHED":
            kind = "finished"
        elif failure is not None and outcome.get("code") == failure[0]:
            kind = failure[0]  # the RUN_ERROR the hub stored
        else:
            kind = "error"  # the agent's own
        self.ended[kind] = self.ended.get(kind, 0) + 1
        run.state = RunState.ENDED
        if self.runs.get(run.thread) is run:
            del self.runs[run.thread]
        if not run.started.done():
            run.started.set_exception(
                refused
                or StoreUnavailable(f"run {run.run_id!r}: nothing could be stored in the thread")
            )
            run.started.exception()  # retrieved: nobody has to wait for it
        run.done.set()

    async def _stream(self, run: BridgedRun) -> None:
        agent = run.agent
        timeout = httpx.Timeout(agent.idle_timeout, connect=agent.connect_timeout)
        # Not compressed: a few compressed bytes could unpack into a huge chunk,
        # and SSE is streamed piece by piece anyway.
        headers = {
            **dict(agent.headers),
            "Accept": "text/event-stream",
            "Accept-Encoding": "identity",
        }
        where = f"agent {agent.name!r} ({agent.url})"
        try:
            async with self._client.stream(
                "POST", agent.url, json=run.input, headers=headers, timeout=timeout
            ) as response:
                if response.status_code != 200:
                    body = await _head_of(response)
                    raise UpstreamError(
                        "upstream_status",
                        f"{where} answered HTTP {response.status_code} "
                        f"{response.reason_phrase}" + (f": {body}" if body else ""),
                    )
                kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
                if kind != "text/event-stream":
                    raise UpstreamError(
                        "upstream_malformed",
                        f"{where} answered with Content-Type {kind or 'none'!r}, "
                        "not text/event-stream: is the URL the agent's run endpoint?",
                    )
                coding = response.headers.get("content-encoding", "identity").strip().lower()
                if coding not in ("", "identity"):
                    raise UpstreamError(
                        "upstream_malformed",
                        f"{where} answered with Content-Encoding {coding!r} although the hub "
                        "asked for none (Accept-Encoding: identity): turn compression off for "
                        "its event streams",
                    )
                await self._relay(run, response, where)
        except httpx.TimeoutException as exc:
            if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
                raise UpstreamError(
                    "upstream_unreachable",
                    f"{where} did not accept a connection within {agent.connect_timeout:g} s",
                ) from None
            raise UpstreamError(
                "upstream_timeout",
                f"{where} sent nothing for {agent.idle_timeout:g} s (its idle timeout)",
            ) from None
        except httpx.ConnectError as exc:
            raise UpstreamError(
                "upstream_unreachable", f"{where} could not be reached: {exc}"
            ) from None
        except httpx.HTTPError as exc:
            raise UpstreamError(
                "upstream_closed",
                f"{where} broke off its response after {run.events} events: "
                f"{exc or type(exc).__name__}",
            ) from None

    async def _relay(self, run: BridgedRun, response: httpx.Response, where: str) -> None:
        """Store the agent's events as they come, in batches: a task of its own reads
        and parses the response while an append is under way, and the next append
        takes what it parsed meanwhile (up to :data:`BATCH_EVENTS`). An agent that
        writes one event at a time costs one append per burst, not per event."""
        inbox = _Inbox(4 * BATCH_EVENTS, 2 * self.max_sse_bytes)
        reader = asyncio.create_task(self._read(run, response, where, inbox))
        try:
            while True:
                batch = await inbox.take(BATCH_EVENTS)
                if batch:
                    await self._store(run, batch)
                    if run.outcome is not None:
                        # The run ended (and was released by the append that stored
                        # its end); whatever follows is not this run's.
                        return
                elif inbox.error is not None:
                    raise inbox.error  # after every event before it was stored
                else:
                    return  # the reader stopped at the run's end (stored above)
        finally:
            if not reader.done():
                reader.cancel()
            await asyncio.wait([reader])

    async def _read(
        self, run: BridgedRun, response: httpx.Response, where: str, inbox: _Inbox
    ) -> None:
        """Read and parse the agent's response into *inbox* until the run's end, an
        error (handed over in *inbox*, after the events before it) or a cancel."""
        parser = SseParser(max_event_bytes=self.max_sse_bytes)
        idle = run.agent.idle_timeout
        loop = asyncio.get_running_loop()
        last_event = loop.time()
        count = 0
        try:
            async for chunk in response.aiter_raw():
                too_large = None
                try:
                    found = parser.feed(chunk)
                except SseTooLarge as exc:
                    found, too_large = exc.events, exc
                for sse in found:
                    count += 1
                    try:
                        event = json.loads(sse.data)
                    except (ValueError, RecursionError) as exc:
                        raise UpstreamError(
                            "upstream_malformed",
                            f"{where} sent event #{count} that is not JSON ({exc}): "
                            f"{_quote(sse.data)}",
                        ) from None
                    if not isinstance(event, dict):
                        raise UpstreamError(
                            "upstream_invalid_event",
                            f"{where} sent event #{count} that is not an object: "
                            f"{_quote(sse.data)}",
                        )
                    await inbox.put(event, len(sse.data))
                    if event.get("type") in TERMINAL:
                        inbox.finish(None)
                        return  # the run's end: nothing after it is read
                if too_large is not None:
                    raise UpstreamError(
                        "upstream_malformed",
                        f"{where} sent an SSE line or event of over {too_large.limit} bytes "
                        f"(event #{count + 1})",
                    )
                now = loop.time()
                if found:
                    last_event = now
                elif now - last_event > idle:
                    # Keepalive comments reset the HTTP client's read timeout, not this one.
                    raise UpstreamError(
                        "upstream_timeout",
                        f"{where} sent no event for {idle:g} s (its idle timeout), only keepalives",
                    )
                await asyncio.sleep(0)  # a fast agent does not hold the event loop
            if parser.close():
                detail = "in the middle of an event"
            else:
                detail = f"after {count} events" if count else "without sending any event"
            raise UpstreamError(
                "upstream_closed",
                f"{where} ended its response {detail}, before the run's RUN_FINISHED or RUN_ERROR",
            )
        except asyncio.CancelledError:
            inbox.finish(None)
            raise
        except Exception as exc:  # httpx's too: _stream maps them where they are raised
            inbox.finish(exc)

    async def _store(self, run: BridgedRun, events: list[dict[str, Any]]) -> None:
        """Store *events* of the agent; on a refusal store those before it and raise.

        The append runs in a task of its own, shielded: a cancel that arrives
        meanwhile waits for its outcome (in :meth:`_fail`) instead of leaving
        the run not knowing what was stored.
        """
        if not events:
            return
        if run.first_offset is None:
            first = events[0]
            if first.get("type") not in ("RUN_STARTED", "RUN_ERROR"):
                raise UpstreamError(
                    "upstream_invalid_event",
                    f"agent {run.agent.name!r} began with {first.get('type')!r}: "
                    "an AG-UI run begins with RUN_STARTED",
                )
            if first.get("type") == "RUN_ERROR":
                # A RUN_ERROR alone would end whatever run another writer has going,
                # and the input's messages would not be kept: the hub's RUN_STARTED
                # goes with it, in the same append (refused whole if a run is going).
                events = [self._hub_started(run), *events]
            else:
                events = [self._amended(run, first), *events[1:]]
        ids = run.event_ids(len(events))
        try:
            await self._append(run, events, ids)
        except (SequenceError, InvalidEvent, ProtocolError) as exc:
            index = exc.index or 0
            if (
                isinstance(exc, SequenceError)
                and exc.rule == "run_already_active"
                and (run.first_offset is None)
            ):
                raise RunActive(f"another run took thread {run.thread!r} first") from None
            if (
                isinstance(exc, SequenceError)
                and run.first_offset is not None
                and exc.rule in _THREAD_CHANGED
                and index == 0
            ):
                # Not the agent's doing: the thread lost its events (a store without
                # persistence restarted) or another writer ended the run.
                raise UpstreamError(
                    "thread_changed",
                    f"thread {run.thread!r} changed under run {run.run_id!r} ({exc.rule}): "
                    "it was reset, or another writer ended the run; the agent's response "
                    "was closed",
                ) from None
            if index > 0:
                await self._append(run, events[:index], ids[:index])
            number = run.events + 1
            kind = events[index].get("type") if index < len(events) else None
            raise UpstreamError(
                "upstream_invalid_event",
                f"agent {run.agent.name!r} sent event #{number} ({kind}) that the hub refused: "
                f"[{exc.code}] {exc}",
            ) from None

    @staticmethod
    def _hub_started(run: BridgedRun) -> dict[str, Any]:
        """A RUN_STARTED of the hub's own for *run* (its agent sent none): the input's
        run id, ``parentRunId`` and new messages, as an agent's would be amended."""
        started: dict[str, Any] = {
            "type": "RUN_STARTED",
            "threadId": run.thread,
            "runId": run.run_id,
        }
        if run.parent_run_id is not None:
            started["parentRunId"] = run.parent_run_id
        if run.new_messages:
            started["input"] = {
                "threadId": run.thread,
                "runId": run.run_id,
                "messages": run.new_messages,
                **({"parentRunId": run.parent_run_id} if run.parent_run_id else {}),
            }
        return started

    def _amended(self, run: BridgedRun, first: dict[str, Any]) -> dict[str, Any]:
        """The agent's RUN_STARTED with what the thread should remember of the input."""
        if first.get("type") != "RUN_STARTED":
            return first
        amended = dict(first)
        if "input" not in first and run.new_messages:
            record: dict[str, Any] = {
                "threadId": run.thread,
                "runId": first.get("runId", run.run_id),
                "messages": run.new_messages,
            }
            if run.parent_run_id is not None:
                record["parentRunId"] = run.parent_run_id
            amended["input"] = record
        if "parentRunId" not in first and run.parent_run_id is not None:
            amended["parentRunId"] = run.parent_run_id
        if amended != first:
            run.first_event = first
        return amended

    async def _append(self, run: BridgedRun, events: list[dict[str, Any]], ids: list[str]) -> None:
        task = asyncio.ensure_future(self._append_retrying(run, events, ids))
        run._inflight = task
        offsets = await asyncio.shield(task)
        del offsets

    async def _append_retrying(
        self, run: BridgedRun, events: list[dict[str, Any]], ids: list[str]
    ) -> list[Offset]:
        deadline = time.monotonic() + STORE_RETRY_SECONDS
        pause = 0.05
        while True:
            try:
                offsets = await self.hub.publish(run.thread, events, ids)
                break
            except StoreUnavailable:
                if time.monotonic() + pause > deadline:
                    raise
                await asyncio.sleep(pause)  # the same ids: a lost reply stores nothing twice
                pause = min(pause * 2, 2.0)
        if run.first_offset is None:
            run.first_offset = offsets[0]
            run.state = RunState.STREAMING
            if not run.started.done():
                run.started.set_result(offsets[0])
        run.last_offset = offsets[-1]
        run.events += len(events)
        if events[-1].get("type") in TERMINAL:
            run.outcome = events[-1]
            if not run._ending:
                # The agent's end: the run is over now, not when its task next runs
                # (a RUN_ERROR of the hub's is counted by _drive, with its code).
                self._release(run)
        return offsets

    async def _fail(self, run: BridgedRun, code: str, message: str) -> None:
        """End the run with a RUN_ERROR, unless it has already ended."""
        inflight = run._inflight
        if inflight is not None and not inflight.done():
            await asyncio.wait([inflight])  # what it stored decides what follows
        if inflight is not None and inflight.done() and not inflight.cancelled():
            inflight.exception()  # retrieved: its failure is reported by the RUN_ERROR
        if run.outcome is not None:
            return  # the agent ended it (RUN_FINISHED or its own RUN_ERROR)
        error = {"type": "RUN_ERROR", "message": message, "code": code}
        # Nothing stored yet: a RUN_STARTED of the hub's own goes with it, in one
        # append, refused whole if another run holds the thread.
        events = [self._hub_started(run), error] if run.first_offset is None else [error]
        try:
            await self._append_retrying(run, events, run.event_ids(len(events)))
        except SequenceError as exc:
            # Another run holds the thread (this one never started), or another
            # writer ended the run: the thread's run has its end, or is not this one.
            log.warning(
                "run %s in thread %s: its RUN_ERROR (%s) was not stored: %s",
                run.run_id, run.thread, message, exc,
            )  # fmt: skip


class _Inbox:
    """Events read from an agent and not stored yet: bounded in count and bytes (the
    reader waits while it is full), with how the reading ended."""

    def __init__(self, max_events: int, max_bytes: int) -> None:
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.events: deque[tuple[dict[str, Any], int]] = deque()
        self.bytes = 0
        self.done = False
        self.error: BaseException | None = None
        """Why the reading stopped, when it was not the run's end."""
        self._ready = asyncio.Event()
        self._room = asyncio.Event()

    async def put(self, event: dict[str, Any], size: int) -> None:
        while self.events and (
            len(self.events) >= self.max_events or self.bytes + size > self.max_bytes
        ):
            self._room.clear()
            await self._room.wait()
        self.events.append((event, size))
        self.bytes += size
        self._ready.set()

    def finish(self, error: BaseException | None) -> None:
        self.done = True
        self.error = error
        self._ready.set()

    async def take(self, most: int) -> list[dict[str, Any]]:
        """Up to *most* events, once there is one; ``[]`` once reading ended and all
        were taken."""
        while not self.events and not self.done:
            self._ready.clear()
            await self._ready.wait()
        batch: list[dict[str, Any]] = []
        while self.events and len(batch) < most:
            event, size = self.events.popleft()
            self.bytes -= size
            batch.append(event)
        self._room.set()
        return batch


async def _head_of(response: httpx.Response) -> str:
    """The start of an error response's body, as text for a message (bounded)."""
    head = b""
    with contextlib.suppress(httpx.HTTPError):
        async for chunk in response.aiter_bytes():
            head += chunk
            if len(head) >= ERROR_BODY_CHARS:
                break
    return _quote(head.decode("utf-8", "replace"))


def _quote(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= ERROR_BODY_CHARS else text[:ERROR_BODY_CHARS] + "…"
