"""A synthetic distributed job: N ranks of one torchrun-like job in one process, without torch.

Each rank writes a real run (ring, run log, registry entry, ``meta.json`` with the job identity
and a simulated host), exactly as a probe would, so a job monitor, the ranks pane and the
benchmark can follow 64 or 1,024 ranks on a 2-core machine. Faults on demand: one rank slower
than the rest (a straggler), one rank whose loss is off by a factor (a data-sharding bug), one
rank that stops stepping. Run it as::

    python -m nnwatch.testing.synthetic_job --ranks 64 --hosts 8 --rate 10 --seconds 30

It prints one JSON line when every rank is ready (``run_dirs``) and one at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from nnwatch.channel.endpoint import RunEndpoint
from nnwatch.store.paths import default_root, ensure_private_dir
from nnwatch.store.runlog import RunLogWriter
from nnwatch.testing.synthetic import make_meta


def main(argv: list[str] | None = None) -> int:
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
    args = p.parse_args(argv)

    world, per_host = args.ranks, max(1, -(-args.ranks // max(1, args.hosts)))
    root = ensure_private_dir(default_root())
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_id = f"{args.name}-{os.getpid()}"
    ranks = []
    for r in range(world):
        meta = make_meta(args.name, args.layers)
        meta.rank, meta.world_size, meta.local_rank = r, world, r % per_host
        meta.host = f"node{r // per_host:02d}"
        meta.extra = {"job": {"id": f"torchelastic:{run_id}", "source": "torchelastic",
                              "master": "node00:29500", "restart": 0, "world_size": world,
                              "group_rank": str(r // per_host)}}  # fmt: skip
        run_dir = ensure_private_dir(root / f"{args.name}-{stamp}-{os.getpid()}-r{r}")
        log = RunLogWriter(run_dir, meta)
        end = RunEndpoint(meta, run_dir, serve=False)
        log.keep_within(end.slots)
        record = np.zeros(1, meta.schema.record_dtype())
        ranks.append((r, run_dir, log, end, record))
    print(json.dumps({"ready": True, "run_dirs": [str(x[1]) for x in ranks], "pid": os.getpid()}),
          flush=True)  # fmt: skip

    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    period = 1.0 / args.rate if args.rate > 0 else 0.0
    next_at = [t0] * world
    last = [t0] * world
    steps = [0] * world
    status = "finished"
    try:
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
                record["step"], record["time"] = step, time.time()
                record["step_time"] = now - last[r] if step else np.nan
                record["loss"], record["grad_norm"] = loss, 1.0 + 0.05 * rng.random()
                record["rss"] = 2.0e8
                record["layer_stats"], record["layer_sums"] = 0.0, 1.0
                view = record.view(np.uint8).data
                end.publish(view)
                log.put(bytes(view))
                last[r] = now
                steps[r] += 1
            wake = min(next_at) - time.perf_counter()
            time.sleep(min(max(wake, 0.001), 0.05))
    except KeyboardInterrupt:
        status = "interrupted"
    finally:
        for r, _run_dir, log, end, _record in ranks:
            log.close(status, steps[r])
            end.close(status)
    print(json.dumps({"done": True, "steps": steps}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
