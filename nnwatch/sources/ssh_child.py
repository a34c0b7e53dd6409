"""The user's own ``ssh`` as a child process: how its command line starts, and how it ends."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Sequence
from typing import Any


def ssh_base(ssh: str, ssh_args: Sequence[str]) -> list[str]:
    """The ssh program (it may carry its own words, ``ssh -F cfg``) and the user's arguments."""
    return [*shlex.split(ssh), *ssh_args]


def stop_process(proc: subprocess.Popen[Any] | None) -> None:
    """End an ssh child: terminate, and kill it if it has not gone within 5 s."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
