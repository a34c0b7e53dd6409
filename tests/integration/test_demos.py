"""Every demo, run the way CI runs it: ``nnwatch demo NAME --headless`` in a real subprocess.

Each demo must raise the finding it exists to show (and ``healthy`` none at all), through the real
scripts, the real probe and detectors, and the real command-line output a script would parse. The
demos are also the examples users copy, so a static check keeps them on the public API.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import nnwatch
from nnwatch.diagnosis import KINDS
from nnwatch.sources.demo_trainer import ORDER, demos_dir, find_demos

REPO = Path(__file__).resolve().parents[2]
FINDING = re.compile(r"^(?P<kind>[a-z_]+) step=(?P<step>\d+) layer=(?P<layer>\S+) \| (?P<text>.+)$")


def run_demo(
    env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nnwatch", "demo", *args],
        env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO,
    )  # fmt: skip


def findings(stdout: str) -> list[dict[str, str]]:
    """The finding lines; any other line on stdout is a format error."""
    out = []
    for line in stdout.splitlines():
        m = FINDING.match(line)
        assert m, f"stdout line is not a finding line: {line!r}"
        out.append(m.groupdict())
    return out


def assert_nothing_left(root: Path) -> None:
    """No run directory, registry entry or socket of the demo is left under the run root."""
    left = [p for sub in ("runs", "registry", "s") for p in (root / sub).glob("*")]
    assert left == [], f"left behind: {left}"


# (demo, --steps, the finding it must raise, extra check on that finding)
CASES = [
    ("exploding", 150, "exploding_gradients", lambda f: int(f["step"]) < 150),
    ("dead_relu", 150, "dead_relu", lambda f: f["layer"] == "relu2" and "LeakyReLU" in f["text"]),
    ("nan_log", 60, "nan_or_inf", lambda f: f["step"] == "40"),
    ("vanishing", 30, "vanishing_gradients", lambda f: f["layer"] == "0"),
    ("amp_collapse", 40, "amp_scale_collapse", lambda f: "scale fell to" in f["text"]),
]


@pytest.mark.parametrize(("name", "steps", "kind", "check"), CASES, ids=[c[0] for c in CASES])
def test_demo_raises_the_finding_it_exists_to_show(
    name: str, steps: int, kind: str, check, subprocess_env: dict[str, str], run_root: Path
) -> None:
    out = run_demo(subprocess_env, name, "--headless", "--steps", str(steps))
    assert out.returncode == 0, out.stderr
    found = findings(out.stdout)
    mine = [f for f in found if f["kind"] == kind]
    assert mine, f"{name} raised {[f['kind'] for f in found]}, not {kind}:\n{out.stderr}"
    assert check(mine[0]), mine[0]
    assert all(f["kind"] in KINDS for f in found)
    assert f"{name}: {len(found)} finding(s)" in out.stderr
    assert_nothing_left(run_root)


def test_every_demo_is_listed_and_tested() -> None:
    demos = find_demos()
    assert set(demos) == set(ORDER)
    assert {c[0] for c in CASES} | {"healthy"} == set(ORDER)
    assert demos_dir().resolve() == (REPO / "demos").resolve()
    for demo in demos.values():
        assert demo.summary and demo.story.startswith("What you see"), demo.name


#: Documented instance attributes of a Watch (set in __init__, so not visible on the class).
WATCH_ATTRIBUTES = {"findings", "should_stop", "run_dir", "step_index"}


def _public_api_violations(path: Path) -> list[str]:
    """nnwatch used other than through ``import nnwatch``, its ``__all__`` and Watch's public methods."""
    tree = ast.parse(path.read_text())
    bad: list[str] = []
    watch_names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nnwatch"):
            bad.append(f"line {node.lineno}: from {node.module} import ...")
        if isinstance(node, ast.Import):
            bad += [
                f"line {node.lineno}: import {a.name}"
                for a in node.names
                if a.name.startswith("nnwatch.")
            ]
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "nnwatch"
        ):
            if node.attr not in nnwatch.__all__:
                bad.append(f"line {node.lineno}: nnwatch.{node.attr}")
        if isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name):
            call = node.context_expr
            if isinstance(call, ast.Call) and ast.unparse(call.func) == "nnwatch.watch":
                watch_names.add(node.optional_vars.id)
    public = {n for n in dir(nnwatch.Watch) if not n.startswith("_")} | WATCH_ATTRIBUTES
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in watch_names
        ):
            if node.attr not in public:
                bad.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    if not watch_names:
        bad.append("never calls `with nnwatch.watch(...) as w`")
    return bad


@pytest.mark.parametrize("name", ORDER)
def test_demo_uses_only_the_public_api(name: str) -> None:
    path = REPO / "demos" / f"{name}.py"
    assert _public_api_violations(path) == []
    text = path.read_text()
    assert "w.should_stop" in text, "the monitor's stop key must end the loop"
    assert all(f"--{opt}" in text for opt in ("steps", "delay", "seed"))
