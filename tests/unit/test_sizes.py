"""The bounds that keep each room small: a module of nnwatch holds at most 500 lines, a class at
most 300, a function at most 60. Past them a concept has grown a second one; split it (see
CONTRIBUTING's map). The project's ceiling is 600 and 350; these bounds sit well under it, so
that no module or class lives at the ceiling and a little growth does not force a hurried split."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 300


def _modules() -> list[Path]:
    return sorted((REPO / "nnwatch").rglob("*.py"))


def test_every_module_has_at_most_500_lines() -> None:
    big = {
        str(p.relative_to(REPO)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert big == {}, big


def test_every_class_has_at_most_300_lines() -> None:
    big: dict[str, int] = {}
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_CLASS_LINES:
                    big[f"{p.relative_to(REPO)}:{node.name}"] = n
    assert big == {}, big


#: A function holds at most this many lines, its decorators and docstring included: past it, it does more than
#: one step, and its steps get names of their own (every package, the TUI and CLI included).
MAX_FUNCTION_LINES = 60


def _long_functions(tree: ast.AST, prefix: str = "") -> dict[str, int]:
    """``Class.method`` (and ``outer.inner``) -> lines, for every function over the bound."""
    out: dict[str, int] = {}
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])  # decorators count
            n = (node.end_lineno or node.lineno) - first + 1
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
        big.update({f"{rel}:{k}": v for k, v in _long_functions(ast.parse(p.read_text())).items()})
    assert big == {}, big


def test_the_function_scan_sees_a_long_function_and_a_nested_one() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    src = f"class C:\n    def m(self):\n        def inner():\n{body.replace('    ', '            ')}\n"
    src += f"def f():\n{body}"
    assert _long_functions(ast.parse(src)) == {"C.m": MAX_FUNCTION_LINES + 2, "C.m.inner": MAX_FUNCTION_LINES + 1, "f": MAX_FUNCTION_LINES + 1}
