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


MAX_FUNCTION_LINES = 60

#: Packages not held to the function bound yet: none now, every package of nnwatch (the TUI, the
#: CLI, the probe, nnwatch/tensors and the nnwatch/testing scaffolding included) is held to it.
FUNCTIONS_NOT_YET: tuple[str, ...] = ()

#: Functions over the bound in the packages that are held to it, still to be split (by meaning:
#: named steps). The list only shrinks; a function that grows past the bound fails.
TOO_LONG_STILL: dict[str, int] = {
    "nnwatch/diagnosis/detectors/exploding_gradients.py:ExplodingGradientsDetector.update": 89,
    "nnwatch/diagnosis/detectors/loss_stalled.py:LossStalledDetector.update": 82,
    "nnwatch/diagnosis/detectors/oscillating_loss.py:OscillatingLossDetector.update": 90,
    "nnwatch/diagnosis/row.py:Row.batch": 64,
}


def _long_functions(tree: ast.AST, prefix: str = "") -> dict[str, int]:
    """``Class.method`` (and ``outer.inner``) -> lines, for every function over the bound."""
    out: dict[str, int] = {}
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            if n > MAX_FUNCTION_LINES:
                out[prefix + node.name] = n
            out.update(_long_functions(node, f"{prefix}{node.name}."))
        elif isinstance(node, ast.ClassDef):
            out.update(_long_functions(node, f"{prefix}{node.name}."))
        else:
            out.update(_long_functions(node, prefix))
    return out


def test_every_function_has_at_most_60_lines() -> None:
    big: dict[str, int] = {}
    for p in _modules():
        rel = str(p.relative_to(REPO))
        if rel.startswith(FUNCTIONS_NOT_YET):
            continue
        for name, n in _long_functions(ast.parse(p.read_text())).items():
            key = f"{rel}:{name}"
            if n > TOO_LONG_STILL.get(key, MAX_FUNCTION_LINES):
                big[key] = n
    assert big == {}, big


def test_the_list_of_long_functions_only_shrinks() -> None:
    """A function of TOO_LONG_STILL that was split (or is gone) is taken off the list."""
    now: dict[str, int] = {}
    for p in _modules():
        rel = str(p.relative_to(REPO))
        now.update({f"{rel}:{k}": v for k, v in _long_functions(ast.parse(p.read_text())).items()})
    assert sorted(k for k in TOO_LONG_STILL if k not in now) == []
