"""The monitor's data side, without a screen: bounded history, the fixture and recorded sources."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nnwatch.sources.base import SourceError
from nnwatch.sources.recorded import RecordedSource
from nnwatch.testing.fixture import DYING_LAYER, FixtureSource, write_run
from nnwatch.tui.model import RunState
from nnwatch.tui.scalar_history import History
from nnwatch.tui.widgets.chart import Plot, Trace, render_plot, trace_from
from nnwatch.tui.widgets.grad import spike_columns


def _rows(n: int, seed: int = 0) -> np.ndarray:
    return FixtureSource(n, seed=seed).scalar_rows(0, n)


@settings(max_examples=25, deadline=None)
@given(
    chunks=st.lists(st.integers(min_value=1, max_value=700), min_size=1, max_size=30),
    capacity=st.sampled_from([4, 8, 64]),
)
def test_streaming_equals_one_bulk_append(chunks: list[int], capacity: int) -> None:
    n = sum(chunks)
    rows = _rows(n)
    streamed = History(capacity=capacity, tail=64)
    pos = 0
    for c in chunks:
        streamed.append(rows[pos : pos + c])
        pos += c
    bulk = History(capacity=capacity, tail=64)
    bulk.reserve(n)
    bulk.append(rows)
    assert (streamed.bucket, streamed.nb, streamed.fill) == (bulk.bucket, bulk.nb, bulk.fill)
    for name in ("_lo", "_hi", "_sum", "_cnt", "_bad"):
        np.testing.assert_allclose(getattr(streamed, name), getattr(bulk, name), equal_nan=True)
    assert streamed.nb <= capacity
    assert streamed.total("step") == pytest.approx(rows["step"].sum())
    np.testing.assert_array_equal(streamed.tail("step"), rows["step"][-64:])


def test_memory_is_bounded_however_long_the_run() -> None:
    h = History(capacity=256, tail=512)
    src = FixtureSource(None, steps_per_poll=5000)
    h.append(src.poll().scalars)
    size = h.nbytes
    for _ in range(60):  # 300k steps
        h.append(src.poll().scalars)
    assert h.nbytes == size
    assert h.rows == 305_000
    assert h.nb <= 256


def test_run_state_stays_bounded_on_an_endless_run() -> None:
    src = FixtureSource(None, steps_per_poll=20_000, layer_every=1)
    state = RunState(src.meta, capacity=512, tail=1024, max_events=4, max_layer_rows=16)
    state.ingest(src.poll())
    size = state.history.nbytes
    for _ in range(20):  # 420k steps, a layer row for each
        state.ingest(src.poll())
    assert state.history.rows == 420_000
    assert state.history.nbytes == size
    assert len(state.layer_rows) == 16
    assert len(state.events) == 4 and state.events_total == len(src.events()) > 4


def test_a_one_step_spike_stays_visible_at_every_zoom() -> None:
    n = 1_000_000
    rows = np.zeros(n, dtype=FixtureSource(1).meta.schema.scalar_dtype())
    rows["step"] = np.arange(n)
    rows["loss"] = 1.0
    rows["loss"][777_777] = 50.0
    h = History(capacity=2048, tail=1024)
    h.append(rows)
    for ncols in (7, 80, 333, 2048):
        cols = h.columns("loss", ncols)
        assert np.nanmax(cols.hi) == 50.0
        assert np.nanmin(cols.lo) == 1.0
        assert int(np.nanargmax(cols.hi)) == int(777_777 * ncols / n)


def test_not_measured_is_not_zero_and_inf_is_counted() -> None:
    src = FixtureSource(2000, amp=False)
    h = History()
    h.append(src.poll().scalars)
    assert not h.measured("amp_scale")  # NaN everywhere: "no scaler", never a scale of 0
    assert h.measured("loss")
    amp = FixtureSource(2000)
    h2 = History()
    h2.append(amp.poll().scalars)
    # the fixture's overflow steps have an infinite grad norm (and are not the loss spike)
    assert h2.bad_total("grad_norm") == len(amp.halving_steps) - 1
    assert np.isfinite(h2.columns("grad_norm", 50).hi).all()


def test_fixture_is_deterministic_whatever_the_chunking() -> None:
    whole = FixtureSource(3000).poll()
    parts = FixtureSource(3000, steps_per_poll=37)
    got = [parts.poll() for _ in range(82)]
    scalars = np.concatenate([u.scalars for u in got])
    layers = np.concatenate([u.layers for u in got])
    assert scalars.tobytes() == whole.scalars.tobytes()
    assert layers.tobytes() == whole.layers.tobytes()
    assert [e["step"] for u in got for e in u.events] == [e["step"] for e in whole.events]
    assert got[-1].status.state == "finished" and got[0].status.state == "live"
    assert FixtureSource(3000, seed=1).poll().scalars.tobytes() != whole.scalars.tobytes()


def test_fixture_has_the_pathologies_a_dashboard_must_show() -> None:
    src = FixtureSource(3000)
    u = src.poll()
    loss = u.scalars["loss"]
    sp = src.spike_step
    assert loss[sp] > 5 * np.median(loss[sp - 50 : sp])  # a one-step spike
    scale = u.scalars["amp_scale"]
    for h in src.halving_steps:  # AMP halvings, each with a skipped step
        assert scale[h] == scale[h - 1] / 2 and u.scalars["amp_skipped"][h] == 1
    dying = src.meta.schema.layer_names.index(DYING_LAYER)
    zero = u.layers["act_zero"][:, dying]
    assert zero[0] < 0.5 and zero[-1] > 0.8  # a layer that dies over the run
    kinds = {e.get("kind") or e.get("type") for e in u.events}
    assert {"loss_spike", "dead_units", "amp_overflow", "snapshot", "command"} <= kinds


def test_a_failing_fixture_raises_source_error() -> None:
    src = FixtureSource(100, steps_per_poll=10, fail_on_poll=2)
    src.poll()
    with pytest.raises(SourceError):
        src.poll()
    assert len(src.poll().scalars) == 10  # and recovers, as a reconnected run would


def test_recorded_run_round_trips_through_the_run_log(tmp_path) -> None:
    src = FixtureSource(3000)
    run_dir = write_run(src, tmp_path / "run")
    rec = RecordedSource(run_dir, chunk_rows=1000)
    assert not rec.can_command
    updates = [rec.poll() for _ in range(3)]
    assert [len(u.scalars) for u in updates] == [1000, 1000, 1000]
    assert {u.status.state for u in updates} == {"finished"}  # never flips while loading
    scalars = np.concatenate([u.scalars for u in updates])
    assert scalars.tobytes() == src.scalar_rows(0, 3000).tobytes()
    assert not updates[0].events and len(updates[-1].events) == len(src.events())
    # per-layer rows: only the newest are handed over; older ones are read when scrubbing
    assert 0 < len(updates[-1].layers) <= 64
    row = rec.layer_row_at(1355)
    assert row is not None and int(row["step"]) == 1350
    assert rec.layer_row_at(-1) is None
    between = rec.scalars_between(100, 149)
    assert list(between["step"][[0, -1]]) == [100, 149]
    assert len(rec.poll().scalars) == 0  # a finished run has nothing more


def test_crashed_run_reads_as_crashed(tmp_path) -> None:
    run_dir = write_run(FixtureSource(500, end_state="crashed"), tmp_path / "run")
    assert RecordedSource(run_dir).poll().status.state == "crashed"


def test_recorded_source_reports_unreadable_dirs_in_words(tmp_path) -> None:
    with pytest.raises(SourceError, match="not a directory"):
        RecordedSource(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="meta.json"):
        RecordedSource(tmp_path / "empty")


def test_run_state_marks_only_changed_panes() -> None:
    src = FixtureSource(400, steps_per_poll=100, amp=False, cuda=False)
    state = RunState(src.meta)
    first = state.ingest(src.poll())
    assert {"header", "loss", "grad", "layers", "updates", "events"} >= first.panes - {"gpu"}
    assert "amp" not in first.panes  # no scaler: the AMP pane has nothing new to draw
    second = state.ingest(src.poll())
    assert "amp" not in second.panes
    assert "loss" in second.panes and "header" in second.panes
    idle = FixtureSource(400, steps_per_poll=100, amp=False, cuda=False)
    idle_state = RunState(idle.meta)
    idle_state.ingest(idle.poll())
    assert {"loss", "header"} <= idle_state.take_changes()
    idle_state.ingest(idle.poll().__class__(idle.scalar_rows(0, 0), idle.layer_rows(0, 0)))
    changed = idle_state.take_changes()
    assert "gpu" not in changed and "loss" not in changed  # nothing arrived: nothing to redraw


def test_chart_draws_the_envelope_spike_and_markers() -> None:
    from rich.style import Style

    h = History()
    src = FixtureSource(3000)
    h.append(src.poll().scalars)
    cols = h.columns("loss", 2 * 60)
    plot = Plot(traces=[trace_from(cols, Style(color="blue"))], markers={3: ("✕", Style())})
    text = render_plot(plot, 67, 10, Style())
    lines = text.plain.split("\n")
    assert len(lines) == 10 and all(len(line) <= 67 for line in lines)
    assert "✕" in lines[0]
    spike_col = 7 + int(src.spike_step * 60 / 3000)  # gutter + the spike's cell column
    assert lines[1][spike_col] != " "  # the spike reaches the top row
    spikes = spike_columns(h.columns("grad_norm", 120))
    assert int(src.spike_step * 120 / 3000) in spikes
    flat = Plot(traces=[Trace(np.ones(10), np.ones(10), Style())])
    assert render_plot(flat, 30, 5, Style()).plain.count("\n") == 4
