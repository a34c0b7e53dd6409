"""Channel benchmark: what a monitor costs the trainer, and how fast it sees each step.

1. Publish cost per step (``RingWriter.publish``) for 16, 128 and 1,024 layers: median and p99
   in microseconds. Target: median <= 5 us at 128 layers.
2. End-to-end latency from ``w.step()`` (the record's ``time`` field) to a reader holding the
   record, at 1,000 steps/s: a local ring reader, and a remote-style subscriber whose records come
   through the command socket's stream process. Measured twice: with the synthetic trainer
   (128-layer records) and with a real ``nnwatch.watch`` loop on a small MLP paced to 1,000
   steps/s. Target: p95 <= 50 ms.
3. Trainer step-time ratio with no reader, a live reader and a frozen reader (SIGSTOP'd ring
   reader plus a SIGSTOP'd stream subscriber), measured in one training process that runs the
   phases in turn (none, live, frozen, none, ...), so that process-to-process noise cancels.
   The trainer is a real ``nnwatch.watch`` torch MLP loop when torch is installed. Target: frozen
   reader ratio <= 1.01.

    python bench/channel.py [--quick] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from nnwatch.channel.client import ChannelClient  # noqa: E402
from nnwatch.store.ring import RingWriter  # noqa: E402
from nnwatch.testing.synthetic import make_meta  # noqa: E402


def _env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        NNWATCH_RUN_DIR=str(root), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )  # fmt: skip
    return env


# -- 1. publish cost ------------------------------------------------------------------------------
def _noop() -> None:
    pass


def publish_cost(layers: int, n: int, where: Path, cold_n: int = 400) -> dict[str, float]:
    """Hot: publishes back to back. Cold: after 32 MB of array work between publishes, as in a
    CPU training step; the cost of a no-op Python call measured the same way is the baseline
    that any Python code pays after such work on this machine."""
    meta = make_meta("bench", layers)
    w = RingWriter(where / f"ring-{layers}", meta.schema.record_size, meta_json=meta.to_json())
    rec = np.zeros(1, meta.schema.record_dtype())
    view = memoryview(rec.view(np.uint8))
    times = np.empty(n, np.int64)
    clock = time.perf_counter_ns
    for i in range(n):
        rec["step"] = i  # the probe rewrites the record every step; so does this loop
        t = clock()
        w.publish(view)
        times[i] = clock() - t
    junk = np.zeros(4_000_000)
    cold = np.empty(cold_n, np.int64)
    noop = np.empty(cold_n, np.int64)
    for i in range(cold_n):
        junk += 1.0
        rec["step"] = n + i
        t = clock()
        w.publish(view)
        cold[i] = clock() - t
        junk += 1.0
        t = clock()
        _noop()
        noop[i] = clock() - t
    w.close()
    us = times[n // 10 :] / 1000.0  # skip warm-up
    return {
        "layers": layers,
        "record_bytes": meta.schema.record_size,
        "slots": w.slots,
        "median_us": float(np.median(us)),
        "p99_us": float(np.percentile(us, 99)),
        "cold_median_us": float(np.median(cold) / 1000.0),
        "cold_noop_median_us": float(np.median(noop) / 1000.0),
    }


# -- 2. latency -------------------------------------------------------------------------------------
_LATENCY_READER = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    from nnwatch.store.ring_reader import RingReader
    r = RingReader(sys.argv[1], start="latest")
    lat = []
    end = time.time() + float(sys.argv[2])
    while time.time() < end:
        if r.wait(0.2, poll=0.002):
            recs = r.read()
            now = time.time()
            lat.extend((now - recs["time"]).tolist())
    print(json.dumps({"latencies": lat, "dropped": r.dropped, "torn": r.torn}))
    """
)

_LATENCY_SUBSCRIBER = textwrap.dedent(
    """
    import json, sys, time
    from nnwatch.channel.client import Subscription
    s = Subscription(sys.argv[1], history=False, start="latest", max_hz=50.0)
    lat = []
    end = time.time() + float(sys.argv[2])
    while time.time() < end:
        for m in s.poll(0.2):
            if m.get("type") == "records" and len(m["rows"]):
                now = time.time()
                lat.extend((now - m["rows"]["time"]).tolist())
    print(json.dumps({"latencies": lat}))
    """
)


