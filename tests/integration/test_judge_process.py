"""The detectors' own process against a real ring it cannot keep up with, and a bad record.

A real RingWriter of the smallest size, a real ``python -m nnwatch.diagnosis.judge_process``
started by the link, stopped with SIGSTOP while the ring laps it.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from nnwatch.diagnosis.context import RunContext
from nnwatch.diagnosis.judge_link import JudgeLink
from nnwatch.diagnosis.pipeline import Pipeline
from nnwatch.diagnosis.spikes import SpikeTrigger
from nnwatch.store.ring import MIN_SLOTS, RingWriter
from nnwatch.testing.synthetic import make_meta


def _record(dtype: np.dtype, step: int, loss: float) -> bytes:
    rec = np.zeros(1, dtype)
    for name in dtype.names or ():
        rec[name] = math.nan
    rec["step"], rec["time"], rec["step_time"] = step, 1e9 + step * 0.01, 0.01
    rec["loss"], rec["grad_norm"], rec["nonfinite_grads"] = loss, 1.0, 0.0
    rec["layer_sums"], rec["layer_stats"] = 0.0, 0.0  # a light step: no layer values
    return rec.tobytes()


def test_a_lapped_judge_says_so_and_still_reports_the_bad_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    meta = make_meta("judge", 2)
    dtype = meta.schema.record_dtype()
    ring = RingWriter(tmp_path / "ring", meta.schema.record_size, MIN_SLOTS, meta_json=meta.to_json())
    findings: list[dict[str, object]] = []
    lost: list[str] = []
    state = pickle.dumps((Pipeline(RunContext.from_meta(meta)), SpikeTrigger()))
    link = JudgeLink.start(
        ring=tmp_path / "ring", state=state, on_finding=findings.append,
        on_snapshot=lambda reason: None, on_lost=lost.append,
    )  # fmt: skip
    assert link is not None
    step = 0
    try:
        for _ in range(50):
            ring.publish(_record(dtype, step, 1.0 - 1e-3 * step))
            step += 1
        time.sleep(1.0)  # it has attached and read these
        os.kill(link.pid, signal.SIGSTOP)
        for _ in range(3 * MIN_SLOTS):  # laps it while it is stopped
            ring.publish(_record(dtype, step, 1.0 - 1e-4 * step))
            step += 1
        os.kill(link.pid, signal.SIGCONT)
        bad = step
        ring.publish(_record(dtype, bad, math.nan))
        with caplog.at_level(logging.WARNING, logger="nnwatch"):
            link.close()
    finally:
        if link.proc.poll() is None:
            link.proc.kill()
        ring.close("finished")
    assert not lost, lost
    assert link.done is not None and link.done["dropped"] > 0
    assert "fell behind the ring" in caplog.text
    assert any(f["kind"] == "nan_or_inf" and f["step"] == bad for f in findings), findings


def test_a_judge_whose_ring_is_gone_is_reported_lost(tmp_path: Path) -> None:
    lost: list[str] = []
    state = pickle.dumps((Pipeline(RunContext.from_meta(make_meta("gone", 1))), SpikeTrigger()))
    link = JudgeLink.start(
        ring=tmp_path / "no-ring", state=state, on_finding=lambda d: None,
        on_snapshot=lambda reason: None, on_lost=lost.append,
    )  # fmt: skip
    assert link is not None
    link.proc.wait(timeout=30)
    link.close()
    assert lost and "ended (exit code 1)" in lost[0]
