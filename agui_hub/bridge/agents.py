"""The upstream agents a gateway may run, by name: the ``agents`` setting (``--agents``,
``AGUI_HUB_AGENTS``) and the ``agents_file`` setting (``--agents-file``).

Each agent is an :class:`AgentEndpoint`: the URL its runs are POSTed to, the
headers that go with them (an API key), and its connect and idle timeouts.
Read them with :func:`parse_agents` and :func:`load_agents` (both raise
:class:`ValueError` saying which entry is at fault), then hand them to
:class:`~agui_hub.bridge.runs.Bridge`. Credentials never stay in a URL: a
URL's user and password become an ``Authorization`` header, so that RUN_ERROR
messages and logs, which show the URL, do not show them.
"""

from __future__ import annotations

import base64
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ..store.urls import redact_url

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_IDLE_TIMEOUT",
    "RAW_EVENTS",
    "AgentEndpoint",
    "load_agents",
    "parse_agents",
]

DEFAULT_CONNECT_TIMEOUT = 10.0
"""Seconds to connect to an upstream agent."""

DEFAULT_IDLE_TIMEOUT = 300.0
"""Seconds an upstream agent may send nothing (its response headers, then its events:
models think, tools run) before its run ends with ``AGUI_HUB_UPSTREAM_TIMEOUT``."""

RAW_EVENTS = ("keep", "strip", "drop")
"""What the hub stores of an agent's RAW events: each as sent (``keep``), without
its payload (``strip``: ``{"type": "RAW", "event": null}``, with its ``source``
and ``timestamp``), or nothing (``drop``)."""

_AGENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True, slots=True)
class AgentEndpoint:
    """An upstream agent: where to POST its runs, and with which headers."""

    name: str
    url: str
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    raw_events: str | None = None
    """One of :data:`RAW_EVENTS`; ``None``: the gateway's ``raw_events`` setting."""

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
        if self.raw_events is not None and self.raw_events not in RAW_EVENTS:
            raise ValueError(
                f"agent {self.name!r}: raw_events is one of {', '.join(RAW_EVENTS)}, "
                f"not {self.raw_events!r}"
            )


def parse_agents(spec: str) -> dict[str, AgentEndpoint]:
    """Agents from ``name=url,name=url`` (the ``--agents`` flag, ``AGUI_HUB_AGENTS``).

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
        raw_events = "strip"   # keep (default: the gateway's raw_events), strip, drop

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
        unknown = set(entry) - {"url", "headers", "connect_timeout", "idle_timeout", "raw_events"}
        if unknown:
            raise ValueError(
                f"agents_file {path}: agent {name!r}: unknown key {sorted(unknown)[0]!r} "
                "(use url, headers, connect_timeout, idle_timeout, raw_events)"
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
                    entry.get("raw_events"),
                ),
            )
        except ValueError as exc:
            raise ValueError(f"agents_file {path}: {exc}") from None
    return agents


def _add(agents: dict[str, AgentEndpoint], agent: AgentEndpoint) -> None:
    if agent.name in agents:
        raise ValueError(f"agent {agent.name!r} is configured twice")
    agents[agent.name] = agent
