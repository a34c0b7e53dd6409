"""What one terminal for a whole job costs: the job summary on the trainer, the monitor on 64 ranks.

Part 1 (CPU, gloo): a tiny DDP model trains on W ranks (2, 8, 64 processes on this machine) with
``job_summary_every`` off and N, alternating in rounds so machine noise hits both alike. Reported
per world size: the median step with the summary off and on, their ratio, and the time the
training thread spends launching the summary (fill one row, launch one async all-reduce), per
launch and amortized per step. The beat thread's store traffic runs beside training, not in it.

Part 2: a synthetic 64-rank job on 8 simulated hosts (``nnwatch.testing.synthetic_job``, each rank
a real ring + run log at 10 steps/s) followed by a ``JobMonitor`` polling once a second, as the
ranks pane does: its CPU time over wall time, in percent of one core; and the same for reading
rank 0's ``job.json`` (the job-summary route) with 64 rows.

    python bench/job.py [--worlds 2 8 64] [--steps 30] [--rounds 4] [--every 10] [--monitor-s 20]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _worker(rank: int, world: int, port: int, args: Any, queue: Any) -> None:
    os.environ["NNWATCH_RUN_DIR"] = args.run_dir
    import torch
    import torch.distributed as dist
    from torch import nn

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    import nnwatch
    from nnwatch.probe.job_summary import JobSummary

    launches: list[float] = []
    original = JobSummary.launch

    def timed(self: Any, *a: Any) -> None:
        t = time.perf_counter()
        original(self, *a)
        launches.append(time.perf_counter() - t)

    JobSummary.launch = timed  # type: ignore[method-assign]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    out: dict[str, list[float]] = {"off": [], "on": [], "launch": []}
    for _ in range(args.rounds):
        for mode in ("off", "on"):
            every = args.every if mode == "on" else 0
            times: list[float] = []
            launches.clear()
            with nnwatch.watch(model, opt, name=f"bench-{mode}", channel=False, detectors=False,
                               consistency_every=0, job_summary_every=every) as w:  # fmt: skip
                for _ in range(args.steps):
                    t = time.perf_counter()
                    opt.zero_grad()
                    loss = nn.functional.cross_entropy(ddp(x), y)
                    loss.backward()
                    opt.step()
                    w.step(loss)
                    times.append(time.perf_counter() - t)
            out[mode] += times[3:]
            if mode == "on":
                out["launch"] += launches
    if rank == 0:
        queue.put(out)
    dist.destroy_process_group()


def summary_part(args: argparse.Namespace) -> None:
    import torch.multiprocessing as mp

    print(f"Job summary cost (CPU, gloo, tiny DDP model, 1 thread a rank; every {args.every} "
          f"steps; {args.rounds} rounds x {args.steps} steps per setting, interleaved)")  # fmt: skip
    print(f"{'ranks':>6} {'step off':>10} {'step on':>10} {'on/off':>7} {'launch':>9} "
          f"{'per step':>9} {'share':>7}")  # fmt: skip
    ctx = mp.get_context("spawn")
    for world in args.worlds:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        queue = ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(r, world, port, args, queue)) for r in range(world)]
        for p in procs:
            p.start()
        res = queue.get(timeout=3600)
        for p in procs:
            p.join()
        off, on = statistics.median(res["off"]), statistics.median(res["on"])
        launch = statistics.median(res["launch"]) if res["launch"] else 0.0
        per_step = launch / args.every
        print(f"{world:>6} {off * 1e3:>8.2f}ms {on * 1e3:>8.2f}ms {on / off:>7.3f} "
              f"{launch * 1e6:>7.0f}us {per_step * 1e6:>7.1f}us {100 * per_step / off:>6.3f}%",
              flush=True)  # fmt: skip


def monitor_part(args: argparse.Namespace) -> None:
    env = {**os.environ, "NNWATCH_RUN_DIR": args.run_dir, "PYTHONPATH": str(REPO)}
    job = subprocess.Popen(
        [sys.executable, "-m", "nnwatch.testing.synthetic_job", "--ranks", "64", "--hosts", "8",
         "--rate", "10", "--seconds", "0", "--straggler", "5"],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert job.stdout is not None
        ready = json.loads(job.stdout.readline())
        time.sleep(3)
        from nnwatch.sources.job_monitor import JobMonitor
        from nnwatch.sources.job_table import view_from_summary
        from nnwatch.store.jobs import group_jobs, run_info_from_dir

        os.environ["NNWATCH_RUN_DIR"] = args.run_dir
        found = group_jobs([run_info_from_dir(d) for d in ready["run_dirs"]])
        monitor = JobMonitor(found[0])
        monitor.poll()  # the first poll reads every rank's history
        cpu, wall = time.process_time(), time.perf_counter()
        polls = 0
        while time.perf_counter() - wall < args.monitor_s:
            view = monitor.poll()
            polls += 1
            time.sleep(max(0.0, polls - (time.perf_counter() - wall)))
        share = (time.process_time() - cpu) / (time.perf_counter() - wall)
        monitor.close()
        print(f"\nMonitor following 64 ranks on 8 simulated hosts at 10 steps/s each, 1 poll/s, "
              f"{polls} polls: {100 * share:.1f}% of one core (target: at most 15%)")  # fmt: skip
        print(f"  findings: {'; '.join(f.kind for f in view.findings) or 'none'}")
        doc = _summary_doc(view)
        cpu = time.process_time()
        n = 200
        for _ in range(n):
            view_from_summary(json.loads(json.dumps(doc)), found[0])
        print(f"  reading rank 0's job.json (64 rows) and building the view: "
              f"{(time.process_time() - cpu) / n * 1e3:.2f} ms a poll")  # fmt: skip
    finally:
        job.terminate()
        job.wait(timeout=60)


def _summary_doc(view: Any) -> dict[str, Any]:
    now = time.time()
    return {"written": now, "world_size": len(view.rows), "silent_after": 1.0, "ranks": [
        {"rank": r.rank, "host": r.host, "pid": r.pid, "beat_step": r.step, "beat_at": now,
         "step_seen_at": now, "ended": None, "step": r.step, "loss": r.loss,
         "grad_norm": r.grad_norm, "step_time": r.step_time, "nonfinite": 0,
         "first_nonfinite": -1, "memory": r.memory, "time": now} for r in view.rows]}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, nargs="*", default=[2, 8, 64])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--monitor-s", type=float, default=20.0)
    ap.add_argument("--only", choices=("summary", "monitor"), default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nnw-bench-job-") as tmp:
        args.run_dir = tmp
        if args.only in (None, "summary") and args.worlds:
            summary_part(args)
        if args.only in (None, "monitor"):
            monitor_part(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
