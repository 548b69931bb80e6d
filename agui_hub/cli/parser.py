"""The ``agui-hub`` argument parser, assembled from the parsers of each group of
commands (in the order ``agui-hub --help`` lists them)."""

from __future__ import annotations

import argparse

from ..version import __version__
from .check import add_check_parser
from .follow import add_replay_parser, add_tail_parser
from .presence import add_presence_parser
from .publish import add_demo_parser, add_publish_parser
from .runs import add_cancel_parser, add_run_parser, add_runs_parser
from .serve import add_serve_parser, add_token_parser
from .threads import add_delete_parser, add_info_parser, add_threads_parser


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command; ``args.command`` names the one parsed (None
    when none was given)."""
    parser = argparse.ArgumentParser(
        prog="agui-hub",
        description="A production relay for the AG-UI protocol.",
    )
    parser.add_argument("--version", action="version", version=f"agui-hub {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_serve_parser(commands)
    add_token_parser(commands)
    add_publish_parser(commands)
    add_tail_parser(commands)
    add_replay_parser(commands)
    add_demo_parser(commands)
    add_run_parser(commands)
    add_cancel_parser(commands)
    add_runs_parser(commands)
    add_presence_parser(commands)
    add_threads_parser(commands)
    add_info_parser(commands)
    add_delete_parser(commands)
    add_check_parser(commands)
    return parser
