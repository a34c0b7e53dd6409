"""A stand-in trainer that drives the real channel (ring, run log, socket, registry) without torch.

It exists so that the channel can be tested and benchmarked as a process on its own, with faults
on demand: stop stepping (hung), die by ``kill -9`` (crashed), or step at a fixed rate with a fixed
amount of busy work per step (for step-time ratios). It applies commands the way the probe does:
at a step boundary, replying with the step they apply at. Run it as::

    python -m nnwatch.testing.synthetic --steps 1000 --rate 200 --layers 128

It prints one JSON line when ready (run_dir, ring, socket, entry), and one at the end (steps,
step times) so a parent process can measure it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time

import numpy as np

from nnwatch.channel.commands import PAUSE, RESUME, SET_CLIP, SET_LAYER_INTERVAL, STOP
from nnwatch.channel.endpoint import RunEndpoint
from nnwatch.channel.server import PendingCommand
from nnwatch.store.paths import default_root, ensure_private_dir
from nnwatch.store.schema import FieldName, RunMeta, RunSchema


def make_meta(name: str, layers: int, *, num_lr: int = 1) -> RunMeta:
    names = tuple(f"layer{i}" for i in range(layers))
    schema = RunSchema(names, ("Linear",) * layers, names, num_lr)
    return RunMeta(
        name=name, schema=schema, pid=os.getpid(), host=socket.gethostname(), started=time.time(),
        nnwatch_version="synthetic",
    )  # fmt: skip


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--name", default="synthetic")
    p.add_argument("--steps", type=int, default=1000, help="0: until stopped")
    p.add_argument(
        "--rate", type=float, default=0.0, help="steps per second (0: as fast as possible)"
    )
    p.add_argument("--work-ms", type=float, default=0.0, help="busy CPU work per step")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--slots", type=int, default=0)
    p.add_argument("--hang-after", type=int, default=-1, help="stop stepping after this step")
    p.add_argument("--crash-after", type=int, default=-1, help="SIGKILL itself after this step")
    p.add_argument("--no-log", action="store_true", help="skip the run log (ring only)")
    p.add_argument("--subscribe-mode", default="process")
    p.add_argument("--times-out", default="", help="write per-step times (float64) to this file")
    args = p.parse_args(argv)

    meta = make_meta(args.name, args.layers)
    root = ensure_private_dir(default_root())
    run_dir = ensure_private_dir(
        root / f"{args.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    )
    log = None
    if not args.no_log:
        from nnwatch.store.runlog import RunLogWriter

        log = RunLogWriter(run_dir, meta)
        from nnwatch.store.overview import OverviewWriter  # as the probe's run files do

        log.observers.append(OverviewWriter(run_dir, meta.schema.scalar_dtype(), log))
    else:
        (run_dir / "meta.json").write_text(meta.to_json())
    end = RunEndpoint(meta, run_dir, slots=args.slots or None, subscribe_mode=args.subscribe_mode)
    if log is not None:
        log.keep_within(end.slots)
    record = np.zeros(1, meta.schema.record_dtype())
    view = record.view(np.uint8).data
    print(json.dumps({
        "ready": True, "run_dir": str(run_dir), "ring": str(end.ring_path),
        "socket": str(end.socket_path), "entry": str(end.entry_path), "pid": os.getpid(),
    }), flush=True)  # fmt: skip

    layer_interval = 10
    clip = float("nan")
    should_stop = False
    paused = False
    times = np.zeros(max(args.steps, 1), np.float64)
    period = 1.0 / args.rate if args.rate > 0 else 0.0
    next_t = time.perf_counter()
    last = time.perf_counter()
    step = 0
    rng = np.random.default_rng(0)
    status = "finished"

    def apply(cmds: list[PendingCommand]) -> None:
        nonlocal layer_interval, clip, should_stop, paused
        for c in cmds:
            if c.name == PAUSE:
                paused = True
            elif c.name == RESUME:
                paused = False
            elif c.name == STOP:
                should_stop = True
            elif c.name == SET_LAYER_INTERVAL:
                layer_interval = c.args["n"]
            elif c.name == SET_CLIP:
                clip = float("nan") if c.args["max_norm"] is None else c.args["max_norm"]
            if log is not None:
                # the line as nnwatch once wrote it ("name", not "command"): monitors and tests
                # read that older form too (nnwatch.store.events types it the same)
                log.event({"type": "command", "name": c.name, "args": c.args, "step": step})
            c.reply(step, paused=paused)

    try:
        while args.steps <= 0 or step < args.steps:
            if args.work_ms:
                _busy(args.work_ms / 1000.0)
            now = time.time()
            record[FieldName.STEP] = step
            record[FieldName.TIME] = now
            record[FieldName.LOSS] = 1.0 / (1 + step) + 0.01 * rng.random()
            record[FieldName.CLIP_THRESHOLD] = clip
            record[FieldName.LAYER_STATS] = 1.0 if step % layer_interval == 0 else 0.0
            record[FieldName.LAYER_SUMS] = 1.0
            record[FieldName.ACT_SUM] = step
            end.publish(view)
            if log is not None:
                log.put(bytes(view))
            end.at_step_boundary(apply, lambda: paused and not should_stop, poll=0.5)
            t = time.perf_counter()
            if step < len(times):
                times[step] = t - last
            last = t
            if step == args.crash_after:
                os.kill(os.getpid(), signal.SIGKILL)
            if step == args.hang_after:
                while True:  # the heartbeat thread goes on; steps do not
                    time.sleep(3600)
            step += 1
            if should_stop:
                status = "stopped"
                break
            if period:
                next_t += period
                delay = next_t - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                last = time.perf_counter()
    finally:
        # stopped by a monitor's `stop`: the loop ended as a watched loop that breaks on
        # w.should_stop does, "finished" (the ring's "stopped" is a Ctrl-C's word)
        ended = "finished" if status == "stopped" else status
        if log is not None:
            log.close(ended, step)
        end.close(ended)
    if args.times_out:
        times[: min(step, len(times))].tofile(args.times_out)
    print(json.dumps({"done": True, "steps": step, "status": status}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
