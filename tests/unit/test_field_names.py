"""The step record's field names have one owner, ``nnwatch.store.schema.FieldName``: elsewhere a
field is named through it (``FieldName.GRAD_NORM_CLIPPED``), never as a bare string, so that
renaming, finding or removing a field happens in one place."""

from __future__ import annotations

import ast

from nnwatch.store.schema import FieldName
from tests.conftest import REPO

FIELDS = {v for k, v in vars(FieldName).items() if k.isupper()}

#: Four field names are also ordinary keys with another owner: every event line, manifest and
#: reply has a "step" (and a "time"), evidence and reports a "loss", and torch's optimizer
#: param_groups an "lr". Bare, they are those keys; the record's fields of these names are written
#: FieldName.STEP and so on where the code reads a record, which this scan cannot tell apart.
SHARED_WORDS = {"step", "time", "loss", "lr"}


OWNER = "nnwatch/store/schema.py"


def bare_field_names(source: str) -> list[tuple[int, str]]:
    """(line, name) of every string literal that is a field name, f-strings' parts left out."""
    tree = ast.parse(source)
    inside_fstrings = {id(c) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for c in ast.walk(n)}
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in inside_fstrings
        and n.value in FIELDS and n.value not in SHARED_WORDS
    ]


def test_field_names_are_named_through_the_schema() -> None:
    found = []
    for path in sorted((REPO / "nnwatch").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        if rel == OWNER:
            continue
        found += [f"{rel}:{line}: {name!r}" for line, name in bare_field_names(path.read_text())]
    assert found == [], "write FieldName.<NAME> (nnwatch/store/schema.py) for these:\n" + "\n".join(found)


def test_the_scan_sees_a_bare_field_name() -> None:
    assert bare_field_names('x = rows["grad_norm_clipped"]\ny = f"{a}grad_norm"\n') == [(1, "grad_norm_clipped")]


def test_every_field_of_the_layout_has_a_name() -> None:
    from nnwatch.store.schema import RunSchema

    schema = RunSchema(("a",), ("Linear",), ("a",), num_lr=1)
    assert set(schema.record_dtype().names or ()) <= FIELDS
    assert set(schema.layer_row_dtype().names or ()) <= FIELDS
