"""A chat-transcript rendering of AG-UI events, for ``agui-hub tail``.

:class:`TranscriptView` turns events, one at a time, into the text a terminal
shows: token deltas stream inline after an ``assistant: `` header, tool calls
read ``tool get_weather({"city": "Paris"})``, runs and steps are marker lines,
everything else is one short line. It does no I/O: the caller writes what
:meth:`TranscriptView.render` returns.

.. code-block:: text

    ── run r1 started
    user: What is the weather in Paris?
    ▸ step plan
    thinking: The user wants the weather; call the tool.
    assistant: Let me check.
    tool get_weather({"city": "Paris"})
      ↳ {"temperature": 18}
    state: replace /progress = 0.5
    ── run r1 finished

Only one line can be open at a time. An event for another item (or any event
that prints a line of its own) first ends the open line; a delta for an item
whose line was interrupted reopens it with a continuation header
(``assistant (cont.): ``, ``tool get_weather(…``). Every tool call line that
was opened gets its closing ``)`` once, when the call ends: at the end of its
line when that line is still open, else on a line of its own
(``tool get_weather(…)``). Work of a subagent (events with ``subagentRunId``)
is prefixed with ``[<subagentRunId>] ``.

``RAW`` events (an agent framework's own events, wrapped: LangGraph's
adapter sends one per LangChain event, 1 to 3 kB each) and bulky ``CUSTOM``
events (a value of more than :data:`LIMIT` characters of JSON) are shown
according to *raw*: ``"short"`` (the default) counts them and writes one line
``raw: 23 events (41.2 kB)`` when the next line starts, so that they never
split a streamed answer; ``"hide"`` shows nothing of them; ``"full"`` writes
each as a line of its own, whole. A ``CUSTOM`` event with a small value is a
line of its own (``custom name: {...}``) in every mode.

Resuming after a restart: rendering is a pure function of (state, event).
Save :meth:`TranscriptView.state` (small, JSON-serialisable) after writing
an event's text, and a view built with ``TranscriptView(state=saved)`` renders
the following events exactly as the first view would have: an open line is
continued where it stopped, with no new header. The saved state must describe
exactly what was written, so a viewer that stops and means to resume writes
nothing more (not :meth:`~TranscriptView.close`, which ends the open line)
after its last save. The state holds only the open line's item and the items
still open, so it does not grow with the length of the thread.

A relay may receive anything a producer stored, so :meth:`~TranscriptView.render`
accepts any mapping (unknown types, missing fields, wrong types) and never
raises; control characters in event content (other than newline and tab) are
shown escaped (``\\x1b``), never sent to the terminal.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

from ..agui.chunks import CLOSING_EVENT_TYPES

__all__ = ["TranscriptView"]

STATE_VERSION: Final = 2
"""Version of the dict :meth:`TranscriptView.state` returns (version 1, which
had no count of RAW events, is read too)."""

RAW_MODES: Final = ("short", "hide", "full")
"""How a :class:`TranscriptView` shows RAW and bulky CUSTOM events (see above)."""

LIMIT: Final = 200
"""Longest one-line summary (tool results, state, snapshot messages), in characters."""

_OP_VALUE_LIMIT: Final = 80
_MALFORMED_LIMIT: Final = 120

# Kinds of streamed item; an item's key is "<kind>:<id>".
_TEXT: Final = "text"
_TOOL: Final = "tool"
_REASONING: Final = "reasoning"
_KINDS: Final = frozenset({_TEXT, _TOOL, _REASONING})

# Chunk streams end the way agui_hub.agui.chunks ends them.
_CLOSE_ALL_LANES: Final = frozenset(
    {"RUN_STARTED", "RUN_FINISHED", "RUN_ERROR", "MESSAGES_SNAPSHOT"}
)
_CLOSE_SUBAGENT_LANE: Final = frozenset({"SUBAGENT_FINISHED", "SUBAGENT_ERROR"})
_CLOSE_OWN_LANE: Final = CLOSING_EVENT_TYPES - _CLOSE_ALL_LANES - _CLOSE_SUBAGENT_LANE

# ANSI styles.
_RESET: Final = "\x1b[0m"
_DIM: Final = "2"
_RED: Final = "31"
_TOOL_STYLE: Final = "1;35"
_SUBAGENT_STYLE: Final = "34"
_THINKING_STYLE: Final = "2;3"
_ROLE_STYLES: Final = {
    "user": "1;36",
    "assistant": "1;32",
    "system": "1;33",
    "developer": "1;33",
}
_OTHER_ROLE_STYLE: Final = "1"

# Anything a terminal could act on: C0 controls except newline and tab, DEL, C1
# controls (0x9b is a one-byte CSI), line / paragraph separators, bidi
# overrides (they reorder what is shown) and lone surrogates (not encodable).
_CONTROL: Final = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
# On a one-line summary, newline and tab are shown too.
_CONTROL_ONE_LINE: Final = re.compile(
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


def _escape_char(match: re.Match[str]) -> str:
    char = match.group()
    if char == "\n":
        return "↵"
    if char == "\t":
        return " "
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _clean(text: str) -> str:
    """*text* with control characters escaped; newlines and tabs kept."""
    if _CONTROL.search(text) is None:
        return text
    return _CONTROL.sub(_escape_char, text)


def _one_line(text: str, limit: int = LIMIT) -> str:
    """*text* on one line (newlines shown as ↵), control characters escaped, at most *limit*."""
    head = text[: limit + 1]  # enough to tell whether it must be cut
    if _CONTROL_ONE_LINE.search(head) is not None:
        head = _CONTROL_ONE_LINE.sub(_escape_char, head)
    if len(text) > limit or len(head) > limit:
        return head[: limit - 1] + "…"
    return head


_FULL_LIMIT: Final = 1 << 20
"""Characters of a RAW or CUSTOM value written whole (``raw="full"``), or measured."""


def _kilobytes(size: int) -> str:
    return f"{size} B" if size < 1000 else f"{size / 1000:.1f} kB"


def _json(value: Any, limit: int = LIMIT) -> str:
    """Compact JSON of *value*, cut at *limit* characters; never raises.

    Works on any value, not only JSON ones (a producer may have stored
    anything), and stops walking once the limit is reached, so a large
    snapshot costs no more than a small one.
    """
    parts: list[str] = []
    size = 0

    def put(text: str) -> bool:
        nonlocal size
        parts.append(text)
        size += len(text)
        return size <= limit

    def walk(item: Any, depth: int) -> bool:
        if item is None:
            return put("null")
        if item is True:
            return put("true")
        if item is False:
            return put("false")
        if isinstance(item, str):
            return put(json.dumps(item[: limit + 1], ensure_ascii=False))
        if isinstance(item, int):
            try:
                return put(int.__repr__(item))
            except ValueError:  # more digits than Python converts to text
                return put("…")
        if isinstance(item, float):
            return put(float.__repr__(item) if math.isfinite(item) else str(item))
        if depth > 20:
            return put("…")
        if isinstance(item, Mapping):
            if not put("{"):
                return False
            for index, (key, sub) in enumerate(item.items()):
                if index and not put(","):
                    return False
                key_text = key if isinstance(key, str) else _safe_repr(key)
                if not put(json.dumps(key_text[: limit + 1], ensure_ascii=False) + ":"):
                    return False
                if not walk(sub, depth + 1):
                    return False
            return put("}")
        if isinstance(item, list | tuple):
            if not put("["):
                return False
            for index, sub in enumerate(item):
                if index and not put(","):
                    return False
                if not walk(sub, depth + 1):
                    return False
            return put("]")
        return put(_safe_repr(item))

    try:
        walk(value, 0)
    except Exception:  # a hostile mapping or sequence; show what was gathered
        parts.append("…")
    return _one_line("".join(parts), limit)


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)[:LIMIT]
    except Exception:
        return f"<{type(value).__name__}>"


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _content_text(content: Any) -> str:
    """The text of a message or tool result content: a string or a list of parts."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        pieces: list[str] = []
        size = 0
        for part in content:
            if size > LIMIT:
                break  # the summary is cut there anyway
            if isinstance(part, Mapping):
                kind = part.get("type")
                text = part.get("text")
                if kind == "text" and isinstance(text, str):
                    piece = text[: LIMIT + 1]
                else:
                    piece = f"[{kind}]" if isinstance(kind, str) else "[?]"
            else:
                piece = _json(part)
            pieces.append(piece)
            size += len(piece) + 1
        return " ".join(pieces)
    return _json(content)


