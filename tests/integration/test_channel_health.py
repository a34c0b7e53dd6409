"""How a reader judges a run from its ring header, its pid and end.json (pure function)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nnwatch.store.health import judge
from nnwatch.store.ring_reader import RingState

NOW = 1_000_000.0

RUNNING = RingState(
    pid=1, start_time=1.0, created=NOW - 100, status="running", status_time=NOW - 100,
    write_seq=500, heartbeat=NOW - 0.5, last_publish=NOW - 0.05, step_interval=0.1, errors=0,
    slots=256, record_size=100,
)  # fmt: skip


@pytest.mark.parametrize(
    ("state", "alive", "end", "expected"),
    [
        (RUNNING, True, None, "running"),
        (replace(RUNNING, status="paused", last_publish=NOW - 600), True, None, "paused"),
        (replace(RUNNING, status="finished", heartbeat=NOW - 900), False, None, "finished"),
        (replace(RUNNING, status="stopped"), False, None, "finished"),
        (replace(RUNNING, status="crashed"), True, None, "crashed"),
        # kill -9: the header still says running, but the pid is gone and there is no end.json
        (RUNNING, False, None, "crashed"),
        # the trainer died after writing end.json but before marking the ring
        (RUNNING, False, {"status": "finished"}, "finished"),
        # frozen process (SIGSTOP, or C code holding the GIL): the 1 Hz heartbeat went stale
        (replace(RUNNING, heartbeat=NOW - 30), True, None, "hung"),
        # heartbeat fine but no step for far longer than usual
        (replace(RUNNING, last_publish=NOW - 60), True, None, "hung"),
        # a slow run (10 s steps) 60 s after its last step is not hung yet
        (replace(RUNNING, last_publish=NOW - 60, step_interval=10.0), True, None, "running"),
        (replace(RUNNING, last_publish=0.0, write_seq=0), True, None, "starting"),
        # on another host the pid cannot be checked: only a long-stale heartbeat means crashed
        (replace(RUNNING, heartbeat=NOW - 3600), None, None, "crashed"),
        (RUNNING, None, None, "running"),
    ],
)
def test_judge(state: RingState, alive: bool | None, end: dict | None, expected: str) -> None:
    health = judge(state, now=NOW, writer_alive=alive, end=end)
    assert health.state == expected
    if expected in ("hung", "crashed"):
        assert health.message  # always says why


def test_hung_threshold_follows_the_usual_step_time() -> None:
    fast = replace(RUNNING, last_publish=NOW - 3.0, step_interval=0.01)
    assert judge(fast, now=NOW, writer_alive=True, hung_min=1.0).state == "hung"
    assert judge(fast, now=NOW, writer_alive=True, hung_min=10.0).state == "running"
    assert "usual 0.01 s" in judge(fast, now=NOW, writer_alive=True, hung_min=1.0).message


def test_live_means_same_process_and_fresh_heartbeat() -> None:
    stopped = judge(replace(RUNNING, heartbeat=NOW - 30), now=NOW, writer_alive=True)
    slow = judge(replace(RUNNING, last_publish=NOW - 60), now=NOW, writer_alive=True)
    gone = judge(RUNNING, now=NOW, writer_alive=False)
    assert (stopped.state, stopped.live) == ("hung", False)  # frozen process: not live
    assert (slow.state, slow.live) == ("hung", True)  # alive, beating, just not stepping
    assert (gone.live, gone.ended) == (False, True)
    assert judge(RUNNING, now=NOW, writer_alive=True).live
