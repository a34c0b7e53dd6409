"""Shared fixtures: every test gets its own run root, so nothing leaks into /dev/shm."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

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
        if not key.startswith("PYTEST_"):  # pytest manages its own
            del os.environ[key]
    for key, value in _SESSION_ENV.items():
        if os.environ.get(key) != value:
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
