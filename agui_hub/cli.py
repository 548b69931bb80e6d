"""The ``agui-hub`` command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from . import __version__


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
        description="Run the WebSocket gateway. Every option can also be set with an "
        "AGUI_HUB_* environment variable (e.g. AGUI_HUB_STORE, AGUI_HUB_PORT); "
        "flags win.",
    )
    serve.add_argument("--host", help="interface to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default 8765; 0: any free)")
    serve.add_argument(
        "--store",
        help="store URL: redis://host:port/db[?max_len=…&max_age=…&ttl=…] or memory:// "
        "(default: the in-process memory store)",
    )
    serve.add_argument("--max-frame-bytes", type=int, help="largest client frame (default 1 MiB)")
    serve.add_argument(
        "--max-subscriptions", type=int, help="threads per connection (default 1000)"
    )
    serve.add_argument(
        "--send-queue-bytes",
        type=int,
        help="unsent bytes per connection before it is closed as slow (default 4 MiB)",
    )
    serve.add_argument("--ping-interval", type=float, help="seconds between keepalive pings")
    serve.add_argument("--idle-timeout", type=float, help="seconds before an idle socket closes")
    serve.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")
    return parser


def _serve(args: argparse.Namespace) -> int:
    from .server import Gateway, GatewayConfig

    level = args.log_level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if level != "DEBUG":
        # One line per connection and health check is noise in production logs.
        logging.getLogger("websockets").setLevel(logging.WARNING)
    try:
        config = GatewayConfig.from_env(
            host=args.host,
            port=args.port,
            store=args.store,
            max_frame_bytes=args.max_frame_bytes,
            max_subscriptions=args.max_subscriptions,
            send_queue_bytes=args.send_queue_bytes,
            ping_interval=args.ping_interval,
            idle_timeout=args.idle_timeout,
        )
        gateway = Gateway(config)
    except ValueError as exc:
        print(f"agui-hub serve: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(gateway.run())
    except OSError as exc:
        print(f"agui-hub serve: cannot listen on {config.host}:{config.port}: {exc}",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    parser.print_help()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
