"""Hand-written AG-UI runs and event builders shared by the tests.

:func:`realistic_run` is one agent run as a front end sees it: text messages
streamed token by token, tool calls with arguments and results, state
snapshots and deltas. The one-liners build single events for tests that
compose sequences by hand (including broken ones).
"""

from __future__ import annotations

import uuid
from typing import Any

Event = dict[str, Any]


def realistic_run(
    thread: str, run: str, *, turns: int = 7, deltas: int = 25, args: int = 10
) -> list[Event]:
    """One agent run of *turns* turns, each a text message of *deltas* deltas, a
    tool call with *args* argument deltas and a result, and a state delta
    (~290 events by default)."""
    events: list[Event] = [
        {"type": "RUN_STARTED", "threadId": thread, "runId": run},
        {"type": "STATE_SNAPSHOT", "snapshot": {"progress": 0, "notes": [], "run": run}},
    ]
    for turn in range(turns):
        message, call = f"{run}-m{turn}", f"{run}-tc{turn}"
        events.append({"type": "TEXT_MESSAGE_START", "messageId": message, "role": "assistant"})
        events += [
            {"type": "TEXT_MESSAGE_CONTENT", "messageId": message, "delta": f"tök{k}✓ "}
            for k in range(deltas)
        ]
        events.append({"type": "TEXT_MESSAGE_END", "messageId": message})
        events.append(
            {
                "type": "TOOL_CALL_START",
                "toolCallId": call,
                "toolCallName": "search",
                "parentMessageId": message,
            }
        )
        events += [
            {"type": "TOOL_CALL_ARGS", "toolCallId": call, "delta": f'{{"q{k}": "é{k}"}}'}
            for k in range(args)
        ]
        events.append({"type": "TOOL_CALL_END", "toolCallId": call})
        events.append(
            {
                "type": "TOOL_CALL_RESULT",
                "messageId": f"{run}-r{turn}",
                "toolCallId": call,
                "content": f"result {turn}",
            }
        )
        events.append(
            {
                "type": "STATE_DELTA",
                "delta": [
                    {"op": "replace", "path": "/progress", "value": turn + 1},
                    {"op": "add", "path": "/notes/-", "value": f"note {turn}"},
                ],
            }
        )
    events.append(
        {"type": "RUN_FINISHED", "threadId": thread, "runId": run, "result": {"turns": turns}}
    )
    return events


def run_started(thread: str, run: str = "r1") -> Event:
    return {"type": "RUN_STARTED", "threadId": thread, "runId": run}


def run_finished(thread: str, run: str = "r1") -> Event:
    return {"type": "RUN_FINISHED", "threadId": thread, "runId": run}


def start(message: str) -> Event:
    return {"type": "TEXT_MESSAGE_START", "messageId": message, "role": "assistant"}


def content(message: str, delta: str = "x") -> Event:
    return {"type": "TEXT_MESSAGE_CONTENT", "messageId": message, "delta": delta}


def end(message: str) -> Event:
    return {"type": "TEXT_MESSAGE_END", "messageId": message}


def new_thread() -> str:
    """A thread name no other test uses."""
    return f"t-{uuid.uuid4().hex[:12]}"
