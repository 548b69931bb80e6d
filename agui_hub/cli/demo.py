"""A realistic AG-UI agent run, for the ``agui-hub demo`` command.

``agui-hub demo`` publishes :func:`demo_run` into a thread with the pauses it
gives, so that a newcomer watching the thread (``agui-hub tail``, or any
AG-UI front end) sees the hub at work within seconds: a user asks about the
weather, the agent thinks, explains, calls a ``get_weather`` tool for two
cities while its shared state fills in, and answers.

The run uses every common part of the protocol: run markers, a user and two
assistant text messages streamed word by word, a step with a reasoning span
and reasoning message, two tool calls whose arguments stream in several
deltas followed by their results, a state snapshot and JSON Patch deltas, and
a run result. It is a valid AG-UI 1.0 stream: every event is in canonical wire
form, the sequence passes :class:`~agui_hub.agui.sequence.SequenceVerifier`
(nothing is left open), and it folds with :mod:`agui_hub.agui.reducer` without a
rejected event.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

__all__ = ["demo_run"]

Event = dict[str, Any]

QUESTION: Final = "What's the weather like in Paris and Berlin today? I'm packing for a trip."
THOUGHT: Final = (
    "The user wants today's weather in two cities. I should call get_weather for Paris "
    "and for Berlin, then compare the forecasts and suggest what to pack."
)
INTRO: Final = "Let me check the current weather in Paris and Berlin for you."
ANSWER: Final = (
    "Paris is sunny and 18 °C, while Berlin is cloudy and 12 °C with a 60% chance of rain. "
    "Pack sunglasses for Paris, and a light jacket and an umbrella for Berlin."
)
FORECASTS: Final[dict[str, dict[str, Any]]] = {
    "Paris": {"temperature": 18, "conditions": "sunny"},
    "Berlin": {"temperature": 12, "conditions": "cloudy", "chanceOfRain": 0.6},
}
RESULT: Final[dict[str, Any]] = {"cities": ["Paris", "Berlin"], "warmest": "Paris"}

# Pauses in seconds. Token deltas vary a little so the stream looks typed by a
# model rather than a metronome; the cycle keeps the run deterministic.
_TOKEN_DELAYS: Final = (0.03, 0.022, 0.038, 0.026, 0.034, 0.024, 0.04, 0.029)
_TOOL_LATENCY: Final = {"Paris": 0.45, "Berlin": 0.38}
_THINKING_PAUSE: Final = 0.6
_STEP_PAUSE: Final = 0.25
_SHORT_PAUSE: Final = 0.08


def _words(text: str) -> list[str]:
    """*text* split into word deltas that join back to it (spaces lead)."""
    return re.findall(r"\s*\S+", text)


def _args_deltas(city: str) -> list[str]:
    """The arguments of a get_weather call, cut where a model's tokens would cut them."""
    half = len(city) // 2
    return ['{"city": ', f'"{city[:half]}', f'{city[half:]}", ', '"unit": ', '"celsius"}']


class _Run:
    """Collects (delay, event) pairs; token delays cycle through _TOKEN_DELAYS."""

    def __init__(self) -> None:
        self.events: list[tuple[float, Event]] = []
        self._tokens = 0

    def add(self, delay: float, event: Event) -> None:
        self.events.append((delay, event))

    def token_delay(self) -> float:
        delay = _TOKEN_DELAYS[self._tokens % len(_TOKEN_DELAYS)]
        self._tokens += 1
        return delay

    def text(self, message_id: str, role: str, text: str, first_delay: float) -> None:
        self.add(first_delay, {"type": "TEXT_MESSAGE_START", "messageId": message_id, "role": role})
        for word in _words(text):
            delta = {"type": "TEXT_MESSAGE_CONTENT", "messageId": message_id, "delta": word}
            self.add(self.token_delay(), delta)
        self.add(self.token_delay(), {"type": "TEXT_MESSAGE_END", "messageId": message_id})


