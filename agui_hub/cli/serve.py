"""``agui-hub serve``, the gateway (one process, or ``--workers`` processes), and
``agui-hub token``, which mints development tokens for its authentication.

The gateway's modules are imported by the commands, not here: the other
commands start without them.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..gateway.workers import WORKER_FLAG
from .common import Subcommands, UsageError, missing_package

if TYPE_CHECKING:
    from ..gateway.server import Gateway


def add_serve_parser(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "serve",
        help="run the WebSocket gateway",
        description="Run the WebSocket gateway. Every setting can also come from an "
        "AGUI_HUB_* environment variable (AGUI_HUB_STORE, AGUI_HUB_MAX_CONNECTIONS, ...) or "
        "a TOML file (--config); flags win over variables, variables over the file.",
    )
    _add_settings(parser)
    parser.add_argument(
        "--config", metavar="FILE", help="TOML file of settings (names as below, with _); "
        "also $AGUI_HUB_CONFIG"
    )  # fmt: skip
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")
    # Set by `serve --workers N` on the processes it starts (agui_hub/gateway/workers.py).
    parser.add_argument(WORKER_FLAG, type=int, help=argparse.SUPPRESS)


def _add_settings(parser: argparse.ArgumentParser) -> None:
    """One flag per gateway setting (--max-connections for max_connections), in groups."""
    from ..gateway.config import LOOPS, SETTING_GROUPS, setting_kinds

    kinds = setting_kinds()
    for title, settings in SETTING_GROUPS.items():
        group = parser.add_argument_group(title)
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


def serve_command(args: argparse.Namespace, argv: Sequence[str]) -> int:
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
        return 1 if missing_package(exc) else 2
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
            return 1 if missing_package(exc) else 2
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
        return 1 if missing_package(exc) else 2
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
    # (exit 2) rather than a broken installation (see missing_package).
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
    _tune_collector()
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


GC_THRESHOLD = (50_000, 10, 10)
"""The cyclic garbage collector's thresholds in ``agui-hub serve`` (Python's are
700, 10, 10): see :func:`_tune_collector`."""


def _tune_collector() -> None:
    """Make the cyclic garbage collector run less often in a gateway process.

    A gateway allocates a few containers per event and frees nearly all of them
    by reference counting, while holding many long-lived objects (a connection
    has dozens): at Python's default threshold the collector ran every 700
    allocations and took about a fifth of the gateway's CPU under load (py-spy,
    bench_load.py's many-threads case: 100 to 107 us of CPU per delivery, 71
    to 79 with these thresholds). What was allocated to start (modules,
    settings) is frozen out of every collection. Only ``serve`` does this: a
    Gateway embedded in another program leaves that program's collector alone.
    """
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


def add_token_parser(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "token",
        help="mint an HS256 token for the gateway (development, small deployments)",
        description="Print a signed JWT for SUBJECT with the given grants, for a gateway "
        "run with --jwt-secret / --jwt-secret-file. Patterns are thread ids or prefixes "
        "ending in * (tenant-42/*). In production an identity provider issues tokens.",
    )
    parser.add_argument("subject", help="the token's sub: who it is (scopes its event ids)")
    parser.add_argument("--subscribe", action="append", default=[], metavar="PATTERN",
                        help="threads it may read (repeat for more)")  # fmt: skip
    parser.add_argument("--publish", action="append", default=[], metavar="PATTERN",
                        help="threads it may publish into (repeat for more)")  # fmt: skip
    parser.add_argument("--admin", action="store_true",
                        help="the admin grant (/metrics, /admin/...)")  # fmt: skip
    parser.add_argument("--run", action="append", default=[], metavar="PATTERN",
                        help="upstream agents it may run (repeat; docs/bridge.md)")  # fmt: skip
    parser.add_argument("--ttl", type=float, default=3600.0,
                        help="seconds until it expires (default 3600)")  # fmt: skip
    parser.add_argument("--secret-file", help="file holding the secret (default "
                        "$AGUI_HUB_JWT_SECRET_FILE, or $AGUI_HUB_JWT_SECRET)")  # fmt: skip
    parser.add_argument("--audience", help="aud claim (default $AGUI_HUB_JWT_AUDIENCE)")
    parser.add_argument("--issuer", help="iss claim (default $AGUI_HUB_JWT_ISSUER)")


def token_command(args: argparse.Namespace) -> int:
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
