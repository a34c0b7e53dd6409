"""The update-level evidence of every case of a suite, side by side: what the mechanism rules read.

For each run of a pathology suite (its bug cases, fixed controls and healthy runs) this prints
what the optimizer did to the weights, as nnwatch recorded it: the update-to-weight ratio (the
whole model's, median and extremes over measured updates), the share of elements an update left
unchanged, the optimizer's parameters without a gradient, the weights' norm at the end against the
start, how coherently the weights moved (distance from the start over the path the updates
walked), the batches' label entropy against ln K, and the findings at warning or worse. It is a
window on the numbers, not a score: ``run_nnwatch.py`` of each suite scores.

    python bench/mechanisms.py ../shared/benchmarks/pathologies-2 --seeds 0 --controls
    python bench/mechanisms.py bench/written_apart --cases bug_shuffled_labels --json out.json

Each suite runs through its own harness (``run_with_nnwatch`` or ``run_one``) in this process,
with a fresh ``NNWATCH_RUN_DIR`` per run, so the runs are exactly the scored ones.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _harness(suite: Path) -> Any:
    sys.path.insert(0, str(suite))
    return importlib.import_module("run_nnwatch")


def _run(h: Any, name: str, seed: int, bug: bool) -> list[Path]:
    """One run through the suite's harness; the run directories it wrote."""
    root = Path(tempfile.mkdtemp(prefix="nnw-mech-"))
    os.chmod(root, 0o700)
    os.environ["NNWATCH_RUN_DIR"] = str(root)
    if hasattr(h, "run_with_nnwatch"):
        h.run_with_nnwatch(name, seed, bug)
    else:
        h.run_one(name, seed, bug, False)
    return sorted(p.parent for p in root.rglob("meta.json"))


def ratio_series(run: Any) -> tuple[np.ndarray, np.ndarray]:
    """(steps, whole-model update norm / weight norm) over measured updates."""
    lay = run.layers
    names = lay.dtype.names or ()
    if "update_layer" not in names or not len(lay):
        return np.zeros(0), np.zeros(0)
    upd = np.sqrt(np.nansum(lay["update_layer"].astype(np.float64) ** 2, axis=1))
    wt = np.sqrt(np.nansum(lay["weight_layer"].astype(np.float64) ** 2, axis=1))
    ok = np.isfinite(lay["update_layer"]).any(axis=1) & (wt > 0)
    return lay["step"][ok], upd[ok] / wt[ok]


def coherence(run: Any) -> float:
    """Distance from the start over the path walked (1: a straight line, ~1/sqrt(n): a random
    walk), with the path between measured updates taken at their update norms."""
    lay = run.layers
    if "update_layer" not in (lay.dtype.names or ()) or not len(lay):
        return math.nan
    upd = np.sqrt(np.nansum(lay["update_layer"].astype(np.float64) ** 2, axis=1))
    ok = np.isfinite(lay["update_layer"]).any(axis=1)
    steps, upd = lay["step"][ok].astype(np.float64), upd[ok]
    drift = run["weight_drift"]
    fin = np.flatnonzero(np.isfinite(drift))
    if len(steps) < 2 or not len(fin):
        return math.nan
    path = float(np.trapezoid(upd, steps)) + float(upd[0])
    return float(drift[fin[-1]]) / path if path > 0 else math.nan


def summarize(run_dir: Path) -> dict[str, Any]:
    import nnwatch

    run = nnwatch.load_run(run_dir)
    _, ratio = ratio_series(run)
    lr = np.log10(ratio[ratio > 0]) if ratio.size else np.zeros(0)
    fro = run["update_frozen"]
    nog = run["params_no_grad"]
    lay = run.layers
    wt = np.sqrt(np.nansum(lay["weight_layer"].astype(np.float64) ** 2, axis=1)) if len(lay) else []
    wt = np.asarray(wt)[np.asarray(wt) > 0] if len(lay) else np.zeros(0)
    ent = run["label_entropy"]
    k = run.meta.num_classes
    loss = run["loss"]
    fin = loss[np.isfinite(loss)]

    def q(x: np.ndarray, p: float) -> float:
        x = x[np.isfinite(x)]
        return float(np.quantile(x, p)) if x.size else math.nan

    return {
        "name": run.meta.name,
        "steps": len(run),
        "measured": int(np.sum(np.isfinite(run["update_frozen"]))),
        "log_ratio_p10": q(lr, 0.1),
        "log_ratio_p50": q(lr, 0.5),
        "log_ratio_p90": q(lr, 0.9),
        "frozen_p50": q(fro, 0.5),
        "no_grad_p50": q(nog, 0.5),
        "unoptimized_p50": q(run["params_unoptimized"], 0.5),
        "weight_end_over_start": float(wt[-1] / wt[0]) if wt.size > 1 else math.nan,
        "coherence": coherence(run),
        "label_entropy_over_lnk": q(ent, 0.5) / math.log(k) if k and k > 1 else math.nan,
        "loss_start": float(np.median(fin[:5])) if fin.size else math.nan,
        "loss_end": float(np.median(fin[-10:])) if fin.size else math.nan,
        "findings": sorted({f"{e['kind']}@{e['step']}" for e in run.findings
                            if e.get("severity") not in ("info",)}),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("suite", help="a suite's folder (with run_nnwatch.py and cases/)")
    p.add_argument("--seeds", default="0")
    p.add_argument("--cases", default="")
    p.add_argument("--controls", action="store_true")
    p.add_argument("--json", default="")
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    import logging

    logging.getLogger("nnwatch").setLevel(logging.CRITICAL)
    suite = Path(a.suite).resolve()
    h = _harness(suite)
    names = a.cases.split(",") if a.cases else h.all_case_names()
    rows = []
    for seed in (int(s) for s in a.seeds.split(",")):
        for name in names:
            mod = h.load_case(name)
            expected = [k for k in mod.CASE.get("expected", []) if k != "healthy"]
            fn = mod.run if hasattr(mod, "run") else mod.build
            variants = [True] + ([False] if a.controls and expected and "bug" in inspect.signature(fn).parameters else [])
            for bug in variants:
                for d in _run(h, name, seed, bug):
                    r = summarize(d)
                    r.update(case=name if bug else name + "[fixed]", seed=seed, expected=expected if bug else [])
                    rows.append(r)
                    print(
                        f"s{seed} {r['case'][:40]:40s} ratio {r['log_ratio_p10']:+.1f}/{r['log_ratio_p50']:+.1f}/"
                        f"{r['log_ratio_p90']:+.1f} frozen {r['frozen_p50']:.2f} nograd {r['no_grad_p50']:.2f} "
                        f"w {r['weight_end_over_start']:.2f} coh {r['coherence']:.2f} "
                        f"ent {r['label_entropy_over_lnk']:.2f} loss {r['loss_start']:.3g}->{r['loss_end']:.3g} "
                        f"{' '.join(r['findings'])[:80]}",
                        flush=True,
                    )
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
