"""The demos' training processes: the scripts in ``demos/`` found and described, and one of them
run under supervision (its own process group, waited for until it registers, stopped with the
``stop`` command, then SIGTERM, then SIGKILL, and its files removed unless they are worth keeping).

The supervisor behind ``nnwatch demo`` (:mod:`nnwatch.cli.demo`), a source of runs like the others
in this package; it never imports torch (the trainer does, in its own process).
"""

from __future__ import annotations

import ast
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nnwatch.store.child_python import CHILD_CWD, child_env, isolation_flags

if TYPE_CHECKING:
    from nnwatch.store.registry import RunInfo

#: The demos, in the order a new user should try them (``--list`` prints them in this order).
ORDER = ("exploding", "dead_relu", "nan_log", "vanishing", "amp_collapse", "healthy")
REGISTER_TIMEOUT = 120.0  # importing torch on a busy machine can take a while
STOP_GRACE = 5.0  # seconds the trainer gets to finish its step after `stop`, and after SIGTERM
POLL = 0.1


class DemoError(RuntimeError):
    """Something the user can act on; ``run`` prints it in plain words."""


@dataclass(frozen=True)
class Demo:
    name: str
    path: Path
    summary: str  # the first line of the script's docstring, without the "name: " prefix
    story: str  # the docstring's "What you see" paragraph


def demos_dir() -> Path:
    """The demo scripts: ``nnwatch/demos`` links to the repository's ``demos/`` (a copy in a wheel)."""
    return Path(__file__).resolve().parent.parent / "demos"


def find_demos() -> dict[str, Demo]:
    """Every demo script, described from its docstring (read with ``ast``: torch is not imported)."""
    found: dict[str, Demo] = {}
    folder = demos_dir()
    if not folder.is_dir():
        return found
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("_"):
            continue
        try:
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        except (OSError, SyntaxError, ValueError):
            continue
        first, _, rest = doc.partition("\n")
        summary = first.partition(": ")[2] or first
        story = next((p for p in rest.split("\n\n") if p.strip().startswith("What you see")), "")
        found[path.stem] = Demo(path.stem, path.resolve(), summary.strip(), " ".join(story.split()))
    return found


def ordered(demos: dict[str, Demo]) -> list[Demo]:
    return sorted(
        demos.values(),
        key=lambda d: (ORDER.index(d.name) if d.name in ORDER else len(ORDER), d.name),
    )


# ----------------------------------------------------------------------------------------------
# the trainer subprocess
class Trainer:
    """The demo's training process: started in its own process group, always cleaned up."""

    def __init__(self, demo: Demo, steps: int | None, delay: float, seed: int) -> None:
        self.demo = demo
        self.scratch = Path(tempfile.mkdtemp(prefix="nnwatch-demo-"))
        self.output_path = self.scratch / "output.txt"
        argv = [sys.executable, *isolation_flags(), str(demo.path), "--delay", str(delay),
                "--seed", str(seed)]  # fmt: skip
        if steps is not None:
            argv += ["--steps", str(steps)]
        env = dict(child_env(), PYTHONUNBUFFERED="1")  # nothing imported from the cwd (see there)
        env.setdefault("OMP_NUM_THREADS", "1")
        try:
            with open(self.output_path, "wb") as out:
                self.proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=CHILD_CWD,
                    start_new_session=True,  # its own process group: Ctrl-C is ours to handle
                )
        except OSError as exc:
            shutil.rmtree(self.scratch, ignore_errors=True)
            raise DemoError(f"cannot start {demo.path}: {exc.strerror or exc}") from None
        self.info: RunInfo | None = None  # the registry entry, once the trainer has registered
        #: keep the run when it wrote a snapshot (the monitor: the user may want to inspect it)
        self.keep_snapshots = False

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def output_tail(self, lines: int = 15) -> str:
        try:
            text = self.output_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def wait_registered(self, timeout: float = REGISTER_TIMEOUT) -> RunInfo:
        """The trainer's registry entry (written at its first step); raises if it dies first."""
        from nnwatch.store.identity import this_host
        from nnwatch.store.registry import list_runs, recorded_runs

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            runs = [r for r in list_runs() if r.pid == self.proc.pid and r.host == this_host()]
            if runs:
                self.info = runs[0]
                return self.info
            if not self.alive:
                # a short run can register, train and unregister between two polls: its run
                # directory is still there
                done = [r for r in recorded_runs() if r.pid == self.proc.pid and r.host == this_host()]
                if done and self.proc.returncode == 0:
                    self.info = done[0]
                    return self.info
                raise DemoError(
                    f"the {self.demo.name} demo exited (status {self.proc.returncode}) before its "
                    f"first step. Its output:\n{self.output_tail()}"
                )
            time.sleep(POLL)
        raise DemoError(
            f"the {self.demo.name} demo did not start training within {timeout:.0f} s "
            f"(pid {self.proc.pid}). Its output so far:\n{self.output_tail()}"
        )

    def stop(self) -> None:
        """Stop the trainer: the ``stop`` command first (it ends its loop cleanly), then signals."""
        if not self.alive:
            return
        if self.info is not None and self.info.socket:
            from nnwatch.channel.client import ChannelClient, ChannelError
            from nnwatch.channel.commands import STOP

            try:
                with ChannelClient(self.info.socket, timeout=STOP_GRACE) as client:
                    client.command(STOP)
            except (ChannelError, OSError):
                pass
            if self._wait(STOP_GRACE):
                return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            if self._wait(STOP_GRACE):
                return

    def _wait(self, seconds: float) -> bool:
        try:
            self.proc.wait(seconds)
            return True
        except subprocess.TimeoutExpired:
            return False

    def finish(self, keep: bool) -> str | None:
        """Stop the trainer and remove its files; the run directory that remains (``keep``), if any."""
        self.stop()
        return self.remove_run(keep)

    def snapshots(self) -> list[Path]:
        """The snapshots this run wrote, oldest first (none before it registered)."""
        if self.info is None:
            return []
        root = Path(self.info.run_dir) / "snapshots"
        try:
            found = [d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")]
        except OSError:
            return []
        return sorted(found, key=lambda d: d.stat().st_mtime)

    def remove_run(self, keep: bool) -> str | None:
        """Remove the run's files (unless ``keep``); return the run directory that remains, if any."""
        from nnwatch.store.registry_entry import unregister

        info = self.info
        shutil.rmtree(self.scratch, ignore_errors=True)
        if info is None:
            return None
        if keep or (self.keep_snapshots and self.snapshots()):
            return info.run_dir
        if info.entry_path:  # gone already after a clean stop; not after a kill
            unregister(Path(info.entry_path))
        if info.socket:
            try:
                os.unlink(info.socket)
            except OSError:
                pass
        if self._made(Path(info.run_dir)):
            shutil.rmtree(info.run_dir, ignore_errors=True)
        return None

    def _made(self, run_dir: Path) -> bool:
        """Whether ``run_dir`` is the run this trainer wrote: only that one is ever deleted."""
        from nnwatch.store.schema import RunMeta

        try:
            return RunMeta.from_json((run_dir / "meta.json").read_text()).pid == self.proc.pid
        except (OSError, ValueError, KeyError, TypeError):
            return False
