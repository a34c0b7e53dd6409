"""``watch(**options)`` is typed by ``WatchOptionsDict``: editors complete the options and mypy
checks a caller's spelling and values; at run time an unknown option is still refused, in words.
"""

from __future__ import annotations

import textwrap
import typing
from dataclasses import fields
from pathlib import Path

import pytest

from nnwatch.probe.options import WatchOptions, WatchOptionsDict
from tests.conftest import REPO

SNIPPET = """\
from torch import nn

import nnwatch

model = nn.Linear(2, 2)
nnwatch.watch(model, None, None, name="run", budget=None, layer_interval=5, run_dir="/tmp/x")
nnwatch.watch(model, nmae="run")
nnwatch.watch(model, budget="high")
"""


def test_the_typed_keywords_are_the_options() -> None:
    """The TypedDict and the frozen dataclass declare the same options with the same types."""
    assert typing.get_type_hints(WatchOptionsDict) == typing.get_type_hints(WatchOptions)
    assert list(WatchOptionsDict.__annotations__) == [f.name for f in fields(WatchOptions)]
    assert WatchOptionsDict.__required_keys__ == frozenset()


def test_mypy_checks_a_callers_options(tmp_path: Path) -> None:
    from mypy import api

    path = tmp_path / "caller.py"
    path.write_text(SNIPPET)
    out, err, status = api.run([
        "--config-file", str(REPO / "pyproject.toml"), "--cache-dir", str(REPO / ".mypy_cache"),
        "--no-error-summary", str(path),
    ])  # fmt: skip
    errors = [line.split(": ", 1)[1] for line in out.splitlines() if ": error: " in line]
    lines = sorted(int(line.split(":")[1]) for line in out.splitlines() if ": error: " in line)
    assert status == 1, out + err
    assert lines == [7, 8], out  # the first call, spelled right, is clean
    assert any('Unexpected keyword argument "nmae"' in e for e in errors), out
    assert any('"budget"' in e and "float | None" in e for e in errors), out


def test_an_unknown_option_is_refused_with_the_one_meant() -> None:
    from torch import nn

    import nnwatch

    with pytest.raises(TypeError, match=r"unexpected keyword argument 'nmae' \(did you mean 'name'\?\)"):
        nnwatch.watch(nn.Linear(2, 2), nmae="run")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="its options are num_classes, name,"):
        nnwatch.watch(nn.Linear(2, 2), zzz=1)  # type: ignore[call-arg]


def test_the_snippet_is_what_the_lines_say() -> None:
    lines = textwrap.dedent(SNIPPET).splitlines()
    assert "nmae" in lines[6] and '"high"' in lines[7]