def _patch_text(patch: Any) -> str:
    """``replace /progress = 0.5; add /cities/- = "Paris"`` for a JSON Patch."""
    if not isinstance(patch, list):
        return _json(patch)
    ops = []
    for op in patch:
        if not isinstance(op, Mapping):
            ops.append(_json(op, _OP_VALUE_LIMIT))
            continue
        name = _str(op.get("op")) or "?"
        path = _str(op.get("path"))
        path = "?" if path is None else path or '""'
        if name in ("move", "copy"):
            source = _str(op.get("from")) or "?"
            ops.append(f"{name} {source} -> {path}")
        elif "value" in op:
            ops.append(f"{name} {path} = {_json(op.get('value'), _OP_VALUE_LIMIT)}")
        else:
            ops.append(f"{name} {path}")
        if sum(len(o) for o in ops) > LIMIT:
            break  # the line is cut anyway
    return "; ".join(ops)


def _check_state(
    state: Any,
) -> tuple[str | None, bool, dict[str, dict[str, Any]], dict[str, str], list[int]]:
    """Validate a saved state; returns owned copies of its parts or raises ValueError."""

    def bad(why: str) -> ValueError:
        return ValueError(
            f"not a saved TranscriptView state ({why}); start without one to render afresh"
        )

    if not isinstance(state, dict):
        raise bad(f"expected a dict, got {type(state).__name__}")
    version = state.get("version")
    if type(version) is not int or version not in (1, STATE_VERSION):
        raise bad(f"version {version!r}, this version reads 1 and {STATE_VERSION}")
    expected = {"version", "line", "nl", "items", "lanes"} | ({"raw"} if version > 1 else set())
    if set(state) != expected:
        raise bad(f"expected the keys {sorted(expected)}, got {sorted(map(str, state))}")
    raw = state.get("raw", [0, 0])
    if (
        not isinstance(raw, list)
        or len(raw) != 2
        or not all(type(n) is int and n >= 0 for n in raw)
    ):
        raise bad(f"'raw' must be [events, bytes] not shown yet, got {raw!r}")
    line, nl, items, lanes = state["line"], state["nl"], state["items"], state["lanes"]
    if line is not None and (not isinstance(line, str) or line.partition(":")[0] not in _KINDS):
        raise bad(f"'line' must be null or an item key like 'text:m1', got {line!r}")
    if not isinstance(nl, bool):
        raise bad(f"'nl' must be a boolean, got {nl!r}")
    if not isinstance(items, dict):
        raise bad("'items' must be a dict")
    owned_items: dict[str, dict[str, Any]] = {}
    for key, item in items.items():
        if not isinstance(key, str) or key.partition(":")[0] not in _KINDS:
            raise bad(f"item key {key!r} is not like 'text:m1'")
        if not isinstance(item, dict) or not set(item) <= {"role", "name", "sub", "chunk"}:
            raise bad(f"item {key!r} is not a dict of role / name / sub / chunk")
        for field in ("role", "name", "sub"):
            if field in item and not isinstance(item[field], str):
                raise bad(f"item {key!r}: {field!r} must be a string")
        if "chunk" in item and item["chunk"] is not True:
            raise bad(f"item {key!r}: 'chunk' must be true when present")
        owned_items[key] = dict(item)
    if not isinstance(lanes, dict) or not all(
        isinstance(lane, str) and isinstance(key, str) and key.partition(":")[0] in _KINDS
        for lane, key in lanes.items()
    ):
        raise bad("'lanes' must map lane names to item keys")
    return line, nl, owned_items, dict(lanes), list(raw)


