"""The ``agui-hub`` command line (the top layer): the gateway (``serve``), the
clients' commands (``publish``, ``tail``, ``replay``, ``demo``, ``run``,
``cancel``, ``runs``, ``presence``, ``token``) and the operator commands
(``threads``, ``info``, ``delete``, ``check``). ``main()`` is the console
script's entry point.

One module per group of commands, each with its parsers and its command
functions: :mod:`.serve` (serve, token), :mod:`.publish` (publish, demo),
:mod:`.follow` (tail, replay), :mod:`.runs` (run, cancel, runs),
:mod:`.presence`, :mod:`.threads` (threads, info, delete) and :mod:`.check`.
What they share is in :mod:`.common` (options, stdout, exit statuses, listed
there), :mod:`.retry` (waiting out an unreachable hub) and
:mod:`.shared_store` (the operator commands' ``--store``); :mod:`.parser`
assembles the parser.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .check import check_command
from .common import run_to_exit_status
from .follow import replay_command, tail_command
from .parser import build_parser
from .presence import presence_command
from .publish import demo_command, publish_command
from .runs import cancel_command, run_command, runs_command
from .serve import serve_command, token_command
from .threads import delete_command, info_command, threads_command

__all__ = ["build_parser", "main"]

ASYNC_COMMANDS: dict[str, Callable[[argparse.Namespace], Any]] = {
    "publish": publish_command,
    "tail": tail_command,
    "replay": replay_command,
    "demo": demo_command,
    "run": run_command,
    "cancel": cancel_command,
    "runs": runs_command,
    "presence": presence_command,
    "threads": threads_command,
    "info": info_command,
    "delete": delete_command,
    "check": check_command,
}
"""The commands that run as a coroutine: each returns its exit status, and
:func:`~.common.run_to_exit_status` turns its failures into theirs."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line *argv* (default: the process's arguments) and return
    the exit status for ``sys.exit``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        # The whole command line: `serve --workers N` starts its workers with it.
        return serve_command(args, sys.argv[1:] if argv is None else list(argv))
    if args.command == "token":
        return token_command(args)
    command = ASYNC_COMMANDS.get(args.command)
    if command is None:
        parser.print_help()
        return 0
    return run_to_exit_status(lambda: command(args), args.command)
