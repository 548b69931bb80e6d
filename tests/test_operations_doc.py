"""docs/operations.md: its settings tables list every gateway setting once, with
the variable, flag and default the code has, and nothing else."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from agui_hub.cli.parser import build_parser
from agui_hub.gateway.config import CLIENT_VARIABLES, GatewayConfig, setting_kinds

DOC = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
ROW = re.compile(r"^\| `(AGUI_HUB_[A-Z_]+)` \| `(--[a-z-]+)` \| ([^|]+) \| [^|]+ \|$", re.M)


def test_every_setting_is_in_the_table_once() -> None:
    rows = ROW.findall(DOC)
    variables = [variable for variable, _, _ in rows]
    expected = {f"AGUI_HUB_{name.upper()}" for name in setting_kinds()}
    assert len(variables) == len(set(variables)), "a variable listed twice"
    assert set(variables) == expected


def test_flags_and_defaults_are_the_code_s() -> None:
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    flags = {option for action in serve._actions for option in action.option_strings}
    defaults = {field.name: field.default for field in dataclasses.fields(GatewayConfig)}
    for variable, flag, default in ROW.findall(DOC):
        name = variable.removeprefix("AGUI_HUB_").lower()
        assert flag in flags, flag
        value = defaults[name]
        if isinstance(value, bool):
            assert default.strip() == ("on" if value else "off"), variable
            assert flag == f"--{'no-' if value else ''}{name.replace('_', '-')}", variable
        elif value in ("", None):
            assert default.strip() == "—", variable
        else:
            assert default.strip() == f"`{value}`", variable


def test_every_variable_named_in_the_doc_exists() -> None:
    named = set(re.findall(r"AGUI_HUB_[A-Z_]+[A-Z]", DOC))
    known = {f"AGUI_HUB_{name.upper()}" for name in setting_kinds()} | CLIENT_VARIABLES
    assert named - known == set(), "variables the code does not know"
