"""Every kind of finding the package makes is declared in ``nnwatch.store.finding.KIND_SPECS``.

The emitted kinds are read from the code, not listed here: every ``Finding(...)`` and
``make_finding(...)`` call, its kind a string, a module constant, or ``self.kind`` (the
detector's class attribute), every ``self.report(...)`` of a detector (its own kind), and every dict literal that is a finding's line (keys ``kind`` and
``severity``, the kind written out). A new kind that nobody adds to KIND_SPECS fails this test, and so does a kind the
scan cannot read (a computed one): name it through a constant so it can be checked.
"""

from __future__ import annotations

import ast

from nnwatch.store.finding import KIND_SPECS, KINDS, SEVERITIES
from tests.conftest import REPO

FINDING_MAKERS = {"Finding", "make_finding"}

#: Places that pass a kind through rather than make one: the record's own reader and the
#: helper whose callers are scanned.
PASS_THROUGH = {
    ("nnwatch/store/finding.py", "from_dict"),
    ("nnwatch/probe/consistency.py", "make_finding"),
    ("nnwatch/diagnosis/detectors/base.py", "report"),  # Detector.report: the detector's own kind
}

#: Synthetic event lines of the demo fixture (nnwatch/testing), pinned by the TUI's snapshots and
#: history tests: not findings any detector makes. Remove when the TUI rewrite renames them.
FIXTURE_KINDS = {("nnwatch/testing/fixture_events.py", "amp_overflow"), ("nnwatch/testing/fixture_events.py", "dead_units")}


class _Scan(ast.NodeVisitor):
    def __init__(self, rel: str, tree: ast.Module) -> None:
        self.rel = rel
        self.constants = {
            t.id: n.value.value
            for n in tree.body
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        self.class_kind: list[str | None] = []
        self.function: list[str] = []
        self.kinds: set[str] = set()
        self.unreadable: list[str] = []

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        kind = None
        for stmt in node.body:
            target = stmt.target if isinstance(stmt, ast.AnnAssign) else None
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target = stmt.targets[0]
            value = getattr(stmt, "value", None)
            if isinstance(target, ast.Name) and target.id == "kind" and isinstance(value, ast.Constant):
                kind = value.value
        self.class_kind.append(kind)
        self.generic_visit(node)
        self.class_kind.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.function.append(node.name)
        self.generic_visit(node)
        self.function.pop()

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name in FINDING_MAKERS and (self.rel, self.function[-1] if self.function else "") not in PASS_THROUGH:
            arg = next((k.value for k in node.keywords if k.arg == "kind"), node.args[0] if node.args else None)
            self._kind(arg, node.lineno)
        elif name == "report" and ast.unparse(func) == "self.report" and self.class_kind and self.class_kind[-1]:
            self.kinds.add(self.class_kind[-1])  # Detector.report(row, ...): a finding of self.kind
        self.generic_visit(node)

    def visit_Dict(self, node: ast.Dict) -> None:
        keys = {k.value: v for k, v in zip(node.keys, node.values, strict=True) if isinstance(k, ast.Constant)}
        if "kind" in keys and "severity" in keys:
            value = keys["kind"]
            if isinstance(value, ast.Constant) and (self.rel, value.value) in FIXTURE_KINDS:
                return
            if isinstance(value, ast.Constant) or (isinstance(value, ast.Name) and value.id in self.constants):
                self._kind(value, node.lineno)  # a record's own to_dict() passes its kind through
        self.generic_visit(node)

    def _kind(self, arg: ast.expr | None, line: int) -> None:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            self.kinds.add(arg.value)
        elif isinstance(arg, ast.Name) and arg.id in self.constants:
            self.kinds.add(self.constants[arg.id])
        elif (
            isinstance(arg, ast.Attribute) and arg.attr == "kind" and isinstance(arg.value, ast.Name)
            and arg.value.id == "self" and self.class_kind and self.class_kind[-1]
        ):
            self.kinds.add(self.class_kind[-1])
        else:
            self.unreadable.append(f"{self.rel}:{line}")


def _scan() -> tuple[set[str], list[str]]:
    kinds: set[str] = set()
    unreadable: list[str] = []
    for path in sorted((REPO / "nnwatch").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        tree = ast.parse(path.read_text())
        scan = _Scan(rel, tree)
        scan.visit(tree)
        kinds |= scan.kinds
        unreadable += scan.unreadable
    return kinds, unreadable


def test_every_emitted_kind_is_declared() -> None:
    kinds, unreadable = _scan()
    assert unreadable == [], f"a finding's kind the scan cannot read (use a constant): {unreadable}"
    assert sorted(kinds - set(KINDS)) == [], "emitted kinds missing from nnwatch.store.finding.KIND_SPECS"


def test_the_scan_sees_the_detectors_and_the_probe() -> None:
    """The scan itself works: kinds made in each way it reads are found."""
    kinds, _ = _scan()
    for made in ("loss_spike", "grads_not_cleared", "adversarial_imbalance", "rank_divergence", "nnwatch_error"):
        assert made in kinds


def test_every_declared_kind_is_emitted_and_described() -> None:
    kinds, _ = _scan()
    assert sorted(set(KINDS) - kinds) == [], "declared kinds that nothing emits"
    for name, spec in KIND_SPECS.items():
        assert spec.description, name
        assert spec.severities and set(spec.severities) <= set(SEVERITIES), name


def test_a_new_kind_is_caught() -> None:
    for made in ("Finding(kind=self.kind)", "self.report(row, 'warning', 's', 'r', {})"):
        src = f"class D:\n    kind = 'brand_new'\n    def f(self):\n        return {made}\n"
        scan = _Scan("x.py", ast.parse(src))
        scan.visit(ast.parse(src))
        assert scan.kinds == {"brand_new"} and "brand_new" not in KINDS


def test_every_finding_is_made_in_diagnosis() -> None:
    """Findings have one maker: the probe, the channel, the sources and the TUI report what
    happened and pass findings on, but the words of a finding (kind, summary, remedy) are
    written in nnwatch/diagnosis only (the store declares the class and reads it back)."""
    makers = []
    for path in sorted((REPO / "nnwatch").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        if rel.startswith("nnwatch/diagnosis/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Finding":
                makers.append(f"{rel}:{node.lineno}")
    assert makers == []
