"""A synthetic distributed job: N ranks of one torchrun-like job in one process, without torch.

Each rank writes a real run (ring, run log, registry entry, ``meta.json`` with the job identity
and a simulated host), exactly as a probe would, so a job monitor, the ranks pane and the
benchmark can follow 64 or 1,024 ranks on a 2-core machine. Faults on demand: one rank slower
than the rest (a straggler), one rank whose loss is off by a factor (a data-sharding bug), one
rank that stops stepping. Run it as::

    python -m nnwatch.testing.synthetic_job --ranks 64 --hosts 8 --rate 10 --seconds 30

It prints one JSON line when every rank is ready (``run_dirs``) and one at the end.

``--processes`` makes every rank a process of its own, each serving its command socket as a
trainer does (so ``nnwatch stacks`` and the job view can ask all of them at once; ``bench/stacks.py``
measures that on 64 ranks); ``--stuck-after S`` then blocks every rank's main thread after S
seconds in a call that releases the GIL, as a rank waiting in a collective does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from nnwatch.channel.endpoint import RunEndpoint
from nnwatch.store.paths import default_root, ensure_private_dir
from nnwatch.store.runlog import RunLogWriter
from nnwatch.store.schema import FieldName
from nnwatch.testing.synthetic import make_meta


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.one_rank >= 0:
        return _one_rank(args)
    if args.processes:
        return _processes(args, argv or sys.argv[1:])

    ranks = _open_ranks(args)
    print(json.dumps({"ready": True, "run_dirs": [str(x[1]) for x in ranks], "pid": os.getpid()}),
          flush=True)  # fmt: skip

    steps = [0] * args.ranks
    status = "finished"
    try:
        _step_ranks(args, ranks, steps)
    except KeyboardInterrupt:
        status = "interrupted"
    finally:
        for r, _run_dir, log, end, _record in ranks:
            log.close(status, steps[r])
            end.close(status)
    print(json.dumps({"done": True, "steps": steps}), flush=True)
    return 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line: the job's shape, its pace, and the faults asked for."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--name", default="simjob")
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--hosts", type=int, default=8, help="simulated nodes (ranks split evenly)")
    p.add_argument("--rate", type=float, default=10.0, help="steps per second per rank")
    p.add_argument("--seconds", type=float, default=30.0, help="0: until killed")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--straggler", type=int, default=-1, help="this rank steps at half the rate")
    p.add_argument("--loss-rank", type=int, default=-1, help="this rank's loss is off ...")
    p.add_argument("--loss-factor", type=float, default=5.0, help="... by this factor")
    p.add_argument("--stop-rank", type=int, default=-1, help="this rank stops stepping ...")
    p.add_argument("--stop-after", type=float, default=5.0, help="... after this many seconds")
    p.add_argument("--processes", action="store_true", help="one process per rank, each serving")
    p.add_argument("--stuck-after", type=float, default=-1.0,
                   help="with --processes: every rank blocks (GIL released) after this long")  # fmt: skip
    p.add_argument("--one-rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--run-id", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


_Rank = tuple[int, Path, RunLogWriter, RunEndpoint, np.ndarray]


def _open_ranks(args: argparse.Namespace) -> list[_Rank]:
    """Every rank's run in this process: its directory, run log and (not serving) endpoint, and
    the record it publishes."""
    world = args.ranks
    root = ensure_private_dir(default_root())
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_id = f"{args.name}-{os.getpid()}"
    ranks = []
    for r in range(world):
        meta = _meta_for(args, r, run_id)
        run_dir = ensure_private_dir(root / f"{args.name}-{stamp}-{os.getpid()}-r{r}")
        log = RunLogWriter(run_dir, meta)
        end = RunEndpoint(meta, run_dir, serve=False)
        log.keep_within(end.ring.slots)
        record = np.zeros(1, meta.schema.record_dtype())
        ranks.append((r, run_dir, log, end, record))
    return ranks


def _step_ranks(args: argparse.Namespace, ranks: list[_Rank], steps: list[int]) -> None:
    """Step every rank at its pace for ``--seconds`` (counting in ``steps``), with the
    straggler, the rank whose loss is off and the rank that stops, as asked."""
    world = args.ranks
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    period = 1.0 / args.rate if args.rate > 0 else 0.0
    next_at = [t0] * world
    last = [t0] * world
    while args.seconds <= 0 or time.perf_counter() - t0 < args.seconds:
        now = time.perf_counter()
        for r, _run_dir, log, end, record in ranks:
            if now < next_at[r]:
                continue
            if r == args.stop_rank and now - t0 > args.stop_after:
                continue  # stopped stepping; its heartbeat thread goes on
            slow = 2.0 if r == args.straggler else 1.0
            next_at[r] = max(next_at[r] + period * slow, now)
            step = steps[r]
            loss = 2.0 / (1 + 0.01 * step) + 0.02 * rng.random()
            if r == args.loss_rank:
                loss *= args.loss_factor
            record[FieldName.STEP], record[FieldName.TIME] = step, time.time()
            record[FieldName.STEP_TIME] = now - last[r] if step else np.nan
            record[FieldName.LOSS], record[FieldName.GRAD_NORM] = loss, 1.0 + 0.05 * rng.random()
            record[FieldName.RSS] = 2.0e8
            record[FieldName.LAYER_STATS], record[FieldName.LAYER_SUMS] = 0.0, 1.0
            view = record.view(np.uint8).data
            end.ring.publish(view)
            log.put(bytes(view))
            last[r] = now
            steps[r] += 1
        wake = min(next_at) - time.perf_counter()
        time.sleep(min(max(wake, 0.001), 0.05))


def _meta_for(args: argparse.Namespace, rank: int, run_id: str) -> Any:
    world, per_host = args.ranks, max(1, -(-args.ranks // max(1, args.hosts)))
    meta = make_meta(args.name, args.layers)
    meta.rank, meta.world_size, meta.local_rank = rank, world, rank % per_host
    meta.host = f"node{rank // per_host:02d}"
    meta.extra = {"job": {"id": f"torchelastic:{run_id}", "source": "torchelastic",
                          "master": "node00:29500", "restart": 0, "world_size": world,
                          "group_rank": str(rank // per_host)}}  # fmt: skip
    return meta


def _processes(args: argparse.Namespace, argv: list[str]) -> int:
    """Every rank a process of its own (``--one-rank R``); ready once all of them are."""
    import signal
    import subprocess

    from nnwatch.sources.ssh_child import spawn_tied  # each rank dies with this process

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    run_id = f"{args.name}-{os.getpid()}"
    from nnwatch.store.child_python import CHILD_CWD, child_env, python_argv

    kids = [spawn_tied(python_argv("nnwatch.testing.synthetic_job", *argv, "--one-rank", str(r),
                                   "--run-id", run_id),
                       stdout=subprocess.PIPE, text=True, env=child_env(),
                       cwd=CHILD_CWD) for r in range(args.ranks)]  # fmt: skip
    ready = []
    for kid in kids:
        assert kid.stdout is not None
        line = kid.stdout.readline()
        if not line:
            for k in kids:
                k.kill()
            print(json.dumps({"ready": False}), flush=True)
            return 1
        ready.append(json.loads(line))
    print(json.dumps({"ready": True, "run_dirs": [x["run_dir"] for x in ready],
                      "pids": [x["pid"] for x in ready], "pid": os.getpid()}), flush=True)  # fmt: skip
    try:
        deadline = time.monotonic() + args.seconds if args.seconds > 0 else None
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.2)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        for kid in kids:
            kid.terminate()
        for kid in kids:
            kid.wait(timeout=30)
    return 0


def wait_in_a_collective(seconds: float) -> None:
    """Stands in for a collective whose peer never comes: blocked in C, the GIL released."""
    time.sleep(seconds)


def _one_rank(args: argparse.Namespace) -> int:
    """One rank of ``--processes``: a run with its ring, log, registry entry and socket."""
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    rank = args.one_rank
    meta = _meta_for(args, rank, args.run_id)
    root = ensure_private_dir(default_root())
    run_dir = ensure_private_dir(root / f"{args.name}-{os.getpid()}-r{rank}")
    log = RunLogWriter(run_dir, meta)
    end = RunEndpoint(meta, run_dir)
    log.keep_within(end.ring.slots)
    record = np.zeros(1, meta.schema.record_dtype())
    print(json.dumps({"run_dir": str(run_dir), "pid": os.getpid()}), flush=True)
    t0, step = time.monotonic(), 0
    try:
        while True:
            if 0 <= args.stuck_after < time.monotonic() - t0:
                wait_in_a_collective(3600.0)
            record[FieldName.STEP], record[FieldName.TIME] = step, time.time()
            record[FieldName.LOSS], record[FieldName.GRAD_NORM], record[FieldName.STEP_TIME] = 1.0, 1.0, 1.0 / args.rate
            view = record.view(np.uint8).data
            end.ring.publish(view)
            log.put(bytes(view))
            step += 1
            time.sleep(1.0 / max(args.rate, 0.1))
    finally:
        log.close("interrupted", step)
        end.close("stopped")


if __name__ == "__main__":
    sys.exit(main())
