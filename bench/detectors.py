"""What the detectors cost per step row in the run-log writer thread (GIL time taken from training).

Feeds synthetic rows of a healthy-looking run (a falling, noisy loss; gradient norms measured
every 4th step as the cost budget does on a cheap CPU step; per-layer statistics every 10th; an
LR schedule; a mild clip) through the live pipeline one row at a time, as the writer does between
two drains, and reports microseconds per row for each detector, for the history and for the
row conversion, and the total.

``--against DIR`` runs the same measurement on another source tree (e.g. an export of the previous
commit) in interleaved rounds, each tree in its own subprocess, and prints the ratio of medians:

    python bench/detectors.py                      # this tree, 20k rows, 3 rounds
    python bench/detectors.py --against /tmp/old   # old vs new, interleaved rounds
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def synthetic_rows(n: int, seed: int = 0):  # type: ignore[no-untyped-def]
    """``n`` records of a 16-layer MLP-like run that trains normally, and its RunMeta."""
    import numpy as np

    from nnwatch.store.schema import RunMeta, RunSchema

    kinds = ("Linear", "ReLU") * 7 + ("Linear", "Identity")
    names = tuple(str(i) for i in range(len(kinds)))
    params = tuple(n_ for n_, k in zip(names, kinds, strict=True) if k == "Linear")
    schema = RunSchema(names, kinds, params, num_lr=1)
    meta = RunMeta(name="bench", schema=schema, pid=0, host="bench", started=0.0, num_classes=10)
    rng = np.random.default_rng(seed)
    rec = np.zeros(n, dtype=schema.record_dtype())
    for f in rec.dtype.names or ():
        rec[f] = np.nan
    t = np.arange(n, dtype=np.float64)
    rec["step"] = t
    rec["time"] = t * 0.002
    rec["step_time"] = 0.002
    rec["samples_per_sec"] = 64 / 0.002
    level = 0.3 + 2.0 * np.exp(-t / 300.0)
    rec["loss"] = level * np.exp(0.08 * rng.standard_normal(n))
    measured = (t % 4 == 0) | (t < 10)
    sampled = t % 10 == 0
    g = 1.5 * np.exp(0.2 * rng.standard_normal(n))
    rec["grad_norm"] = np.where(measured, g, np.nan)
    rec["clip_threshold"] = 5.0
    rec["grad_norm_clipped"] = np.minimum(g, 5.0)
    rec["clipped"] = (g > 5.0).astype(np.float64)
    rec["layer_sums"] = measured.astype(np.float64)
    rec["layer_stats"] = sampled.astype(np.float64)
    rec["nonfinite_grads"] = 0.0
    rec["lr"][:, 0] = 1e-3 * (0.5 + 0.5 * np.cos(math.pi * t / n))
    L, P = schema.num_layers, schema.num_param_layers
    act_sum = rng.normal(50.0, 5.0, (n, L)).astype(np.float32)
    rec["act_sum"] = np.where(measured[:, None], act_sum, np.nan)
    grad_layer = (g[:, None] * rng.uniform(0.2, 0.5, (n, P))).astype(np.float32)
    rec["grad_layer"] = np.where(measured[:, None], grad_layer, np.nan)
    relu = np.array([k == "ReLU" for k in kinds])
    stats = {
        "act_mean": rng.normal(0.1, 0.02, (n, L)),
        "act_std": rng.uniform(0.5, 1.0, (n, L)),
        "act_zero": np.where(relu, rng.uniform(0.4, 0.6, (n, L)), 0.0),
        "act_maxabs": rng.uniform(2.0, 4.0, (n, L)),
        "act_nonfinite": np.zeros((n, L)),
    }
    for f, v in stats.items():
        rec[f] = np.where(sampled[:, None], v, np.nan).astype(np.float32)
    return rec, meta


def measure(rows: int, seed: int) -> dict[str, float]:
    """Microseconds per row: each detector, the history, the row conversion, and the total."""
    from nnwatch.diagnosis.context import RunContext
    from nnwatch.diagnosis.pipeline import Pipeline
    from nnwatch.diagnosis.row import Row

    rec, meta = synthetic_rows(rows, seed)
    pipe = Pipeline(RunContext.from_meta(meta))
    hist = pipe.history
    spent = {d.kind: 0.0 for d in pipe.detectors}
    clock = time.perf_counter
    t_conv = t_hist = 0.0
    findings = 0
    t_all = clock()
    for i in range(0, rows, 64):  # the writer converts what it drained, then feeds row by row
        t0 = clock()
        batch = Row.batch(rec[i : i + 64])
        t_conv += clock() - t0
        for row in batch:
            for det in pipe.detectors:
                t0 = clock()
                if det.update(row, hist) is not None:
                    findings += 1
                spent[det.kind] += clock() - t0
            t0 = clock()
            hist.push(row)
            t_hist += clock() - t0
    total = clock() - t_all
    # the bare pipeline, without the per-detector clocks, for the total
    pipe2 = Pipeline(RunContext.from_meta(meta))
    t0 = clock()
    for i in range(0, rows, 64):
        pipe2.feed(rec[i : i + 64])
    bare = clock() - t0
    out = {k: 1e6 * v / rows for k, v in spent.items()}
    out["(history)"] = 1e6 * t_hist / rows
    out["(row conversion)"] = 1e6 * t_conv / rows
    out["total, timed per detector"] = 1e6 * total / rows
    out["total"] = 1e6 * bare / rows
    out["findings"] = float(findings)
    return out


def _worker(src: Path, rows: int, seed: int) -> dict[str, float]:
    code = (
        f"import sys, json; sys.path.insert(0, {str(src)!r}); sys.path.insert(1, {str(ROOT / 'bench')!r});"
        f"import detectors; print(json.dumps(detectors.measure({rows}, {seed})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=src
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rows", type=int, default=20_000, help="rows per round (default 20000)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--against", default="", help="another source tree to compare with")
    args = p.parse_args()
    trees = {"this tree": ROOT}
    if args.against:
        trees = {"other": Path(args.against).resolve(), "this tree": ROOT}
    results: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
    for r in range(args.rounds):
        for name, src in trees.items():
            results[name].append(_worker(src, args.rows, seed=r))
    keys: list[str] = []
    for res in results.values():
        for k in res[0]:
            if k not in keys:
                keys.append(k)
    print(
        f"detector cost, us per row: {args.rows} synthetic rows x {args.rounds} interleaved "
        f"round(s), median per tree\n"
    )
    head = f"{'':28s}" + "".join(f"{n:>12s}" for n in trees)
    print(head + ("   new/old" if len(trees) == 2 else ""))
    for k in keys:
        meds = [statistics.median(x.get(k, math.nan) for x in res) for res in results.values()]
        line = f"{k:28s}" + "".join(f"{m:12.1f}" if k != "findings" else f"{m:12.0f}" for m in meds)
        if len(meds) == 2 and k != "findings" and meds[0] > 0:
            line += f"   {meds[1] / meds[0]:7.2f}"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
