"""Store URLs: parsing ``memory://``, ``redis://`` and ``redis+cluster://`` URLs
with their options, and redacting their secrets for logs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .contract import Retention

DEFAULT_OP_TIMEOUT = 5.0
"""Default deadline of one store operation, in seconds (``op_timeout``)."""

DEFAULT_OUTAGE_GRACE = 5.0
"""Default seconds a live feed waits out a Redis outage before it ends with
:class:`StoreUnavailable` (``outage_grace``)."""

_REDACTED = "***"
_SECRET_OPTIONS = frozenset({"password", "ssl_password"})


def redact_url(url: str) -> str:
    """*url* without its secrets: the password (and a ``password`` or
    ``ssl_password`` query option) replaced by ``***``; user, host, port, db
    and the other options kept. Safe to log, to show in /readyz and in error
    messages. Never raises.
    """
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hostinfo = netloc.rpartition("@")
            if ":" in userinfo:
                user = userinfo.split(":", 1)[0]
                netloc = f"{user}:{_REDACTED}@{hostinfo}"
        query = parts.query
        if query:
            fields = []
            for item in query.split("&"):
                name, sep, _value = item.partition("=")
                fields.append(f"{name}={_REDACTED}" if sep and name in _SECRET_OPTIONS else item)
            query = "&".join(fields)
        if netloc == parts.netloc and query == parts.query:
            return url
        return parts._replace(netloc=netloc, query=query).geturl()
    except Exception:
        scheme = url.split(":", 1)[0] if isinstance(url, str) and ":" in url else "?"
        return f"{scheme}://{_REDACTED} (unparseable URL)"


@dataclass
class StoreURL:
    """A parsed store URL: scheme, Redis connection URL, options from the query."""

    scheme: str
    redis_url: str | None
    prefix: str = "agui"
    retention: Retention = field(default_factory=Retention)
    op_timeout: float | None = None
    """``op_timeout`` from the query (``None``: the store's default)."""
    outage_grace: float | None = None
    """``outage_grace`` from the query (``None``: the store's default)."""


_OWN_OPTIONS = (
    "prefix",
    "max_len",
    "max_age",
    "ttl",
    "max_bytes",
    "max_tenant_threads",
    "op_timeout",
    "outage_grace",
)

# Options redis-py's URL parser takes as strings (it passes any query option
# to the connection class; these are the ones the connection classes accept).
_REDIS_STRING_OPTIONS = frozenset(
    {"username", "password", "client_name", "lib_name", "lib_version"}
)
_REDIS_SSL_STRING_OPTIONS = frozenset(
    {
        "ssl_keyfile",
        "ssl_certfile",
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_ca_data",
        "ssl_ca_path",
        "ssl_ciphers",
        "ssl_password",
    }
)
# Used when redis-py is not installed (open_store then says so).
_REDIS_PARSED_FALLBACK = frozenset(
    {
        "db",
        "health_check_interval",
        "legacy_responses",
        "max_connections",
        "protocol",
        "retry_on_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "socket_read_size",
        "socket_timeout",
        "ssl_check_hostname",
        "ssl_exclude_verify_flags",
        "ssl_include_verify_flags",
        "ssl_min_version",
        "timeout",
    }
)


def redis_url_options(scheme: str) -> frozenset[str]:
    """The query options a ``redis://`` (or ``rediss://``) URL may pass to redis-py:
    those its URL parser documents (``URL_QUERY_ARGUMENT_PARSERS``) plus the
    string options its connection classes take; the ``ssl_*`` ones only with
    ``rediss://``."""
    try:
        from redis.asyncio.connection import URL_QUERY_ARGUMENT_PARSERS

        parsed = frozenset(URL_QUERY_ARGUMENT_PARSERS)
    except ImportError:
        parsed = _REDIS_PARSED_FALLBACK
    known = parsed | _REDIS_STRING_OPTIONS | _REDIS_SSL_STRING_OPTIONS
    if scheme != "rediss":
        known = frozenset(name for name in known if not name.startswith("ssl_"))
    return known


def check_redis_options(scheme: str, names: Sequence[str]) -> None:
    """:class:`ValueError` naming the first of *names* redis-py would not take."""
    known = redis_url_options(scheme)
    for name in names:
        if name in known:
            continue
        if name.startswith("ssl_") and name in redis_url_options("rediss"):
            raise ValueError(f"store URL option {name!r} needs a rediss:// URL")
        raise ValueError(
            f"unknown store URL option {name!r}; known options: "
            f"{', '.join(_OWN_OPTIONS)} and, for redis-py, {', '.join(sorted(known))}"
        )


def _number(
    query: dict[str, list[str]], name: str, kind: type[float] | type[int], *, positive: bool = False
) -> Any:
    """The option *name* as a finite number >= 0 (> 0 if *positive*); None when absent."""
    if name not in query:
        return None
    raw = query[name][-1]
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(
            f"store URL option {name}={raw!r} "
            + ("must be a whole number" if kind is int and _is_float(raw) else "is not a number")
        ) from None
    if not math.isfinite(value):
        raise ValueError(f"store URL option {name}={raw!r} must be a finite number")
    if value < 0 or (positive and value == 0):
        bound = "greater than 0" if positive else "0 or more"
        raise ValueError(f"store URL option {name}={raw!r} must be {bound}")
    return value


def _is_float(raw: str) -> bool:
    try:
        float(raw)
    except ValueError:
        return False
    return True


def _parse_retention(query: dict[str, list[str]]) -> Retention:
    defaults = Retention()
    values = {
        name: _number(query, name, kind)
        for name, kind in (
            ("max_len", int),
            ("max_age", float),
            ("ttl", float),
            ("max_bytes", int),
            ("max_tenant_threads", int),
        )
    }
    return Retention(**{k: getattr(defaults, k) if v is None else v for k, v in values.items()})


REDIS_SCHEMES = frozenset({"redis", "rediss", "redis+cluster", "rediss+cluster"})
"""Store URL schemes of the Redis store (``+cluster``: Redis Cluster, docs/cluster.md)."""

CLUSTER_SCHEMES = frozenset({"redis+cluster", "rediss+cluster"})
"""URL schemes of a Redis Cluster (see :mod:`agui_hub.store.redis.cluster`)."""


def parse_store_url(url: str) -> StoreURL:
    """Parse ``memory://`` or ``redis[s]://host:port/db?prefix=agui&max_len=…&ttl=…``.

    Our options: ``prefix``, ``max_len``, ``max_age``, ``ttl``, ``max_bytes``,
    ``max_tenant_threads``, ``op_timeout``, ``outage_grace`` (see
    docs/store.md); a ``redis://`` URL may also carry the options redis-py
    documents (:func:`redis_url_options`). Anything else, a negative or
    non-finite number, a fraction for ``max_len``, ``max_bytes`` or
    ``max_tenant_threads``: :class:`ValueError` (whose message never shows
    the password). Retention options the URL leaves out keep the
    :class:`Retention` defaults.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in {"memory", *REDIS_SCHEMES}:
        raise ValueError(
            f"unsupported store URL {redact_url(url)!r}: use memory://, "
            "redis://host:port/db, rediss://… or, for Redis Cluster, "
            "redis+cluster://host:port,host:port/"
        )
    query = parse_qs(parts.query, keep_blank_values=True)
    foreign = [name for name in query if name not in _OWN_OPTIONS]
    redis_url = None
    if scheme in REDIS_SCHEMES:
        check_redis_options(scheme.removesuffix("+cluster"), foreign)
        # Pass the options redis-py understands through; keep ours.
        passthrough = "&".join(
            item
            for item in parts.query.split("&")
            if item and item.partition("=")[0] not in _OWN_OPTIONS
        )
        redis_url = parts._replace(query=passthrough).geturl()
    elif foreign:
        raise ValueError(
            f"unknown store URL option(s) for memory://: {', '.join(sorted(foreign))}; "
            f"known options: {', '.join(_OWN_OPTIONS)}"
        )
    prefix = query.get("prefix", ["agui"])[-1]
    if not prefix or "{" in prefix or "}" in prefix:
        raise ValueError("store URL option prefix must be non-empty and without braces")
    return StoreURL(
        scheme,
        redis_url,
        prefix,
        _parse_retention(query),
        op_timeout=_number(query, "op_timeout", float, positive=True),
        outage_grace=_number(query, "outage_grace", float),
    )
