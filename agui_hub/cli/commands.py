"""The ``agui-hub`` command line: serve, token, publish, tail, replay, demo, run and
cancel, and the operator commands threads, info, delete and check (which read the
shared store).

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
import json
import logging
import math
import os
import shlex
import stat
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from .. import __version__
from ..errors import (
    AguiHubError,
    HubUnreachable,
    OffsetExpired,
    ProtocolError,
    RateLimited,
    SequenceError,
    StoreUnavailable,
)
from ..gateway.workers import WORKER_FLAG
from ..wire.offsets import START, check_thread, offset_key
from ..wire.protocol import Position

if TYPE_CHECKING:
    from ..gateway.server import Gateway
    from ..store.contract import ThreadInfo

DEFAULT_URL = "ws://127.0.0.1:8765"
URL_HELP = (
    "the hub: a gateway URL ws://HOST:PORT (default $AGUI_HUB_URL or "
    f"{DEFAULT_URL}), or for publish, replay and demo also a store URL redis://HOST:PORT/DB"
)


TOKEN_HELP = "bearer token for a gateway with authentication (default $AGUI_HUB_TOKEN)"
WAIT_HELP = (
    "give up after SECONDS without a connection to the hub (default %s); while it "
    "cannot be reached the command says so at once, then every 10 s"
)


class UsageError(Exception):
    """A command line that cannot work; reported with exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agui-hub",
        description="A production relay for the AG-UI protocol.",
    )
    parser.add_argument("--version", action="version", version=f"agui-hub {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="run the WebSocket gateway",
        description="Run the WebSocket gateway. Every setting can also come from an "
        "AGUI_HUB_* environment variable (AGUI_HUB_STORE, AGUI_HUB_MAX_CONNECTIONS, ...) or "
        "a TOML file (--config); flags win over variables, variables over the file.",
    )
    _add_settings(serve)
    serve.add_argument(
        "--config", metavar="FILE", help="TOML file of settings (names as below, with _); "
        "also $AGUI_HUB_CONFIG"
    )  # fmt: skip
    serve.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")
    # Set by `serve --workers N` on the processes it starts (agui_hub/workers.py).
    serve.add_argument(WORKER_FLAG, type=int, help=argparse.SUPPRESS)

    token = commands.add_parser(
        "token",
        help="mint an HS256 token for the gateway (development, small deployments)",
        description="Print a signed JWT for SUBJECT with the given grants, for a gateway "
        "run with --jwt-secret / --jwt-secret-file. Patterns are thread ids or prefixes "
        "ending in * (tenant-42/*). In production an identity provider issues tokens.",
    )
    token.add_argument("subject", help="the token's sub: who it is (scopes its event ids)")
    token.add_argument("--subscribe", action="append", default=[], metavar="PATTERN",
                       help="threads it may read (repeat for more)")  # fmt: skip
    token.add_argument("--publish", action="append", default=[], metavar="PATTERN",
                       help="threads it may publish into (repeat for more)")  # fmt: skip
    token.add_argument("--admin", action="store_true",
                       help="the admin grant (/metrics, /admin/...)")  # fmt: skip
    token.add_argument("--run", action="append", default=[], metavar="PATTERN",
                       help="upstream agents it may run (repeat; docs/bridge.md)")  # fmt: skip
    token.add_argument("--ttl", type=float, default=3600.0,
                       help="seconds until it expires (default 3600)")  # fmt: skip
    token.add_argument("--secret-file", help="file holding the secret (default "
                       "$AGUI_HUB_JWT_SECRET_FILE, or $AGUI_HUB_JWT_SECRET)")  # fmt: skip
    token.add_argument("--audience", help="aud claim (default $AGUI_HUB_JWT_AUDIENCE)")
    token.add_argument("--issuer", help="iss claim (default $AGUI_HUB_JWT_ISSUER)")

    publish = commands.add_parser(
        "publish",
        help="publish NDJSON events into a thread",
        description="Publish AG-UI events, one JSON object per line, into THREAD and print "
        'one offset per event. A line is an event, or {"event": {...}, "eventId": '
        '"..."} (what `replay --json` prints also works: publishing it again stores '
        "nothing twice). Event ids must all differ. Every event is validated and "
        "checked against the thread's sequence rules before it is stored; from a file, "
        "nothing is published unless every line is a valid event. Input without any "
        "event publishes nothing, says so on stderr and exits 0.",
    )
    publish.add_argument("thread")
    publish.add_argument("file", nargs="?", default="-", help="NDJSON file (default -: stdin)")
    publish.add_argument("--url", help=URL_HELP)
    publish.add_argument("--token", help=TOKEN_HELP)
    publish.add_argument(
        "--sequence",
        choices=["strict", "off"],
        default="strict",
        help="sequence checks when publishing into a store (a gateway is always strict)",
    )
    publish.add_argument("--timeout", type=float, metavar="SECONDS",
                         help=WAIT_HELP % f"{DEFAULT_TIMEOUT:g}")  # fmt: skip

    tail = commands.add_parser(
        "tail",
        help="follow a thread as a chat transcript",
        description="Follow THREAD through a gateway and print it as a chat transcript: "
        "streaming text, tool calls and results, reasoning, state changes, runs. "
        "Reconnects and resumes by itself. With --offset-file the position is kept on "
        "disk after every event, so a tail that is killed and started again continues "
        "exactly where it stopped.",
    )
    tail.add_argument("thread")
    tail.add_argument("--url", help="the gateway, ws://HOST:PORT (default $AGUI_HUB_URL or "
                      f"{DEFAULT_URL})")  # fmt: skip
    tail.add_argument("--token", help=TOKEN_HELP)
    tail.add_argument(
        "--from",
        dest="start",
        default="start",
        metavar="WHERE",
        help="start, live, snapshot, or an offset (OFFSET or OFFSET@EPOCH); default start",
    )
    tail.add_argument("--offset-file", type=Path, help="keep the position in this file")
    tail.add_argument(
        "--until-finished",
        action="store_true",
        help="exit when a run ends at or after the newest event stored when tail connected",
    )
    tail.add_argument("--run", help="show only this run's events")
    tail.add_argument("--timeout", type=float, metavar="SECONDS",
                      help="give up after SECONDS without a connection to the gateway, at "
                      "the start or later (default: never: tail waits and reconnects for "
                      "ever); while it cannot be reached tail says so at once, then every "
                      "10 s")  # fmt: skip
    tail.add_argument("--color", choices=["auto", "always", "never"], default="auto")

    replay = commands.add_parser(
        "replay",
        help="print every stored event of a thread",
        description="Print every stored event of THREAD and exit: as NDJSON lines "
        '{"offset": ..., "event": {...}, "eventId": "THREAD@OFFSET"} with --json, as a '
        "transcript otherwise. The eventId makes `replay --json | agui-hub publish "
        "OTHER` idempotent: run twice, it stores the events once.",
    )
    replay.add_argument("thread")
    replay.add_argument("--url", help=URL_HELP)
    replay.add_argument("--token", help=TOKEN_HELP)
    replay.add_argument("--json", action="store_true", help="NDJSON, one event per line")
    replay.add_argument("--timeout", type=float, metavar="SECONDS",
                        help="wait up to SECONDS for an unreachable hub (default 0: fail at "
                        "once)")  # fmt: skip
    replay.add_argument("--color", choices=["auto", "always", "never"], default="auto")

    demo = commands.add_parser(
        "demo",
        help="stream a realistic demo run into a thread",
        description="Publish a realistic agent run (reasoning, streamed text, tool calls "
        "with results, state deltas, steps) into THREAD, paced like a real model. Watch "
        "it with `agui-hub tail THREAD`. Event ids derive from the run id: a run cut "
        "short is finished by running demo again with --run-id and its id.",
    )
    demo.add_argument("thread", nargs="?", default="demo", help="default: demo")
    demo.add_argument("--url", help=URL_HELP)
    demo.add_argument("--token", help=TOKEN_HELP)
    demo.add_argument("--run-id", help="the run's id (default: a new one)")
    demo.add_argument("--runs", type=int, default=1, help="how many runs, one after another")
    demo.add_argument(
        "--speed", type=float, default=1.0, help="pace multiplier (2: twice as fast; 0: no pauses)"
    )
    demo.add_argument("--timeout", type=float, metavar="SECONDS",
                      help=WAIT_HELP % f"{DEFAULT_TIMEOUT:g}")  # fmt: skip
    run = commands.add_parser(
        "run",
        help="run an upstream AG-UI agent in a thread, through the hub",
        description="Ask a gateway to run upstream agent NAME (configured on the gateway "
        "with --agents or --agents-file) in THREAD, and print the run as a transcript "
        "until it ends. The gateway builds the agent's input from the thread: its messages "
        "(plus --message), its state, and parentRunId its latest run. The run belongs to "
        "the gateway: interrupting this command (or --detach) leaves it going, and every "
        "viewer of the thread follows it. Exit status 0 when the run finishes, 1 when it "
        "ends with RUN_ERROR.",
    )
    run.add_argument("--agent", required=True, metavar="NAME", help="the upstream agent")
    run.add_argument("--thread", required=True, help="the thread to run it in")
    run.add_argument("--message", action="append", default=[], metavar="TEXT",
                     help="a user message to add before the run (repeat for more)")  # fmt: skip
    run.add_argument("--run-id", help="the run's id (default: a new one)")
    run.add_argument("--detach", action="store_true",
                     help="print the run id and exit once the run is going")  # fmt: skip
    run.add_argument("--url", help="the gateway, ws://HOST:PORT (default $AGUI_HUB_URL or "
                     f"{DEFAULT_URL})")  # fmt: skip
    run.add_argument("--token", help=TOKEN_HELP)
    run.add_argument("--timeout", type=float, metavar="SECONDS",
                     help=WAIT_HELP % f"{DEFAULT_TIMEOUT:g}")  # fmt: skip
    run.add_argument("--color", choices=["auto", "always", "never"], default="auto")

    cancel = commands.add_parser(
        "cancel",
        help="cancel the bridged run going in a thread",
        description="Cancel the run of an upstream agent going in THREAD: the gateway closes "
        "its request to the agent and the run ends with RUN_ERROR AGUI_HUB_RUN_CANCELLED. "
        "Send it to the gateway that started the run.",
    )
    cancel.add_argument("thread")
    cancel.add_argument("--run-id", help="only this run")
    cancel.add_argument("--abandoned", action="store_true",
                        help="end a run the thread holds open that no gateway relays any "
                        "more (its gateway crashed): appends RUN_ERROR "
                        "AGUI_HUB_RUN_ABANDONED")  # fmt: skip
    cancel.add_argument("--url", help="the gateway, ws://HOST:PORT (default $AGUI_HUB_URL or "
                        f"{DEFAULT_URL})")  # fmt: skip
    cancel.add_argument("--token", help=TOKEN_HELP)
    cancel.add_argument("--timeout", type=float, metavar="SECONDS",
                        help=WAIT_HELP % f"{DEFAULT_TIMEOUT:g}")  # fmt: skip
    _add_operator_commands(commands)
    return parser


