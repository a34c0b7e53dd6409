"""Flood benchmark: what a same-uid client flooding the command socket costs a training loop.

A real watched training loop (a small torch MLP under ``nnwatch.watch``, CPU, one thread, so
GIL-bound: the command server's thread takes the GIL from it whenever it works) runs in a
subprocess for the whole benchmark. In interleaved rounds the parent measures its steps/s with no
flood and under each kind of flood, each from a separate flooder process:

- ``junk``: 8 connections sending malformed requests (JSON of the wrong shape, non-JSON) as fast
  as the socket takes them, replies drained;
- ``endless``: 8 connections sending one line that never ends;
- ``storm``: connect/disconnect as fast as possible (half of them send a junk line first);
- ``idle``: 300 connections opened and held, reopened as soon as the server closes one;
- ``hello``: 8 connections repeating a valid request the server answers itself, replies drained;
- ``resume``: 8 connections repeating a valid, useless request the training thread applies;
- ``busy``: the control: a process that spins on the flooders' core and never touches the socket,
  so that what a busy neighbour core does to the trainer on this machine is seen apart.

After each flooded window a real monitor connects and sends ``hello`` and ``resume``: the table
says whether both were answered, and how long it took.

It prints, per flood kind, the ratio of the median steps/s under the flood to the median with none
(1.00 = no cost), and the command server thread's CPU time per second of wall time. The trainer
and the flooders are pinned to different cores when there are two or more, so that what is
measured is the server's cost to training, not the flooder's own use of a shared core.

    python bench/flood.py [--rounds 5] [--seconds 2] [--kinds junk,endless] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

KINDS = ("busy", "junk", "endless", "storm", "idle", "hello", "resume")

_TRAINER = textwrap.dedent(
    """
    import sys, threading, time
    import torch
    from torch import nn
    import nnwatch
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))

    def server_cpu():
        for t in threading.enumerate():
            if t.name == "nnwatch-commands" and t.native_id is not None:
                try:
                    return time.clock_gettime(time.pthread_getcpuclockid(t.ident))
                except OSError:
                    return 0.0
        return 0.0

    with nnwatch.watch(model, opt, name="flood-bench") as w:
        print("run_dir", w.run_dir, flush=True)
        step, next_report = 0, 0.0
        while not w.should_stop:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            w.step(loss)
            step += 1
            if step % 16 == 0:
                now = time.monotonic()
                if now >= next_report:
                    next_report = now + 0.05
                    print("P", now, step, server_cpu(), time.process_time(), flush=True)
    """
)


# -- the flooders (run as `flood.py --flooder KIND SOCKET` in their own process) --------------------
JUNK = (
    b'{"cmd": [1, 2, {"x": "' + b"j" * 200 + b'"}]}\n'
    b"this is not json at all\n"
    b'{"cmd": "launch", "args": {"a": 1}}\n'
)


def _connect(path: str) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError:
        s.close()
        return None
    return s


def _drainer(socks: list[socket.socket], lock: threading.Lock) -> None:
    """Read every reply so that the server never cuts a flooder off for not reading."""
    while True:
        with lock:
            live = [s for s in socks if s.fileno() >= 0]
        if not live:
            time.sleep(0.05)
            continue
        sel = selectors.DefaultSelector()
        try:
            for s in live:
                sel.register(s, selectors.EVENT_READ)
            for key, _ in sel.select(0.05):
                key.fileobj.recv(1 << 16)  # type: ignore[union-attr]
        except (OSError, ValueError):
            pass  # a socket closed meanwhile: its sender reconnects
        sel.close()


def _sender(path: str, payload: bytes, socks: list[socket.socket], lock: threading.Lock) -> None:
    while True:
        s = _connect(path)
        if s is None:
            time.sleep(0.01)
            continue
        with lock:
            socks.append(s)
        try:
            while True:
                s.sendall(payload)
        except OSError:
            pass
        with lock:
            socks.remove(s)
        s.close()


def flooder(kind: str, path: str) -> None:
    lock = threading.Lock()
    socks: list[socket.socket] = []
    if kind in ("junk", "endless", "hello", "resume"):
        payload = {
            "junk": JUNK * 64,
            "endless": b"x" * 65536,
            "hello": b'{"cmd": "hello"}\n' * 256,
            "resume": b'{"cmd": "resume"}\n' * 256,
        }[kind]
        for _ in range(8):
            threading.Thread(target=_sender, args=(path, payload, socks, lock), daemon=True).start()
        _drainer(socks, lock)
    elif kind == "busy":
        while True:
            pass
    elif kind == "storm":
        n = 0
        while True:
            s = _connect(path)
            if s is not None:
                if n % 2:
                    try:
                        s.send(JUNK)
                    except OSError:
                        pass
                s.close()
            n += 1
    elif kind == "idle":
        sel = selectors.DefaultSelector()
        while True:
            while len(sel.get_map()) < 300:
                s = _connect(path)
                if s is None:
                    break
                sel.register(s, selectors.EVENT_READ)
            for key, _ in sel.select(0.05):
                sock = key.fileobj
                try:
                    data = sock.recv(4096)  # type: ignore[union-attr]
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(sock)
                    sock.close()  # type: ignore[union-attr]
    else:
        raise SystemExit(f"unknown flood kind {kind!r}")


# -- the parent ------------------------------------------------------------------------------------
class Progress:
    """The trainer's (time, step, server thread CPU s, process CPU s) reports, from its stdout."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.points: list[tuple[float, int, float, float]] = []
        self.lock = threading.Lock()
        assert proc.stdout is not None
        self._out = proc.stdout
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._out:
            parts = line.split()
            if parts and parts[0] == "P":
                with self.lock:
                    self.points.append(
                        (float(parts[1]), int(parts[2]), float(parts[3]), float(parts[4]))
                    )

    def window(self, t0: float, t1: float) -> tuple[float, float, float]:
        """Between the reports nearest t0 and t1: steps per second of wall time, steps per second
        of the trainer process's CPU time, and the server thread's CPU seconds per second."""
        with self.lock:
            pts = [p for p in self.points if t0 <= p[0] <= t1]
        if len(pts) < 2:
            raise RuntimeError("the trainer reported no progress in a window")
        (ta, sa, ca, pa), (tb, sb, cb, pb) = pts[0], pts[-1]
        return (sb - sa) / (tb - ta), (sb - sa) / max(pb - pa, 1e-9), (cb - ca) / (tb - ta)


