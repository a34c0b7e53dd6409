"""The run behind a watch has one back door, ``internals(w)``, for tests and benchmarks. nnwatch's
own code (the integrations above all) goes through public API: ``w.framework`` for what a
framework's callback needs."""

from __future__ import annotations

import ast

from tests.conftest import REPO


def test_no_module_of_nnwatch_reaches_a_run_through_internals() -> None:
    users = []
    for path in sorted((REPO / "nnwatch").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "internals":
                users.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert users == []


def test_the_framework_link_is_public_and_typed() -> None:
    from torch import nn

    import nnwatch
    from nnwatch.probe.framework_link import FrameworkLink

    model = nn.Linear(2, 1)
    w = nnwatch.watch(model, channel=False)
    try:
        link = w.framework
        assert isinstance(link, FrameworkLink)
        assert link.learning_rates() is None  # no optimizer given: nothing to record
        with link.recorded_lrs([0.1]):  # and nothing to swap in
            pass
    finally:
        w.close()
