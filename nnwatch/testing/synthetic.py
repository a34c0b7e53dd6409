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
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from nnwatch.channel.commands import PAUSE, RESUME, SET_CLIP, SET_LAYER_INTERVAL, STOP
from nnwatch.channel.endpoint import RunEndpoint
from nnwatch.channel.server import PendingCommand
from nnwatch.store.paths import default_root, ensure_private_dir
from nnwatch.store.schema import FieldName, RunMeta, RunSchema

if TYPE_CHECKING:
    from nnwatch.store.runlog import RunLogWriter


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
    args = _parse(argv)
    meta = make_meta(args.name, args.layers)
    run_dir, log, end = _open_run(args, meta)
    record = np.zeros(1, meta.schema.record_dtype())
    view = record.view(np.uint8).data
    print(json.dumps({
        "ready": True, "run_dir": str(run_dir), "ring": str(end.ring_path),
        "socket": str(end.socket_path), "entry": str(end.entry_path), "pid": os.getpid(),
    }), flush=True)  # fmt: skip

    controls = _Controls(log)
    times = np.zeros(max(args.steps, 1), np.float64)
    status = "finished"
    try:
        status = _step_loop(args, end, log, controls, record, view, times)
    finally:
        # stopped by a monitor's `stop`: the loop ended as a watched loop that breaks on
        # w.should_stop does, "finished" (the ring's "stopped" is a Ctrl-C's word)
        ended = "finished" if status == "stopped" else status
        if log is not None:
            log.close(ended, controls.step)
        end.close(ended)
    step = controls.step
    if args.times_out:
        times[: min(step, len(times))].tofile(args.times_out)
    print(json.dumps({"done": True, "steps": step, "status": status}), flush=True)
    return 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line: the run's shape, its pace, and the faults asked for."""
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
    return p.parse_args(argv)


def _open_run(
    args: argparse.Namespace, meta: RunMeta
) -> tuple[Path, RunLogWriter | None, RunEndpoint]:
    """A fresh run directory with its run log (unless ``--no-log``: then only meta.json) and the
    endpoint (ring, socket, registry entry), as the probe's run files make them."""
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
        log.keep_within(end.ring.slots)
    return run_dir, log, end


class _Controls:
    """What the monitors' commands have set, and the step they apply at: commands are applied
    at a step boundary, as the probe applies them, replying with that step."""

    def __init__(self, log: RunLogWriter | None) -> None:
        self.log = log
        self.layer_interval = 10
        self.clip = float("nan")
        self.should_stop = False
        self.paused = False
        self.step = 0

    @property
    def holding(self) -> bool:
        """Paused and not asked to stop: the endpoint's pause loop holds the steps."""
        return self.paused and not self.should_stop

    def apply_pending(self, cmds: list[PendingCommand]) -> None:
        for c in cmds:
            if c.name == PAUSE:
                self.paused = True
            elif c.name == RESUME:
                self.paused = False
            elif c.name == STOP:
                self.should_stop = True
            elif c.name == SET_LAYER_INTERVAL:
                self.layer_interval = c.args["n"]
            elif c.name == SET_CLIP:
                self.clip = float("nan") if c.args["max_norm"] is None else c.args["max_norm"]
            if self.log is not None:
                # the line as nnwatch once wrote it ("name", not "command"): monitors and tests
                # read that older form too (nnwatch.store.events types it the same)
                self.log.events.event(
                    {"type": "command", "name": c.name, "args": c.args, "step": self.step}
                )
            c.reply(self.step, paused=self.paused)


def _step_loop(
    args: argparse.Namespace,
    end: RunEndpoint,
    log: RunLogWriter | None,
    controls: _Controls,
    record: np.ndarray,
    view: memoryview,
    times: np.ndarray,
) -> str:
    """Step until ``--steps`` (or a monitor's ``stop``: then "stopped"), publishing one record a
    step, with the faults and the pace asked for; each step's time goes into ``times``."""
    c = controls
    period = 1.0 / args.rate if args.rate > 0 else 0.0
    next_t = time.perf_counter()
    last = time.perf_counter()
    rng = np.random.default_rng(0)
    while args.steps <= 0 or c.step < args.steps:
        step = c.step
        if args.work_ms:
            _busy(args.work_ms / 1000.0)
        now = time.time()
        record[FieldName.STEP] = step
        record[FieldName.TIME] = now
        record[FieldName.LOSS] = 1.0 / (1 + step) + 0.01 * rng.random()
        record[FieldName.CLIP_THRESHOLD] = c.clip
        record[FieldName.LAYER_STATS] = 1.0 if step % c.layer_interval == 0 else 0.0
        record[FieldName.LAYER_SUMS] = 1.0
        record[FieldName.ACT_SUM] = step
        end.ring.publish(view)
        if log is not None:
            log.put(bytes(view))
        end.at_step_boundary(c, poll=0.5)
        t = time.perf_counter()
        if step < len(times):
            times[step] = t - last
        last = t
        if step == args.crash_after:
            os.kill(os.getpid(), signal.SIGKILL)
        if step == args.hang_after:
            while True:  # the heartbeat thread goes on; steps do not
                time.sleep(3600)
        c.step += 1
        if c.should_stop:
            return "stopped"
        if period:
            next_t += period
            delay = next_t - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            last = time.perf_counter()
    return "finished"


if __name__ == "__main__":
    sys.exit(main())
