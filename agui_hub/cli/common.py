"""What the commands share: the hub, thread, token and color options, stdout, and
how a command's outcome becomes its exit status.

Exit status: 0 done, 1 the work failed (the hub is unreachable, an event was
rejected, a thread does not exist, ...; the message on stderr says why), 2 a
usage error, 130 interrupted. ``check`` differs: 0 the store keeps the hub's
promises, 1 it does not, 2 nothing could be checked. Transcripts, offsets,
listings and check results go to stdout, everything else to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Callable
from typing import IO, Any, TypeAlias
from urllib.parse import urlsplit

from ..errors import AguiHubError
from ..wire.offsets import check_thread

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""What ``add_subparsers`` returns: each command module adds its parsers to it."""

DEFAULT_URL = "ws://127.0.0.1:8765"
URL_HELP = (
    "the hub: a gateway URL ws://HOST:PORT (default $AGUI_HUB_URL or "
    f"{DEFAULT_URL}), or for publish, replay and demo also a store URL redis://HOST:PORT/DB"
)
GATEWAY_URL_HELP = f"the gateway, ws://HOST:PORT (default $AGUI_HUB_URL or {DEFAULT_URL})"
TOKEN_HELP = "bearer token for a gateway with authentication (default $AGUI_HUB_TOKEN)"

RAW_HELP = (
    "RAW events (an agent framework's own events, e.g. LangGraph's) and CUSTOM events "
    "with a large value: short (default: counted, one 'raw: N events (size)' line when the "
    "next line starts, never splitting an answer), hide, or full (each whole, on its own line)"
)


class UsageError(Exception):
    """A command line that cannot work; reported with exit status 2."""


def add_transcript_options(parser: argparse.ArgumentParser) -> None:
    """--color and --raw, for the commands that print a TranscriptView."""
    parser.add_argument("--color", choices=["auto", "always", "never"], default="auto")
    # TranscriptView's RAW_MODES (not imported: the CLI starts without the client's modules).
    parser.add_argument("--raw", choices=["short", "hide", "full"], default="short", help=RAW_HELP)


def client_token(args: argparse.Namespace) -> str | None:
    """The token of a client command (``--token``, or ``$AGUI_HUB_TOKEN``), if any."""
    token: str | None = getattr(args, "token", None) or os.environ.get("AGUI_HUB_TOKEN")
    return token.strip() if token and token.strip() else None


def hub_url(args: argparse.Namespace, *, gateway_only: bool = False) -> str:
    """The hub a client command talks to (``--url``, ``$AGUI_HUB_URL``, or
    :data:`DEFAULT_URL`): a gateway's ws:// URL, or with *gateway_only* false
    also a Redis store's. Raises :class:`UsageError` for any other URL.
    """
    url: str = args.url or os.environ.get("AGUI_HUB_URL") or DEFAULT_URL
    from ..store.urls import REDIS_SCHEMES

    scheme = urlsplit(url).scheme.lower()
    allowed = {"ws", "wss"} if gateway_only else {"ws", "wss", *REDIS_SCHEMES}
    if scheme not in allowed:
        if gateway_only:
            raise UsageError(f"{url!r}: give the gateway's ws:// URL")
        hint = (
            "; a memory:// store lives inside one process: reach it through its gateway"
            if scheme == "memory"
            else ""
        )
        raise UsageError(
            f"{url!r}: give a gateway (ws://HOST:PORT) or a Redis store "
            f"(redis://HOST:PORT/DB){hint}"
        )
    return url


def thread_name(name: str) -> str:
    """*name* as a thread id; :class:`UsageError` when the hub would refuse it."""
    try:
        return check_thread(name)
    except AguiHubError as exc:
        raise UsageError(str(exc)) from None


def use_color(choice: str, stream: IO[str]) -> bool:
    """Whether a transcript on *stream* is colored: ``--color`` *choice* (auto:
    on a terminal, unless ``$NO_COLOR`` is set)."""
    if choice == "always":
        return True
    if choice == "never" or os.environ.get("NO_COLOR"):
        return False
    return stream.isatty()


class Output:
    """stdout, written and flushed per piece; a closed pipe ends the command quietly."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        if text:
            self.stream.write(text)
            self.stream.flush()


def run_to_exit_status(coro_factory: Callable[[], Any], name: str) -> int:
    """Run the command *name* (the coroutine *coro_factory* makes) and return its
    exit status: the coroutine's own, or the one its failure calls for, said on
    stderr (see the module's docstring)."""
    try:
        result: int = asyncio.run(coro_factory())
        return result
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): not an error of ours.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except UsageError as exc:
        print(f"agui-hub {name}: {exc}", file=sys.stderr)
        return 2
    except (AguiHubError, ValueError, OSError) as exc:
        print(f"agui-hub {name}: {exc}{_hint(exc)}", file=sys.stderr)
        return 1


def _hint(exc: BaseException) -> str:
    """What to do about a refusal that a command-line flag fixes."""
    code = getattr(exc, "code", None)
    close_code = getattr(exc, "close_code", None)
    if code == "unauthorized" or close_code == 4401:
        return " (this gateway wants a valid, unexpired token: pass --token or set AGUI_HUB_TOKEN)"
    if code == "forbidden" or close_code == 4403:
        return " (the token does not grant this thread: ask for one that does)"
    return ""


def missing_package(exc: BaseException) -> bool:
    """Whether *exc* says a package is not installed (a redis:// store without the
    redis extra): the installation is at fault, not the command line, so exit 1
    as the other commands do."""
    return isinstance(exc.__context__, ImportError)
