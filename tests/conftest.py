"""Shared fixtures: every test gets its own run root, so nothing leaks into /dev/shm."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from .small_disk import tmpfs  # noqa: F401 - a fixture for every test that needs a full disk

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
#: The environment as the session started. Libraries run in-process by some tests (Lightning,
#: the Hugging Face Trainer) export variables such as MASTER_PORT or LOCAL_RANK; left in place,
#: they would steer later subprocesses (a torchrun job) and rank detection.
_SESSION_ENV = dict(os.environ)

# A suite started in the background (``make test &``, ``nohup``) inherits SIGINT (and with nohup
# SIGHUP) ignored, and an ignored signal stays ignored in every child: the trainers and monitors
# whose Ctrl-C and hang-up the tests send would never get them, and those tests would time out.
# The tests set the dispositions a terminal gives, for themselves and so for their children.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def clean_environ() -> object:
    yield
    for key in set(os.environ) - set(_SESSION_ENV):
        # pytest manages its own; pytest-textual-snapshot's report folder is set at session start
        if not key.startswith(("PYTEST_", "TEXTUAL_SNAPSHOT_")):
            del os.environ[key]
    for key, value in _SESSION_ENV.items():
        # a pytest started by a test inherits its parent's snapshot folder: restoring that name
        # would make the child's session end delete the parent's folder
        if os.environ.get(key) != value and not key.startswith("TEXTUAL_SNAPSHOT_"):
            os.environ[key] = value


@pytest.fixture(autouse=True)
def run_root(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path_factory.mktemp("nnw")
    monkeypatch.setenv("NNWATCH_RUN_DIR", str(root))
    return root


@pytest.fixture
def subprocess_env(run_root: Path) -> dict[str, str]:
    """Environment for trainer subprocesses: same run root, one thread, unbuffered output."""
    env = dict(_SESSION_ENV)
    env.update(
        NNWATCH_RUN_DIR=str(run_root),
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    return env


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# -- every process a test starts ends with it ------------------------------------------------------
# The suite makes itself a child subreaper: a process a test started and lost track of (a trainer
# left as pid 1 of a PID namespace when ``unshare`` was stopped, a daemon that double-forked) is
# then re-parented to pytest, not to init, and the session's end finds it. Each one still running
# there fails the run, named with the test that left it, and is killed (a user's CI would keep it).

_STARTED_BY: dict[int, str] = {}  # pid -> the test after which it was first seen
_PR_SET_CHILD_SUBREAPER = 36


def _descendants() -> list[psutil.Process]:
    """Every live process below this one (zombies reaped: they are the subreaper's to reap)."""
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                try:
                    os.waitpid(proc.pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                continue
            out.append(proc)
        except psutil.Error:
            continue
    return out


def pytest_sessionstart(session: pytest.Session) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: leftovers re-parent to init, unseen here
        pass


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield
    for proc in _descendants():
        _STARTED_BY.setdefault(proc.pid, item.nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    deadline = time.monotonic() + 10.0  # what is on its way out gets the time to go
    left = _descendants()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _descendants()
    if not left:
        return
    lines = []
    for proc in left:
        try:
            cmd = " ".join(proc.cmdline())[:200]
        except psutil.Error:
            cmd = "?"
        lines.append(f"  pid {proc.pid} ({_STARTED_BY.get(proc.pid, 'unknown test')}): {cmd}")
        try:
            proc.kill()
        except psutil.Error:
            pass
    sys.stderr.write(
        "\nthe tests left processes running (killed now):\n" + "\n".join(lines) + "\n"
    )
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
