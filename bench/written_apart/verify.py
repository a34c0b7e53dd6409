#!/usr/bin/env python
"""Plain-torch verification of the sealed cases (no monitor involved).

Runs each case (standard loop for build() cases, the case's own loop for run() cases, with a
no-op watch), collects per-step evidence with cases._common.Tracer and checks fixed rules that
the labels must satisfy. A case verifies when every `expected` label's rule holds and no rule
outside expected+acceptable fires (for healthy: the healthy rule holds).

usage: python verify.py [case ...] [--seeds 0,1,2] [--controls] [--json out.json]
"""
import argparse
import importlib
import inspect
import json
import math
import os
import pkgutil
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cases._common import Tracer, no_watch  # noqa: E402

PATHOLOGIES = ["exploding_gradients", "vanishing_gradients", "dead_relu", "nan_or_inf", "loss_stalled",
               "bad_initial_loss", "amp_scale_collapse", "oscillating_loss", "loss_diverging"]


def load_case(name):
    return importlib.import_module(f"cases.{name}")


def all_case_names():
    import cases
    return sorted(m.name for m in pkgutil.iter_modules(cases.__path__) if not m.name.startswith("_"))


def has_control(mod):
    fn = mod.run if hasattr(mod, "run") else mod.build
    return "bug" in inspect.signature(fn).parameters and mod.CASE.get("control", True)


def standard_loop(spec, watch=None, name=None):
    """The standard loop; with watch (a factory) it also attaches it. Returns the trace."""
    model, opt, loss_fn = spec["model"], spec["optimizer"], spec["loss_fn"]
    batches, steps = spec["batches"], int(spec["steps"])
    scaler, autocast, clip = spec.get("scaler"), spec.get("autocast"), spec.get("clip")
    scheduler, zero_grad = spec.get("scheduler"), spec.get("zero_grad", True)
    tr = Tracer(model)
    w = (watch or no_watch)(model, opt, scaler=scaler, num_classes=spec.get("num_classes"), name=name)
    model.train()
    try:
        for step in range(steps):
            x, y = batches(step)
            if zero_grad:
                opt.zero_grad(set_to_none=True)
            if autocast:
                with torch.autocast(**autocast):
                    loss = loss_fn(model(x), y)
            else:
                loss = loss_fn(model(x), y)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
            else:
                loss.backward()
            gn = tr.grad_norm()
            clipped = None
            if clip is not None:
                clipped = float(gn[0]) > clip
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            lr = opt.param_groups[0]["lr"]
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            if scheduler is not None:
                scheduler.step()
            tr.record(loss, lr=lr, scale=None if scaler is None else float(scaler.get_scale()), gn_pg=gn,
                      clipped=clipped)
            w.step(loss, batch=(x, y))
    finally:
        w.close()
    t = tr.close()
    t["num_classes"] = spec.get("num_classes")
    return t


def run_case(name, seed, bug=True):
    mod = load_case(name)
    kw = {} if bug else {"bug": False}
    if hasattr(mod, "run"):
        out = mod.run(seed, watch=no_watch, **kw)
    else:
        out = standard_loop(mod.build(seed, **kw))
    return out


# ----------------------------------------------------------------------------- evidence
def _fin(xs):
    return [v for v in xs if v is not None and math.isfinite(v)]


def _first(pred, xs):
    for i, v in enumerate(xs):
        if pred(v):
            return i
    return None


def _smooth(xs, w=9):
    h = w // 2
    return [statistics.median(xs[max(0, i - h):i + h + 1]) for i in range(len(xs))]


