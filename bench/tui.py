"""Benchmark of the monitor (the Textual dashboard), run as users run it: in a real terminal.

Measures, against the targets of the TUI issue:

1. CPU use of ``nnwatch attach`` (percent of one core) while it follows a run stepping at
   1,000 steps/s, at the default fps. The run is the channel's synthetic trainer (real ring, run
   log, socket, registry; no torch), so the number is the monitor's alone. Target: <= 15%.
2. Time for ``nnwatch open`` to show a finished 10-million-step run in full (the header reaches
   the last step), from process start, with the run's files cold (dropped from the page cache
   with posix_fadvise) and warm. Target: <= 3 s.
3. Peak resident memory (VmHWM) of the monitor on that run. Target: <= 300 MB.

Both monitors run under a pseudo-terminal of 160x48 whose output is read and discarded, so
rendering and terminal output are included. Usage::

    python bench/tui.py                       # everything (writes a 10M-step run once, ~1.7 GB)
    python bench/tui.py --steps 1000000 --seconds 10   # quicker
    python bench/tui.py --keep /var/tmp/nnw-bench      # reuse the generated run next time

The machine's load average is printed too: other work on the machine inflates wall times.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

COLS, ROWS = 160, 48


class Terminal:
    """A child process on a pseudo-terminal; its screen output is drained and searched."""

    def __init__(self, argv: list[str], env: dict[str, str], watch: tuple[str, ...] = ()) -> None:
        self.started = time.perf_counter()
        pid, fd = pty.fork()
        if pid == 0:  # child
            os.execvpe(argv[0], argv, env)
        self.pid, self.fd = pid, fd
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
        self.buffer = bytearray()
        self.bytes = 0
        self._lock = threading.Lock()
        self._found: dict[bytes, float] = {}
        self._watch: list[bytes] = [w.encode() for w in watch]
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            now = time.perf_counter()
            with self._lock:
                self.bytes += len(chunk)
                self.buffer += chunk
                del self.buffer[:-200_000]
                for marker in self._watch:
                    if marker not in self._found and marker in self.buffer:
                        self._found[marker] = now

    def wait_for(self, marker: str, timeout: float) -> float | None:
        """Seconds from start until ``marker`` was drawn, or None."""
        m = marker.encode()
        with self._lock:
            self._watch.append(m)
            if m in self.buffer:
                self._found.setdefault(m, time.perf_counter())
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            with self._lock:
                if m in self._found:
                    return self._found[m] - self.started
            time.sleep(0.01)
        return None

    def press(self, key: str) -> None:
        os.write(self.fd, key.encode())

    def wait_exit(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        return None


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def monitor_env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        NNWATCH_RUN_DIR=str(root),
        TERM="xterm-256color",
        COLUMNS=str(COLS),
        LINES=str(ROWS),
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    env.pop("NO_COLOR", None)
    return env


def bench_follow(seconds: float, rate: float, layers: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="nnw-bench-follow-"))
    env = monitor_env(root)
    trainer = subprocess.Popen(
        [sys.executable, "-m", "nnwatch.testing.synthetic", "--steps", "0", "--rate", str(rate),
         "--layers", str(layers), "--name", "bench-follow"],
        env=env, stdout=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        assert trainer.stdout is not None
        ready = json.loads(trainer.stdout.readline())
        run_dir = Path(ready["run_dir"])
        term = Terminal([sys.executable, "-m", "nnwatch", "attach", str(run_dir)], env)
        if term.wait_for("LIVE", 60) is None:
            raise RuntimeError("the monitor never showed the run as live")
        time.sleep(3.0)  # past start-up and the history load
        proc = psutil.Process(term.pid)
        scalar_size = _scalar_size(run_dir)
        rows0 = _rows(run_dir, scalar_size)
        c0, t0 = proc.cpu_times(), time.perf_counter()
        out0 = term.bytes
        time.sleep(seconds)
        c1, t1 = proc.cpu_times(), time.perf_counter()
        rows1 = _rows(run_dir, scalar_size)
        out1 = term.bytes
        cpu = (c1.user + c1.system - c0.user - c0.system) / (t1 - t0) * 100.0
        rss = proc.memory_info().rss
        term.press("q")
        code = term.wait_exit(15)
        return {
            "follow_cpu_percent": round(cpu, 1),
            "follow_steps_per_s": round((rows1 - rows0) / (t1 - t0), 1),
            "follow_terminal_kB_per_s": round((out1 - out0) / (t1 - t0) / 1024, 1),
            "follow_rss_MB": round(rss / 1e6, 1),
            "follow_exit_code": float(code if code is not None else -1),
        }
    finally:
        trainer.kill()
        trainer.wait()


def _scalar_size(run_dir: Path) -> int:
    from nnwatch.store.schema import RunMeta

    return RunMeta.from_json((run_dir / "meta.json").read_text()).schema.scalar_size


def _rows(run_dir: Path, scalar_size: int) -> int:
    try:
        return max(0, ((run_dir / "scalars.bin").stat().st_size - 64) // scalar_size)
    except OSError:
        return 0


def make_big_run(path: Path, steps: int) -> float:
    """Write a finished fixture run of ``steps`` steps (bulk); returns the seconds it took."""
    from nnwatch.testing.fixture import FixtureSource, write_run

    done = path / "end.json"
    if done.exists() and json.loads(done.read_text()).get("steps") == steps:
        return 0.0
    if path.exists():
        import shutil

        shutil.rmtree(path)
    t = time.perf_counter()
    write_run(FixtureSource(steps, layer_every=10), path, bulk=True)
    return time.perf_counter() - t


def drop_cache(run_dir: Path) -> None:
    for f in run_dir.iterdir():
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)  # dirty pages cannot be dropped
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def bench_open(run_dir: Path, steps: int, cold: bool) -> dict[str, float]:
    if cold:
        drop_cache(run_dir)
    env = monitor_env(run_dir.parent)
    last = f"{steps - 1:,}"
    term = Terminal(
        [sys.executable, "-m", "nnwatch", "open", str(run_dir)], env, watch=("nnwatch", last)
    )
    opened = term.wait_for(last, 120)
    first_paint = term.wait_for("nnwatch", 1)
    time.sleep(1.5)
    peak = peak_rss(term.pid)
    term.press("q")
    code = term.wait_exit(15)
    tag = "cold" if cold else "warm"
    return {
        f"open_{tag}_s": round(opened, 2) if opened is not None else -1.0,
        f"open_{tag}_first_paint_s": round(first_paint, 2) if first_paint is not None else -1.0,
        f"open_{tag}_peak_rss_MB": round(peak / 1e6, 1),
        f"open_{tag}_exit_code": float(code if code is not None else -1),
    }


def bench_baseline() -> dict[str, float]:
    """Start-up alone: the same command on a 3,000-step run."""
    from nnwatch.testing.fixture import FixtureSource, write_run

    tmp = Path(tempfile.mkdtemp(prefix="nnw-bench-small-"))
    run_dir = write_run(FixtureSource(3000), tmp / "small")
    env = monitor_env(tmp)
    term = Terminal([sys.executable, "-m", "nnwatch", "open", str(run_dir)], env)
    t = term.wait_for("2,999", 60)
    time.sleep(1.0)
    peak = peak_rss(term.pid)
    term.press("q")
    term.wait_exit(15)
    return {"open_small_s": round(t or -1.0, 2), "open_small_peak_rss_MB": round(peak / 1e6, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=20.0, help="follow measurement window")
    ap.add_argument("--rate", type=float, default=1000.0, help="steps/s of the followed run")
    ap.add_argument("--layers", type=int, default=32, help="layers of the followed run")
    ap.add_argument("--steps", type=int, default=10_000_000, help="steps of the run to open")
    ap.add_argument("--keep", type=Path, default=None, help="directory to keep the big run in")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--skip-follow", action="store_true")
    ap.add_argument("--skip-open", action="store_true")
    args = ap.parse_args()

    results: dict[str, float] = {"cpus": float(os.cpu_count() or 1)}
    results["load_avg_1m_before"] = round(os.getloadavg()[0], 2)
    if not args.skip_follow:
        results.update(bench_follow(args.seconds, args.rate, args.layers))
    if not args.skip_open:
        results.update(bench_baseline())
        base = args.keep or Path(tempfile.gettempdir()) / "nnw-bench-open"
        base.mkdir(parents=True, exist_ok=True)
        run_dir = base / f"run-{args.steps}"
        results["generate_run_s"] = round(make_big_run(run_dir, args.steps), 1)
        results["run_files_MB"] = round(sum(f.stat().st_size for f in run_dir.iterdir()) / 1e6, 1)
        results.update(bench_open(run_dir, args.steps, cold=True))
        results.update(bench_open(run_dir, args.steps, cold=False))
    results["load_avg_1m_after"] = round(os.getloadavg()[0], 2)

    targets = {
        "follow_cpu_percent": 15.0,
        "open_cold_s": 3.0,
        "open_warm_s": 3.0,
        "open_cold_peak_rss_MB": 300.0,
        "open_warm_peak_rss_MB": 300.0,
    }
    width = max(map(len, results))
    for key, value in results.items():
        target = targets.get(key)
        mark = ""
        if target is not None:
            mark = f"  (target <= {target:g}: {'ok' if 0 <= value <= target else 'MISSED'})"
        print(f"{key:<{width}}  {value:g}{mark}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
