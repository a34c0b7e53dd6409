"""The bounds that keep each room small: a module of nnwatch holds at most 600 lines, a class at
most 350. Past them a concept has grown a second one; split it (see CONTRIBUTING's map)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 350


def _modules() -> list[Path]:
    return sorted((REPO / "nnwatch").rglob("*.py"))


def test_every_module_has_at_most_600_lines() -> None:
    big = {
        str(p.relative_to(REPO)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert big == {}, big


def test_every_class_has_at_most_350_lines() -> None:
    big: dict[str, int] = {}
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_CLASS_LINES:
                    big[f"{p.relative_to(REPO)}:{node.name}"] = n
    assert big == {}, big
