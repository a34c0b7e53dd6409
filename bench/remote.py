"""Remote monitoring at scale: what attaching to a long run through its socket costs.

For runs of 100k and 1M steps (10M with ``--big``) from the synthetic trainer (16 layers, the
real ring, run log, command socket and stream process), held paused so the target stays still:
bytes and seconds until the first screen (the first poll that gives the monitor rows, ingested
into the TUI's ``RunState`` as the app does) and until caught up (every step held, the stream
says caught up). Then bytes/s while following a trainer at 1,000 steps/s.

The socket is the run's own (what ``ssh -L`` forwards); ssh adds its own framing and
encryption but not bytes of ours. Targets from the issue: first screen within 2 s and under
2 MB whatever the run length; following under 20 KB/s at 1,000 steps/s.

    python bench/remote.py [--sizes 100000,1000000] [--big] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from nnwatch.channel.client import ChannelClient  # noqa: E402
from nnwatch.sources.live import ConnectedSource  # noqa: E402
from nnwatch.sources.summarised import SummarisedSource  # noqa: E402
from nnwatch.store.overview import OverviewWriter  # noqa: E402
from nnwatch.store.ring_reader import RingReader  # noqa: E402
from nnwatch.tui.model import RunState  # noqa: E402


class Synthetic:
    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nnwatch.testing.synthetic", *args],
            stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        assert self.proc.stdout is not None
        info = json.loads(self.proc.stdout.readline())
        self.ring, self.socket = Path(info["ring"]), Path(info["socket"])

    def published(self) -> int:
        with RingReader(self.ring) as r:
            return r.state().write_seq

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


SOURCES = {"summarised": SummarisedSource, "full": ConnectedSource}


def attach(trainer: Synthetic, steps: int, kind: str) -> dict[str, Any]:
    pause = ChannelClient(trainer.socket)
    assert pause.request("pause").ok
    time.sleep(0.3)
    last = trainer.published() - 1
    t0 = time.perf_counter()
    source = SOURCES[kind](trainer.socket)
    state = RunState(source.meta)
    first: dict[str, float] | None = None
    while True:
        update = source.poll()
        state.ingest(update)
        now = time.perf_counter() - t0
        if first is None and len(update.scalars):
            first = {"s": now, "bytes": source.received}
        if state.history.last_step >= last and update.status.catching_up is None:
            break
        if now > 600:
            raise SystemExit("did not catch up within 10 minutes")
        if not len(update.scalars):
            time.sleep(0.01)
    out = {
        "source": kind, "steps": last + 1, "first_screen_s": first["s"] if first else None,
        "first_screen_bytes": first["bytes"] if first else None,
        "caught_up_s": time.perf_counter() - t0, "caught_up_bytes": source.received,
        "bytes_per_step": source.received / (last + 1),
    }  # fmt: skip
    source.close()
    pause.close()
    return out


def follow(env: dict[str, str], seconds: float, kind: str) -> dict[str, Any]:
    trainer = Synthetic(env, "--steps", "0", "--rate", "1000", "--name", f"follow-{kind}")
    try:
        while trainer.published() < 2000:
            time.sleep(0.05)
        source = SOURCES[kind](trainer.socket)
        state = RunState(source.meta)
        while source.poll().status.catching_up is not None or state.history.rows == 0:
            state.ingest(source.poll())
            time.sleep(0.05)
        b0, s0, t0 = source.received, trainer.published(), time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            state.ingest(source.poll())
            time.sleep(1 / 4)  # the app polls at a few Hz
        dt = time.perf_counter() - t0
        rate = (trainer.published() - s0) / dt
        out = {"source": kind, "steps_per_s": rate, "bytes_per_s": (source.received - b0) / dt,
               "bytes_per_step": (source.received - b0) / dt / rate}  # fmt: skip
        source.close()
        return out
    finally:
        trainer.stop()


def writer_cost(rows: int = 200_000, drain: int = 250, rounds: int = 5) -> dict[str, float]:
    """The summaries' cost per row in the log writer thread, in drains of ``drain`` records (a
    0.25 s drain at 1,000 steps/s), median over rounds; beside it the cost of a bare copy of the
    same records (what the writer already does per drain), as a ratio."""
    from nnwatch.testing.synthetic import make_meta

    schema = make_meta("cost", 16).schema
    rec = np.zeros(rows, schema.record_dtype())
    rec["step"] = np.arange(rows)
    rec["loss"] = np.random.default_rng(0).random(rows)
    ours, copy = [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="nnw-cost-", dir="/tmp") as d:
            w = OverviewWriter(Path(d), schema.scalar_dtype())
            t0 = time.perf_counter()
            for i in range(0, rows, drain):
                w(rec[i : i + drain])
            ours.append((time.perf_counter() - t0) / rows)
        t0 = time.perf_counter()
        for i in range(0, rows, drain):
            rec[i : i + drain].tobytes()
        copy.append((time.perf_counter() - t0) / rows)
    med = float(np.median(ours))
    return {"ns_per_row": med * 1e9, "copy_ns_per_row": float(np.median(copy)) * 1e9,
            "ratio_to_copy": med / float(np.median(copy))}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="100000,1000000")
    p.add_argument("--big", action="store_true", help="add a 10M-step run")
    p.add_argument("--follow-s", type=float, default=5.0)
    p.add_argument("--sources", default="summarised,full",
                   help="summarised (overview mode, what attach uses) and/or full (every row)")
    p.add_argument("--json", default="")
    args = p.parse_args()
    sizes = [int(x) for x in args.sizes.split(",") if x] + ([10_000_000] if args.big else [])
    kinds = [k for k in args.sources.split(",") if k]
    results: dict[str, Any] = {"attach": [], "follow": [], "writer": None}
    c = writer_cost()
    results["writer"] = c
    print(f"summaries in the log writer: {c['ns_per_row']:.0f} ns/row "
          f"({c['ratio_to_copy']:.1f}x a bare copy of the records, {c['copy_ns_per_row']:.0f} ns)",
          flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="nnw-bench-", dir="/tmp") as root:
        env = dict(os.environ, NNWATCH_RUN_DIR=root, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
        for n in sizes:
            trainer = Synthetic(env, "--steps", "0", "--rate", "0", "--name", f"run{n}")
            try:
                while trainer.published() < n:
                    time.sleep(0.05)
                for kind in kinds:  # the same run, one source after the other
                    r = attach(trainer, n, kind)
                    results["attach"].append(r)
                    print(
                        f"{kind:>10} attach at {r['steps']:>10,} steps: first screen "
                        f"{r['first_screen_s']:.2f} s {r['first_screen_bytes'] / 1e6:.2f} MB; "
                        f"caught up {r['caught_up_s']:.2f} s {r['caught_up_bytes'] / 1e6:.2f} MB "
                        f"({r['bytes_per_step']:.2f} B/step)",
                        flush=True,
                    )
            finally:
                trainer.stop()
        for kind in kinds:
            f = follow(env, args.follow_s, kind)
            results["follow"].append(f)
            print(
                f"{kind:>10} following at {f['steps_per_s']:,.0f} steps/s: "
                f"{f['bytes_per_s'] / 1e3:.1f} KB/s ({f['bytes_per_step']:.1f} B/step)",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
