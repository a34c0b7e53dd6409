"""verify.py --json output -> markdown table of per-seed evidence (used for README.md)."""
import json
import sys


def f(v, p=3):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if v != v or v in (float("inf"), float("-inf")):
        return str(v)
    return f"{v:.{p - 1}e}" if v != 0 and (abs(v) < 1e-2 or abs(v) >= 1e4) else f"{v:.{p}g}"


def line(row):
    ex = row["extra"]
    parts = []
    for nm, e in row["evidence"].items():
        s = []
        if len(row["evidence"]) > 1:
            s.append(f"[{nm}]")
        s.append(f"loss {f(e['loss0'])}->{f(e['loss_tail'])} (first5 {f(e['loss_first5'])})")
        s.append(f"gn x{f(e['gn_growth'])}")
        if e.get("dead_max_end"):
            s.append(f"dead {f(e['dead_max_end'], 2)}" + (f" (>=90% at {e['dead90_step']})" if e.get('dead90_step') is not None else ""))
        if e.get("zero_frac_mean", 0) > 0.3:
            s.append(f"zeros {f(e['zero_frac_mean'], 2)}")
        if e.get("clip_frac") is not None:
            s.append(f"clip active {f(e['clip_frac'], 2)}")
        if e.get("first_nonfinite_step") is not None:
            s.append(f"non-finite at {e['first_nonfinite_step']} (non-finite loss on {e['nonfinite_loss_steps']} steps)")
        if e.get("scale_min") is not None:
            s.append(f"scale min {f(e['scale_min'])}, skipped {e['skipped_steps']}")
        if row["flags"].get("loss_stalled") and not row["case"].startswith("healthy"):
            s.append(f"tail/head {f(e['stall_tail_over_head'], 4)}, min/head {f(e['loss_min'] / e['loss_head'], 4)}")
            if e.get("max_rel_dev_lnK") is not None:
                s.append(f"max dev from lnK {f(100 * e['max_rel_dev_lnK'], 3)}%")
        if e.get("diverge_step") is not None:
            s.append(f"diverging at {e['diverge_step']} ({e['finite_steps_after_diverge']} finite steps after)")
        if e.get("explode_step") is not None:
            s.append(f">=100x grad at {e['explode_step']}")
        if "siamese" in row["case"] and e.get("plateau_end") is not None:
            s.append(f"plateau ends at {e['plateau_end']}")
        parts.append(", ".join(s))
    if "gan" in ex:
        g = ex["gan"]
        parts.append(f"GAN: {g['covered']}/8 modes, spread {f(g['spread_ratio'])}, energy {f(g['energy_start'])}->"
                     f"{f(g['energy_tail'])}, D not winning {g['d_not_winning']}")
    for k in ("watched_loss0", "lr_below_1e6_at", "val_acc_final"):
        if k in ex:
            parts.append(f"{k} {f(ex[k])}")
    return "; ".join(parts)


rows = json.load(open(sys.argv[1]))
print("| case | seed | verified | flags raised | evidence |")
print("|---|---|---|---|---|")
for r in sorted(rows, key=lambda r: (r["case"], r["seed"])):
    fl = ",".join(k for k, v in r["flags"].items() if v)
    print(f"| {r['case']} | {r['seed']} | {'yes' if r['ok'] else 'NO'} | {fl} | {line(r)} |")