# -- serve ---------------------------------------------------------------------------------------


def _add_settings(serve: argparse.ArgumentParser) -> None:
    """One flag per gateway setting (--max-connections for max_connections), in groups."""
    from ..gateway.config import LOOPS, SETTING_GROUPS, setting_kinds

    kinds = setting_kinds()
    for title, settings in SETTING_GROUPS.items():
        group = serve.add_argument_group(title)
        for name, text in settings.items():
            flag = "--" + name.replace("_", "-")
            kind = kinds[name]
            if kind is bool:
                # --no-<flag> too: a setting on by default (viewer), or on in a TOML
                # file or a variable, can be switched off for one run.
                group.add_argument(
                    flag, action=argparse.BooleanOptionalAction, default=None, help=text
                )
            else:
                metavar = {int: "N", float: "SECONDS", str: "TEXT"}.get(kind, "VALUE")
                if name.endswith(("_file", "_cert", "_key")):
                    metavar = "FILE"
                elif name.endswith("_per_second"):
                    metavar = "RATE"
                elif name in ("store",):
                    metavar = "URL"
                elif name == "loop":
                    metavar = "{" + ",".join(LOOPS) + "}"
                group.add_argument(flag, type=_setting_type(flag, kind), help=text, metavar=metavar)


def _setting_type(flag: str, kind: type) -> Callable[[str], Any]:
    names = {int: "an integer", float: "a number", str: "a string"}

    def parse(raw: str) -> Any:
        try:
            return kind(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{raw!r} is not {names[kind]}") from None

    parse.__name__ = names.get(kind, kind.__name__)
    return parse


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
WORKERS_LOG_FORMAT = "%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"
"""With ``--workers``: the processes share stderr, so each line names its process."""


def _serve(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from ..errors import StoreError
    from ..gateway.config import setting_kinds, unknown_variables
    from ..gateway.server import Gateway, GatewayConfig, raise_open_file_limit
    from ..gateway.workers import Supervisor, check_port_free

    level = args.log_level.upper()
    if level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        print(f"agui-hub serve: --log-level {args.log_level!r}: use DEBUG, INFO, WARNING "
              "or ERROR", file=sys.stderr)  # fmt: skip
        return 2
    worker = args.worker_pipe is not None
    try:
        config = GatewayConfig.from_env(
            config_file=args.config,
            **{name: getattr(args, name) for name in setting_kinds()},
        )
        config.check_processes()
        run_loop = _event_loop(config.loop)
    except ValueError as exc:
        print(f"agui-hub serve: {exc}", file=sys.stderr)
        return 1 if _missing_package(exc) else 2
    logging.basicConfig(
        level=level, format=LOG_FORMAT if config.workers == 1 else WORKERS_LOG_FORMAT
    )
    if level != "DEBUG":
        # One line per connection and health check is noise in production logs.
        logging.getLogger("websockets").setLevel(logging.WARNING)
    log = logging.getLogger("agui_hub.server")
    if not worker:  # the parent said it already
        for name in unknown_variables():
            log.warning("%s is not a setting of agui-hub serve: ignored (see serve --help)", name)
    if config.workers > 1 and not worker:
        try:
            # Settings that cannot work are said once, here, rather than by every worker.
            Gateway(config)
            check_port_free(config.host, config.port)
        except ValueError as exc:
            print(f"agui-hub serve: {exc}", file=sys.stderr)
            return 1 if _missing_package(exc) else 2
        except OSError as exc:
            print(f"agui-hub serve: cannot listen on {config.host}:{config.port}: {exc}",
                  file=sys.stderr)  # fmt: skip
            return 1
        log.info("agui-hub starting %d workers on %s:%d (SO_REUSEPORT), event loop %s",
                 config.workers, config.host, config.port, config.loop)  # fmt: skip
        return Supervisor([sys.executable, "-m", "agui_hub.cli", *argv], config.workers).run()
    try:
        before, after = raise_open_file_limit()
        if after != before:
            log.info("open-file limit raised from %d to %d (the hard limit)", before, after)
        else:
            log.info("open-file limit %d (soft and hard limits alike)", after)
        gateway = Gateway(config)
    except ValueError as exc:
        print(f"agui-hub serve: {exc}", file=sys.stderr)
        return 1 if _missing_package(exc) else 2
    try:
        run_loop(_run_gateway(gateway, args.worker_pipe))
    except ValueError as exc:
        print(f"agui-hub serve: {exc}", file=sys.stderr)
        return 2
    except StoreError as exc:
        print(f"agui-hub serve: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"agui-hub serve: cannot listen on {config.host}:{config.port}: {exc}",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


def _event_loop(name: str) -> Callable[[Coroutine[Any, Any, None]], None]:
    """What runs the gateway's coroutine on the event loop *name* (``loop`` setting)."""
    if name != "uvloop":
        return asyncio.run
    try:
        import uvloop
    except ImportError as exc:
        if exc.name != "uvloop":
            raise
    else:
        return uvloop.run
    # Raised outside the except block: no ImportError context, so a usage error
    # (exit 2) rather than a broken installation (see _missing_package).
    raise ValueError(
        "loop uvloop needs the uvloop package, which is not installed: "
        "pip install 'agui-hub[speed]'"
    )


def _describe_loop(loop: asyncio.AbstractEventLoop) -> str:
    if type(loop).__module__.partition(".")[0] == "uvloop":
        from importlib.metadata import version

        return f"uvloop {version('uvloop')}"
    return f"asyncio ({type(loop).__name__})"


async def _run_gateway(gateway: Gateway, worker_pipe: int | None) -> None:
    """Run *gateway* until SIGTERM / SIGINT; a worker also until its parent is gone."""
    loop = asyncio.get_running_loop()
    log = logging.getLogger("agui_hub.server")
    log.info("event loop: %s", _describe_loop(loop))
    stop = asyncio.Event()
    if worker_pipe is not None:
        import signal

        from ..gateway.workers import FORWARDED

        # The parent started this process with these signals blocked: they are
        # let through once something handles them (Gateway.run then installs
        # the same handlers again).
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, gateway.check_revocations)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)

        def parent_gone() -> None:
            loop.remove_reader(worker_pipe)
            log.warning("the parent process of this worker is gone: draining")
            stop.set()

        # Readable only at end of file: the parent never writes.
        loop.add_reader(worker_pipe, parent_gone)
    await gateway.run(stop)


def _missing_package(exc: BaseException) -> bool:
    """Whether *exc* says a package is not installed (a redis:// store without the
    redis extra): the installation is at fault, not the command line, so exit 1
    as the other commands do."""
    return isinstance(exc.__context__, ImportError)


def _token(args: argparse.Namespace) -> int:
    from ..gateway.auth import encode_token

    path = args.secret_file or os.environ.get("AGUI_HUB_JWT_SECRET_FILE")
    try:
        if path:
            secret = Path(path).read_text().strip()
        else:
            secret = os.environ.get("AGUI_HUB_JWT_SECRET", "")
        if not secret:
            raise UsageError(
                "give the gateway's secret: --secret-file FILE (or $AGUI_HUB_JWT_SECRET_FILE, "
                "$AGUI_HUB_JWT_SECRET)"
            )
        if len(secret.encode()) < 32:
            raise UsageError("the secret is shorter than 32 bytes; the gateway refuses it")
        if not args.ttl > 0:
            raise UsageError("--ttl must be a positive number of seconds")
        print(
            encode_token(
                secret,
                args.subject,
                subscribe=args.subscribe,
                publish=args.publish,
                admin=args.admin,
                run=args.run,
                ttl=args.ttl,
                audience=args.audience or os.environ.get("AGUI_HUB_JWT_AUDIENCE") or None,
                issuer=args.issuer or os.environ.get("AGUI_HUB_JWT_ISSUER") or None,
            )
        )
    except OSError as exc:
        print(f"agui-hub token: cannot read {path}: {exc.strerror}", file=sys.stderr)
        return 2
    except (UsageError, ValueError) as exc:
        print(f"agui-hub token: {exc}", file=sys.stderr)
        return 2
    return 0


def _token_of(args: argparse.Namespace) -> str | None:
    """The token of a client command (``--token``, or ``$AGUI_HUB_TOKEN``), if any."""
    token: str | None = getattr(args, "token", None) or os.environ.get("AGUI_HUB_TOKEN")
    return token.strip() if token and token.strip() else None


# -- shared helpers ---------------------------------------------------------------------------


def _url(args: argparse.Namespace, *, gateway_only: bool = False) -> str:
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


def _thread(name: str) -> str:
    try:
        return check_thread(name)
    except AguiHubError as exc:
        raise UsageError(str(exc)) from None


def _color(choice: str, stream: IO[str]) -> bool:
    if choice == "always":
        return True
    if choice == "never" or os.environ.get("NO_COLOR"):
        return False
    return stream.isatty()


class _Output:
    """stdout, written and flushed per piece; a closed pipe ends the command quietly."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        if text:
            self.stream.write(text)
            self.stream.flush()


DEFAULT_TIMEOUT = 30.0
"""Seconds that publish and demo wait for an unreachable hub before giving up."""
NOTICE_EVERY = 10.0
"""Seconds between two "still retrying" lines while the hub cannot be reached."""
ATTEMPT_SECONDS = 2.0
"""How long one publish through a gateway waits for the connection and its reply
before the command says so and tries again (with the same event ids: safe)."""

_T = TypeVar("_T")


class _Retry:
    """How one command waits out a hub it cannot reach.

    The first failure is said at once (the URL and the reason), then one
    "still retrying" line every :data:`NOTICE_EVERY` seconds rather than one
    per attempt, and one line when the hub answers again. After *timeout*
    seconds without a connection (``None``: never; ``0``: at the first
    failure) the command gives up with :class:`HubUnreachable`.
    """

    def __init__(
        self,
        command: str,
        url: str,
        timeout: float | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        say: Callable[[str], None] | None = None,
    ) -> None:
        from ..store.urls import redact_url

        self.url = redact_url(url)
        self.timeout = timeout
        self._clock = clock
        self._say = say or (lambda text: print(f"agui-hub {command}: {text}", file=sys.stderr))
        self._since: float | None = None  # when the current outage began
        self._told = 0.0  # when it was last said
        self._delay = 0.1

    def failed(self, exc: AguiHubError, began: float | None = None) -> float:
        """Note a failed attempt (*began* at that time): the seconds to pause
        before the next one.

        Raises *exc* itself with a timeout of 0, :class:`HubUnreachable` once the
        outage has lasted *timeout* seconds (counted from the start of its first
        failed attempt, which may have waited for the connection a while).
        """
        if self.timeout == 0:
            raise exc
        now = self._clock()
        reason = str(exc) if self.url in str(exc) else f"cannot reach {self.url}: {exc}"
        first = self._since is None
        if self._since is None:
            self._since, self._told = (now if began is None else began), now
            until = "until it answers" if self.timeout is None else f"for up to {self.timeout:g} s"
            self._say(f"{reason}; retrying {until} (--timeout)")
        if self.timeout is not None and now - self._since >= self.timeout:
            raise HubUnreachable(
                f"gave up after {self.timeout:g} s without a connection (--timeout): {reason}"
            ) from exc
        if not first and now - self._told >= NOTICE_EVERY:
            self._told = now
            self._say(f"still retrying {self.url} ({now - self._since:.0f} s so far): {exc}")
        # A busy gateway (HTTP 429 / 503) says when to come back.
        pause = max(self._delay, getattr(exc, "retry_after", 0.0))
        self._delay = min(self._delay * 2, 2.0)
        if self.timeout is not None:
            pause = min(pause, max(0.0, self._since + self.timeout - now))
        return pause

    def succeeded(self) -> None:
        if self._since is not None:
            self._say(f"connected to {self.url} after {self._clock() - self._since:.0f} s")
        self._since = None
        self._delay = 0.1

    async def call(self, attempt: Callable[[], Awaitable[_T]]) -> _T:
        """*attempt()* until it does not fail for want of the hub."""
        while True:
            began = self._clock()
            try:
                result = await attempt()
            except (HubUnreachable, StoreUnavailable) as exc:
                await asyncio.sleep(self.failed(exc, began))
                continue
            except RateLimited as exc:
                # Nothing was carried out: the same command again is safe, once
                # the gateway's pause is over. The hub is there: not an outage.
                await asyncio.sleep(max(exc.retry_after, 0.05))
                continue
            self.succeeded()
            return result


def _timeout(args: argparse.Namespace, default: float | None) -> float | None:
    """The command's --timeout in seconds (``None``: wait for ever)."""
    value: float | None = getattr(args, "timeout", None)
    if value is None:
        return default
    if not value >= 0:  # also NaN
        raise UsageError("--timeout must be 0 or more seconds")
    return None if math.isinf(value) else value


def _run(coro_factory: Callable[[], Any], name: str) -> int:
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


# -- publish -----------------------------------------------------------------------------------


@dataclass
class _Line:
    number: int
    event: Any
    event_id: str | None


def _parse_line(number: int, text: str) -> _Line | None:
    text = text.strip()
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"line {number}: not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"line {number}: expected a JSON object (an event)")
    if "type" not in value and isinstance(value.get("event"), dict):
        event_id = value.get("eventId")
        if event_id is not None and (not isinstance(event_id, str) or not event_id):
            raise ValueError(f"line {number}: eventId must be a non-empty string")
        return _Line(number, value["event"], event_id)
    return _Line(number, value, None)


def _check_line(line: _Line, thread: str) -> dict[str, Any]:
    from ..agui.events import validate_wire
    from ..errors import InvalidEvent

    try:
        event = validate_wire(line.event)
    except InvalidEvent as exc:
        raise ValueError(f"line {line.number}: {exc}") from None
    named = event.get("threadId")
    if event["type"] in ("RUN_STARTED", "RUN_FINISHED") and named != thread:
        # A thread copied under another name (replay --json | publish): its run
        # markers must name the thread they are in, or the hub refuses them.
        if not _retargeted:
            print(f"agui-hub publish: run events name thread {named!r}; published into "
                  f"{thread!r} with threadId {thread!r}", file=sys.stderr)  # fmt: skip
            _retargeted.append(named)
        event = {**event, "threadId": thread}
    return event


_retargeted: list[Any] = []


async def _lines_of_stream(stream: IO[str]) -> AsyncIterator[list[tuple[int, str]]]:
    """Lines of a pipe or terminal, in the batches they arrive in (at most 1000)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[int, str] | None] = asyncio.Queue()

    def pump() -> None:
        # A thread: a blocking read of stdin must not stall the event loop.
        try:
            for number, text in enumerate(stream, 1):
                loop.call_soon_threadsafe(queue.put_nowait, (number, text))
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, None)

    threading.Thread(target=pump, daemon=True).start()
    done = False
    while not done:
        first = await queue.get()
        if first is None:
            return
        batch = [first]
        while len(batch) < 1000 and not queue.empty():
            item = queue.get_nowait()
            if item is None:
                done = True
                break
            batch.append(item)
        yield batch


class _EventIds:
    """The event ids of the input so far, with their lines.

    An id given twice would be taken by the store for a retry of the first
    event, and the second event silently dropped: refused instead, naming both
    lines. (Kept for the whole input: a repeat may be far from the first.)
    """

    def __init__(self) -> None:
        self._lines: dict[str, int] = {}

    def check(self, lines: list[_Line], stored: str) -> None:
        for line in lines:
            if line.event_id is None:
                continue
            first = self._lines.setdefault(line.event_id, line.number)
            if first != line.number:
                raise ValueError(
                    f"line {line.number}: eventId {line.event_id!r} is also the id of line "
                    f"{first}: give each event an id of its own ({stored})"
                )


async def _publish(args: argparse.Namespace) -> int:
    from ..client.publisher import Publisher

    thread = _thread(args.thread)
    url = _url(args)
    retry = _Retry("publish", url, _timeout(args, DEFAULT_TIMEOUT))
    out = _Output(sys.stdout)
    if args.file == "-":
        stream: IO[str] = sys.stdin
        whole = not stream.isatty() and stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
    else:
        try:
            stream = open(args.file, encoding="utf-8")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise UsageError(f"cannot read {args.file}: {exc.strerror}") from None
        whole = True
    ids = _EventIds()
    published = 0
    # Retries are this command's (said, and bounded by --timeout): one attempt each.
    publisher = Publisher(url, sequence=args.sequence, token=_token_of(args), retry_for=0.0)
    try:
        if whole:
            # A file: check every line before anything is published.
            lines = [
                line
                for number, text in enumerate(stream, 1)
                if (line := _parse_line(number, text)) is not None
            ]
            events = [_check_line(line, thread) for line in lines]
            ids.check(lines, "nothing was published")
            for begin in range(0, len(lines), 1000):
                await _publish_lines(publisher, retry, thread, lines[begin : begin + 1000],
                                     events[begin : begin + 1000], out)  # fmt: skip
                published += len(lines[begin : begin + 1000])
        else:
            async for batch in _lines_of_stream(stream):
                lines = [line for number, text in batch if (line := _parse_line(number, text))]
                events = [_check_line(line, thread) for line in lines]
                ids.check(lines, "nothing of this batch was stored")
                await _publish_lines(publisher, retry, thread, lines, events, out)
                published += len(lines)
    finally:
        if stream is not sys.stdin:
            stream.close()
        await publisher.close()
    if not published:
        # Not an error: `replay --json` of an empty thread piped in is no mistake.
        where = "stdin" if args.file == "-" else args.file
        print(f"agui-hub publish: no events in {where}: nothing published", file=sys.stderr)
    return 0


async def _connect_publisher(publisher: Any, retry: _Retry) -> None:
    """Connect *publisher* (a no-op once connected, and for a store URL), waiting
    out an unreachable hub as *retry* says."""
    await retry.call(publisher.connect)
    # Through a gateway one attempt waits for the connection and the reply; a
    # store's attempt is one append, and the pauses between attempts are ours.
    publisher.retry_for = ATTEMPT_SECONDS if publisher.via_gateway else 0.0


async def _published(publisher: Any, thread: str, events: list[Any], ids: list[str]) -> list[str]:
    """One attempt at publishing a batch, with a plain reason when the connection is gone."""
    try:
        offsets: list[str] = await publisher.publish_batch(thread, events, ids)
    except HubUnreachable as exc:
        # Connected once, so the client is reconnecting by itself; its own words
        # ("no connection to ... in time") do not say that the connection was lost.
        if publisher.via_gateway and str(exc).startswith(("no connection to", "publish to")):
            from ..store.urls import redact_url

            raise HubUnreachable(
                f"lost the connection to {redact_url(publisher.url)}: not back within "
                f"{publisher.retry_for:g} s"
            ) from exc
        raise
    return offsets


async def _publish_lines(
    publisher: Any,
    retry: _Retry,
    thread: str,
    lines: list[_Line],
    events: list[dict[str, Any]],
    out: _Output,
) -> None:
    if not lines:
        return
    await _connect_publisher(publisher, retry)
    ids = [line.event_id or publisher.new_event_id() for line in lines]
    try:
        # The same ids on every attempt: a batch stored before its reply was lost
        # is not stored again.
        offsets = await retry.call(lambda: _published(publisher, thread, events, ids))
    except ProtocolError as exc:
        where = f"lines {lines[0].number}-{lines[-1].number}" if len(lines) > 1 else "line"
        number = _culprit(lines, exc)
        prefix = f"line {number}" if number is not None else where
        raise ValueError(f"{prefix}: {exc} (nothing of this batch was stored)") from None
    out.write("".join(f"{offset}\n" for offset in offsets))


def _culprit(lines: list[_Line], exc: ProtocolError) -> int | None:
    """The line of the event an error is about, when it can be told."""
    if exc.index is not None and 0 <= exc.index < len(lines):
        return lines[exc.index].number
    return lines[0].number if len(lines) == 1 else None


# -- tail and replay ------------------------------------------------------------------------


class OffsetFile:
    """A tail's position and transcript state, rewritten in place after every event.

    One small JSON record, padded with spaces so that a shorter record fully
    covers a longer one; one ``pwrite`` per update, so a process killed at any
    moment leaves either the old record or the new one.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size

    def load(self, thread: str) -> tuple[Position, dict[str, Any]] | None:
        data = os.pread(self._fd, max(self._size, 1), 0).decode("utf-8", "replace").strip()
        if not data:
            return None
        try:
            record = json.loads(data)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
            position = Position.from_json(record)
            view = record.get("view", {})
            if not isinstance(view, dict):
                raise ValueError("view is not an object")
        except ValueError as exc:
            raise UsageError(f"{self.path} is not an agui-hub offset file: {exc}") from None
        if record.get("thread") != thread:
            raise UsageError(
                f"{self.path} holds the position in thread {record.get('thread')!r}, "
                f"not {thread!r}: use another file"
            )
        return position, view

    def save(self, thread: str, position: Position, view: dict[str, Any]) -> None:
        record = {"thread": thread, **position.to_json(), "view": view}
        data = json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode()
        padded = data.ljust(max(self._size - 1, len(data))) + b"\n"
        os.pwrite(self._fd, padded, 0)
        self._size = len(padded)

    def close(self) -> None:
        os.close(self._fd)


def _start(value: str) -> Any:
    if value in ("start", "live", "snapshot"):
        return value
    offset, _, epoch = value.partition("@")
    try:
        offset_key(offset)
    except AguiHubError:
        raise UsageError(
            f"--from {value!r}: expected start, live, snapshot, OFFSET or OFFSET@EPOCH"
        ) from None
    return Position(offset, epoch or None)


async def _connect(
    url: str, retry: _Retry, token: str | None = None, give_up_after: float | None = None
) -> Any:
    """A connected HubClient, once the gateway answers (as *retry* says)."""
    from ..client.hub_client import HubClient

    async def attempt() -> Any:
        client = HubClient(url, token=token, give_up_after=give_up_after)
        await client.connect()
        return client

    return await retry.call(attempt)


async def _watch_connection(client: Any, command: str, url: str) -> None:
    """Say when *client* loses its connection, and every NOTICE_EVERY seconds while
    it has none (it reconnects by itself; the subscription says when it is back)."""
    from ..client.hub_client import ClientState
    from ..store.urls import redact_url

    lost_at: float | None = None
    told = 0.0
    while True:
        await asyncio.sleep(0.2)
        now = time.monotonic()
        if client.state is not ClientState.RECONNECTING:
            lost_at = None
        elif lost_at is None:
            lost_at = told = now
            print(f"agui-hub {command}: lost the connection to {redact_url(url)} (code "
                  f"{client.close_code}); reconnecting", file=sys.stderr)  # fmt: skip
        elif now - told >= NOTICE_EVERY:
            told = now
            print(f"agui-hub {command}: still reconnecting to {redact_url(url)} "
                  f"({now - lost_at:.0f} s so far)", file=sys.stderr)  # fmt: skip


async def _tail(args: argparse.Namespace) -> int:
    from ..client.hub_client import Snapshot, Subscribed, ThreadEvent
    from ..client.transcript import TranscriptView

    thread = _thread(args.thread)
    url = _url(args, gateway_only=True)
    start = _start(args.start)
    retry = _Retry("tail", url, _timeout(args, None))
    view_state: dict[str, Any] | None = None
    offset_file = OffsetFile(args.offset_file) if args.offset_file else None
    if offset_file is not None and (saved := offset_file.load(thread)) is not None:
        start, view_state = saved
    try:
        view = TranscriptView(color=_color(args.color, sys.stdout), state=view_state)
    except ValueError as exc:
        raise UsageError(f"{args.offset_file}: {exc}") from None
    out = _Output(sys.stdout)
    # --timeout bounds the later outages too: the client gives up after as long.
    client = await _connect(url, retry, _token_of(args), give_up_after=retry.timeout)
    watcher = asyncio.create_task(_watch_connection(client, "tail", url))
    newest: tuple[int, int] | None = None
    subscribed = False  # the first Subscribed is the reply to our subscribe
    reconnects = 0
    try:
        async with client.subscribe(thread, start, run=args.run) as sub:
            async for item in sub:
                text = ""
                finished = False
                if isinstance(item, Subscribed):
                    if newest is None:
                        newest = offset_key(item.offset)
                    if item.resumed and client.reconnects > reconnects:
                        reconnects = client.reconnects
                        print(f"agui-hub tail: reconnected (code {client.close_code})",
                              file=sys.stderr)  # fmt: skip
                    # Not recovered: after a reconnect or from a position, events
                    # were lost; later, unasked, the thread was re-created.
                    if not item.recovered and (
                        item.resumed or subscribed or isinstance(start, Position)
                    ):
                        text = view.notice(
                            "events were lost to retention or a reset: a snapshot follows"
                        )
                    if not subscribed and item.offset == START:
                        print(f"agui-hub tail: thread {thread!r} has no events yet; waiting "
                              "for its first event", file=sys.stderr)  # fmt: skip
                    subscribed = True
                elif isinstance(item, Snapshot):
                    text = view.reset() + "".join(view.render(event) for event in item.events)
                elif isinstance(item, ThreadEvent):
                    text = view.render(item.event)
                    finished = (
                        args.until_finished
                        and item.event.get("type") in ("RUN_FINISHED", "RUN_ERROR")
                        and newest is not None
                        and offset_key(item.offset) >= newest
                    )
                out.write(text)
                if offset_file is not None and sub.position is not None:
                    offset_file.save(thread, sub.position, view.state())
                if finished:
                    break
    except BaseException as exc:
        # Interrupted. With an offset file, stdout gets nothing more: the saved
        # state describes exactly what was printed, so a tail started again
        # continues the open line and the two outputs join up exactly. On a
        # terminal the line is ended on stderr, for the prompt. Without an
        # offset file the open line is ended on stdout.
        with contextlib.suppress(Exception):
            if offset_file is None:
                out.write(view.close())
            elif sys.stdout.isatty() and sys.stderr.isatty() and view.state().get("line"):
                print(file=sys.stderr)
        if isinstance(exc, HubUnreachable) and retry.timeout is not None:
            # The client gave up reconnecting after --timeout: said as the others say it.
            raise HubUnreachable(
                f"gave up after {retry.timeout:g} s without a connection (--timeout): "
                f"lost the connection to {retry.url}"
            ) from exc
        raise
    finally:
        watcher.cancel()
        await client.close()
        if offset_file is not None:
            offset_file.close()
    return 0


def replay_event_id(thread: str, offset: str, index: int | None = None) -> str:
    """The eventId that ``replay --json`` gives an event: ``THREAD@OFFSET``.

    Stable for a stored event (the same replay printed again gives the same
    ids), different for every event of the thread, and the same through a
    gateway and from the store: publishing the output twice stores it once.
    The *index*-th event of a snapshot (several events at one offset) gets
    ``THREAD@OFFSET#INDEX``.
    """
    return f"{thread}@{offset}" if index is None else f"{thread}@{offset}#{index}"


async def _replay(args: argparse.Namespace) -> int:
    thread = _thread(args.thread)
    url = _url(args)
    retry = _Retry("replay", url, _timeout(args, 0.0))
    scheme = urlsplit(url).scheme.lower()
    out = _Output(sys.stdout)
    if args.json:

        def emit(offset: str, event: dict[str, Any], snapshot: int | None = None) -> None:
            record: dict[str, Any] = {
                "offset": offset,
                "event": event,
                "eventId": replay_event_id(thread, offset, snapshot),
            }
            if snapshot is not None:
                record["snapshot"] = True
            out.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")

    else:
        from ..client.transcript import TranscriptView

        view = TranscriptView(color=_color(args.color, sys.stdout))

        def emit(offset: str, event: dict[str, Any], snapshot: int | None = None) -> None:
            out.write(view.render(event))

    count = 0
    if scheme in ("ws", "wss"):
        count = await _replay_gateway(url, thread, emit, _token_of(args), retry)
    else:
        count = await _replay_store(url, thread, emit, retry)
    if not args.json:
        out.write(view.close())
    if count == 0:
        print(f"agui-hub replay: thread {thread!r} has no events", file=sys.stderr)
    return 0


async def _replay_gateway(
    url: str, thread: str, emit: Callable[..., None], token: str | None, retry: _Retry
) -> int:
    from ..client.hub_client import Snapshot, Subscribed, ThreadEvent

    client = await _connect(url, retry, token, give_up_after=retry.timeout)
    count = 0
    try:
        async with client.subscribe(thread, "start") as sub:
            newest: tuple[int, int] | None = None
            async for item in sub:
                if isinstance(item, Subscribed) and newest is None:
                    newest = offset_key(item.offset)
                    if item.offset == START:
                        break
                elif isinstance(item, Snapshot):
                    print(
                        f"agui-hub replay: the beginning of thread {thread!r} was trimmed; "
                        "what was trimmed is summarised by a snapshot (marked snapshot)",
                        file=sys.stderr,
                    )
                    for index, event in enumerate(item.events):
                        emit(item.offset, event, index)
                    count += len(item.events)
                    if newest is not None and offset_key(item.offset) >= newest:
                        break
                elif isinstance(item, ThreadEvent):
                    emit(item.offset, item.event)
                    count += 1
                    if newest is not None and offset_key(item.offset) >= newest:
                        break
    finally:
        await client.close()
    return count


async def _replay_store(url: str, thread: str, emit: Callable[..., None], retry: _Retry) -> int:
    from functools import partial

    import msgpack

    from ..store import open_store

    store = open_store(url)
    count = 0
    try:
        after = START
        while True:
            try:
                entries = await retry.call(partial(store.read, thread, after=after, limit=1000))
            except OffsetExpired as exc:
                print(
                    f"agui-hub replay: events of thread {thread!r} up to {exc.first} were "
                    "trimmed; printing what is stored",
                    file=sys.stderr,
                )
                info = await retry.call(lambda: store.info(thread))
                if info is None or info.trimmed is None or info.trimmed == after:
                    raise
                after = info.trimmed
                continue
            for entry in entries:
                emit(entry.offset, msgpack.unpackb(entry.data, raw=False))
            count += len(entries)
            if len(entries) < 1000:
                return count
            after = entries[-1].offset
    finally:
        await store.close()


# -- demo ------------------------------------------------------------------------------------


def _demo_again(args: argparse.Namespace, *more: str) -> str:
    """The demo command line that goes on from here (never with a token or password)."""
    from ..store.urls import redact_url

    words = ["agui-hub", "demo", args.thread]
    if args.url:
        words += ["--url", redact_url(args.url)]
    return shlex.join([*words, *more])


async def _demo(args: argparse.Namespace) -> int:
    from functools import partial

    from ..client.publisher import Publisher
    from .demo import demo_run

    thread = _thread(args.thread)
    url = _url(args)
    if args.runs < 1:
        raise UsageError("--runs must be at least 1")
    if args.speed < 0:
        raise UsageError("--speed must be 0 or more")
    retry = _Retry("demo", url, _timeout(args, DEFAULT_TIMEOUT))
    publisher = Publisher(url, token=_token_of(args), retry_for=0.0)
    try:
        await _connect_publisher(publisher, retry)
        for number in range(args.runs):
            run_id = args.run_id or f"run-{uuid.uuid4().hex[:8]}"
            if args.run_id and args.runs > 1:
                run_id = f"{args.run_id}-{number + 1}"
            events = demo_run(thread, run_id)
            watch = shlex.join(["agui-hub", "tail", thread])
            print(
                f"agui-hub demo: streaming run {run_id} ({len(events)} events) into thread "
                f"{thread!r} at {retry.url}; watch it with: {watch}",
                file=sys.stderr,
            )
            offset = ""
            index = 0
            try:
                for index, (delay, event) in enumerate(events):
                    if delay and args.speed:
                        await asyncio.sleep(delay / args.speed)
                    # Ids from the run id: a retry never stores an event twice, and
                    # `demo --run-id` again finishes a run cut short.
                    published = partial(
                        _published, publisher, thread, [event], [f"{run_id}-{index}"]
                    )
                    offset = (await retry.call(published))[0]
            except SequenceError as exc:
                if exc.rule != "run_not_started" or index == 0:
                    raise
                # The run's RUN_STARTED was stored, and now no run was ever started:
                # the thread is empty again.
                raise AguiHubError(
                    f"thread {thread!r} was reset while run {run_id} was streaming (the hub "
                    "restarted on the memory store, or Redis lost its data): its earlier "
                    "events are gone, so this run cannot go on. Start a new run: "
                    f"{_demo_again(args)} (or stream this one again from its start: "
                    f"{_demo_again(args, '--run-id', run_id)})"
                ) from None
            except (HubUnreachable, StoreUnavailable) as exc:
                raise HubUnreachable(
                    f"{exc}; run {run_id} is unfinished: finish it, once the hub is back, "
                    f"with: {_demo_again(args, '--run-id', run_id)}"
                ) from None
            print(f"agui-hub demo: run {run_id} finished at offset {offset}", file=sys.stderr)
    finally:
        await publisher.close()
    return 0


# -- run, cancel ---------------------------------------------------------------------------------


async def _run_agent(args: argparse.Namespace) -> int:
    from ..client.hub_client import Subscribed, ThreadEvent
    from ..client.transcript import TranscriptView

    thread = _thread(args.thread)
    url = _url(args, gateway_only=True)
    retry = _Retry("run", url, _timeout(args, DEFAULT_TIMEOUT))
    messages = [
        {"id": f"msg-{uuid.uuid4().hex}", "role": "user", "content": text} for text in args.message
    ]
    view = TranscriptView(color=_color(args.color, sys.stdout))
    out = _Output(sys.stdout)
    client = await _connect(url, retry, _token_of(args))
    outcome: dict[str, Any] | None = None
    try:
        # Following from the live end before the run starts: none of its events is missed.
        async with client.subscribe(thread, "live") as sub:
            async for item in sub:
                if isinstance(item, Subscribed):
                    break
            reply = await client.run(
                thread, args.agent, messages=messages, run_id=args.run_id, timeout=retry.timeout
            )
            run_id = reply.get("runId")
            cancel = shlex.join(["agui-hub", "cancel", thread])
            if args.detach:
                print(run_id)
                print(f"agui-hub run: run {run_id} of {args.agent} is going in thread "
                      f"{thread!r}; follow it with: {shlex.join(['agui-hub', 'tail', thread])}",
                      file=sys.stderr)  # fmt: skip
                return 0
            print(f"agui-hub run: run {run_id} of {args.agent} in thread {thread!r} (Ctrl-C "
                  f"stops following, the run goes on; stop it with: {cancel})",
                  file=sys.stderr)  # fmt: skip
            async for item in sub:
                if isinstance(item, ThreadEvent):
                    out.write(view.render(item.event))
                    if item.event.get("type") in ("RUN_FINISHED", "RUN_ERROR"):
                        outcome = item.event
                        break
    finally:
        with contextlib.suppress(Exception):
            out.write(view.close())
        await client.close()
    if outcome is not None and outcome["type"] == "RUN_ERROR":
        code = outcome.get("code")
        print(f"agui-hub run: the run ended with RUN_ERROR{f' {code}' if code else ''}: "
              f"{outcome.get('message')}", file=sys.stderr)  # fmt: skip
        return 1
    return 0


async def _cancel(args: argparse.Namespace) -> int:
    thread = _thread(args.thread)
    url = _url(args, gateway_only=True)
    retry = _Retry("cancel", url, _timeout(args, DEFAULT_TIMEOUT))
    client = await _connect(url, retry, _token_of(args))
    try:
        reply = await client.cancel(thread, args.run_id, abandoned=args.abandoned)
    finally:
        await client.close()
    agent = f" of {reply['agent']}" if reply.get("agent") else ""
    print(f"agui-hub cancel: run {reply.get('runId')}{agent} in thread {thread!r} "
          f"{'ended' if args.abandoned else 'cancelled'}", file=sys.stderr)  # fmt: skip
    return 0


# -- operator commands: threads, info, delete, check -------------------------------------------

STORE_HELP = (
    "the shared store, redis://HOST:PORT/DB[?prefix=...] (default $AGUI_HUB_STORE): the URL "
    "the gateways are run with, options included"
)
DEFAULT_THREADS_LIMIT = 100
DEFAULT_SCAN = 10_000
INFO_CONCURRENCY = 64
"""Thread infos asked for at once by ``threads`` (the Redis pool bounds the connections)."""
MEMORY_WARN_FRACTION = 0.9
"""``check`` warns when Redis uses this much of its ``maxmemory``."""


def _add_operator_commands(commands: Any) -> None:
    """The parsers of threads, info, delete and check (the store's operator view)."""
    threads = commands.add_parser(
        "threads",
        help="list the stored threads, most recently active first",
        description="List the threads of the store with their event count, payload bytes, "
        "first and last offset, last activity (the time in the last event's offset) and "
        "epoch, most recently active first: a table, or one JSON object per line with "
        "--json. Reads the store directly, so it needs the shared store the gateways use.",
    )
    threads.add_argument("--store", metavar="URL", help=STORE_HELP)
    threads.add_argument("--limit", type=int, default=DEFAULT_THREADS_LIMIT, metavar="N",
                         help="list at most N threads (default %(default)s)")  # fmt: skip
    threads.add_argument("--scan", type=int, default=DEFAULT_SCAN, metavar="N",
                         help="look at up to N threads to find the most recently active "
                         "(default %(default)s); said on stderr when there are more")  # fmt: skip
    threads.add_argument("--json", action="store_true", help="one JSON object per thread and line")

    info = commands.add_parser(
        "info",
        help="show one thread: events, bytes, offsets, epoch, run, expiry, checkpoint",
        description="Show what the store holds of THREAD: event count, payload bytes, first, "
        "last and trimmed offsets, last activity, epoch, current run, time left until it "
        "expires, and its checkpoint (the folded state gateways start from). Exit 1 when "
        "the thread does not exist.",
    )
    info.add_argument("thread")
    info.add_argument("--store", metavar="URL", help=STORE_HELP)
    info.add_argument("--json", action="store_true", help="one JSON object")

    delete = commands.add_parser(
        "delete",
        help="delete a thread and all its events (asks first)",
        description="Delete THREAD from the store: its events, event ids and checkpoint. "
        "On a terminal it shows the thread and asks you to type its id; otherwise it "
        "refuses unless given --yes. Viewers of the thread are told at once (a new "
        "epoch when it is published to again). Exit 1 when the thread does not exist.",
    )
    delete.add_argument("thread")
    delete.add_argument("--store", metavar="URL", help=STORE_HELP)
    delete.add_argument("--yes", action="store_true", help="delete without asking")

    check = commands.add_parser(
        "check",
        help="check that Redis's persistence and eviction keep the hub's promises",
        description="Connect to the store's Redis and check the settings the hub's "
        "promises rest on: AOF persistence (appendonly, appendfsync), the eviction policy "
        "(maxmemory-policy), memory headroom, and every warning `serve` logs at start-up. "
        "One line per check, OK, WARN or FAIL, with the change to make. Exit 0 when every "
        "promise holds (what serve --require-durable-store needs to start), 1 when one "
        "does not, 2 when nothing could be checked (the store is unreachable).",
    )
    check.add_argument("--store", metavar="URL", help=STORE_HELP)


def _store_url(args: argparse.Namespace, command: str) -> str:
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


def _open_shared_store(url: str) -> Any:
    """The store at *url*; :class:`UsageError` for a URL it cannot use, ValueError
    (exit 1) when the redis package is missing."""
    from ..store import open_store

    try:
        return open_store(url)
    except ValueError as exc:
        if _missing_package(exc):
            raise
        raise UsageError(str(exc)) from None


def _size(count: int) -> str:
    """*count* bytes for people: ``512 B``, ``58.3 KiB``, ``1.2 GiB``."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def _duration(seconds: float) -> str:
    """*seconds* for people: ``45 s``, ``12 min``, ``6 h 59 min``, ``6 d 23 h``."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


def _iso_utc(ms: int | None) -> str | None:
    from ..store.contract import iso_utc  # the store module only when a command needs it

    return iso_utc(ms)


def _json_line(record: dict[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"


async def _infos(store: Any, names: Sequence[str]) -> list[ThreadInfo]:
    """The infos of the threads *names* that still exist, a bounded number at a time."""
    found: list[ThreadInfo] = []
    for begin in range(0, len(names), INFO_CONCURRENCY):
        chunk = names[begin : begin + INFO_CONCURRENCY]
        infos = await asyncio.gather(*(store.info(name) for name in chunk))
        # None: deleted or expired since it was listed.
        found.extend(info for info in infos if info is not None)
    return found


def _thread_names(names: Sequence[str]) -> tuple[list[str], int]:
    """The valid thread names among *names* (keys a plain XADD made may be odd ones),
    and how many were not."""
    valid = []
    for name in names:
        try:
            valid.append(check_thread(name))
        except AguiHubError:
            continue
    return valid, len(names) - len(valid)


async def _threads(args: argparse.Namespace) -> int:
    from ..store.urls import redact_url

    if args.limit < 1:
        raise UsageError("--limit must be at least 1")
    if args.scan < 1:
        raise UsageError("--scan must be at least 1")
    url = _store_url(args, "threads")
    store = _open_shared_store(url)
    try:
        # The store lists names, not activity: the newest N are found among all
        # of them (up to --scan), not among the first N the listing returns.
        listed = await store.threads(args.scan + 1)
        more = len(listed) > args.scan
        names, odd = _thread_names(listed[: args.scan])
        infos = await _infos(store, names)
    finally:
        await store.close()
    infos.sort(key=lambda info: (-(info.last_activity or -1), info.thread))
    shown = infos[: args.limit]
    out = _Output(sys.stdout)
    if args.json:
        out.write("".join(_json_line(info.as_json()) for info in shown))
    elif shown:
        out.write(_threads_table(shown))
    where = redact_url(url)
    if not infos:
        print(f"agui-hub threads: no threads in {where}", file=sys.stderr)
    elif len(shown) < len(infos):
        print(f"agui-hub threads: the {len(shown)} most recently active of {len(infos)} "
              f"threads in {where} (--limit)", file=sys.stderr)  # fmt: skip
    else:
        print(f"agui-hub threads: {len(infos)} thread{'s' if len(infos) != 1 else ''} in {where}",
              file=sys.stderr)  # fmt: skip
    if more:
        print(f"agui-hub threads: the store holds more than {args.scan} threads and only "
              f"{args.scan} were looked at: more recently active ones may be missing (raise "
              "--scan)", file=sys.stderr)  # fmt: skip
    if odd:
        keys = "stream keys under the prefix do" if odd != 1 else "stream key under the prefix does"
        print(f"agui-hub threads: {odd} {keys} not name a valid thread (written by something "
              "else?): not listed", file=sys.stderr)  # fmt: skip
    return 0


def _threads_table(infos: Sequence[ThreadInfo]) -> str:
    header = ("THREAD", "EVENTS", "BYTES", "FIRST", "LAST", "LAST ACTIVITY (UTC)", "EPOCH")
    rows = [
        (
            info.thread,
            str(info.length),
            _size(info.bytes),
            info.first or "-",
            info.last or "-",
            _iso_utc(info.last_activity) or "-",
            info.epoch,
        )
        for info in infos
    ]
    widths = [max(len(row[column]) for row in (header, *rows)) for column in range(len(header))]
    right = {1, 2}  # numbers line up on the right

    def line(row: Sequence[str]) -> str:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        return "  ".join(cells).rstrip() + "\n"

    return "".join(line(row) for row in (header, *rows))


async def _info(args: argparse.Namespace) -> int:
    from ..store.urls import redact_url

    thread = _thread(args.thread)
    url = _store_url(args, "info")
    store = _open_shared_store(url)
    try:
        info = await store.info(thread)
        checkpoint = await store.get_checkpoint(thread) if info is not None else None
    finally:
        await store.close()
    if info is None:
        print(f"agui-hub info: thread {thread!r} does not exist in {redact_url(url)}",
              file=sys.stderr)  # fmt: skip
        return 1
    record = info.as_json()
    record["checkpoint"] = None
    if checkpoint is not None:
        record["checkpoint"] = {
            "offset": checkpoint.offset,
            "epoch": checkpoint.epoch,
            "complete": checkpoint.complete,
            "bytes": len(checkpoint.events),
            # A checkpoint of another epoch is ignored by the gateways.
            "current": checkpoint.epoch == info.epoch,
        }
    out = _Output(sys.stdout)
    if args.json:
        out.write(_json_line(record))
        return 0
    fields = [
        ("thread", info.thread),
        ("epoch", info.epoch),
        ("events", str(info.length)),
        ("bytes", f"{_size(info.bytes)} of event payloads"),
        ("first", info.first or "-"),
        ("last", info.last or "-"),
        ("last activity", record["lastActivity"] or "-"),
        ("trimmed", f"up to {info.trimmed}" if info.trimmed else "nothing"),
        ("run", info.run_id or "-"),
        ("expires", _expiry(info.ttl)),
        ("checkpoint", _describe_checkpoint(record["checkpoint"])),
    ]
    width = max(len(name) for name, _ in fields)
    out.write("".join(f"{name.ljust(width)}  {value}\n" for name, value in fields))
    return 0


def _expiry(ttl: float | None) -> str:
    if ttl is None:
        return "never (no ttl)"
    return f"in {_duration(ttl)} unless it is published to (ttl)"


def _describe_checkpoint(checkpoint: dict[str, Any] | None) -> str:
    if checkpoint is None:
        return "none"
    text = f"at {checkpoint['offset']}, {_size(checkpoint['bytes'])}"
    if not checkpoint["complete"]:
        text += ", incomplete (folded after events were trimmed)"
    if not checkpoint["current"]:
        text += f", of epoch {checkpoint['epoch']}: stale, ignored"
    return text


def _describe_thread(info: ThreadInfo) -> str:
    """One line about *info*'s thread: what deleting it removes."""
    span = f", offsets {info.first} to {info.last}" if info.first and info.last else ""
    activity = _iso_utc(info.last_activity)
    when = f", last activity {activity}" if activity else ""
    return f"{info.length} events ({_size(info.bytes)}){span}{when}, epoch {info.epoch}"


async def _delete(args: argparse.Namespace) -> int:
    from ..store.urls import redact_url

    thread = _thread(args.thread)
    url = _store_url(args, "delete")
    where = redact_url(url)
    ask = not args.yes
    if ask and not sys.stdin.isatty():
        # A pipe or a script cannot answer: deleting must be asked for explicitly.
        raise UsageError(
            f"not deleting thread {thread!r}: stdin is not a terminal, so nobody can "
            "confirm; pass --yes to delete without asking"
        )
    store = _open_shared_store(url)
    try:
        info = await store.info(thread)
        if info is None:
            print(f"agui-hub delete: thread {thread!r} does not exist in {where}: nothing "
                  "deleted", file=sys.stderr)  # fmt: skip
            return 1
        if ask:
            print(
                f"thread {thread!r} in {where}: {_describe_thread(info)}\n"
                "Deleting it removes its events, event ids and checkpoint for good; its "
                "viewers are told.\n"
                f"Type the thread id ({thread}) to delete it: ",
                end="",
                file=sys.stderr,
                flush=True,
            )
            answer = sys.stdin.readline().rstrip("\r\n")
            if answer != thread:
                said = "no answer" if not answer else f"the answer was {answer!r}"
                print(f"agui-hub delete: not deleted ({said}, not {thread!r})", file=sys.stderr)
                return 1
        deleted = await store.delete(thread)
    finally:
        await store.close()
    if not deleted:
        print(f"agui-hub delete: thread {thread!r} was gone already (deleted or expired "
              "meanwhile): nothing deleted", file=sys.stderr)  # fmt: skip
        return 1
    said = f"deleted thread {thread!r} from {where}: {_describe_thread(info)}"
    _Output(sys.stdout).write(said + "\n")
    return 0


@dataclass(frozen=True)
class _Verdict:
    """One line of ``check``: its level (OK, WARN, FAIL), what was checked, and why."""

    level: str
    name: str
    text: str

    def line(self) -> str:
        return f"{self.level:<4} {self.name}: {self.text}"


CHECKED_SETTINGS = ("appendonly", "appendfsync", "save", "maxmemory", "maxmemory-policy")


def _conf_change(name: str, value: str, also: str = "") -> str:
    """The change to make, as ``check`` words it: at once and for good."""
    return (
        f"change: CONFIG SET {name} {value} (at once) and `{name} {value}` in redis.conf "
        f"(for good){also}"
    )


def _persistence_verdicts(settings: dict[str, str]) -> list[_Verdict]:
    appendonly = settings.get("appendonly", "").lower()
    fsync = settings.get("appendfsync", "").lower()
    save = settings.get("save", "").strip()
    lost = "(viewers are told: new epochs)"
    if appendonly == "yes":
        aof = _Verdict(
            "OK", "appendonly", "yes: Redis logs every write to its AOF before it answers, so "
            "a restart loses nothing",
        )  # fmt: skip
    elif appendonly == "no" and save:
        aof = _Verdict(
            "FAIL", "appendonly", f'no, RDB snapshots only (save "{save}"): a crash or '
            "restart of Redis loses every acknowledged event since the last snapshot and "
            f"rolls threads back to it {lost}; {_conf_change('appendonly', 'yes')}",
        )  # fmt: skip
    elif appendonly == "no":
        aof = _Verdict(
            "FAIL", "appendonly", 'no, and no RDB snapshots (save ""): Redis persists '
            f"nothing, a restart loses every thread {lost}; {_conf_change('appendonly', 'yes')}",
        )  # fmt: skip
    else:
        aof = _Verdict("WARN", "appendonly", f"{appendonly!r}, a value this check does not "
                       "know: the hub needs yes")  # fmt: skip
    later = "" if appendonly == "yes" else "; it applies once appendonly is yes"
    if fsync == "always":
        sync = _Verdict(
            "OK", "appendfsync", "always: every write is on disk before Redis answers, even a "
            f"crash of its machine loses nothing{later}",
        )  # fmt: skip
    elif fsync == "everysec":
        sync = _Verdict(
            "OK", "appendfsync", "everysec: a crash of Redis loses nothing, a crash of its "
            "machine at most ~1 s of acknowledged events (always: none, at a cost in write "
            f"throughput){later}",
        )  # fmt: skip
    elif fsync == "no":
        sync = _Verdict(
            "FAIL", "appendfsync", "no: the operating system decides when the AOF reaches the "
            "disk, a crash of the machine can lose ~30 s of acknowledged events; "
            + _conf_change("appendfsync", "everysec"),
        )  # fmt: skip
    else:
        sync = _Verdict("WARN", "appendfsync", f"{fsync!r}, a value this check does not know: "
                        "the hub needs everysec or always")  # fmt: skip
    return [aof, sync]


def _eviction_verdict(settings: dict[str, str], uses_ttl: bool) -> _Verdict:
    policy = settings.get("maxmemory-policy", "").lower()
    try:
        maxmemory = int(settings.get("maxmemory", "0") or 0)
    except ValueError:
        maxmemory = 0
    limit = f"maxmemory {_size(maxmemory)}" if maxmemory else "maxmemory 0: no limit"
    when = "when maxmemory is reached" if maxmemory else "as soon as a maxmemory is set"
    change = _conf_change("maxmemory-policy", "noeviction")
    name = "maxmemory-policy"
    if policy == "noeviction":
        text = f"noeviction ({limit}): a full Redis refuses appends with an error, drops nothing"
        return _Verdict("OK", name, text)
    if policy.startswith("allkeys-"):
        text = f"{policy} ({limit}): Redis evicts any key {when}, threads' events included"
        return _Verdict("FAIL", name, f"{text}; {change}")
    if policy.startswith("volatile-") and uses_ttl:
        text = (
            f"{policy} ({limit}): Redis evicts keys with a TTL {when}, and the store's ttl "
            "option (7 days unless set) gives every thread's keys one"
        )
        return _Verdict("FAIL", name, f"{text}; {change} (or ttl=0 in the store URL)")
    if policy.startswith("volatile-"):
        text = f"{policy} ({limit}): evicts only keys with a TTL; ttl=0 gives thread keys none"
        return _Verdict("OK", name, text)
    text = f"{policy!r}, a value this check does not know: the hub needs noeviction"
    return _Verdict("WARN", name, f"{text}; {change}")


def _memory_verdict(settings: dict[str, str], facts: dict[str, str]) -> _Verdict | None:
    """Headroom under maxmemory: not a promise, but a full Redis refuses appends."""
    try:
        maxmemory = int(settings.get("maxmemory", "0") or 0)
        used = int(facts["used_memory"])
    except (KeyError, ValueError):
        return None
    if not maxmemory:
        return _Verdict("OK", "memory", f"{_size(used)} used, no maxmemory")
    share = used / maxmemory
    text = f"{_size(used)} used of maxmemory {_size(maxmemory)} ({share:.0%})"
    if share < MEMORY_WARN_FRACTION:
        return _Verdict("OK", "memory", text)
    return _Verdict(
        "WARN", "memory", f"{text}: a full Redis refuses appends; raise maxmemory (CONFIG SET "
        "maxmemory, and in redis.conf) or keep less (the store's max_len, max_bytes, ttl)",
    )  # fmt: skip


async def _redis_facts(redis_url: str, timeout: float) -> tuple[dict[str, str], str | None,
                                                                dict[str, str]]:  # fmt: skip
    """Redis's settings (CONFIG GET), why they could not be read (or None), and INFO.

    Raises :class:`StoreUnavailable` when Redis does not answer.
    """
    import redis.asyncio as aioredis
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import RedisError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from ..store.urls import redact_url

    client = aioredis.Redis.from_url(
        redis_url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        decode_responses=True,
    )
    settings: dict[str, str] = {}
    refused: str | None = None
    facts: dict[str, str] = {}
    try:
        for name in CHECKED_SETTINGS:
            try:
                reply = await asyncio.wait_for(client.config_get(name), timeout)
            except (RedisConnectionError, RedisTimeoutError):
                raise
            except RedisError as exc:  # a managed Redis may refuse CONFIG
                refused = str(exc)
                break
            settings.update({str(k): str(v) for k, v in reply.items()})
        with contextlib.suppress(RedisConnectionError, RedisTimeoutError, RedisError):
            raw = await asyncio.wait_for(client.info(), timeout)
            facts = {str(k): str(v) for k, v in raw.items()}
    except (RedisConnectionError, RedisTimeoutError, TimeoutError, OSError) as exc:
        raise StoreUnavailable(f"Redis at {redact_url(redis_url)} is unavailable: {exc}") from exc
    finally:
        with contextlib.suppress(Exception):
            await client.aclose()
    if refused is None and any(name not in settings for name in CHECKED_SETTINGS):
        refused = "incomplete reply"
    return settings, refused, facts


async def _check(args: argparse.Namespace) -> int:
    from ..errors import StoreError
    from ..store.urls import parse_store_url, redact_url

    try:
        url = _store_url(args, "check")
        parsed = parse_store_url(url)
        store = _open_shared_store(url)
    except (UsageError, ValueError) as exc:
        # Nothing was checked: exit 2 also for a missing redis package.
        print(f"agui-hub check: {exc}", file=sys.stderr)
        return 2
    where = redact_url(url)
    assert parsed.redis_url is not None
    try:
        try:
            await store.ping()
            settings, refused, facts = await _redis_facts(parsed.redis_url, store.op_timeout)
            warnings: list[str] = await store.durability_warnings()
        except StoreError as exc:  # unreachable, or it refuses us (a wrong password)
            why = str(exc).rstrip(".")
            print(_Verdict("FAIL", "reachable", f"{why}; nothing else was checked").line())
            return 2
    finally:
        await store.close()
    version = facts.get("redis_version", "?")
    verdicts = [_Verdict("OK", "reachable", f"Redis {version} at {where} answers")]
    if refused is not None:
        text = (
            f"Redis does not let agui-hub read its settings (CONFIG GET: {refused}); check by "
            "hand that appendonly is yes, appendfsync everysec or always, and maxmemory-policy "
            "noeviction"
        )
        verdicts.append(_Verdict("FAIL", "settings", text))
    else:
        verdicts += _persistence_verdicts(settings)
        verdicts.append(_eviction_verdict(settings, store.retention.ttl > 0))
        memory = _memory_verdict(settings, facts)
        if memory is not None:
            verdicts.append(memory)
    # What `serve` warns about, unless a FAIL line above already said it: one
    # verdict, whichever check finds it (a warning this check does not know
    # of still fails it, as it stops serve --require-durable-store).
    failed = [verdict.name for verdict in verdicts if verdict.level == "FAIL"]
    for warning in warnings:
        if not any(name in warning for name in failed):
            verdicts.append(_Verdict("FAIL", "store", warning))
    out = _Output(sys.stdout)
    out.write("".join(verdict.line() + "\n" for verdict in verdicts))
    failures = sum(verdict.level == "FAIL" for verdict in verdicts)
    if failures:
        print(f"agui-hub check: {failures} check{'s' if failures != 1 else ''} failed: the "
              f"hub's promises do not hold on Redis at {where}, or cannot be verified: see the "
              "FAIL lines, and docs/store.md, 'Redis settings the store needs'",
              file=sys.stderr)  # fmt: skip
        return 1
    print(f"agui-hub check: Redis at {where} keeps the hub's promises", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args, sys.argv[1:] if argv is None else list(argv))
    if args.command == "token":
        return _token(args)
    commands: dict[str, Callable[[argparse.Namespace], Any]] = {
        "publish": _publish,
        "tail": _tail,
        "replay": _replay,
        "demo": _demo,
        "run": _run_agent,
        "cancel": _cancel,
        "threads": _threads,
        "info": _info,
        "delete": _delete,
        "check": _check,
    }
    command = commands.get(args.command)
    if command is None:
        parser.print_help()
        return 0
    return _run(lambda: command(args), args.command)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
