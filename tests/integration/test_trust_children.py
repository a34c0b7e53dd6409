"""Issue 43, item 1: no process nnwatch starts imports from the working directory.

``python -m`` puts the current directory first on ``sys.path``, ahead of site-packages and even
the standard library. A second real user plants ``nnwatch/``, ``numpy/`` and ``json/`` packages
in a world-writable sticky directory; a root trainer started from there (its script elsewhere)
must run none of them, in any child: the detectors' process, the stream process of a
subscription, a real torch trainer's detectors. Each planted package leaves a file behind when
it is imported (the way the attack was seen: as root). The browser view's per-tab processes are
checked in ``tests/e2e/test_serve_browser.py``, the installed wheel in
``tests/e2e/test_wheel_without_torch.py``.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from nnwatch.store.child_python import CHILD_CWD, child_env, python_argv
from tests.conftest import REPO
from tests.other_user import as_other

PYTHON = sys.executable
pytestmark = pytest.mark.timeout(240)
PLANTED = ("nnwatch", "numpy", "json", "psutil")


def plant(where: Path, by_other: bool = True) -> None:
    """Packages that shadow what nnwatch imports, each leaving ``PWNED-<name>-<pid>`` when run."""
    for name in PLANTED:
        code = (
            "import os\n"
            f"open(os.path.join({str(where)!r}, 'PWNED-{name}-%d' % os.getpid()), 'w').close()\n"
        )
        if by_other:
            as_other("mkdir", str(where / name))
            as_other("sh", "-c", f"cat > {where / name / '__init__.py'}", stdin=code)
        else:
            (where / name).mkdir()
            (where / name / "__init__.py").write_text(code)


def pwned(where: Path) -> list[str]:
    return sorted(p.name for p in where.iterdir() if p.name.startswith("PWNED"))


@pytest.fixture
def shared() -> Iterator[Path]:
    """A world-writable sticky directory like /shared or /tmp, with the other user's packages."""
    d = Path(tempfile.mkdtemp(prefix="nnw-shared-"))
    os.chmod(d, 0o1777)
    plant(d)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def clean_env(run_root: Path) -> dict[str, str]:
    """The trainer's environment: the project's venv (nnwatch installed editable), no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(NNWATCH_RUN_DIR=str(run_root), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def test_the_detectors_and_stream_processes_import_nothing_from_the_cwd(
    shared: Path, run_root: Path
) -> None:
    """The editable install: both children start, work (a NaN found, records streamed) and run
    nothing planted (before: ``PWNED-json``, ``-nnwatch``, ``-numpy`` from both children)."""
    done = subprocess.run(
        [PYTHON, str(REPO / "tests" / "trainers" / "children_driver.py")], cwd=shared,
        env=clean_env(run_root), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said == {"judge": ["nan_or_inf"], "stream_records": 10}, said
    assert pwned(shared) == []


TRAINER = """
import torch
import nnwatch

torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with nnwatch.watch(model, opt, name="fromshared") as w:
    for step in range(60):
        opt.zero_grad()
        x = torch.randn(4, 8)
        loss = model(x).pow(2).mean() * (float("nan") if step == 50 else 1.0)
        loss.backward()
        opt.step()
        w.step(loss, batch=(x,))
print("findings", sorted({f.kind for f in w.findings}), flush=True)
"""


def test_a_root_trainer_started_from_a_shared_directory_runs_none_of_its_code(
    shared: Path, run_root: Path, tmp_path: Path
) -> None:
    """The report's repro: a root trainer in a fast loop, started from the shared directory, with
    its detectors in their own process; they still find the NaN."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAINER))
    env = dict(clean_env(run_root), NNWATCH_DETECTORS="process")
    done = subprocess.run([PYTHON, str(script)], cwd=shared, env=env, capture_output=True,
                          text=True, timeout=200)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "ended (exit code" not in done.stderr, done.stderr  # the process did not die early
    assert "nan_or_inf" in done.stdout, done.stdout + done.stderr
    assert pwned(shared) == []


def test_a_child_gets_the_parents_imports_never_the_cwds(tmp_path: Path) -> None:
    """The child's path: this nnwatch first when it is not in site-packages, the parent's
    ``PYTHONPATH`` made absolute, no empty entry (the cwd), the run root absolute."""
    os.chdir(tmp_path)
    env = child_env({"PYTHONPATH": f":rel{os.pathsep}/abs{os.pathsep}", "NNWATCH_RUN_DIR": "runs"})
    entries = env["PYTHONPATH"].split(os.pathsep)
    assert entries == [str(REPO), str(tmp_path / "rel"), "/abs"], entries
    assert env["NNWATCH_RUN_DIR"] == str(tmp_path / "runs")
    argv = python_argv("nnwatch", "ls")
    assert argv[0] == sys.executable and argv[-3:] == ["-m", "nnwatch", "ls"]
    probe = subprocess.run(
        [*argv[:-3], "-c", "import sys, nnwatch; print(sys.path[0] in ('/', '') or sys.flags.safe_path)"],
        cwd=CHILD_CWD, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert probe.stdout.strip() == "True", probe.stderr


def test_every_python_nnwatch_starts_goes_through_child_python() -> None:
    """The class, not the instance: ``sys.executable`` appears in nnwatch's code only where a
    child is started isolated (``child_python``) or where it is data or a message."""
    allowed = {
        "nnwatch/store/child_python.py",  # the one place that builds a child's command line
        "nnwatch/store/registry_entry.py", "nnwatch/probe/run_files.py",  # data: the trainer's Python
        "nnwatch/__init__.py", "nnwatch/cli/__init__.py",  # "this Python (...) has no torch"
        "nnwatch/sources/demo_trainer.py",  # a demo script by path, with isolation_flags()
        "nnwatch/diagnosis/judge_link.py",  # "no interpreter to run": a check, not a command
    }  # fmt: skip
    found = set()
    for path in sorted((REPO / "nnwatch").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "executable":
                if isinstance(node.value, ast.Name) and node.value.id == "sys":
                    found.add(str(path.relative_to(REPO)))
    assert found <= allowed, sorted(found - allowed)
    demo = (REPO / "nnwatch/sources/demo_trainer.py").read_text()
    assert "isolation_flags()" in demo and "cwd=CHILD_CWD" in demo
