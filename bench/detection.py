"""Detection quality on the bundled pathology suite: recall per kind, false alarms, delay.

Every case in ``tests/pathologies`` is a real training run with ``nnwatch.watch`` attached (hooks,
run log, detectors in the writer thread, the guard). A sick case counts as detected when a finding
of its kind arrives at or after its onset; delay = finding step - onset. Any finding on a healthy
run, or on a sick run before its onset, is a false alarm. ``--seeds N`` repeats the whole suite
with N different data/init seeds, which shows whether the rules generalize or were tuned to one draw.

    python bench/detection.py            # three seeds, the table in docs/detectors.md
    python bench/detection.py --seeds 5  # five passes, aggregated
    python bench/detection.py --seeds 1 --only oscill  # one seed, some cases
    python bench/detection.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--seeds", type=int, default=3, help="repeat the suite with this many seeds (default 3)"
    )
    p.add_argument("--only", default="", help="run only cases whose name contains this text")
    p.add_argument("--json", default="", help="also write the per-case results to this file")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("-v", "--verbose", action="store_true", help="list every finding")
    args = p.parse_args()

    root = tempfile.mkdtemp(prefix="nnwatch-bench-")
    import torch

    torch.set_num_threads(args.threads)
    logging.getLogger("nnwatch").setLevel(logging.CRITICAL)  # findings are tallied, not printed
    import pathologies.common as common
    from pathologies import CASES, run_case, score

    cases = [c for c in CASES if args.only in c.name]
    outcomes = []
    rows = []
    t0 = time.perf_counter()
    for s in range(args.seeds):
        common.SEED_OFFSET = s
        for case in cases:
            # a fresh run root per run: two runs of one name within a second would share a directory
            os.environ["NNWATCH_RUN_DIR"] = tempfile.mkdtemp(prefix=f"{case.name}-", dir=root)
            o = run_case(case)
            outcomes.append(o)
            status = _status(o)
            rows.append(
                {
                    "seed": s,
                    "case": case.name,
                    "expect": case.expect or "healthy",
                    "status": status,
                    "onset": o.onset,
                    "detected_at": o.hit.step if o.hit else None,
                    "delay": o.delay,
                    "false_alarms": [f"{f.kind}@{f.step}" for f in o.false_alarms],
                    "other_kinds": o.other_kinds,
                    "steps": o.steps,
                    "seconds": round(o.seconds, 2),
                    "error": o.error,
                }
            )
            if args.verbose:
                print(f"[seed {s}] {case.name}: {status}")
                for f in o.findings:
                    print(f"    step {f.step}: {f.message}")
    wall = time.perf_counter() - t0
    result = score(outcomes)

    print(
        f"nnwatch detection benchmark: {len(cases)} cases x {args.seeds} seed(s), {wall:.0f} s, torch threads={args.threads}\n"
    )
    print(
        f"{'case':34s} {'expect':20s} {'result':10s} {'onset':>5s} {'found':>5s} {'delay':>5s}  also / false alarms"
    )
    for r in rows:
        extra = ", ".join(r["other_kinds"])
        if r["false_alarms"]:
            extra = (
                "FALSE: " + ", ".join(r["false_alarms"]) + ((" | also: " + extra) if extra else "")
            )
        if r["error"]:
            extra = "ERROR " + r["error"]
        seed = f"[{r['seed']}] " if args.seeds > 1 else ""
        print(
            f"{seed + r['case']:34s} {r['expect']:20s} {r['status']:10s} {_n(r['onset']):>5s} "
            f"{_n(r['detected_at']):>5s} {_n(r['delay']):>5s}  {extra}"
        )
    false_by_kind: dict[str, int] = {}
    for o in outcomes:
        for f in o.false_alarms:
            false_by_kind[f.kind] = false_by_kind.get(f.kind, 0) + 1
    print(
        f"\n{'kind':22s} {'recall':>12s} {'false alarms':>13s} {'median delay':>13s} {'max delay':>10s}"
    )
    for kind, v in result["per_kind"].items():
        print(
            f"{kind:22s} {v['detected']:>4d}/{v['cases']:<3d} {100 * v['recall']:3.0f}% "
            f"{false_by_kind.pop(kind, 0):>13d} {_n(v['median_delay']):>13s} {_n(v['max_delay']):>10s}"
        )
    for kind, n in sorted(false_by_kind.items()):  # kinds with no sick case of their own
        print(f"{kind:22s} {'-':>12s} {n:>13d} {'-':>13s} {'-':>10s}")
    healthy = [o for o in outcomes if o.case.expect is None]
    print(
        f"\nrecall (all kinds): {100 * result['recall']:.0f}%   "
        f"false alarms: {result['false_alarms']} "
        f"({result['healthy_with_false_alarms']} of {len(healthy)} healthy runs flagged)   "
        f"median delay: {_n(result['median_delay'])} steps after onset"
    )
    if result["errors"]:
        print("cases that crashed: " + ", ".join(result["errors"]))
    delays = [r["delay"] for r in rows if r["delay"] is not None]
    if delays:
        print(
            f"delays (all detections): mean {statistics.mean(delays):.1f}, p90 {_quantile(delays, 0.9)}"
        )
    cost = detector_cost([o for o in outcomes if o.case.expect is None and not o.error])
    if cost:
        print(
            f"detector cost in the writer thread: {cost[0]:.0f} us per record fed one at a time, "
            f"{cost[1]:.0f} us per record in batches of 64 (the writer drains every 0.1 s), on {cost[2]}"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"summary": result, "cases": rows, "detector_cost_us": cost}, indent=1, default=str
            )
        )
    ok = result["recall"] == 1.0 and result["false_alarms"] == 0 and not result["errors"]
    return 0 if ok else 1


def detector_cost(healthy: list) -> tuple[float, float, str] | None:
    """Time the detector pipeline on the widest healthy run's own log (4 copies back to back)."""
    import numpy as np

    from nnwatch import load_run
    from nnwatch.diagnosis.context import RunContext
    from nnwatch.diagnosis.offline import full_records
    from nnwatch.diagnosis.pipeline import Pipeline

    if not healthy:
        return None
    run = max((load_run(o.run_dir) for o in healthy), key=lambda r: r.meta.schema.num_layers)
    rec, _ = full_records(run)
    rec = np.concatenate([rec] * 4)
    rec["step"] = np.arange(len(rec))
    out = []
    for batch in (1, 64):
        pipe = Pipeline(RunContext.from_meta(run.meta))
        t = time.perf_counter()
        for i in range(0, len(rec), batch):
            pipe.feed(rec[i : i + batch])
        out.append((time.perf_counter() - t) / len(rec) * 1e6)
    where = f"{run.meta.name} ({run.meta.schema.num_layers} layers)"
    return out[0], out[1], where


def _status(o: object) -> str:
    if getattr(o, "error", None):
        return "ERROR"
    if o.case.expect is None:  # type: ignore[attr-defined]
        return "FALSE" if o.false_alarms else "quiet"  # type: ignore[attr-defined]
    if o.hit is None:  # type: ignore[attr-defined]
        return "MISSED"
    return "EARLY+hit" if o.false_alarms else "detected"  # type: ignore[attr-defined]


def _n(x: object) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:g}" if isinstance(x, float) else str(x)


def _quantile(xs: list[int], q: float) -> int:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


if __name__ == "__main__":
    raise SystemExit(main())
