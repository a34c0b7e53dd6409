"""Stacks of a stuck job: how long every rank's Python stacks take to come back.

A synthetic job of N rank processes (64 by default; ``nnwatch.testing.synthetic_job
--processes``), each serving its command socket as a trainer does, all stuck after a few seconds
in a call that releases the GIL (as ranks waiting in a collective are). Then, several times,
every rank is asked at once, as the job view and ``nnwatch stacks`` do (``job_stacks.gather``),
and ``nnwatch stacks JOB`` is run as a command (its process start and imports included). The
issue's target: stacks from 64 ranks within 2 s of asking.

    python bench/stacks.py [--ranks 64] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from nnwatch.cli.stacks import local_targets  # noqa: E402
from nnwatch.sources.job_stacks import gather  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="nnw-stacks-", dir="/tmp"))
    os.chmod(root, 0o700)
    env = {**os.environ, "NNWATCH_RUN_DIR": str(root), "PYTHONPATH": str(REPO),
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    os.environ["NNWATCH_RUN_DIR"] = str(root)
    t0 = time.monotonic()
    job = subprocess.Popen(
        [sys.executable, "-m", "nnwatch.testing.synthetic_job", "--processes", "--ranks",
         str(args.ranks), "--hosts", "8", "--rate", "10", "--seconds", "0", "--stuck-after", "3",
         "--name", "stuckjob"],
        env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert job.stdout is not None
        ready = json.loads(job.stdout.readline() or "{}")
        if not ready.get("ready"):
            print("the synthetic job did not start", file=sys.stderr)
            return 1
        print(f"{args.ranks} rank processes ready in {time.monotonic() - t0:.1f} s")
        time.sleep(5)  # every rank is stuck now
        label, targets = local_targets("stuckjob")
        assert len(targets) == args.ranks, (label, len(targets))
        gathers, answered = [], []
        for _ in range(args.rounds):
            t = time.monotonic()
            got = gather(targets)
            gathers.append(time.monotonic() - t)
            answered.append(sum(1 for s in got if not s.error))
            where = {s.threads[0]["frames"][-1][2] for s in got if s.threads}
        commands = []
        for _ in range(args.rounds):
            t = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "nnwatch", "stacks", "stuckjob"], env=env,
                                  capture_output=True, text=True, timeout=120)  # fmt: skip
            commands.append(time.monotonic() - t)
            assert done.returncode == 0, done.stderr
    finally:
        job.terminate()
        job.wait(timeout=120)
    result = {
        "ranks": args.ranks, "cpus": os.cpu_count(),
        "gather_s": {"median": statistics.median(gathers), "max": max(gathers)},
        "answered": min(answered),
        "command_s": {"median": statistics.median(commands), "max": max(commands)},
        "innermost": sorted(where),
    }
    print(f"gather (the job view's ask): median {result['gather_s']['median']:.3f} s, "
          f"max {result['gather_s']['max']:.3f} s; {result['answered']}/{args.ranks} answered")
    print(f"`nnwatch stacks stuckjob` (a new process): median {result['command_s']['median']:.2f} s, "
          f"max {result['command_s']['max']:.2f} s")
    print(f"each main thread waits in: {', '.join(result['innermost'])}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
