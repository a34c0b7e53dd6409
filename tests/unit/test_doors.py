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


def _public_names(cls: ast.ClassDef) -> set[str]:
    """The methods, properties and ``self.x =`` attributes of ``cls`` without a leading ``_``."""
    names = {n.name for n in cls.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name) and node.value.id == "self"
            and not node.attr.startswith("_")
        ):  # fmt: skip
            names.add(node.attr)
    return names


def _forwarders(cls: ast.ClassDef) -> list[str]:
    """Public methods whose whole body (docstring aside) calls one method of one of the run's
    parts with the arguments it was given: a relay, which the caller should make to the part."""
    found = []
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef) or fn.name.startswith("_"):
            continue
        body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        if len(body) != 1 or not isinstance(body[0], (ast.Return, ast.Expr)):
            continue
        call = body[0].value
        args = [a.arg for a in fn.args.args[1:]]
        if (
            isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and isinstance(call.func.value, ast.Attribute)  # self.<part>.<method>(...)
            and [a.id for a in call.args if isinstance(a, ast.Name)] == args and args
        ):  # fmt: skip
            found.append(fn.name)
    return found


def test_the_run_behind_a_watch_stays_small_and_relays_nothing() -> None:
    """``WatchedRun`` holds the run's parts in one place and its life (start, findings, events,
    close); a part is reached through ``parts``, not through a method of the run that relays."""
    tree = ast.parse((REPO / "nnwatch/probe/watched_run.py").read_text())
    run = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "WatchedRun")
    names = _public_names(run)
    assert len(names) <= 25, sorted(names)
    assert {"parts", "files", "findings", "step_index", "close"} <= names
    assert _forwarders(run) == []


def test_the_forwarder_check_finds_a_relay() -> None:
    """The check above is not vacuous: a method that only passes its arguments on is caught."""
    src = (
        "class R:\n"
        "    def apply_command(self, name, args):\n"
        '        """Apply one command."""\n'
        "        return self.commands.apply(name, args)\n"
        "    def close(self, ending):\n"
        "        self.closed = True\n"
        "        self.files.close(ending)\n"
    )
    cls = ast.parse(src).body[0]
    assert isinstance(cls, ast.ClassDef)
    assert _forwarders(cls) == ["apply_command"]
    assert _public_names(cls) == {"apply_command", "close", "closed"}
