#!/usr/bin/env python
"""verify.py --json output -> markdown tables (per-run evidence, per-case timing and onsets).

usage: python summarize.py verify_evidence.json [--out evidence_table.md]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics


def fmt(v, p=3):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    v = float(v)
    if not math.isfinite(v):
        return str(v)
    if v != 0 and (abs(v) < 1e-2 or abs(v) >= 1e4):
        return f"{v:.{p - 1}e}"
    return f"{v:.{p}g}"


def evidence_text(r):
    parts = [r["learn"]]
    for i, ev in enumerate(r["evidence"]):
        pre = f"[trace {i}] " if len(r["evidence"]) > 1 else ""
        bits = [f"gn x{fmt(ev.get('gn_growth'))}"]
        if ev.get("first_last_grad_ratio") is not None:
            bits.append(f"first/last grad {fmt(ev['first_last_grad_ratio'])}")
        if ev.get("dead_max_end"):
            bits.append(f"dead {fmt(ev['dead_max_end'])}")
        if ev.get("sat_min_end") is not None:
            bits.append(f"sat {fmt(ev['sat_min_end'])}")
        if ev.get("nonfinite_steps"):
            bits.append(f"non-finite steps {ev['nonfinite_steps']}")
        if "scale_min" in ev:
            bits.append(f"scale {fmt(ev['scale_max'])}->{fmt(ev['scale_min'])}, "
                        f"skipped {ev['skipped_steps']}")
        if ev.get("clip_ratio_median") is not None:
            bits.append(f"clip ratio med {fmt(ev['clip_ratio_median'])}")
        if ev.get("zero_grad_params"):
            zp = ev["zero_grad_params"]
            bits.append(f"zero-grad params {len(zp)} ({zp[0]}{', ...' if len(zp) > 1 else ''})")
        u = ev.get("update", {})
        if u.get("frac_unchanged_with_grad") is not None:
            bits.append(f"unchanged-with-grad {fmt(u['frac_unchanged_with_grad'])}")
        if u.get("median_update_ratio") is not None:
            bits.append(f"upd/weight med {fmt(u['median_update_ratio'])}")
        if u.get("weight_norm_final_over_initial") is not None:
            bits.append(f"|w| x{fmt(u['weight_norm_final_over_initial'])}")
        if u.get("frac_steps_lr_zero"):
            bits.append(f"lr=0 on {fmt(u['frac_steps_lr_zero'])} of steps")
        if u.get("grad_not_in_optimizer"):
            bits.append(f"grad but not optimized: {len(u['grad_not_in_optimizer'])}")
        if u.get("optimizer_param_without_grad"):
            bits.append(f"optimized without grad: {len(u['optimizer_param_without_grad'])}")
        lg = u.get("least_grad_param")
        if lg and lg[0] < 0.95:
            bits.append(f"{lg[1]} has a grad on {fmt(lg[0])} of its trainable steps")
        sr = u.get("smallest_update_ratio_param")
        if sr and sr[0] < 1e-4:
            bits.append(f"smallest median upd/weight {fmt(sr[0])} ({sr[1]})")
        if u.get("moved_without_grad"):
            mv = u["moved_without_grad"]
            bits.append(f"moved without a grad: {len(mv)} params ({mv[0]}, ...)")
        parts.append(pre + ", ".join(bits))
    if r.get("origin"):
        o = r["origin"]
        parts.append(f"first non-finite op {o['op']} ({o['phase']}) at {o['step']}")
    return "; ".join(parts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json_path")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    with open(a.json_path) as fh:
        res = json.load(fh)["results"]
    lines = ["| case | seed | verified | flags raised (step) | update-level evidence | "
             "evidence | cpu s |", "|---|---|---|---|---|---|---|"]
    per_case = {}
    for key in sorted(res, key=lambda k: (res[k]["case"], res[k]["control"], res[k]["seed"])):
        r = res[key]
        label = r["case"] + ("[fixed]" if r["control"] else "")
        fired = ", ".join(f"{k} ({v})" for k, v in sorted(r["fired"].items(), key=lambda kv: kv[1]))
        lines.append(f"| {label} | {r['seed']} | {'yes' if r['verified'] else 'NO'} | "
                     f"{fired or 'none'} | {', '.join(r['update_rules']) or '-'} | "
                     f"{evidence_text(r)} | {r.get('cpu_seconds', 0):.1f} |")
        pc = per_case.setdefault(r["case"], dict(cpu=[], wall=[], onsets={}, ok=0, n=0))
        pc["cpu"].append(r.get("cpu_seconds", 0.0))
        pc["wall"].append(r["seconds"])
        pc["ok"] += bool(r["verified"])
        pc["n"] += 1
        if not r["control"] and r["onset"] is not None:
            pc["onsets"][r["seed"]] = r["onset"]
    total = len(res)
    ok = sum(bool(r["verified"]) for r in res.values())
    head = [f"{ok}/{total} runs verified.", "",
            "| case | runs verified | onset s0/s1/s2 | cpu s (median, max) | wall s (max) |",
            "|---|---|---|---|---|"]
    for c in sorted(per_case):
        pc = per_case[c]
        ons = " / ".join(str(pc["onsets"].get(s, "-")) for s in (0, 1, 2))
        head.append(f"| {c} | {pc['ok']}/{pc['n']} | {ons} | "
                    f"{statistics.median(pc['cpu']):.1f}, {max(pc['cpu']):.1f} | "
                    f"{max(pc['wall']):.1f} |")
    text = "\n".join(head + ["", "## Per-run evidence", ""] + lines) + "\n"
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text)
    print(text)


if __name__ == "__main__":
    main()
