"""Module-level state that is mutated is listed, with why it must be per process, in
CONTRIBUTING.md ("State that lives in a module"): this test finds all of it, so that a new
registry, cache or dict at module level is either given to an object or justified there."""

from __future__ import annotations

import ast

from tests.conftest import REPO

#: (module, name): what CONTRIBUTING.md's table lists. Keep the two in step.
DOCUMENTED = {
    ("nnwatch/probe/sharded_reduce.py", "_created"),
    ("nnwatch/probe/watch.py", "_LIVE"), ("nnwatch/probe/watch.py", "_BY_NAME"),
    ("nnwatch/probe/clip_intercept.py", "_listeners"), ("nnwatch/probe/clip_intercept.py", "_originals"),
    ("nnwatch/probe/clip_intercept.py", "_wrappers"),
    ("nnwatch/probe/scaler_discovery.py", "_waiting"), ("nnwatch/probe/scaler_discovery.py", "_original"),
    ("nnwatch/probe/scaler_discovery.py", "_wrapper"),
    ("nnwatch/probe/hook_hiding.py", "_wrapped"),
    ("nnwatch/probe/game.py", "_tick"), ("nnwatch/probe/game.py", "_last"), ("nnwatch/probe/game.py", "_turns"),
    ("nnwatch/probe/game.py", "_alone"),
    ("nnwatch/probe/consistency.py", "_created"),
    ("nnwatch/channel/endpoint.py", "_open_instances"),
    ("nnwatch/sources/ssh_child.py", "_OPEN"), ("nnwatch/sources/ssh_child.py", "_HANDLED"),
    ("nnwatch/store/paths.py", "_PINNED"), ("nnwatch/store/paths.py", "_SAID"),
    ("nnwatch/store/findings_count.py", "_findings_cache"), ("nnwatch/store/jobs.py", "_job_cache"),
}  # fmt: skip

MUTATORS = {
    "append", "add", "update", "setdefault", "pop", "clear", "extend", "remove", "discard",
    "popitem", "insert", "appendleft", "popleft",
}
CONTAINERS = {
    "dict", "list", "set", "defaultdict", "deque", "OrderedDict", "Counter",
    "WeakKeyDictionary", "WeakValueDictionary", "WeakSet",
}


def _module_state(tree: ast.Module) -> set[str]:
    """Names bound at module level to a container and mutated anywhere, or rebound by ``global``."""
    containers = set()
    for node in tree.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if not isinstance(target, ast.Name) or value is None:
            continue
        displays = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
        call = isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in CONTAINERS
        if isinstance(value, displays) or call:
            containers.add(target.id)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found |= set(node.names)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id in containers and node.func.attr in MUTATORS:
                found.add(owner.id)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for t in targets:
                if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id in containers:
                    found.add(t.value.id)
    return found


def test_module_level_state_is_documented() -> None:
    found = set()
    for path in sorted((REPO / "nnwatch").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        found |= {(rel, name) for name in _module_state(ast.parse(path.read_text()))}
    assert sorted(found - DOCUMENTED) == [], "module-level state not in CONTRIBUTING.md's table"
    assert sorted(DOCUMENTED - found) == [], "listed in CONTRIBUTING.md but gone: remove it there"


def test_the_scan_sees_a_registry() -> None:
    src = "REG = {}\ndef register(k, v):\n    REG[k] = v\nCONST = {'a': 1}\n"
    assert _module_state(ast.parse(src)) == {"REG"}