class TranscriptView:
    """Renders a thread's events as a chat transcript, one event at a time.

    Write what :meth:`render`, :meth:`notice`, :meth:`reset` and
    :meth:`close` return, in order, to one terminal. With *color*, roles,
    tool names, markers and errors are coloured with ANSI codes; without it
    the output holds no escape codes at all. *state* is a dict from
    :meth:`state` of an earlier view (after a JSON round trip is fine) to
    continue exactly where it stopped; a dict that is not such a state raises
    :class:`ValueError`. *raw* is one of :data:`RAW_MODES`: how RAW and
    bulky CUSTOM events are shown (see the module's docstring).
    """

    __slots__ = ("_color", "_items", "_lanes", "_line", "_nl", "_raw", "_raw_mode")

    def __init__(
        self,
        *,
        color: bool = False,
        state: dict[str, Any] | None = None,
        raw: str = "short",
    ) -> None:
        if raw not in RAW_MODES:
            raise ValueError(f"raw must be one of {', '.join(RAW_MODES)}, not {raw!r}")
        self._color = color
        self._raw_mode = raw
        # RAW (and bulky CUSTOM) events counted and not shown yet: [events, bytes].
        self._raw = [0, 0]
        # The item whose line is open ("text:m1"), or None when the cursor is
        # at the start of a line.
        self._line: str | None = None
        # Whether the open line's text already ends with a newline (a delta
        # did), so that ending the line adds no blank one.
        self._nl = False
        # Items started and not yet ended: key -> role / name / sub / chunk.
        # What a continuation header needs, nothing more.
        self._items: dict[str, dict[str, Any]] = {}
        # Chunk streams being assembled: lane ("" for the parent agent,
        # "s:<subagentRunId>") -> item key, as agui_hub.agui.chunks keeps them.
        self._lanes: dict[str, str] = {}
        if state is not None:
            self._line, self._nl, self._items, self._lanes, self._raw = _check_state(state)

    # -- public API ------------------------------------------------------------

    def render(self, event: Mapping[str, Any]) -> str:
        """The text to write for *event* (may be ``""``); never raises.

        *event* is a wire dict (camelCase keys). Anything else, including
        unknown types and missing or mistyped fields, gives one short line.
        """
        try:
            ev = event if type(event) is dict else dict(event)
            return self._render(ev)
        except Exception:  # a hostile mapping; report it and keep the view usable
            return self._emit(self._paint("── unrenderable event", _DIM))

    def notice(self, text: str) -> str:
        """A marker line ``── text`` (ending any open line first), e.g. "reconnected"."""
        return self._emit(self._paint("── " + _one_line(text, 10 * LIMIT), _DIM))

    def reset(self) -> str:
        """Forget every open item (call it before rendering a snapshot of the thread).

        Returns the text that ends an open line; write it.
        """
        out = self._break()
        self._items.clear()
        self._lanes.clear()
        return out

    def close(self) -> str:
        """The text that ends an open line; write it before exiting."""
        return self._break()

    def state(self) -> dict[str, Any]:
        """A small JSON-serialisable dict to resume from (``TranscriptView(state=...)``).

        Take it after writing the text of the last event rendered. The colour
        setting is not part of it: pass the same *color* to the new view.
        """
        return {
            "version": STATE_VERSION,
            "line": self._line,
            "nl": self._nl,
            "items": {key: dict(item) for key, item in self._items.items()},
            "lanes": dict(self._lanes),
            "raw": list(self._raw),
        }

    def __repr__(self) -> str:
        return f"<TranscriptView line={self._line!r} open={len(self._items)}>"

    # -- output helpers --------------------------------------------------------

    def _paint(self, text: str, style: str) -> str:
        return f"\x1b[{style}m{text}{_RESET}" if self._color else text

    def _break(self) -> str:
        """End the open line, if any, and write the count of RAW events not shown."""
        out = ""
        if self._line is not None:
            out = "" if self._nl else "\n"
            self._line, self._nl = None, False
        if self._raw[0]:
            (events, size), self._raw = self._raw, [0, 0]
            what = "1 event" if events == 1 else f"{events} events"
            out += self._paint(f"raw: {what} ({_kilobytes(size)})", _DIM) + "\n"
        return out

    def _emit(self, line: str, sub: str | None = None) -> str:
        """A line of its own: ends the open line first."""
        return f"{self._break()}{self._prefix(sub)}{line}\n"

    def _prefix(self, sub: str | None) -> str:
        if sub is None:
            return ""
        return self._paint(f"[{_one_line(sub, 60)}]", _SUBAGENT_STYLE) + " "

    def _marker(self, text: str, style: str = _DIM, sub: str | None = None) -> str:
        return self._emit(self._paint("── " + text, style), sub)

    def _malformed(self, ev: Mapping[str, Any], why: str) -> str:
        etype = ev.get("type")
        label = _one_line(etype, 60) if isinstance(etype, str) else "event"
        return self._marker(f"malformed {label} ({why}): {_json(ev, _MALFORMED_LIMIT)}")

    def _header(self, key: str, sub: str | None, cont: bool) -> str:
        """The text that opens the line of item *key* (``assistant: ``, ``tool f(``)."""
        kind, _, _ = key.partition(":")
        item = self._items.get(key)
        if item is not None:
            sub = item.get("sub")
        if kind == _TOOL:
            name = item.get("name", "?") if item is not None else "?"
            return f"{self._prefix(sub)}tool {self._paint(_one_line(name, 80), _TOOL_STYLE)}" + (
                "(…" if cont else "("
            )
        if kind == _REASONING:
            label = self._paint("thinking", _THINKING_STYLE)
        else:
            role = item.get("role", "assistant") if item is not None else "message"
            label = self._paint(_one_line(role, 40), _ROLE_STYLES.get(role, _OTHER_ROLE_STYLE))
            name = item.get("name") if item is not None else None
            if name is not None:
                label += f" ({_one_line(name, 40)})"
        return f"{self._prefix(sub)}{label}{' (cont.)' if cont else ''}: "

    # -- streamed items --------------------------------------------------------

    def _open(self, key: str, item: dict[str, Any]) -> str:
        out = self._break()
        self._items[key] = item
        out += self._header(key, None, False)
        self._line, self._nl = key, False
        return out

    def _write(self, key: str, delta: str, sub: str | None) -> str:
        """Add *delta* to item *key*'s line, reopening the line when it was interrupted."""
        if not delta:
            return ""  # a keep-alive: reopening a line for it would show nothing
        out = ""
        if self._line != key:
            out = self._break() + self._header(key, sub, True)
            self._line = key
        text = _clean(delta)
        self._nl = text.endswith("\n")
        return out + text

    def _end(self, key: str) -> str:
        if self._line == key:
            self._items.pop(key, None)
            out = ")\n" if key.startswith(f"{_TOOL}:") else ("" if self._nl else "\n")
            self._line, self._nl = None, False
            return out
        if key.startswith(f"{_TOOL}:") and key in self._items:
            # A tool call whose line was interrupted still gets its closing
            # parenthesis: on a line of its own, ``tool f(…)``.
            out = self._break() + self._header(key, None, True) + ")\n"
            del self._items[key]
            return out
        # A message whose line was already ended: nothing left to show.
        self._items.pop(key, None)
        return ""

    def _on_text_start(self, ev: Mapping[str, Any]) -> str:
        mid = _str(ev.get("messageId"))
        if mid is None:
            return self._malformed(ev, "no messageId")
        item: dict[str, Any] = {"role": _str(ev.get("role")) or "assistant"}
        return self._open(f"{_TEXT}:{mid}", self._item(item, ev))

    def _on_reasoning_start(self, ev: Mapping[str, Any]) -> str:
        mid = _str(ev.get("messageId"))
        if mid is None:
            return self._malformed(ev, "no messageId")
        return self._open(f"{_REASONING}:{mid}", self._item({}, ev))

    def _on_tool_start(self, ev: Mapping[str, Any]) -> str:
        cid = _str(ev.get("toolCallId"))
        if cid is None:
            return self._malformed(ev, "no toolCallId")
        name = _str(ev.get("toolCallName"))
        if name is None:
            return self._malformed(ev, "no toolCallName")
        return self._open(f"{_TOOL}:{cid}", self._item({"name": name}, ev))

    def _item(self, item: dict[str, Any], ev: Mapping[str, Any]) -> dict[str, Any]:
        name = _str(ev.get("name"))
        if name is not None and "role" in item:
            item["name"] = name
        sub = _str(ev.get("subagentRunId"))
        if sub is not None:
            item["sub"] = sub
        return item

    def _delta(self, ev: Mapping[str, Any], kind: str, field: str) -> str:
        eid = _str(ev.get(field))
        if eid is None:
            return self._malformed(ev, f"no {field}")
        delta = ev.get("delta")
        if not isinstance(delta, str):
            return self._malformed(ev, "no string delta")
        return self._write(f"{kind}:{eid}", delta, _str(ev.get("subagentRunId")))

    def _on_text_content(self, ev: Mapping[str, Any]) -> str:
        return self._delta(ev, _TEXT, "messageId")

    def _on_reasoning_content(self, ev: Mapping[str, Any]) -> str:
        return self._delta(ev, _REASONING, "messageId")

    def _on_tool_args(self, ev: Mapping[str, Any]) -> str:
        return self._delta(ev, _TOOL, "toolCallId")

    # -- chunks ------------------------------------------------------------------

    def _chunk(self, ev: Mapping[str, Any], kind: str, field: str) -> str:
        raw_id = ev.get(field)
        if raw_id is not None and not isinstance(raw_id, str):
            return self._malformed(ev, f"{field} is not a string")
        delta = ev.get("delta")
        if delta is not None and not isinstance(delta, str):
            return self._malformed(ev, "delta is not a string")
        tag = _str(ev.get("subagentRunId"))
        prefix = f"{kind}:"
        lanes = self._lanes
        # The lane, as agui_hub.agui.chunks resolves it: an id open somewhere
        # continues there; without an id, the lane named by the tag, else the
        # parent's, else the only lane assembling this kind.
        if raw_id is not None:
            key = prefix + raw_id
            lane = next((ln for ln, k in lanes.items() if k == key), _lane(tag))
        elif tag is not None:
            lane = _lane(tag)
        elif lanes.get("", "").startswith(prefix):
            lane = ""
        else:
            candidates = [ln for ln, k in lanes.items() if k.startswith(prefix)]
            lane = candidates[0] if len(candidates) == 1 else ""
        current = lanes.get(lane)
        if (
            current is not None
            and current.startswith(prefix)
            and raw_id in (None, current[len(prefix) :])
        ):
            return self._write(current, delta or "", tag)
        if raw_id is None:
            # Nothing to continue and no id to open a stream with.
            return self._malformed(ev, f"no {field} and no open stream") if delta else ""
        out = self._end_lane(lane) if current is not None else ""
        lanes[lane] = key
        if key not in self._items:
            item: dict[str, Any] = {"chunk": True}
            if kind == _TEXT:
                item["role"] = _str(ev.get("role")) or "assistant"
                name = _str(ev.get("name"))
                if name is not None:
                    item["name"] = name
            elif kind == _TOOL:
                item["name"] = _str(ev.get("toolCallName")) or "?"
            owner = tag if tag is not None else _lane_owner(lane)
            if owner is not None:
                item["sub"] = owner
            self._items[key] = item
        if self._line != key:
            out += self._break() + self._header(key, None, False)
            self._line, self._nl = key, False
        return out + self._write(key, delta or "", tag)

    def _on_text_chunk(self, ev: Mapping[str, Any]) -> str:
        return self._chunk(ev, _TEXT, "messageId")

    def _on_tool_chunk(self, ev: Mapping[str, Any]) -> str:
        return self._chunk(ev, _TOOL, "toolCallId")

    def _on_reasoning_chunk(self, ev: Mapping[str, Any]) -> str:
        return self._chunk(ev, _REASONING, "messageId")

    def _end_lane(self, lane: str) -> str:
        """End the chunk stream of *lane*; like an END event, this ends its open line."""
        key = self._lanes.pop(lane, None)
        if key is None or not self._items.get(key, {}).get("chunk"):
            return ""
        return self._end(key)

    def _close_lanes(self, etype: str, ev: Mapping[str, Any]) -> str:
        if etype in _CLOSE_ALL_LANES:
            return "".join([self._end_lane(lane) for lane in list(self._lanes)])
        if etype in _CLOSE_SUBAGENT_LANE:
            sub = _str(ev.get("subagentRunId"))
            return "" if sub is None else self._end_lane(_lane(sub))
        if etype in _CLOSE_OWN_LANE:
            return self._end_lane(_lane(_str(ev.get("subagentRunId"))))
        return ""

    # -- one-line events -----------------------------------------------------------

    def _on_run_started(self, ev: Mapping[str, Any]) -> str:
        self._items.clear()
        parent = _str(ev.get("parentRunId"))
        after = f" (from {_one_line(parent, 80)})" if parent is not None else ""
        return self._marker(f"run {self._run_id(ev)} started{after}")

    def _on_run_finished(self, ev: Mapping[str, Any]) -> str:
        self._items.clear()
        outcome = ev.get("outcome")
        kind = _str(outcome.get("type")) if isinstance(outcome, Mapping) else None
        how = f" ({_one_line(kind, 40)})" if kind is not None and kind != "success" else ""
        return self._marker(f"run {self._run_id(ev)} finished{how}")

    def _on_run_error(self, ev: Mapping[str, Any]) -> str:
        self._items.clear()
        return self._marker(f"run error: {self._error_text(ev)}", _RED)

    def _run_id(self, ev: Mapping[str, Any]) -> str:
        run_id = _str(ev.get("runId"))
        return "?" if run_id is None else _one_line(run_id, 80)

    def _error_text(self, ev: Mapping[str, Any]) -> str:
        message = _str(ev.get("message"))
        code = _str(ev.get("code"))
        text = "?" if message is None else _one_line(message)
        return text + (f" [{_one_line(code, 60)}]" if code is not None else "")

    def _on_step(self, ev: Mapping[str, Any]) -> str:
        name = _str(ev.get("stepName"))
        if name is None:
            return self._malformed(ev, "no stepName")
        done = " done" if ev.get("type") == "STEP_FINISHED" else ""
        return self._emit(self._paint(f"▸ step {_one_line(name, 80)}{done}", _DIM), _sub(ev))

    def _on_tool_result(self, ev: Mapping[str, Any]) -> str:
        return self._emit(self._result_line(ev.get("content")), _sub(ev))

    def _result_line(self, content: Any) -> str:
        text = _one_line(_content_text(content))
        return self._paint("  ↳", _DIM) + (f" {text}" if text else "")

    def _on_encrypted(self, ev: Mapping[str, Any]) -> str:
        return self._emit(f"{self._paint('thinking', _THINKING_STYLE)}: [encrypted]", _sub(ev))

    def _on_state_snapshot(self, ev: Mapping[str, Any]) -> str:
        return self._emit(f"{self._paint('state', _DIM)}: {_json(ev.get('snapshot'))}", _sub(ev))

    def _on_state_delta(self, ev: Mapping[str, Any]) -> str:
        text = _one_line(_patch_text(ev.get("delta")))
        return self._emit(f"{self._paint('state', _DIM)}: {text}", _sub(ev))

    def _on_activity(self, ev: Mapping[str, Any]) -> str:
        kind = _str(ev.get("activityType"))
        label = self._paint(f"activity {'?' if kind is None else _one_line(kind, 60)}", _DIM)
        if ev.get("type") == "ACTIVITY_DELTA":
            text = _one_line(_patch_text(ev.get("patch")))
        else:
            text = _json(ev.get("content"))
        return self._emit(f"{label}: {text}", _sub(ev))

    def _on_custom(self, ev: Mapping[str, Any]) -> str:
        name = _str(ev.get("name"))
        label = self._paint(f"custom {'?' if name is None else _one_line(name, 60)}", _DIM)
        value = ev.get("value")
        text = _json(value, LIMIT + 1)  # longer than LIMIT: bulky
        if len(text) <= LIMIT:
            return self._emit(f"{label}: {text}", _sub(ev))
        return self._bulky(label, value, ev)

    def _on_raw(self, ev: Mapping[str, Any]) -> str:
        source = _str(ev.get("source"))
        label = self._paint("raw" if source is None else f"raw {_one_line(source, 60)}", _DIM)
        return self._bulky(label, ev.get("event"), ev)

    def _bulky(self, label: str, value: Any, ev: Mapping[str, Any]) -> str:
        """A RAW or bulky CUSTOM event, as the *raw* mode says."""
        if self._raw_mode == "hide":
            return ""
        if self._raw_mode == "full":
            return self._emit(f"{label}: {_json(value, _FULL_LIMIT)}", _sub(ev))
        self._raw[0] += 1
        self._raw[1] += len(_json(value, _FULL_LIMIT).encode())
        return ""  # counted, written with the next line (or by close())

    def _on_subagent_started(self, ev: Mapping[str, Any]) -> str:
        name = _str(ev.get("name"))
        shown = "?" if name is None else _one_line(name, 60)
        return self._marker(f"subagent {shown} started ({self._subagent_id(ev)})")

    def _on_subagent_finished(self, ev: Mapping[str, Any]) -> str:
        outcome = ev.get("outcome")
        kind = _str(outcome.get("type")) if isinstance(outcome, Mapping) else None
        how = f" ({_one_line(kind, 40)})" if kind is not None and kind != "success" else ""
        return self._marker(f"subagent {self._subagent_id(ev)} finished{how}")

    def _on_subagent_error(self, ev: Mapping[str, Any]) -> str:
        return self._marker(f"subagent {self._subagent_id(ev)} error: {self._error_text(ev)}", _RED)

    def _subagent_id(self, ev: Mapping[str, Any]) -> str:
        sub = _str(ev.get("subagentRunId"))
        return "?" if sub is None else _one_line(sub, 60)

    def _on_messages_snapshot(self, ev: Mapping[str, Any]) -> str:
        messages = ev.get("messages")
        if not isinstance(messages, list):
            return self._malformed(ev, "messages is not a list")
        # The first line ends any open line; an empty snapshot shows nothing.
        return "".join(self._snapshot_message(message) for message in messages)

    def _snapshot_message(self, message: Any) -> str:
        if not isinstance(message, Mapping):
            return self._marker(f"malformed message: {_json(message, _MALFORMED_LIMIT)}")
        role = _str(message.get("role"))
        sub = _str(message.get("subagentRunId"))
        content = message.get("content")
        if role is None:
            return self._marker(f"malformed message (no role): {_json(message, _MALFORMED_LIMIT)}")
        if role == "tool":
            return self._emit(self._result_line(content), sub)
        if role == "reasoning":
            label = self._paint("thinking", _THINKING_STYLE)
            return self._emit(f"{label}: {_one_line(_content_text(content))}", sub)
        if role == "activity":
            kind = _str(message.get("activityType"))
            label = self._paint(f"activity {'?' if kind is None else _one_line(kind, 60)}", _DIM)
            return self._emit(f"{label}: {_json(content)}", sub)
        label = self._paint(_one_line(role, 40), _ROLE_STYLES.get(role, _OTHER_ROLE_STYLE))
        name = _str(message.get("name"))
        if name is not None:
            label += f" ({_one_line(name, 40)})"
        text = _content_text(content)
        calls = message.get("toolCalls")
        calls = calls if isinstance(calls, list) and role == "assistant" else []
        out = self._emit(f"{label}: {_one_line(text)}", sub) if text or not calls else ""
        for call in calls:
            function = call.get("function") if isinstance(call, Mapping) else None
            function = function if isinstance(function, Mapping) else {}
            name = _str(function.get("name"))
            args = _str(function.get("arguments"))
            shown = self._paint("?" if name is None else _one_line(name, 80), _TOOL_STYLE)
            args_text = _one_line(args) if args is not None else _json(function.get("arguments"))
            out += self._emit(f"tool {shown}({args_text})", sub)
        return out

    def _on_unknown(self, ev: Mapping[str, Any], etype: str) -> str:
        return self._marker(f"unknown event {_one_line(etype, 60)}: {_json(ev, _MALFORMED_LIMIT)}")

    # -- dispatch ----------------------------------------------------------------

    def _render(self, ev: Mapping[str, Any]) -> str:
        etype = ev.get("type")
        if not isinstance(etype, str):
            return self._malformed(ev, "no string type")
        # Chunk streams this event ends are ended first, as agui_hub.agui.chunks does.
        ended = self._close_lanes(etype, ev) if self._lanes else ""
        handler = _HANDLERS.get(etype)
        if handler is None:
            return ended + self._on_unknown(ev, etype)
        return ended + handler(self, ev)