def evidence(t):
    K = t.get("num_classes")
    lnK = math.log(K) if K else None
    loss, gn = t["loss"], t["grad_norm"]
    n = len(loss)
    ev = {}
    fl = _fin(loss)
    allfin = len(fl) == n
    k10 = max(1, n // 10)
    ev["loss0"] = loss[0]
    ev["loss_head"] = statistics.mean(_fin(loss[:k10]) or [float("nan")])
    ev["loss_tail"] = statistics.mean(_fin(loss[-k10:]) or [float("nan")])
    ev["loss_first5"] = statistics.mean(_fin(loss[:5]) or [float("nan")])
    ev["loss_min"] = min(fl) if fl else float("nan")
    ev["loss_max"] = max(fl) if fl else float("nan")
    g0 = statistics.median(_fin(gn[:5]) or [float("nan")])
    ev["gn0"] = g0
    fg = _fin(gn)
    ev["gn_max"] = max(fg) if fg else float("nan")
    ev["gn_med"] = statistics.median(fg) if fg else float("nan")
    scale = [s for s in t["scale"] if s is not None]
    if scale:
        ev["scale0"] = scale[0]
        ev["scale_min"] = min(scale)
        ev["scale_end"] = scale[-1]
        ev["skipped"] = sum(t["nonfinite_grad"])
        ev["scale_lt1_step"] = _first(lambda v: v is not None and v < 1.0, t["scale"])
    lrs = [v for v in t["lr"] if v is not None]
    if lrs:
        ev["lr_first"], ev["lr_max"], ev["lr_end"] = lrs[0], max(lrs), lrs[-1]
    clipped = [c for c in t["extra"].get("clipped", []) if c is not None]
    if clipped:
        ev["clip_frac"] = sum(clipped) / len(clipped)

    # nan_or_inf (with a GradScaler only the loss and the parameters count)
    if scale:
        nf = [a or c for a, c in zip(t["nonfinite_loss"], t["nonfinite_param"])]
    else:
        nf = [a or b or c for a, b, c in zip(t["nonfinite_loss"], t["nonfinite_grad"], t["nonfinite_param"])]
    ev["nonfinite_step"] = _first(bool, nf)
    ev["nonfinite_loss_step"] = _first(bool, t["nonfinite_loss"])
    ev["nonfinite_grad_step"] = _first(bool, t["nonfinite_grad"])
    nonfinite = ev["nonfinite_step"] is not None

    # exploding: a finite grad norm >= 100x the median of steps 0-4 (not under a GradScaler)
    ev["explode_step"] = _first(lambda v: v is not None and math.isfinite(v) and g0 > 0 and v >= 100 * g0, gn)
    ev["gn_growth"] = ev["gn_max"] / g0 if g0 and g0 > 0 else float("nan")
    exploding = ev["explode_step"] is not None and not scale

    # vanishing: median(first weight grad) / median(last weight grad) < 1e-4
    ws = []
    for nme in t["param_names"]:
        s = t["param_grad"].get(nme, [])
        if nme.split(".")[-1].startswith("weight") and any(v is not None for v in s):
            ws.append(_fin(s))
    vr = None
    if len(ws) >= 2 and ws[0] and ws[-1] and statistics.median(ws[-1]) > 0:
        vr = statistics.median(ws[0]) / statistics.median(ws[-1])
    ev["first_last_grad_ratio"] = vr
    vanishing = vr is not None and vr < 1e-4

    # dead_relu: a ReLU module with >= 90% dead units (per unit, over the batch), mean of last 10%
    dead_end = {k: statistics.mean(v[-max(1, len(v) // 10):]) for k, v in t["dead"].items() if v}
    ev["dead_max_end"] = max(dead_end.values()) if dead_end else 0.0
    ev["dead_max_any"] = max((max(v) for v in t["dead"].values() if v), default=0.0)
    ev["dead90_step"] = min((s for s in (_first(lambda d: d >= 0.9, v) for v in t["dead"].values())
                             if s is not None), default=None)
    dead = ev["dead_max_end"] >= 0.9
    zero_mean = {k: statistics.mean(v) for k, v in t.get("zero", {}).items() if v}
    ev["zero_frac_max"] = max(zero_mean.values()) if zero_mean else None
    if lnK:
        sm10 = [statistics.mean(loss[max(0, i - 9):i + 1]) for i in range(n)] if allfin else []
        ev["steps_at_lnK"] = sum(1 for v in sm10 if abs(v - lnK) <= 0.03 * lnK)

    # loss_stalled: after the first 10%, every loss within 2% of ln K; else a flat loss
    stalled = False
    if lnK and fl:
        after = loss[n // 10:]
        fa = _fin(after)
        ev["max_rel_dev_lnK"] = max(abs(v - lnK) / lnK for v in fa) if fa else float("nan")
        stalled = len(fa) == len(after) and ev["max_rel_dev_lnK"] <= 0.02
    if allfin and not stalled:
        hd = ev["loss_head"]
        stalled = abs(ev["loss_tail"] - hd) <= 0.02 * abs(hd) and ev["loss_min"] >= 0.95 * hd - 1e-12
    ev["stalled"] = stalled

    # bad_initial_loss
    bad_init = bool(lnK) and (not math.isfinite(loss[0]) or loss[0] > 2 * lnK or loss[0] < 0.5 * lnK)

    # oscillating: 2nd half, >= 80% sign flips, mean |d| >= 25% of mean loss, no downward trend
    osc = False
    half = loss[n // 2:]
    if len(half) > 8 and all(math.isfinite(v) for v in half):
        d = [b - a for a, b in zip(half, half[1:])]
        flips = sum(1 for a, b in zip(d, d[1:]) if a * b < 0) / max(1, len(d) - 1)
        amp = statistics.mean(abs(x) for x in d) / (abs(statistics.mean(half)) + 1e-12)
        q = len(half) // 4
        trend = statistics.mean(half[-q:]) / (statistics.mean(half[:q]) + 1e-12)
        ev["osc_flip_frac"], ev["osc_rel_amp"], ev["osc_trend"] = flips, amp, trend
        osc = flips >= 0.8 and amp >= 0.25 and trend > 0.8

    # loss_diverging: on the finite prefix, the smoothed (9-step median) loss ends >= 5x above its best
    # level (min of the smoothed loss and of loss[0]) and above loss[0], or climbs >= 10x above its
    # best and >= 2x above loss[0]
    div = False
    pref = loss[:ev["nonfinite_loss_step"]] if ev["nonfinite_loss_step"] is not None else loss
    if len(pref) >= 20:
        sm = _smooth(pref)
        best_i = min(range(len(sm)), key=lambda i: sm[i])
        best = sm[best_i]
        start = pref[0]
        if start < best:  # the initial loss is a level the run has been at (the smoothing hides a jump at step 1)
            best_i, best = 0, start
        peak_after = max(sm[best_i:])
        end = statistics.mean(sm[-max(1, len(sm) // 10):])
        ev["div_best"], ev["div_end"], ev["div_peak_after_best"] = best, end, peak_after
        if best > 0:
            div = (end >= 5 * best and end >= start) or (peak_after >= 10 * best and peak_after >= 2 * start)
        else:
            div = end > start + 1.0
        ev["div_step"] = _first(lambda v: v >= 10 * best and v >= 2 * start, sm[best_i:]) if best > 0 else None
        if ev["div_step"] is not None:
            ev["div_step"] += best_i

    amp_collapse = bool(scale) and min(scale) < 1.0
    learns = allfin and ev["loss_tail"] < 0.5 * ev["loss_first5"]
    ev["learns"] = bool(learns)
    healthy = bool(learns) and not (nonfinite or exploding or dead or amp_collapse or osc or bad_init
                                    or vanishing or div or stalled)
    ev["flags"] = dict(exploding_gradients=exploding, vanishing_gradients=vanishing, dead_relu=dead,
                       nan_or_inf=nonfinite, loss_stalled=stalled, bad_initial_loss=bad_init,
                       amp_scale_collapse=amp_collapse, oscillating_loss=osc, loss_diverging=div,
                       healthy=healthy)
    return ev


def gan_evidence(out):
    """GAN rule: both nets finite, D's loss never collapses to ~0 (tail mean > 0.1), G's loss
    stays bounded (tail mean < 8), samples do not collapse (tail generated-sample std across the
    batch >= 40% of the data's), and D's real/fake accuracy is not pinned at 100%."""
    G, D = out["G"], out["D"]
    eg, ed = evidence(G), evidence(D)
    k = max(1, len(D["loss"]) // 10)
    gstd = _fin(out["gen_std"][-k:])
    ev = dict(g_loss0=G["loss"][0], g_tail=eg["loss_tail"], d_loss0=D["loss"][0], d_tail=ed["loss_tail"],
              d_min=ed["loss_min"], gen_std_tail=statistics.mean(gstd) if gstd else float("nan"),
              data_std=out["data_std"], d_acc_tail=statistics.mean(out["d_acc"][-k:]),
              g_gn_growth=eg["gn_growth"], d_gn_growth=ed["gn_growth"], g_dead=eg["dead_max_end"],
              d_dead=ed["dead_max_end"])
    fin = eg["nonfinite_step"] is None and ed["nonfinite_step"] is None
    healthy = (fin and ed["loss_tail"] > 0.1 and eg["loss_tail"] < 8 and ev["gen_std_tail"] >= 0.4 * out["data_std"]
               and ev["d_acc_tail"] < 0.99 and not eg["flags"]["dead_relu"] and not ed["flags"]["dead_relu"])
    flags = {k: False for k in PATHOLOGIES}
    flags["nan_or_inf"] = not fin
    flags["healthy"] = healthy
    ev["flags"] = flags
    return ev


def fmt(v, p=3):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return str(v)
    v = float(v)
    if not math.isfinite(v):
        return str(v)
    if v != 0 and (abs(v) < 1e-2 or abs(v) >= 1e4):
        return f"{v:.{p - 1}e}"
    return f"{v:.{p}g}"


def check(mod, ev, bug=True):
    c = mod.CASE
    exp = c["expected"] if bug else ["healthy"]
    acc = c.get("acceptable", []) if bug else []
    fl = ev["flags"]
    ok = all(fl[e] for e in exp)
    extra = [k for k in PATHOLOGIES if fl[k] and k not in exp and k not in acc]
    if "healthy" in exp:
        extra = [k for k in extra]  # healthy already requires no symptom
    return ok and not extra, extra


def summary_line(name, ev):
    keys = ["loss0", "loss_tail", "loss_min", "loss_max", "gn0", "gn_growth", "dead_max_end", "first_last_grad_ratio",
            "nonfinite_step", "explode_step", "dead90_step", "div_step", "scale_min", "scale_lt1_step", "skipped", "lr_first", "lr_end",
            "clip_frac", "zero_frac_max", "steps_at_lnK", "osc_flip_frac", "osc_rel_amp", "max_rel_dev_lnK", "g_loss0", "g_tail", "d_loss0", "d_tail", "gen_std_tail",
            "data_std", "d_acc_tail", "g_gn_growth", "d_gn_growth"]
    parts = [f"{k}={fmt(ev[k])}" for k in keys if k in ev and ev[k] is not None]
    on = [k for k, v in ev["flags"].items() if v]
    return f"{name:<36} flags={'+'.join(on) or '-'} " + " ".join(parts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="*")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--controls", action="store_true")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    torch.set_num_threads(1)
    names = a.cases or all_case_names()
    nfail, rows = 0, []
    for seed in [int(s) for s in a.seeds.split(",")]:
        for name in names:
            mod = load_case(name)
            variants = [True]
            if a.controls and "healthy" not in mod.CASE["expected"] and has_control(mod):
                variants.append(False)
            for bug in variants:
                t0 = time.time()
                out = run_case(name, seed, bug)
                dt = time.time() - t0
                ev = gan_evidence(out) if "G" in out else evidence(out)
                ok, extra = check(mod, ev, bug)
                nfail += not ok
                label = name if bug else name + "[fixed]"
                exp = mod.CASE["expected"] if bug else ["healthy"]
                print(f"[seed {seed}] {'OK  ' if ok else 'FAIL'} exp={'+'.join(exp)} "
                      f"{summary_line(label, ev)} {'extra=' + '+'.join(extra) if extra else ''} {dt:.1f}s",
                      flush=True)
                rows.append(dict(seed=seed, case=label, ok=ok, extra=extra, seconds=dt,
                                 evidence={k: v for k, v in ev.items()}))
    print("ALL VERIFIED" if nfail == 0 else f"{nfail} case-runs did not verify")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1, default=str)
    return 0 if nfail == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
