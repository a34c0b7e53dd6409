"""The bundled pathology suite, run for real: every kind detected, healthy runs left alone.

Each case is a real training loop with ``nnwatch.watch`` attached (hooks, run log, detectors in the
writer thread, the non-finite guard). This is the quality gate behind ``bench/detection.py``:
recall 100%, no false alarms, a median delay of at most 5 steps after onset (per kind, but for the
few in ``LATE_KINDS``), and every finding
carrying its evidence, its remedy, and (where one applies) the culprit layer. Seed 0 runs case by
case; ``test_targets_hold_on_two_more_seeds`` repeats the whole suite on fresh data and inits
(seeds 1 and 2), which is what shows that the rules were not tuned to one draw.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pathologies.common as common  # noqa: E402
from pathologies import CASES, CaseOutcome, run_case, score  # noqa: E402

from nnwatch import load_run  # noqa: E402

_OUTCOMES: dict[str, CaseOutcome] = {}

#: Median delay bars per kind above the 5 steps every other kind meets. A divergence has 20 by the
#: issue's bar; for the other two the README's detection section says why the evidence itself comes
#: later (an LR set too high at step 0 explodes only ~13 steps later; a loss past the stability
#: limit keeps falling for 6 steps before it swings).
#: the label-order rule of oscillating_loss reads one window (24 steps) of batches before it can
#: say that the labels' variance lies between them: a run sorted from step 0 is told at step 24
LATE_KINDS = {"loss_diverging": 20, "exploding_gradients": 20, "oscillating_loss": 24}


def _per_kind_delays_hold(result: dict) -> list[str]:
    return [
        f"{k}: {v['median_delay']}"
        for k, v in result["per_kind"].items()
        if not v["median_delay"] <= LATE_KINDS.get(k, 5)
    ]


@pytest.fixture(scope="module", autouse=True)
def _one_thread(tmp_path_factory):
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


def _run(case, tmp_path_factory, monkeypatch) -> CaseOutcome:
    if case.name not in _OUTCOMES:
        monkeypatch.setenv("NNWATCH_RUN_DIR", str(tmp_path_factory.mktemp(case.name)))
        _OUTCOMES[case.name] = run_case(case)
    return _OUTCOMES[case.name]


#: Sick runs whose records show no cause: labels shuffled apart from their inputs leave the loss at
#: ln(K) with real gradients and real updates, exactly like a healthy plateau before a drop. Such a
#: stall is a note (severity info) until 1000 steps at chance, never a warning on sight (issue 32).
NOTE_ONLY = {"stalled_misaligned_labels"}


@pytest.mark.parametrize("case", [c for c in CASES if c.name in NOTE_ONLY], ids=lambda c: c.name)
def test_a_stall_with_no_cause_in_the_records_is_a_note(case, tmp_path_factory, monkeypatch):
    o = _run(case, tmp_path_factory, monkeypatch)
    notes = [f for f in o.findings if f.kind == case.expect]
    assert notes and all(f.severity == "info" for f in notes), [f.message for f in o.findings]
    assert "not yet a warning" in notes[0].summary


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.expect and c.name not in NOTE_ONLY], ids=lambda c: c.name
)
def test_sick_run_is_diagnosed(case, tmp_path_factory, monkeypatch):
    o = _run(case, tmp_path_factory, monkeypatch)
    assert o.error is None, o.error
    assert not o.false_alarms, [f.message for f in o.false_alarms]
    hit = o.hit
    assert hit is not None, f"no {case.expect} finding; got {[f.message for f in o.findings]}"
    assert hit.remedy and hit.message.endswith(hit.remedy)
    assert hit.evidence and all(isinstance(v, (int, float)) for v in hit.evidence.values())
    assert hit.severity in ("warning", "error", "critical")
    if case.layer is not None:
        assert hit.layer == case.layer, hit.message
    logged = [
        e
        for e in load_run(o.run_dir).findings
        if e["kind"] == case.expect and e["severity"] != "info"
    ]
    assert logged and logged[0]["step"] == hit.step and logged[0]["remedy"] == hit.remedy


@pytest.mark.parametrize("case", [c for c in CASES if not c.expect], ids=lambda c: c.name)
def test_healthy_run_raises_nothing(case, tmp_path_factory, monkeypatch):
    o = _run(case, tmp_path_factory, monkeypatch)
    assert o.error is None, o.error
    assert o.steps >= 150
    assert o.false_alarms == [], [f.message for f in o.findings]  # nothing warning-or-worse


def test_suite_targets(tmp_path_factory, monkeypatch):
    """Recall per kind 100%, no false alarms, median delay after onset at most 5 steps."""
    outcomes = [_run(c, tmp_path_factory, monkeypatch) for c in CASES]
    kinds = {c.expect for c in CASES if c.expect}
    assert len(kinds) == 13 and sum(1 for c in CASES if not c.expect) >= 30
    for k in kinds:
        assert all(o.hit for o in outcomes if o.case.expect == k and o.case.name not in NOTE_ONLY), k
    assert sum(len(o.false_alarms) for o in outcomes) == 0
    delays = [o.delay for o in outcomes if o.delay is not None]
    assert statistics.median(delays) <= 5, delays
    assert _per_kind_delays_hold(score(outcomes)) == []
    json.dumps([o.case.name for o in outcomes])  # the outcome list stays plain data


@pytest.mark.slow
@pytest.mark.timeout(3600)  # every case twice: minutes alone, far more on a loaded machine
def test_targets_hold_on_two_more_seeds(tmp_path_factory, monkeypatch):
    """The bar on seeds 1 and 2: every kind recalled on every seed, no warning on a healthy run,
    median delay at most 5 steps (a divergence's at most 20)."""
    outcomes: list[CaseOutcome] = []
    try:
        for s in (1, 2):
            common.SEED_OFFSET = s
            for case in CASES:
                monkeypatch.setenv("NNWATCH_RUN_DIR", str(tmp_path_factory.mktemp(case.name)))
                outcomes.append(run_case(case))
    finally:
        common.SEED_OFFSET = 0
    assert [o.case.name for o in outcomes if o.error] == []
    result = score(outcomes)
    missed = [
        f"{o.case.name}" for o in outcomes if o.case.expect and o.hit is None and o.case.name not in NOTE_ONLY
    ]
    assert missed == []
    flagged = [
        (o.case.name, [f.message for f in o.false_alarms]) for o in outcomes if o.false_alarms
    ]
    assert flagged == []
    assert result["median_delay"] <= 5, result["median_delay"]
    assert _per_kind_delays_hold(result) == []
