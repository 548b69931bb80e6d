"""What the operator commands (threads, info, delete, check) share: the
``--store`` option, opening the store the gateways use, and sizes for people.
"""

from __future__ import annotations

import argparse
import os
from typing import Any
from urllib.parse import urlsplit

from .common import UsageError, missing_package

STORE_HELP = (
    "the shared store, redis://HOST:PORT/DB[?prefix=...] (default $AGUI_HUB_STORE): the URL "
    "the gateways are run with, options included"
)


def store_url(args: argparse.Namespace, command: str) -> str:
    """The shared store a command works on: ``--store`` or ``$AGUI_HUB_STORE``.

    Raises :class:`UsageError` for no URL, a gateway URL, or ``memory://``
    (which lives inside one gateway process: no other process can see it).
    """
    url: str = args.store or os.environ.get("AGUI_HUB_STORE") or ""
    if not url:
        raise UsageError(
            "give the store: --store redis://HOST:PORT/DB, or set AGUI_HUB_STORE (as for "
            "agui-hub serve)"
        )
    scheme = urlsplit(url).scheme.lower()
    if scheme == "memory":
        raise UsageError(
            f"{url!r}: a memory:// store lives inside the one gateway process that uses it, "
            f"out of reach of `agui-hub {command}`; it needs a shared store: --store "
            "redis://HOST:PORT/DB"
        )
    if scheme in ("ws", "wss"):
        from ..store.urls import redact_url

        raise UsageError(
            f"{redact_url(url)!r} is a gateway; `agui-hub {command}` reads the store the "
            "gateways use: --store redis://HOST:PORT/DB"
        )
    return url


def open_shared_store(url: str) -> Any:
    """The store at *url*; :class:`UsageError` for a URL it cannot use, ValueError
    (exit 1) when the redis package is missing."""
    from ..store import open_store

    try:
        return open_store(url)
    except ValueError as exc:
        if missing_package(exc):
            raise
        raise UsageError(str(exc)) from None


def human_size(count: int) -> str:
    """*count* bytes for people: ``512 B``, ``58.3 KiB``, ``1.2 GiB``."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover
