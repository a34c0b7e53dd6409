"""A real terminal for end-to-end tests: one private tmux server running one command.

The command's exit status goes to a file the shell writes, because tmux 3.3a can mark a pane
dead before it has reaped the process and then has no status to give.
"""

from __future__ import annotations

import shlex
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil


class Terminal:
    def __init__(
        self,
        command: str,
        env: dict[str, str],
        *,
        size: tuple[int, int] = (160, 48),
        status_file: Path | None = None,
    ) -> None:
        self.socket = f"nnwatch-term-{uuid.uuid4().hex[:8]}"
        self.status_file = status_file or Path(tempfile.mkdtemp(prefix="nnw-tmux-")) / "status"
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        script = f"{command}; echo $? > {shlex.quote(str(self.status_file))}"
        # env -i: pytest exports COLUMNS/LINES, which would win over the window's real size
        self.tmux(
            "new-session", "-d", "-s", "t", "-x", str(size[0]), "-y", str(size[1]),
            f"env -i {exports} sh -c {shlex.quote(script)}",
        )  # fmt: skip

    def tmux(self, *args: str) -> str:
        out = subprocess.run(
            ["tmux", "-L", self.socket, "-f", "/dev/null", *args],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if out.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "t")

    def wait_for(
        self, what: str | Callable[[str], bool], label: str | None = None, timeout: float = 60.0
    ) -> str:
        check = what if callable(what) else (lambda s: what in s)
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if check(screen):
                return screen
            time.sleep(0.2)
        raise AssertionError(
            f"waited {timeout:.0f} s for {label or repr(what)}; the screen shows:\n{screen}"
        )

    def keys(self, *keys: str) -> None:
        for k in keys:
            self.tmux("send-keys", "-t", "t", k)
            # a bare Escape must not run into the next key, or the pair reads as alt+key
            time.sleep(0.6 if k == "Escape" else 0.15)

    def exit_status(self, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.status_file.read_text().strip() if self.status_file.exists() else ""
            if text:
                return int(text)  # 128+N when signal N ended it
            time.sleep(0.2)
        ps = subprocess.run(["ps", "-ef"], capture_output=True, text=True).stdout
        left = "\n".join(line for line in ps.splitlines() if "nnwatch" in line)
        raise AssertionError(f"the command did not exit:\n{self.screen()}\n{left}")

    def command_pid(self) -> int:
        """The pid of the command (the shell's only child in the pane)."""
        shell = int(self.tmux("display-message", "-p", "-t", "t", "#{pane_pid}").strip())
        children = psutil.Process(shell).children()
        assert len(children) == 1, children
        return children[0].pid

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)
