"""Shared fixtures: every test gets its own run root, so nothing leaks into /dev/shm."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


@pytest.fixture(autouse=True)
def run_root(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path_factory.mktemp("nnw")
    monkeypatch.setenv("NNWATCH_RUN_DIR", str(root))
    return root


@pytest.fixture
def subprocess_env(run_root: Path) -> dict[str, str]:
    """Environment for trainer subprocesses: same run root, one thread, unbuffered output."""
    env = dict(os.environ)
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