_Handler = Callable[["TranscriptView", Mapping[str, Any]], str]


def _ender(kind: str, field: str) -> _Handler:
    """The handler of an END event of *kind*, keyed by *field*."""

    def end(view: TranscriptView, ev: Mapping[str, Any]) -> str:
        eid = _str(ev.get(field))
        if eid is None:
            return view._malformed(ev, f"no {field}")
        return view._end(f"{kind}:{eid}")

    return end


def _lane(sub: str | None) -> str:
    return "" if sub is None else "s:" + sub


def _lane_owner(lane: str) -> str | None:
    return lane[2:] if lane.startswith("s:") else None


def _sub(ev: Mapping[str, Any]) -> str | None:
    return _str(ev.get("subagentRunId"))


_HANDLERS: Final[dict[str, _Handler]] = {
    "RUN_STARTED": TranscriptView._on_run_started,
    "RUN_FINISHED": TranscriptView._on_run_finished,
    "RUN_ERROR": TranscriptView._on_run_error,
    "STEP_STARTED": TranscriptView._on_step,
    "STEP_FINISHED": TranscriptView._on_step,
    "TEXT_MESSAGE_START": TranscriptView._on_text_start,
    "TEXT_MESSAGE_CONTENT": TranscriptView._on_text_content,
    "TEXT_MESSAGE_END": _ender(_TEXT, "messageId"),
    "TEXT_MESSAGE_CHUNK": TranscriptView._on_text_chunk,
    "TOOL_CALL_START": TranscriptView._on_tool_start,
    "TOOL_CALL_ARGS": TranscriptView._on_tool_args,
    "TOOL_CALL_END": _ender(_TOOL, "toolCallId"),
    "TOOL_CALL_CHUNK": TranscriptView._on_tool_chunk,
    "TOOL_CALL_RESULT": TranscriptView._on_tool_result,
    "REASONING_START": lambda view, ev: "",
    "REASONING_END": lambda view, ev: "",
    "REASONING_MESSAGE_START": TranscriptView._on_reasoning_start,
    "REASONING_MESSAGE_CONTENT": TranscriptView._on_reasoning_content,
    "REASONING_MESSAGE_END": _ender(_REASONING, "messageId"),
    "REASONING_MESSAGE_CHUNK": TranscriptView._on_reasoning_chunk,
    "REASONING_ENCRYPTED_VALUE": TranscriptView._on_encrypted,
    "STATE_SNAPSHOT": TranscriptView._on_state_snapshot,
    "STATE_DELTA": TranscriptView._on_state_delta,
    "MESSAGES_SNAPSHOT": TranscriptView._on_messages_snapshot,
    "ACTIVITY_SNAPSHOT": TranscriptView._on_activity,
    "ACTIVITY_DELTA": TranscriptView._on_activity,
    "CUSTOM": TranscriptView._on_custom,
    "RAW": TranscriptView._on_raw,
    "SUBAGENT_STARTED": TranscriptView._on_subagent_started,
    "SUBAGENT_FINISHED": TranscriptView._on_subagent_finished,
    "SUBAGENT_ERROR": TranscriptView._on_subagent_error,
}
"""The renderer of each AG-UI 1.0 event type; other types get an "unknown event" line."""
