"""Verify every case's labels with plain PyTorch (no nnwatch). Objective per-step evidence rules.

    python verify.py [--seeds 0,1,2] [--cases a,b] [--controls] [--json out.json]

build() cases run in the standard loop (same as run_nnwatch.py) with a tracer; run() cases get a
tracing stand-in for `watch` that records, at every w.step: loss, global grad norm, per-parameter
grad norms, per-unit dead fraction of every nn.ReLU (a unit is dead when it is <= 0 for every input
of the batch, last forward before the step), non-finite flags, GradScaler scale, lr.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
LABELS = ["exploding_gradients", "vanishing_gradients", "dead_relu", "nan_or_inf", "loss_stalled",
          "bad_initial_loss", "amp_scale_collapse", "oscillating_loss", "loss_diverging", "healthy"]


def all_case_names():
    return sorted(f[:-3] for f in os.listdir(os.path.join(HERE, "cases"))
                  if f.endswith(".py") and not f.startswith("_"))


def load_case(name):
    return importlib.import_module("cases." + name)


def _isfin(t):
    return bool(torch.isfinite(t).all())


class TraceWatch:
    """Records per-step evidence; API-compatible with the subset of nnwatch.watch the cases use."""
    created = []

    def __init__(self, model, optimizer, scaler=None, *, num_classes=None, name=None):
        self.model, self.opt, self.scaler = model, optimizer, scaler
        self.name = name or f"w{len(TraceWatch.created)}"
        self.num_classes = num_classes
        self.findings = []
        self.pre_clip = None
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.tr = dict(name=self.name, num_classes=num_classes, loss=[], gn=[], clipped_gn=[],
                       pgrad={n: [] for n, _ in self.params}, dead={}, zero_frac={},
                       nf_loss=[], nf_grad=[], nf_param=[], scale=[], lr=[])
        self._dead_now, self._zero_now = {}, {}
        self.handles = []
        for n, m in model.named_modules():
            if isinstance(m, nn.ReLU):
                self.handles.append(m.register_forward_hook(self._hook(n)))
        TraceWatch.created.append(self)

    def _hook(self, name):
        def hook(mod, inp, out):
            with torch.no_grad():
                t = out.detach().float()
                if not _isfin(t) or t.numel() == 0:
                    return
                fdim = 1 if t.dim() in (2, 4) else t.dim() - 1
                alive = (t > 0).transpose(0, fdim).reshape(t.shape[fdim], -1).any(1)
                self._dead_now[name] = 1.0 - float(alive.float().mean())
                self._zero_now[name] = float((t == 0).float().mean())
        return hook

    def step(self, loss, batch=None):
        tr = self.tr
        lv = float(loss.detach().float()) if torch.is_tensor(loss) else float(loss)
        tr["loss"].append(lv)
        tr["nf_loss"].append(not math.isfinite(lv))
        sq, nfg = 0.0, False
        for n, p in self.params:
            if p.grad is None:
                tr["pgrad"][n].append(None)
                continue
            v = float(p.grad.detach().float().norm())
            tr["pgrad"][n].append(v)
            if not math.isfinite(v):
                nfg = True
            else:
                sq += v * v
        cur = math.sqrt(sq) if not nfg else float("inf")
        tr["clipped_gn"].append(cur)
        tr["gn"].append(self.pre_clip if self.pre_clip is not None else cur)
        if self.pre_clip is not None and not math.isfinite(self.pre_clip):
            nfg = True
        self.pre_clip = None
        tr["nf_grad"].append(nfg)
        tr["nf_param"].append(not all(_isfin(p.detach()) for _, p in self.params))
        for k, v in self._dead_now.items():
            tr["dead"].setdefault(k, []).append(v)
            tr["zero_frac"].setdefault(k, []).append(self._zero_now[k])
        if self.scaler is not None:
            tr["scale"].append(float(self.scaler.get_scale()))
        tr["lr"].append(float(self.opt.param_groups[0]["lr"]))

    def close(self):
        for h in self.handles:
            h.remove()
        self.handles = []

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


def _gnorm(params):
    sq = 0.0
    for p in params:
        if p.grad is not None:
            v = float(p.grad.detach().float().norm())
            if not math.isfinite(v):
                return float("inf")
            sq += v * v
    return math.sqrt(sq)


def standard_loop(spec, w):
    model, opt, loss_fn = spec["model"], spec["optimizer"], spec["loss_fn"]
    batches, steps = spec["batches"], int(spec["steps"])
    scaler, autocast, clip = spec.get("scaler"), spec.get("autocast"), spec.get("clip")
    scheduler, zero_grad = spec.get("scheduler"), spec.get("zero_grad", True)
    model.train()
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
        w.pre_clip = _gnorm(model.parameters())
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        if scheduler is not None:
            scheduler.step()
        w.step(loss, batch=(x, y))
    return {}


def run_case(name, seed, bug=True):
    torch.set_num_threads(1)
    mod = load_case(name)
    TraceWatch.created = []
    t0 = time.time()
    kw = {} if bug else {"bug": False}
    if hasattr(mod, "run"):
        extra = mod.run(seed, bug, TraceWatch) or {}
    else:
        spec = mod.build(seed, **kw)
        w = TraceWatch(spec["model"], spec["optimizer"], spec.get("scaler"),
                       num_classes=spec.get("num_classes"), name=name)
        w.tr["clip"] = spec.get("clip")
        extra = standard_loop(spec, w)
        w.close()
    secs = time.time() - t0
    traces = [w.tr for w in TraceWatch.created]
    return traces, extra, secs


# ----------------------------------------------------------------------------------------------
def _fin(xs):
    return [x for x in xs if x is not None and math.isfinite(x)]


def _first(pred, xs):
    for i, v in enumerate(xs):
        if pred(v):
            return i
    return None


def _ma(xs, k):
    out, s = [], 0.0
    for i, v in enumerate(xs):
        s += v
        if i >= k:
            s -= xs[i - k]
        out.append(s / min(i + 1, k))
    return out


def evidence(tr, loss_override=None):
    K = tr["num_classes"]
    lnK = math.log(K) if K else None
    loss = list(loss_override) if loss_override is not None else tr["loss"]
    gn = tr["gn"]
    n = len(loss)
    ev = {}
    fl = _fin(loss)
    ev["loss0"] = loss[0]
    ev["lnK"] = lnK
    head, tail = _fin(loss[:max(1, n // 10)]), _fin(loss[-max(1, n // 10):])
    ev["loss_head"] = statistics.mean(head) if head else float("nan")
    ev["loss_tail"] = statistics.mean(tail) if tail else float("nan")
    ev["loss_min"] = min(fl) if fl else float("nan")
    f5 = _fin(loss[:5])
    ev["loss_first5"] = statistics.mean(f5) if f5 else float("nan")
    g0 = statistics.median(_fin(gn[:5]) or [float("nan")])
    ev["gn0"] = g0
    fgn = _fin(gn)
    ev["gn_max"] = max(fgn) if fgn else float("nan")
    ev["gn_med"] = statistics.median(fgn) if fgn else float("nan")
    ev["gn_growth"] = ev["gn_max"] / g0 if g0 and g0 > 0 else float("nan")
    if tr.get("clip"):
        ev["clip_frac"] = sum(1 for v in gn if math.isfinite(v) and v > tr["clip"]) / n

    scale = tr["scale"]
    nfl = [math.isnan(v) or math.isinf(v) for v in loss]
    if scale:
        rows = [a or c for a, c in zip(nfl, tr["nf_param"])]
        ev["scale_min"], ev["scale_end"] = min(scale), scale[-1]
        ev["skipped_steps"] = sum(tr["nf_grad"])
        ev["scale_lt1_step"] = _first(lambda s: s < 1.0, scale)
    else:
        rows = [a or b or c for a, b, c in zip(nfl, tr["nf_grad"], tr["nf_param"])]
    ev["first_nonfinite_step"] = _first(bool, rows)
    ev["nonfinite_loss_steps"] = sum(nfl)
    nonfinite = ev["first_nonfinite_step"] is not None
    amp_collapse = bool(scale) and min(scale) < 1.0

    expl = _first(lambda v: math.isfinite(v) and g0 > 0 and v >= 100 * g0, gn)
    ev["explode_step"] = expl
    exploding = expl is not None and not scale

    ws = []
    for pn, s in tr["pgrad"].items():
        if all(v is None for v in s):
            continue
        if "weight" in pn.split(".")[-1] or pn.split(".")[-1].startswith("w"):
            ws.append((pn, _fin([v for v in s if v is not None])))
    vr = None
    if len(ws) >= 2 and ws[0][1] and ws[-1][1] and statistics.median(ws[-1][1]) > 0:
        vr = statistics.median(ws[0][1]) / statistics.median(ws[-1][1])
    ev["first_last_grad_ratio"] = vr
    vanishing = vr is not None and vr < 1e-4

    dead_end = {k: statistics.mean(v[-max(1, len(v) // 10):]) for k, v in tr["dead"].items() if v}
    ev["dead_max_end"] = max(dead_end.values()) if dead_end else 0.0
    ev["dead_by_layer_end"] = dead_end
    ds = [_first(lambda d: d >= 0.9, v) for v in tr["dead"].values()]
    ds = [s for s in ds if s is not None]
    ev["dead90_step"] = min(ds) if ds else None
    zf = {k: statistics.mean(v) for k, v in tr["zero_frac"].items() if v}
    ev["zero_frac_mean"] = max(zf.values()) if zf else 0.0
    dead = ev["dead_max_end"] >= 0.9

    stalled = False
    if lnK and fl:
        after = _fin(loss[n // 10:])
        ev["max_rel_dev_lnK"] = max(abs(v - lnK) / lnK for v in after) if after else float("nan")
        stalled = bool(after) and len(after) == len(loss[n // 10:]) and ev["max_rel_dev_lnK"] <= 0.02
    if fl and not stalled and len(fl) == n:
        stalled = (abs(ev["loss_tail"] - ev["loss_head"]) <= 0.02 * abs(ev["loss_head"])
                   and ev["loss_min"] >= 0.95 * ev["loss_head"])
    ev["stall_tail_over_head"] = ev["loss_tail"] / ev["loss_head"] if ev["loss_head"] else float("nan")

    bad_init = bool(lnK) and (not math.isfinite(loss[0]) or loss[0] > 2 * lnK or loss[0] < 0.5 * lnK)

    osc = False
    half = loss[n // 2:]
    if len(half) > 4 and all(math.isfinite(v) for v in half):
        d = [b - a for a, b in zip(half, half[1:])]
        flips = sum(1 for a, b in zip(d, d[1:]) if a * b < 0) / max(1, len(d) - 1)
        amp = statistics.mean(abs(x) for x in d) / (abs(statistics.mean(half)) + 1e-12)
        q = len(half) // 4
        trend = statistics.mean(half[-q:]) / (statistics.mean(half[:q]) + 1e-12) if q else 1.0
        ev.update(osc_flip_frac=flips, osc_rel_amp=amp, osc_trend=trend)
        osc = flips >= 0.8 and amp >= 0.25 and trend > 0.8

    # diverging: over the finite prefix, the moving-average loss rises to >= 3x its running minimum
    # and >= 1.5x its start, and does not come back (final MA >= 2x the minimum, or it goes non-finite)
    diverging = False
    nf0 = ev["first_nonfinite_step"]
    pre = [v for v in loss[:nf0 if nf0 is not None else n]]
    ev["diverge_step"] = None
    if len(pre) >= 10 and min(pre) >= 0:
        k = max(5, n // 50)
        ma = _ma(pre, k)
        rmin, dstep = float("inf"), None
        for t, v in enumerate(ma):
            rmin = min(rmin, v)
            if t >= k and v >= 3 * rmin and v >= 1.5 * ev["loss_first5"]:
                dstep = t
                break
        if dstep is not None and (nf0 is not None or ma[-1] >= 2 * min(ma)):
            diverging = True
            ev["diverge_step"] = dstep
            ev["diverge_ma_max_over_min"] = max(ma) / max(min(ma), 1e-12)
            ev["finite_steps_after_diverge"] = (nf0 if nf0 is not None else n) - dstep

    # plateau length: first step at which the 10-step moving average drops below 80% of the mean of steps 0-9
    if len(fl) == n and n >= 20:
        ma10, m0 = _ma(loss, 10), statistics.mean(loss[:10])
        ev["plateau_end"] = next((t for t in range(10, n) if ma10[t] < 0.8 * m0), None)
    learns = len(fl) == n and ev["loss_tail"] < 0.5 * ev["loss_first5"]
    ev["learns"] = learns
    healthy = learns and not nonfinite and expl is None and not dead and not amp_collapse and not osc \
        and not bad_init and not vanishing and not diverging and not stalled
    ev["symptom_step"] = dict(exploding_gradients=expl, nan_or_inf=nf0, dead_relu=ev["dead90_step"],
                              amp_scale_collapse=ev.get("scale_lt1_step"), loss_diverging=ev["diverge_step"])
    ev["flags"] = dict(exploding_gradients=exploding, vanishing_gradients=vanishing, dead_relu=dead,
                       nan_or_inf=nonfinite, loss_stalled=stalled, bad_initial_loss=bad_init,
                       amp_scale_collapse=amp_collapse, oscillating_loss=osc, loss_diverging=diverging,
                       healthy=healthy)
    return ev


def judge(case, traces, extra):
    """Combine per-watch evidence into one verdict for the case."""
    evs = {}
    for tr in traces:
        evs[tr["name"]] = evidence(tr, (extra.get("rule_loss") or {}).get(tr["name"]))
    flags = {lab: any(e["flags"][lab] for e in evs.values()) for lab in LABELS}
    flags["healthy"] = all(e["flags"]["healthy"] for e in evs.values())
    if case.get("gan"):
        # GAN rule: no non-finite, no 100x grad growth, no dead layer (either net), the discriminator
        # does not win outright (its loss not near 0), no collapse, and the samples approach the data
        g = extra["gan"]
        ok = (not flags["nan_or_inf"] and not flags["exploding_gradients"] and not flags["dead_relu"]
              and g["d_not_winning"] and g["covered"] >= 6 and g["spread_ratio"] >= 0.5
              and g["energy_tail"] < 0.3 * g["energy_start"])
        flags["healthy"] = ok
        flags["loss_stalled"] = False  # GAN losses are flat by design; not a stall
        flags["oscillating_loss"] = False
        flags["loss_diverging"] = False
    for k, v in (extra.get("flags_override") or {}).items():
        flags[k] = v
    return evs, flags


def verdict(case, flags, bug=True):
    exp = case["expected"] if bug else ["healthy"]
    ok = all(flags[lab] for lab in exp)
    extra = [k for k, v in flags.items() if v and k not in exp and k not in case.get("acceptable", [])
             and not (k == "healthy")]
    return ok, extra


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, (bool, int)):
        return str(v)
    v = float(v)
    if not math.isfinite(v):
        return str(v)
    return f"{v:.3g}" if 1e-3 <= abs(v) < 1e5 or v == 0 else f"{v:.2e}"


def describe(evs, extra):
    out = []
    for nm, e in evs.items():
        s = (f"[{nm}] loss {fmt(e['loss0'])}->{fmt(e['loss_tail'])} (first5 {fmt(e['loss_first5'])}, "
             f"min {fmt(e['loss_min'])}) gn0 {fmt(e['gn0'])} max {fmt(e['gn_max'])} (x{fmt(e['gn_growth'])}) "
             f"dead_end {fmt(e['dead_max_end'])} zero {fmt(e['zero_frac_mean'])}")
        if e.get("clip_frac") is not None:
            s += f" clip_frac {fmt(e['clip_frac'])}"
        if e.get("first_last_grad_ratio") is not None:
            s += f" g1/gL {fmt(e['first_last_grad_ratio'])}"
        if e["first_nonfinite_step"] is not None:
            s += f" nonfinite@{e['first_nonfinite_step']} (nf loss {e['nonfinite_loss_steps']})"
        if e.get("scale_min") is not None:
            s += f" scale min {fmt(e['scale_min'])} skipped {e['skipped_steps']}"
        if e.get("max_rel_dev_lnK") is not None:
            s += f" maxdev_lnK {fmt(e['max_rel_dev_lnK'])}"
        s += f" tail/head {fmt(e['stall_tail_over_head'])}"
        if e.get("plateau_end") is not None:
            s += f" plateau_end {e['plateau_end']}"
        if e.get("osc_flip_frac") is not None:
            s += f" osc(flip {fmt(e['osc_flip_frac'])} amp {fmt(e['osc_rel_amp'])} trend {fmt(e['osc_trend'])})"
        if e["explode_step"] is not None:
            s += f" 100x@{e['explode_step']}"
        if e["dead90_step"] is not None:
            s += f" dead90@{e['dead90_step']}"
        if e["diverge_step"] is not None:
            s += (f" diverge@{e['diverge_step']} (MA x{fmt(e['diverge_ma_max_over_min'])}, "
                  f"{e['finite_steps_after_diverge']} finite steps after)")
        out.append(s)
    info = {k: v for k, v in extra.items() if k not in ("rule_loss",)}
    if info:
        out.append("extra " + json.dumps(info, default=lambda o: fmt(o) if isinstance(o, float) else str(o)))
    return "; ".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--cases", default="")
    ap.add_argument("--controls", action="store_true")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    torch.set_num_threads(1)
    names = a.cases.split(",") if a.cases else all_case_names()
    rows, nfail = [], 0
    for seed in [int(s) for s in a.seeds.split(",")]:
        for name in names:
            mod = load_case(name)
            variants = [True]
            fn = getattr(mod, "run", None) or mod.build
            if a.controls and "healthy" not in mod.CASE["expected"] and mod.CASE.get("control", True) and "bug" in inspect.signature(fn).parameters:
                variants.append(False)
            for bug in variants:
                traces, extra, secs = run_case(name, seed, bug)
                evs, flags = judge(mod.CASE, traces, extra)
                ok, extras = verdict(mod.CASE, flags, bug)
                nfail += not ok
                lab = name if bug else name + "[fixed]"
                print(f"seed {seed} {lab:44s} {'OK  ' if ok else 'FAIL'} {secs:4.1f}s "
                      f"flags={[k for k, v in flags.items() if v]} extra={extras}\n    {describe(evs, extra)}",
                      flush=True)
                rows.append(dict(seed=seed, case=lab, ok=ok, flags=flags, extras=extras, seconds=secs,
                                 evidence=evs, extra={k: v for k, v in extra.items() if k != "rule_loss"}))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1, default=str)
    print(f"{len(rows) - nfail}/{len(rows)} runs verified")
    return 0 if nfail == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
