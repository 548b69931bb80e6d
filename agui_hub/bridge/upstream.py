"""Relaying one upstream agent's answer into its thread: :class:`UpstreamRelay`.

Most AG-UI agents are one HTTP endpoint: POST a ``RunAgentInput``, read an SSE
stream of events. The relay POSTs a run's input, checks the answer (HTTP 200,
``text/event-stream``, not compressed), parses it with
:class:`~agui_hub.wire.sse.SseParser` and hands the events, in batches, to a
:class:`~agui_hub.bridge.recorder.RunRecorder`. It stops at the run's
RUN_FINISHED or RUN_ERROR; anything else that ends the answer becomes one
:class:`~agui_hub.errors.UpstreamError` whose code says what happened (the
agent could not be reached, answered an HTTP error, sent something that is
not SSE or not JSON, went silent for longer than its idle timeout, or closed
its response before the run ended): the caller stores it as the run's
RUN_ERROR.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from typing import Any

import httpx

from ..errors import UpstreamError
from ..wire.sse import SseParser, SseTooLarge
from .agents import RAW_EVENTS
from .bridged_run import TERMINAL, BridgedRun
from .recorder import RunRecorder

__all__ = ["BATCH_EVENTS", "ERROR_BODY_CHARS", "UPSTREAM_KEEPALIVE", "UpstreamRelay"]

UPSTREAM_KEEPALIVE = 16
"""Idle connections to upstream agents kept open for the next run."""

BATCH_EVENTS = 256
"""Most upstream events stored in one append (a burst of token deltas goes together)."""

ERROR_BODY_CHARS = 300
"""How much of an upstream error response's body a RUN_ERROR message quotes."""


class UpstreamRelay:
    """Runs' requests to their agents, and the relay of each answer into *recorder*.

    Holds the HTTP client (and its idle connections) that every run's request
    goes through, *transport* for tests. *max_event_bytes* is the size the hub
    stores of one event. *raw_events* (one of
    :data:`~agui_hub.bridge.agents.RAW_EVENTS`) is what is stored of the RAW
    events of agents that do not say (``AgentEndpoint.raw_events``). Close it
    with :meth:`aclose` once no run is relayed.
    """

    def __init__(
        self,
        recorder: RunRecorder,
        *,
        max_event_bytes: int,
        transport: httpx.AsyncBaseTransport | None = None,
        raw_events: str = "keep",
    ) -> None:
        if raw_events not in RAW_EVENTS:
            raise ValueError(f"raw_events is one of {', '.join(RAW_EVENTS)}, not {raw_events!r}")
        self.recorder = recorder
        self.raw_events = raw_events
        # JSON from the agent is larger than the msgpack the hub stores: the
        # writer judges the stored size, the parser only stops runaway buffers.
        self.max_sse_bytes = 2 * max_event_bytes + 4096
        self._client = httpx.AsyncClient(
            transport=transport,
            follow_redirects=False,
            # Per request timeouts come from each agent; no pool limit beyond max_runs.
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=UPSTREAM_KEEPALIVE),
            trust_env=False,
        )

    async def aclose(self) -> None:
        """Close the HTTP client and its idle connections to the agents."""
        await self._client.aclose()

    async def relay(self, run: BridgedRun) -> None:
        """POST *run*'s input to its agent and store the events of its answer, up to the
        run's end.

        Raises :class:`~agui_hub.errors.UpstreamError` when the agent fails (end
        the run with its :attr:`~agui_hub.errors.UpstreamError.run_error_code`),
        and whatever :meth:`RunRecorder.store
        <agui_hub.bridge.recorder.RunRecorder.store>` raises.
        """
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
                await self._store_as_read(run, response, where)
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

    async def _store_as_read(self, run: BridgedRun, response: httpx.Response, where: str) -> None:
        """Store the agent's events as they come, in batches: a task of its own reads
        and parses the response while an append is under way, and the next append
        takes what it parsed meanwhile (up to :data:`BATCH_EVENTS`). An agent that
        writes one event at a time costs one append per burst, not per event."""
        ahead = _ReadAhead(4 * BATCH_EVENTS, 2 * self.max_sse_bytes)
        reader = asyncio.create_task(self._read(run, response, where, ahead))
        try:
            while True:
                batch = await ahead.take(BATCH_EVENTS)
                if batch:
                    await self.recorder.store(run, batch)
                    if run.outcome is not None:
                        # The run ended (and was released by the append that stored
                        # its end); whatever follows is not this run's.
                        return
                elif ahead.error is not None:
                    raise ahead.error  # after every event before it was stored
                else:
                    return  # the reader stopped at the run's end (stored above)
        finally:
            if not reader.done():
                reader.cancel()
            await asyncio.wait([reader])

    async def _read(
        self, run: BridgedRun, response: httpx.Response, where: str, ahead: _ReadAhead
    ) -> None:
        """Read and parse the agent's response into *ahead* until the run's end, an
        error (handed over in *ahead*, after the events before it) or a cancel."""
        parser = SseParser(max_event_bytes=self.max_sse_bytes)
        idle = run.agent.idle_timeout
        raw_events = run.agent.raw_events or self.raw_events
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
                    if event.get("type") == "RAW" and raw_events != "keep":
                        if raw_events == "drop":
                            continue
                        event = _stripped(event)
                    await ahead.put(event, len(sse.data))
                    if event.get("type") in TERMINAL:
                        ahead.finish(None)
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
            ahead.finish(None)
            raise
        except Exception as exc:  # httpx's too: relay() maps them where they are raised
            ahead.finish(exc)


class _ReadAhead:
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
        """Add *event* (*size* bytes as read), once there is room for it."""
        while self.events and (
            len(self.events) >= self.max_events or self.bytes + size > self.max_bytes
        ):
            self._room.clear()
            await self._room.wait()
        self.events.append((event, size))
        self.bytes += size
        self._ready.set()

    def finish(self, error: BaseException | None) -> None:
        """The reading stopped: at the run's end or a cancel (``None``), or on *error*."""
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


def _stripped(event: dict[str, Any]) -> dict[str, Any]:
    """A RAW event without its payload (``raw_events = "strip"``)."""
    kept: dict[str, Any] = {key: event[key] for key in ("source", "timestamp") if key in event}
    return {"type": "RAW", "event": None, **kept}


def _quote(text: str) -> str:
    """*text* on one line, cut at :data:`ERROR_BODY_CHARS` characters, for a message."""
    text = " ".join(text.split())
    return text if len(text) <= ERROR_BODY_CHARS else text[:ERROR_BODY_CHARS] + "…"
