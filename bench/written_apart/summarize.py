#!/usr/bin/env python
"""verify.py --json output -> markdown evidence tables for README.md.

usage: python summarize.py verify_results.json
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from verify import fmt, load_case  # noqa: E402


def g(ev, k):
    v = ev.get(k)
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            pass
    return v


def f(v, p=3):
    return fmt(v, p)


def cell(label, ev):
    if label == "exploding_gradients":
        return f"grad ×{f(g(ev, 'gn_growth'), 2)} (≥100× @{f(g(ev, 'explode_step'))})"
    if label == "nan_or_inf":
        return f"non-finite @{f(g(ev, 'nonfinite_step'))}"
    if label == "dead_relu":
        return f"dead {f(g(ev, 'dead_max_end'), 2)} (≥90% @{f(g(ev, 'dead90_step'))})"
    if label == "loss_stalled":
        s = f"loss {f(g(ev, 'loss0'))}→{f(g(ev, 'loss_tail'))}"
        if g(ev, "max_rel_dev_lnK") is not None:
            s += f", max dev from lnK {f(100 * g(ev, 'max_rel_dev_lnK'), 2)}%"
        return s
    if label == "bad_initial_loss":
        return f"loss[0] {f(g(ev, 'loss0'))}"
    if label == "amp_scale_collapse":
        return f"scale min {f(g(ev, 'scale_min'))} (<1 @{f(g(ev, 'scale_lt1_step'))}), {g(ev, 'skipped')} skipped"
    if label == "vanishing_gradients":
        return f"g1/gL {f(g(ev, 'first_last_grad_ratio'))}"
    if label == "oscillating_loss":
        return f"flips {f(g(ev, 'osc_flip_frac'), 2)}, amp {f(g(ev, 'osc_rel_amp'), 2)}"
    if label == "loss_diverging":
        return (f"best {f(g(ev, 'div_best'))} → end {f(g(ev, 'div_end'))}, max {f(g(ev, 'loss_max'))}"
                + (f", 10× @{g(ev, 'div_step')}" if g(ev, 'div_step') is not None else ""))
    return ""


def healthy_cell(ev):
    if "g_tail" in ev:
        return (f"G {f(g(ev, 'g_loss0'))}→{f(g(ev, 'g_tail'))}, D {f(g(ev, 'd_loss0'))}→{f(g(ev, 'd_tail'))}, "
                f"sample std {f(g(ev, 'gen_std_tail'), 2)}/{f(g(ev, 'data_std'), 2)}, D acc {f(g(ev, 'd_acc_tail'), 2)}")
    s = f"loss {f(g(ev, 'loss_first5'))}→{f(g(ev, 'loss_tail'))}, grad ×{f(g(ev, 'gn_growth'), 2)}"
    if g(ev, "dead_max_end"):
        s += f", dead {f(g(ev, 'dead_max_end'), 2)}"
    if g(ev, "zero_frac_max") is not None:
        s += f", zeros {f(g(ev, 'zero_frac_max'), 2)}"
    if g(ev, "clip_frac") is not None:
        s += f", clip fires {f(100 * g(ev, 'clip_frac'), 2)}%"
    if g(ev, "scale_min") is not None:
        s += f", scale min {f(g(ev, 'scale_min'))}, {g(ev, 'skipped')} skipped"
    if g(ev, "steps_at_lnK"):
        s += f", {g(ev, 'steps_at_lnK')} steps at lnK"
    if g(ev, "lr_first") is not None and g(ev, "lr_end") is not None and g(ev, "lr_first") != g(ev, "lr_end"):
        s += f", lr {f(g(ev, 'lr_first'))}→{f(g(ev, 'lr_end'))}"
    return s


def main():
    rows = json.load(open(sys.argv[1]))
    by = {}
    for r in rows:
        by.setdefault(r["case"], {})[r["seed"]] = r
    print("| case | expected (acceptable) | seed 0 | seed 1 | seed 2 | also flagged (all acceptable) |")
    print("|---|---|---|---|---|---|")
    ctrl = []
    for case in sorted(by):
        seeds = by[case]
        if case.endswith("[fixed]"):
            ctrl.append(case)
            continue
        c = load_case(case).CASE
        exp = c["expected"]
        acc = c.get("acceptable", [])
        cells = []
        also = set()
        for s in (0, 1, 2):
            r = seeds.get(s)
            if r is None:
                cells.append("-")
                continue
            ev = r["evidence"]
            ok = "✓ " if r["ok"] else "✗ "
            if "healthy" in exp:
                cells.append(ok + healthy_cell(ev))
            else:
                cells.append(ok + "; ".join(cell(lab, ev) for lab in exp))
            also |= {k for k, v in ev["flags"].items() if v and k not in exp and k != "healthy"}
        lab = ", ".join(exp) + (f" ({', '.join(acc)})" if acc else "")
        print(f"| {case} | {lab} | " + " | ".join(cells) + f" | {', '.join(sorted(also)) or '–'} |")
    if ctrl:
        print()
        print("| fixed control | seed 0 | seed 1 | seed 2 |")
        print("|---|---|---|---|")
        for case in ctrl:
            cells = []
            for s in (0, 1, 2):
                r = by[case].get(s)
                cells.append("-" if r is None else ("✓ " if r["ok"] else "✗ ") + healthy_cell(r["evidence"]))
            print(f"| {case} | " + " | ".join(cells) + " |")
    n = len(rows)
    print(f"\n{sum(r['ok'] for r in rows)}/{n} runs verified; seconds per run: max "
          f"{max(r['seconds'] for r in rows):.1f}, total {sum(r['seconds'] for r in rows):.0f}")


if __name__ == "__main__":
    main()
