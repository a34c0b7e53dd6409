"""Module-level state that is mutated is listed, with why it must be per process, in
CONTRIBUTING.md ("State that lives in a module"): this test finds all of it and reads that table
(the one list of it), so that a new registry, cache or dict at module level is either given to an
object or justified there, and an entry whose state is gone is removed there."""

from __future__ import annotations

import ast
import re

from tests.conftest import REPO

SECTION = "## State that lives in a module"
CACHES = {"cache", "lru_cache"}  # functools decorators: a module-level function's cache is state


def documented() -> set[tuple[str, str]]:
    """(module, name) of each entry in CONTRIBUTING.md's table, the one list of them: a ``where``
    cell names a module (`` `probe/watch.py` ``) and then its names (`` `_LIVE`, `_BY_NAME` ``),
    and may name another module after them."""
    text = (REPO / "CONTRIBUTING.md").read_text()
    assert SECTION in text, f"CONTRIBUTING.md has no {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    entries = set()
    for line in section.splitlines():
        cells = line.split("|")
        if len(cells) < 3 or not cells[1].strip().startswith("`"):
            continue  # not a row, or the header or rule
        module = ""
        for word in re.findall(r"`([^`]+)`", cells[1]):
            if word.endswith(".py"):
                module = f"nnwatch/{word}"
            else:
                assert module, f"a name before its module in CONTRIBUTING.md: {line}"
                entries.add((module, word))
    return entries


MUTATORS = {
    "append", "add", "update", "setdefault", "pop", "clear", "extend", "remove", "discard",
    "popitem", "insert", "appendleft", "popleft",
}
CONTAINERS = {
    "dict", "list", "set", "defaultdict", "deque", "OrderedDict", "Counter",
    "WeakKeyDictionary", "WeakValueDictionary", "WeakSet",
}


def _module_state(tree: ast.Module) -> set[str]:
    """Names bound at module level to a container and mutated anywhere, rebound by ``global``,
    or of a module-level function that ``functools`` caches."""
    containers = set()
    found = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            for deco in node.decorator_list:
                call = deco.func if isinstance(deco, ast.Call) else deco
                if ast.unparse(call).split(".")[-1] in CACHES:
                    found.add(node.name)
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
    listed = documented()
    assert sorted(found - listed) == [], "module-level state not in CONTRIBUTING.md's table"
    assert sorted(listed - found) == [], "listed in CONTRIBUTING.md but gone: remove it there"


def test_the_scan_sees_a_registry() -> None:
    src = "REG = {}\ndef register(k, v):\n    REG[k] = v\nCONST = {'a': 1}\n"
    assert _module_state(ast.parse(src)) == {"REG"}
    cached = "import functools\n@functools.lru_cache(maxsize=4)\ndef f(x):\n    return x\n"
    cached += "@functools.cache\ndef g():\n    return 1\n@staticmethod\ndef h():\n    return 2\n"
    assert _module_state(ast.parse(cached)) == {"f", "g"}


def test_the_table_is_read_with_every_module_of_a_cell() -> None:
    listed = documented()
    assert {("nnwatch/probe/watch.py", "_LIVE"), ("nnwatch/probe/watch.py", "_BY_NAME")} <= listed
    # one cell, two modules: each name goes with the module before it
    assert ("nnwatch/store/jobs.py", "_job_cache") in listed
    assert ("nnwatch/store/findings_count.py", "_job_cache") not in listed
