"""A second real user on this machine, for the tests of what another user can do to nnwatch.

Made once with ``useradd`` (no home, no shell) and acted as through ``setpriv``; tests that need
one skip, saying why, where that cannot be done (not root, no util-linux).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

OTHER = "nnwatch-other"


def other_user() -> tuple[int, int]:
    """(uid, gid) of the second user, made on first use; a skip with the reason otherwise."""
    if os.geteuid() != 0:
        pytest.skip("needs root: creates a second user")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is not installed")
    import pwd

    try:
        pw = pwd.getpwnam(OTHER)
    except KeyError:
        if shutil.which("useradd") is None:
            pytest.skip("useradd is not installed")
        made = subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER],
                              capture_output=True, text=True)  # fmt: skip
        if made.returncode not in (0, 9):  # 9: made meanwhile
            pytest.skip(f"useradd failed: {made.stderr.strip()}")
        pw = pwd.getpwnam(OTHER)
    return pw.pw_uid, pw.pw_gid


def as_other_argv(*cmd: str) -> list[str]:
    """``cmd`` run as the second user (for a shell line or a Popen)."""
    uid, gid = other_user()
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *cmd]


def as_other(*cmd: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` as the second user (``stdin`` fed to it); it must succeed."""
    return subprocess.run(as_other_argv(*cmd), input=stdin, check=True, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
