"""The package's layout holds: the import contracts of pyproject.toml
([tool.importlinter]: layers, no cycles, pure lower layers, redis only in the
store), and rooms small enough to read (docs/architecture.md)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "agui_hub"

MAX_MODULE_LINES = 1_000
MAX_CLASS_LINES = 550
"""About 500: a class past this has a concern to hand to a collaborator."""


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the package under *root* with *root*'s pyproject.toml."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command as c; c()",
         str(root / "pyproject.toml"), "--no-cache"],
        cwd=root, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_every_import_contract_is_kept() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    # Every contract ran, none was left out by a typo in the configuration.
    assert "4 kept, 0 broken" in result.stdout, result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract", "named"),
    [
        # A protocol module reaching up into the gateway.
        ("agui/events.py", "from ..gateway import server as _server", "Layers",
         "agui_hub.agui.events -> agui_hub.gateway.server"),
        # The wire layer doing I/O.
        ("wire/codec.py", "import asyncio as _asyncio", "do no I/O",
         "agui_hub.wire.codec -> asyncio"),
        # Two modules of one folder importing each other.
        ("store/memory.py", "from . import urls as _urls", "No import cycle",
         "No cycles are allowed in agui_hub.store."),
    ],
)  # fmt: skip
def test_an_import_against_the_layout_breaks_a_contract(
    tmp_path: Path, module: str, line: str, contract: str, named: str
) -> None:
    """The contracts are not vacuous: one bad import in a copy of the package fails them."""
    shutil.copytree(PACKAGE, tmp_path / "agui_hub", ignore=shutil.ignore_patterns("static"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    if module == "store/memory.py":  # the cycle needs the way back too
        with (tmp_path / "agui_hub/store/urls.py").open("a") as f:
            f.write("\nfrom . import memory as _memory  # noqa\n")
    with (tmp_path / "agui_hub" / module).open("a") as f:
        f.write(f"\n{line}  # noqa\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0, result.stdout
    broken = result.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, result.stdout
    assert named in " ".join(broken.split()), result.stdout


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_is_over_a_thousand_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"split these along their seams (docs/architecture.md): {long}"


def test_no_class_is_over_about_five_hundred_lines() -> None:
    big = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    big[f"{path.relative_to(ROOT)}:{node.name}"] = size
    assert not big, f"give a concern of these to a collaborator: {big}"
