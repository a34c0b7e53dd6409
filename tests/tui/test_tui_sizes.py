"""The monitor's and the commands' functions stay short: at most 60 lines each, decorators and
docstring included, in nnwatch/tui and nnwatch/cli. A longer one does two things; give the second
a name (a helper, or a controller of the app, see ``nnwatch/tui/app.py``)."""

from __future__ import annotations

import ast

import pytest

from tests.conftest import REPO

MAX_FUNCTION_LINES = 60


@pytest.mark.parametrize("package", ["tui", "cli"])
def test_every_function_has_at_most_60_lines(package: str) -> None:
    long: dict[str, int] = {}
    for path in sorted((REPO / "nnwatch" / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                n = (node.end_lineno or node.lineno) - first + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(REPO)}:{node.lineno} {node.name}"] = n
    assert long == {}, long