_PACED_PROBE_TRAINER = textwrap.dedent(
    """
    import time
    import torch
    from torch import nn
    import nnwatch
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    with nnwatch.watch(model, opt, name="latency-probe") as w:
        print("run_dir", w.run_dir, flush=True)
        next_t = time.perf_counter()
        while not w.should_stop:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            w.step(loss)
            next_t += 0.001  # 1,000 steps/s
            delay = next_t - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
    """
)


def _registered(run_dir: Path, timeout: float = 60.0) -> object:
    from nnwatch.store.registry import list_runs

    deadline = time.time() + timeout
    while time.time() < deadline:
        info = next((r for r in list_runs() if r.run_dir == str(run_dir) and r.socket), None)
        if info is not None:
            return info
        time.sleep(0.05)
    raise RuntimeError(f"the trainer in {run_dir} never registered")


def latency(root: Path, seconds: float, *, probe: bool) -> dict[str, dict[str, float]]:
    """Latency with the synthetic writer (128 layers), or with a real ``nnwatch.watch`` loop."""
    env = _env(root)
    if probe:
        trainer = subprocess.Popen(
            [sys.executable, "-c", _PACED_PROBE_TRAINER], stdout=subprocess.PIPE, text=True, env=env
        )
        assert trainer.stdout is not None
        found = _registered(Path(trainer.stdout.readline().split()[-1]))
        info = {"ring": found.ring, "socket": found.socket}  # type: ignore[attr-defined]
    else:
        trainer = subprocess.Popen(
            [sys.executable, "-m", "nnwatch.testing.synthetic", "--steps", "0", "--rate", "1000",
             "--layers", "128", "--name", "latency"],
            stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        assert trainer.stdout is not None
        info = json.loads(trainer.stdout.readline())
    time.sleep(1.0)
    out: dict[str, dict[str, float]] = {}
    try:
        for label, script, target in (
            ("ring reader (local)", _LATENCY_READER, info["ring"]),
            ("stream subscriber (socket)", _LATENCY_SUBSCRIBER, info["socket"]),
        ):
            res = subprocess.run(
                [sys.executable, "-c", script, target, str(seconds)],
                capture_output=True, text=True, env=env, check=True,
            )  # fmt: skip
            lat = np.array(json.loads(res.stdout)["latencies"]) * 1000.0
            out[label] = {
                "records": int(len(lat)),
                "steps_per_s": len(lat) / seconds,
                "p50_ms": float(np.percentile(lat, 50)),
                "p95_ms": float(np.percentile(lat, 95)),
            }
    finally:
        try:
            with ChannelClient(info["socket"]) as c:
                c.command("stop")
        except Exception:  # noqa: BLE001
            pass
        try:
            trainer.wait(timeout=20)
        except subprocess.TimeoutExpired:
            trainer.kill()
    return out


# -- 3. step-time ratio -----------------------------------------------------------------------------
_TORCH_TRAINER = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import torch
    from torch import nn
    import nnwatch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    y = torch.randint(0, 10, (64,))
    ends, durs, cpus = [], [], []
    with nnwatch.watch(model, opt, num_classes=10, name="ratio") as w:
        i = 0
        while not w.should_stop:
            t = time.perf_counter()
            c = time.thread_time()
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            w.step(loss)
            ends.append(time.time())
            durs.append(time.perf_counter() - t)
            cpus.append(time.thread_time() - c)
            if i == 0:
                print("run_dir", w.run_dir, flush=True)
            i += 1
    np.save(sys.argv[1], np.array([ends, durs, cpus]))
    """
)

_LIVE_READER = textwrap.dedent(
    """
    import sys, time
    from nnwatch.sources.live import LiveSource
    s = LiveSource(sys.argv[1])
    print("attached", flush=True)
    while True:
        s.poll()
        time.sleep(0.02)
    """
)

_SUBSCRIBER = textwrap.dedent(
    """
    import sys, time
    from nnwatch.sources.live import ConnectedSource
    s = ConnectedSource(sys.argv[1])
    print("attached", flush=True)
    while True:
        s.poll()
        time.sleep(0.05)
    """
)


#: With two or more CPUs the trainer gets CPU 0 and monitors CPU 1, as on a real host where a
#: monitor never shares the training core; this also keeps other load on the machine out of it.
TRAINER_CPU, MONITOR_CPU = 0, 1


def _pin(pid: int, cpu: int) -> None:
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 1:
        try:
            os.sched_setaffinity(pid, {cpu})
        except OSError:
            pass


def _spawn(script: str, arg: str, env: dict[str, str]) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-c", script, arg], stdout=subprocess.PIPE, text=True, env=env
    )
    _pin(p.pid, MONITOR_CPU)
    assert p.stdout is not None
    p.stdout.readline()
    return p


def _children(pid: int) -> list[int]:
    try:
        import psutil

        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except Exception:  # noqa: BLE001
        return []


class _Phase:
    """Start and stop the monitors of one phase kind."""

    def __init__(
        self, kind: str, run_dir: Path, socket_path: str, trainer_pid: int, env: dict
    ) -> None:
        self.kind, self.run_dir, self.socket, self.trainer_pid, self.env = (
            kind, run_dir, socket_path, trainer_pid, env,
        )  # fmt: skip
        self.procs: list[subprocess.Popen[str]] = []

    def start(self) -> None:
        if self.kind == "none":
            return
        if self.kind == "live":
            self.procs = [_spawn(_LIVE_READER, str(self.run_dir), self.env)]
        elif self.kind == "live-remote":
            self.procs = [_spawn(_SUBSCRIBER, self.socket, self.env)]
        elif self.kind == "frozen":
            self.procs = [
                _spawn(_LIVE_READER, str(self.run_dir), self.env),
                _spawn(_SUBSCRIBER, self.socket, self.env),
            ]
        # stream processes are the trainer's children and inherit its CPU: move them to the
        # monitors' CPU, as the scheduler would on a host with idle cores
        for child in _children(self.trainer_pid):
            _pin(child, MONITOR_CPU)
        if self.kind == "frozen":
            for p in self.procs:
                os.kill(p.pid, signal.SIGSTOP)
        time.sleep(0.5)  # settle: first reads, and the stream filling a frozen socket

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        self.procs = []


def step_time_ratio(root: Path, phase_s: float, rounds: int) -> dict[str, object]:
    env = _env(root)
    times_file = root / "times.npy"
    try:
        import torch  # noqa: F401
    except ImportError:
        return {"trainer": "-", "error": "torch is not installed; the step-time ratio needs it"}
    kind = "torch MLP 256-512-512-10, batch 64, 1 thread, nnwatch.watch"
    cmd = [sys.executable, "-c", _TORCH_TRAINER, str(times_file)]
    trainer = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    _pin(trainer.pid, TRAINER_CPU)
    assert trainer.stdout is not None
    run_dir = Path(trainer.stdout.readline().split()[-1])
    info: Any = _registered(run_dir)
    time.sleep(2.0)  # warm-up
    kinds = ("live", "live-remote", "frozen")
    phases: list[tuple[str, float, float]] = []
    for _ in range(rounds):
        for k in kinds:  # none, k, none, k, ...: each phase has a baseline on both sides
            for name in ("none", k):
                phase = _Phase(name, run_dir, info.socket, trainer.pid, env)
                phase.start()
                t0 = time.time()
                time.sleep(phase_s)
                phases.append((name, t0, time.time()))
                phase.stop()
    t0 = time.time()
    time.sleep(phase_s)
    phases.append(("none", t0, time.time()))
    with ChannelClient(info.socket) as c:
        c.command("stop")
    trainer.wait(timeout=60)
    if not times_file.exists():
        return {"trainer": kind, "error": "the trainer wrote no step times"}
    ends, walls, cpus = np.load(times_file)
    result: dict[str, object] = {"trainer": kind, "steps": int(len(walls))}
    for metric, values in (("wall", walls), ("cpu", cpus)):
        meds = []
        for name, a, b in phases:
            sel = values[(ends >= a) & (ends < b)]
            meds.append((name, float(np.median(sel)) if len(sel) else float("nan")))
        base = [m for n, m in meds if n == "none"]
        result[f"step_ms_none_{metric}"] = float(np.nanmedian(base)) * 1000
        for k in kinds:
            ratios = [
                m / ((meds[i - 1][1] + meds[i + 1][1]) / 2)
                for i, (n, m) in enumerate(meds)
                if n == k and 0 < i < len(meds) - 1
            ]
            q1, q3 = np.nanpercentile(ratios, [25, 75])
            result[f"ratio_{k}_{metric}"] = float(np.nanmedian(ratios))
            result[f"ratio_{k}_{metric}_iqr"] = [float(q1), float(q3)]
    return result


class _Replier:
    """A trainer that answers each command and never holds a pause: the endpoint's target."""

    holding = False
    step = 0

    def apply_pending(self, commands: list[Any]) -> None:
        for cmd in commands:
            cmd.reply(self.step)


def trainer_side_cost(root: Path, steps: int, rounds: int = 3) -> dict[str, dict[str, float]]:
    """The channel work the training thread does per step (publish, then the step boundary's
    command check), measured in this process while monitors are absent, live, or frozen. Unlike
    whole-step times, this is not drowned by other load on the machine."""
    from nnwatch.channel.endpoint import RunEndpoint
    from nnwatch.store.paths import ensure_private_dir

    env = _env(root)
    meta = make_meta("cost", 128)
    run_dir = ensure_private_dir(root / f"cost-{os.getpid()}")
    (run_dir / "meta.json").write_text(meta.to_json())
    end = RunEndpoint(meta, run_dir)
    assert end.socket_path is not None
    rec = np.zeros(1, meta.schema.record_dtype())
    view = memoryview(rec.view(np.uint8))
    clock = time.perf_counter_ns
    out: dict[str, dict[str, float]] = {}
    n = 0
    target = _Replier()
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    _pin(0, TRAINER_CPU)  # this process plays the trainer
    try:
        samples: dict[str, list[np.ndarray]] = {"none": [], "live": [], "frozen": []}
        for _ in range(rounds):  # interleaved, so that drifting machine load hits all alike
            for kind in ("none", "live", "none", "frozen"):
                procs: list[subprocess.Popen[str]] = []
                if kind != "none":
                    procs = [
                        _spawn(_LIVE_READER, str(run_dir), env),
                        _spawn(_SUBSCRIBER, str(end.socket_path), env),
                    ]
                    for child in _children(os.getpid()):  # stream processes: off our CPU
                        _pin(child, MONITOR_CPU)
                    if kind == "frozen":
                        for p in procs:
                            os.kill(p.pid, signal.SIGSTOP)
                    time.sleep(0.5)
                times = np.empty(steps, np.int64)
                for i in range(steps):
                    rec["step"] = n
                    rec["time"] = time.time()
                    target.step = n
                    t = clock()
                    end.ring.publish(view)
                    end.at_step_boundary(target)  # the probe's own call at each step's end
                    times[i] = clock() - t
                    n += 1
                    time.sleep(0.0005)  # ~1,000-2,000 steps/s
                for p in procs:
                    p.kill()
                    p.wait()
                samples[kind].append(times / 1000.0)
        for kind, parts in samples.items():
            us = np.concatenate(parts)
            out[kind] = {
                "median_us": float(np.median(us)),
                "p99_us": float(np.percentile(us, 99)),
            }
    finally:
        end.close()
        if cpus:
            os.sched_setaffinity(0, cpus)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="shorter runs (noisier numbers)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    shm = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else None
    root = Path(tempfile.mkdtemp(prefix="nnw-bench-", dir=shm))
    os.chmod(root, 0o700)
    os.environ["NNWATCH_RUN_DIR"] = str(root)
    results: dict[str, object] = {}
    n = 20_000 if args.quick else 100_000
    print("## Publish cost per step (RingWriter.publish)\n")
    print(
        "| layers | record bytes | slots | median us | p99 us | cold median us | cold no-op call us |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    costs = []
    for layers in (16, 128, 1024):
        c = publish_cost(layers, n, root)
        costs.append(c)
        print(
            f"| {layers} | {c['record_bytes']} | {c['slots']} | {c['median_us']:.2f} "
            f"| {c['p99_us']:.2f} | {c['cold_median_us']:.1f} | {c['cold_noop_median_us']:.1f} |"
        )
    results["publish"] = costs

    print("\n## End-to-end latency, w.step() to a reader holding the record, at 1,000 steps/s\n")
    print("| trainer | reader | records | steps/s seen | p50 ms | p95 ms |")
    print("|---|---|---:|---:|---:|---:|")
    latencies: dict[str, dict[str, dict[str, float]]] = {}
    for probe, name in ((False, "synthetic, 128 layers"), (True, "nnwatch.watch, 3-layer MLP")):
        lat = latency(root, 3.0 if args.quick else 8.0, probe=probe)
        latencies[name] = lat
        for label, row in lat.items():
            print(
                f"| {name} | {label} | {row['records']} | {row['steps_per_s']:.0f} "
                f"| {row['p50_ms']:.2f} | {row['p95_ms']:.2f} |"
            )
    results["latency"] = latencies

    print(
        "\n## Trainer step-time ratio (median step time / median of the no-reader phases around it)\n"
    )
    ratio = step_time_ratio(root, 1.0, 3 if args.quick else 10)
    results["step_time"] = ratio
    if "error" in ratio:
        print(ratio["error"])
    else:
        print(
            f"trainer: {ratio['trainer']}; {ratio['steps']} steps; with no reader "
            f"{ratio['step_ms_none_wall']:.3f} ms/step wall, {ratio['step_ms_none_cpu']:.3f} ms CPU\n"
        )
        print("| readers | wall-time ratio (IQR) | CPU-time ratio (IQR) |")
        print("|---|---:|---:|")
        print("| none | 1.000 | 1.000 |")
        rows = (
            ("live", "live local reader (LiveSource polling at 50 Hz)"),
            ("live-remote", "live subscriber (socket stream, 20 Hz)"),
            ("frozen", "frozen (SIGSTOP'd local reader + SIGSTOP'd subscriber)"),
        )
        for key, label in rows:
            cells = []
            for metric in ("wall", "cpu"):
                lo, hi = ratio[f"ratio_{key}_{metric}_iqr"]
                cells.append(f"{ratio[f'ratio_{key}_{metric}']:.3f} ({lo:.3f}-{hi:.3f})")
            print(f"| {label} | {cells[0]} | {cells[1]} |")
    print("\n## Trainer-side channel work per step (publish + the step boundary's command check, 128 layers), by monitors\n")
    side = trainer_side_cost(root, 2000 if args.quick else 5000)
    results["trainer_side"] = side
    print("| monitors | median us | p99 us |")
    print("|---|---:|---:|")
    labels = {
        "none": "none",
        "live": "live local reader (50 Hz) + live subscriber",
        "frozen": "same two, SIGSTOP'd",
    }
    for kind, row in side.items():
        print(f"| {labels[kind]} | {row['median_us']:.2f} | {row['p99_us']:.2f} |")
    med128 = next(c["median_us"] for c in costs if c["layers"] == 128)
    p95 = max(v["ring reader (local)"]["p95_ms"] for v in latencies.values())
    print("\n## Targets\n")
    print(
        f"- publish median at 128 layers <= 5 us: {med128:.2f} us -> {'ok' if med128 <= 5 else 'MISSED'}"
    )
    print(
        f"- latency p95 <= 50 ms (local reader): {p95:.2f} ms -> {'ok' if p95 <= 50 else 'MISSED'}"
    )
    if "ratio_frozen_wall" in ratio:
        fr = float(ratio["ratio_frozen_wall"])
        lo, hi = ratio["ratio_frozen_wall_iqr"]  # type: ignore[misc]
        verdict = "ok" if fr <= 1.01 else "MISSED"
        if lo <= 1.01 <= hi or lo <= 1.0 <= hi:
            verdict += " (within this machine's noise: IQR spans 1.0)"
        print(
            f"- frozen-reader step-time ratio <= 1.01: {fr:.3f} (IQR {lo:.3f}-{hi:.3f}) -> {verdict}"
        )
    extra = side["frozen"]["median_us"] - side["none"]["median_us"]
    print(
        f"- channel work per step with frozen monitors vs none: {extra:+.2f} us "
        f"({side['frozen']['median_us']:.2f} vs {side['none']['median_us']:.2f} us)"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
