"""Runs of existing AG-UI agents through the hub: the upstream side of the HTTP bridge.

:class:`Bridge` runs an agent for a thread: it builds or takes the run's
input, has an :class:`~agui_hub.bridge.upstream.UpstreamRelay` POST it and
read the agent's SSE answer, and a :class:`~agui_hub.bridge.recorder.RunRecorder`
store every event into the thread through a
:class:`~agui_hub.bridge.sink.ThreadSink` (the gateway's hub), so every viewer of
the thread follows the run live and can resume it. The run belongs to the
gateway, not to whoever asked for it: when every viewer leaves, it goes on and
is stored to the end.

A run always ends in the thread. The agent's own RUN_FINISHED or RUN_ERROR
ends it; otherwise the bridge appends a RUN_ERROR saying what happened, with
a ``code`` starting ``AGUI_HUB_`` (docs/bridge.md lists them): the agent
failed (see :mod:`~agui_hub.bridge.upstream`), sent an event the hub refuses
(see :mod:`~agui_hub.bridge.recorder`), or somebody cancelled the run, or the
gateway stopped.

Exceptions are :class:`~agui_hub.errors.BridgeError` subclasses
(:class:`~agui_hub.errors.UnknownAgent`, :class:`~agui_hub.errors.RunActive`,
:class:`~agui_hub.errors.TooManyRuns`, :class:`~agui_hub.errors.NoActiveRun`)
raised when a run cannot start or be cancelled; failures after the start are
in the thread, as RUN_ERROR events.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping
from typing import Any

import httpx

from ..agui.events import RunAgentInput, parse_message, to_wire
from ..agui.runs import RunState as RunStatus
from ..agui.runs import RunTree
from ..errors import (
    InvalidEvent,
    NoActiveRun,
    RunActive,
    StoreError,
    StoreUnavailable,
    TooManyRuns,
    UnknownAgent,
    UpstreamError,
)
from ..wire.offsets import Offset
from .agents import AgentEndpoint
from .bridged_run import TERMINAL, BridgedRun, RunState
from .recorder import RunRecorder
from .sink import ThreadSink
from .upstream import UPSTREAM_KEEPALIVE, UpstreamRelay

__all__ = [
    "DEFAULT_MAX_RUNS",
    "TERMINAL",
    "UPSTREAM_KEEPALIVE",
    "Bridge",
    "BridgedRun",
    "RunState",
    "ThreadSink",
]

log = logging.getLogger("agui_hub.bridge")

DEFAULT_MAX_RUNS = 64
"""Upstream runs one gateway process has going at once."""


class Bridge:
    """The upstream runs of one gateway process.

    *hub* is where threads are read and runs stored (the gateway's hub);
    *agents* are the agents it may call by name; *max_event_bytes* is the
    largest event *hub* stores (the agents' SSE events are bounded by it);
    *raw_events* what is stored of the RAW events of agents that do not say
    (see :data:`~agui_hub.bridge.agents.RAW_EVENTS`).
    At most *max_runs* runs go at once, one per thread. Close it with
    :meth:`close`, which ends every run still going with a RUN_ERROR.
    """

    def __init__(
        self,
        hub: ThreadSink,
        agents: Mapping[str, AgentEndpoint],
        *,
        max_event_bytes: int,
        max_runs: int = DEFAULT_MAX_RUNS,
        transport: httpx.AsyncBaseTransport | None = None,
        raw_events: str = "keep",
    ) -> None:
        if max_runs < 1:
            raise ValueError("max_runs must be at least 1")
        self.hub = hub
        self.agents = dict(agents)
        self.max_runs = max_runs
        self.recorder = RunRecorder(hub, on_end=self._release)
        """Stores the runs' events, and their RUN_ERROR when they fail."""
        self.upstream = UpstreamRelay(
            self.recorder,
            max_event_bytes=max_event_bytes,
            transport=transport,
            raw_events=raw_events,
        )
        """POSTs the runs' inputs and relays the agents' answers to :attr:`recorder`."""
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
        parent_run_id: str | None = None,
    ) -> BridgedRun:
        """Start a run of *agent* in *thread*; returns once it is going.

        With *input* (a whole RunAgentInput, as an HTTP client sends it) that
        input goes to the agent as it is. Without, the hub builds it: the
        thread's messages (but activity messages, as the TypeScript client
        does) followed by *messages*, the thread's state unless *state* is
        given, *tools*, *context* and *forwarded_props*, and ``parentRunId``
        set to the thread's latest run. With *parent_run_id*, the messages and
        state are those of the branch that ends with that run, as of its end
        (a regenerate or an edit), and ``parentRunId`` is that run. Raises
        :class:`~agui_hub.errors.UnknownAgent`,
        :class:`~agui_hub.errors.UnknownRun` (no such run in the thread),
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
                forwarded_props, run_id, parent_run_id,
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
        parent_run_id: str | None = None,
    ) -> BridgedRun:
        # One run at a time in a thread, whatever its branch. The input is a
        # branch's: the one asked for, as of its end, or else the latest run's
        # when the thread has branches (without, that is the whole thread).
        tree = RunTree(await self.hub.runs(thread))
        latest = tree.runs[-1] if tree.runs else None
        if given is None and (parent_run_id is not None or len(tree.tips()) > 1):
            if latest is not None and latest.status is RunStatus.RUNNING:
                raise self._run_active(thread, latest.run_id)
            parent = parent_run_id or (latest.run_id if latest is not None else None)
            assert parent is not None  # a tree with two tips has runs
            folded, epoch, _cursor = await self.hub.fold(thread, branch=parent, tree=tree)
            last_run = latest.run_id if latest is not None else None
        else:
            folded, epoch, _cursor = await self.hub.fold(thread)
            current = folded.current_run
            if folded.run_active:
                raise self._run_active(thread, current.run_id if current else None)
            last_run = current.run_id if current is not None else None
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
            wire = {
                "threadId": thread,
                "runId": run_id or str(uuid.uuid4()),
                "state": folded.state if state is None else state,
                "messages": history + extra,
                "tools": tools or [],
                "context": context or [],
                "forwardedProps": forwarded_props if forwarded_props is not None else {},
            }
            if parent_run_id is not None:
                wire["parentRunId"] = parent_run_id
            elif last_run is not None:
                wire["parentRunId"] = last_run
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

    @staticmethod
    def _run_active(thread: str, run_id: str | None) -> RunActive:
        return RunActive(
            f"thread {thread!r} has run {run_id!r} going (its RUN_FINISHED or RUN_ERROR is "
            "not stored yet): cancel it or wait; if the gateway relaying it crashed, end it "
            "with `agui-hub cancel THREAD --abandoned`"
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
        await self.upstream.aclose()
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
                await self.upstream.relay(run)
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
                await self.recorder.fail(run, *failure)
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