def demo_run(thread: str, run_id: str) -> list[tuple[float, dict[str, Any]]]:
    """One realistic agent run in *thread*: ``(seconds to wait before it, wire event)`` pairs.

    Publish the events in order, sleeping each delay first; the delays add
    up to about six and a half seconds. The result is the same for the same arguments,
    and every message, tool call and reasoning id is derived from *run_id*,
    so publish each run of a thread with a new *run_id*. The events are
    canonical wire dicts (what :func:`agui_hub.agui.events.validate_wire`
    returns); each call returns fresh dicts that the caller may change.
    """
    ids = {
        name: f"{run_id}-{name}" for name in ("question", "thinking", "thought", "intro", "answer")
    }
    run = _Run()
    run.add(0.0, {"type": "RUN_STARTED", "threadId": thread, "runId": run_id})

    # The user's question arrives whole, as a front end sends it.
    question = ids["question"]
    run.add(_SHORT_PAUSE, {"type": "TEXT_MESSAGE_START", "messageId": question, "role": "user"})
    run.add(0.0, {"type": "TEXT_MESSAGE_CONTENT", "messageId": question, "delta": QUESTION})
    run.add(0.0, {"type": "TEXT_MESSAGE_END", "messageId": question})

    run.add(_STEP_PAUSE, {"type": "STEP_STARTED", "stepName": "plan"})
    run.add(_SHORT_PAUSE, {"type": "REASONING_START", "messageId": ids["thinking"]})
    thought = ids["thought"]
    run.add(
        _THINKING_PAUSE,
        {"type": "REASONING_MESSAGE_START", "messageId": thought, "role": "reasoning"},
    )
    for word in _words(THOUGHT):
        delta = {"type": "REASONING_MESSAGE_CONTENT", "messageId": thought, "delta": word}
        run.add(run.token_delay(), delta)
    run.add(run.token_delay(), {"type": "REASONING_MESSAGE_END", "messageId": thought})
    run.add(0.0, {"type": "REASONING_END", "messageId": ids["thinking"]})
    run.add(_SHORT_PAUSE, {"type": "STEP_FINISHED", "stepName": "plan"})

    run.text(ids["intro"], "assistant", INTRO, _STEP_PAUSE)

    run.add(_STEP_PAUSE, {"type": "STEP_STARTED", "stepName": "fetch_weather"})
    snapshot = {"status": "fetching weather", "progress": 0, "cities": [], "forecasts": {}}
    run.add(_SHORT_PAUSE, {"type": "STATE_SNAPSHOT", "snapshot": snapshot})
    for done, (city, forecast) in enumerate(FORECASTS.items(), start=1):
        call = f"{run_id}-call-{city.lower()}"
        start = {
            "type": "TOOL_CALL_START",
            "toolCallId": call,
            "toolCallName": "get_weather",
            "parentMessageId": ids["intro"],
        }
        run.add(_STEP_PAUSE, start)
        for piece in _args_deltas(city):
            run.add(
                run.token_delay(), {"type": "TOOL_CALL_ARGS", "toolCallId": call, "delta": piece}
            )
        run.add(run.token_delay(), {"type": "TOOL_CALL_END", "toolCallId": call})
        content = json.dumps({"city": city, "unit": "celsius", **forecast})
        result = {
            "type": "TOOL_CALL_RESULT",
            "messageId": f"{run_id}-result-{city.lower()}",
            "toolCallId": call,
            "content": content,
            "role": "tool",
        }
        run.add(_TOOL_LATENCY[city], result)
        progress: float = 1 if done == len(FORECASTS) else done / len(FORECASTS)
        patch = [
            {"op": "replace", "path": "/progress", "value": progress},
            {"op": "add", "path": "/cities/-", "value": city},
            {"op": "add", "path": f"/forecasts/{city}", "value": dict(forecast)},
        ]
        run.add(_SHORT_PAUSE, {"type": "STATE_DELTA", "delta": patch})
    run.add(_SHORT_PAUSE, {"type": "STEP_FINISHED", "stepName": "fetch_weather"})

    run.text(ids["answer"], "assistant", ANSWER, _THINKING_PAUSE)
    done_patch = [{"op": "replace", "path": "/status", "value": "done"}]
    run.add(_SHORT_PAUSE, {"type": "STATE_DELTA", "delta": done_patch})
    finished = {"type": "RUN_FINISHED", "threadId": thread, "runId": run_id}
    run.add(_SHORT_PAUSE, {**finished, "result": {**RESULT, "cities": list(RESULT["cities"])}})
    return run.events
