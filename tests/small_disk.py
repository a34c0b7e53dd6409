"""A real, small, full disk for the tests that need one: a 4 MiB tmpfs and a way to fill it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = os.geteuid() == 0


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MiB tmpfs, like a small /dev/shm in a container (root only; skipped otherwise)."""
    if not ROOT:
        pytest.skip("needs root to mount a tmpfs")
    mnt = tmp_path / "shm"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(path: Path) -> None:
    """Fill the file system that holds ``path`` to the last byte."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (65536, 4096, 1):
            try:
                while os.write(fd, b"\1" * size):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)
