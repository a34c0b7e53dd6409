"""Drives every Python process nnwatch starts, without torch: run it from any working directory.

- the detectors' process (``JudgeLink``), fed a ring with one NaN record: it must report it;
- the stream process a ``subscribe`` hands a monitor to (a real endpoint, a real subscription):
  it must deliver the records.

Prints one JSON line: what each child did. A test runs it from a directory another user planted
packages in, with an installed wheel or the editable install, and checks that nothing planted ran.
"""

from __future__ import annotations

import json
import math
import pickle
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from nnwatch.channel.client import Subscription
from nnwatch.channel.endpoint import RunEndpoint
from nnwatch.diagnosis.context import RunContext
from nnwatch.diagnosis.judge_link import JudgeLink
from nnwatch.diagnosis.pipeline import Pipeline
from nnwatch.diagnosis.spikes import SpikeTrigger
from nnwatch.store.ring import MIN_SLOTS, RingWriter
from nnwatch.testing.synthetic import make_meta


def record(dtype: np.dtype, step: int, loss: float) -> bytes:
    rec = np.zeros(1, dtype)
    for name in dtype.names or ():
        rec[name] = math.nan
    rec["step"], rec["time"], rec["step_time"] = step, 1e9 + step * 0.01, 0.01
    rec["loss"], rec["grad_norm"], rec["nonfinite_grads"] = loss, 1.0, 0.0
    rec["layer_sums"], rec["layer_stats"] = 0.0, 0.0
    return rec.tobytes()


def judge(scratch: Path) -> list[str]:
    meta = make_meta("children", 2)
    ring = RingWriter(scratch / "ring", meta.schema.record_size, MIN_SLOTS, meta_json=meta.to_json())
    found: list[str] = []
    lost: list[str] = []
    state = pickle.dumps((Pipeline(RunContext.from_meta(meta)), SpikeTrigger()))
    link = JudgeLink.start(ring=scratch / "ring", state=state, on_finding=lambda f: found.append(f["kind"]),
                           on_snapshot=lambda reason: None, on_lost=lost.append)  # fmt: skip
    assert link is not None, "the detectors' process did not start"
    try:
        for step in range(20):
            ring.publish(record(meta.schema.record_dtype(), step, math.nan if step == 19 else 1.0))
        link.close()
    finally:
        if link.proc.poll() is None:
            link.proc.kill()
        ring.close("finished")
    return found + [f"lost: {why}" for why in lost]


def stream(scratch: Path) -> int:
    meta = make_meta("children-stream", 2)
    run_dir = scratch / "run"
    run_dir.mkdir(mode=0o700)
    end = RunEndpoint(meta, run_dir, root=scratch / "root", subscribe_mode="process")
    try:
        for step in range(10):
            end.ring.publish(record(meta.schema.record_dtype(), step, 1.0))
        assert end.socket_path is not None, end.problem
        sub = Subscription(end.socket_path, history=True)
        got = 0
        deadline = time.monotonic() + 60
        while got < 10 and time.monotonic() < deadline:
            for msg in sub.poll(timeout=0.5):
                got += len(msg.get("rows", ())) if msg.get("type") in ("records", "scalars") else 0
        sub.close()
        return got
    finally:
        end.close("finished")


def main() -> int:
    scratch = Path(tempfile.mkdtemp(prefix="nnw-children-"))
    out = {"judge": judge(scratch), "stream_records": stream(scratch)}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