def _env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        NNWATCH_RUN_DIR=str(root), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )  # fmt: skip
    return env


def _pin(cpus: set[int]) -> Any:
    def apply() -> None:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError:
            pass

    return apply


def _monitor_check(path: str) -> tuple[bool, float]:
    """Whether a real monitor gets hello and a trainer-applied command answered, and how fast."""
    from nnwatch.channel.client import ChannelClient, ChannelError

    t = time.monotonic()
    try:
        with ChannelClient(path, timeout=5.0) as c:
            ok = bool(c.hello().get("name")) and c.request("resume").ok
    except ChannelError:
        ok = False
    return ok, time.monotonic() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0, help="measured window per phase")
    ap.add_argument("--settle", type=float, default=0.5, help="seconds a flood runs unmeasured")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--flooder", nargs=2, metavar=("KIND", "SOCKET"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.flooder:
        flooder(*args.flooder)
        return 0
    kinds = [k for k in args.kinds.split(",") if k]
    for k in kinds:
        if k not in KINDS:
            ap.error(f"unknown kind {k!r}; choose from {', '.join(KINDS)}")
    cpus = sorted(os.sched_getaffinity(0))
    train_cpus, flood_cpus = ({cpus[0]}, set(cpus[1:])) if len(cpus) > 1 else (set(cpus), set(cpus))

    from nnwatch.store.registry import list_runs

    with tempfile.TemporaryDirectory(prefix="nnwatch-flood-") as tmp:
        root = Path(tmp)
        env = _env(root)
        os.environ["NNWATCH_RUN_DIR"] = str(root)  # where list_runs looks
        trainer = subprocess.Popen(
            [sys.executable, "-c", _TRAINER], stdout=subprocess.PIPE, text=True, env=env,
            preexec_fn=_pin(train_cpus),
        )  # fmt: skip
        try:
            assert trainer.stdout is not None
            run_dir = trainer.stdout.readline().split()[-1]
            deadline = time.time() + 60
            sock = None
            while sock is None and time.time() < deadline:
                sock = next(
                    (r.socket for r in list_runs() if r.run_dir == run_dir and r.socket), None
                )
                time.sleep(0.05)
            if sock is None:
                raise RuntimeError("the trainer never registered its socket")
            progress = Progress(trainer)
            time.sleep(2.0)  # warm-up
            rates: dict[str, list[float]] = {k: [] for k in ["none", *kinds]}
            per_cpu: dict[str, list[float]] = {k: [] for k in rates}
            cpu: dict[str, list[float]] = {k: [] for k in rates}
            checks: dict[str, list[tuple[bool, float]]] = {k: [] for k in kinds}
            rng = random.Random(0)
            for r in range(args.rounds):
                order = ["none", *kinds]
                rng.shuffle(order)
                for kind in order:
                    flood = None
                    if kind != "none":
                        flood = subprocess.Popen(
                            [sys.executable, __file__, "--flooder", kind, sock], env=env,
                            preexec_fn=_pin(flood_cpus),
                        )  # fmt: skip
                    time.sleep(args.settle)
                    t0 = time.monotonic()
                    time.sleep(args.seconds)
                    rate, rate_cpu, server = progress.window(t0, time.monotonic())
                    rates[kind].append(rate)
                    per_cpu[kind].append(rate_cpu)
                    cpu[kind].append(server)
                    if flood is not None:
                        checks[kind].append(_monitor_check(sock))
                        flood.kill()
                        flood.wait()
                    time.sleep(0.2)
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        finally:
            trainer.kill()
            trainer.wait()
    base = statistics.median(rates["none"])
    base_cpu = statistics.median(per_cpu["none"])
    print(
        f"no flood: {base:.0f} steps/s, {base_cpu:.0f} steps per CPU second "
        f"(medians of {len(rates['none'])} windows)"
    )
    print(
        f"{'flood':<9} {'steps/s':>8} {'per CPU s':>10} {'server cpu':>11} {'monitor':>9} "
        f"{'answer':>8}"
    )
    none_share = statistics.median(cpu["none"])
    print(f"{'none':<9} {1.0:>8.3f} {1.0:>10.3f} {none_share * 100:>10.2f}%")
    out: dict[str, Any] = {
        "none": {"steps_per_s": base, "steps_per_cpu_s": base_cpu, "server_cpu": none_share}
    }
    for k in kinds:
        ratio = statistics.median(rates[k]) / base
        ratio_cpu = statistics.median(per_cpu[k]) / base_cpu
        served = sum(ok for ok, _ in checks[k])
        answer = statistics.median(t for _, t in checks[k])
        share = statistics.median(cpu[k])
        print(
            f"{k:<9} {ratio:>8.3f} {ratio_cpu:>10.3f} {share * 100:>10.2f}% "
            f"{served:>4}/{len(checks[k]):<4} {answer * 1000:>6.0f}ms"
        )
        out[k] = {"ratio": ratio, "ratio_per_cpu_s": ratio_cpu, "server_cpu": share,
                  "monitor_ok": served, "monitor_tries": len(checks[k]), "monitor_s": answer,
                  "rates": rates[k]}  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
