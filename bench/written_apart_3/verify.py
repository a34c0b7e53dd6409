#!/usr/bin/env python
"""Plain-torch verification of the third sealed batch (no nnwatch anywhere).

Every case runs with a tracer in place of the monitor: build() cases in the standard loop, run()
cases with the tracer handed in as `watch`. The tracer records, at every `w.step(loss)`:

- the loss, the global grad norm (pre-clip in the standard loop, after GradScaler.unscale_; in run()
  cases the grads as they are at w.step), each parameter's grad norm (None = no grad), whether it
  was trainable at that step, and non-finite flags (loss, grads, parameters);
- for every nn.ReLU the per-unit dead fraction and the fraction of exact zeros, for every
  nn.Sigmoid / nn.Tanh the mean relative derivative (last forward before the step);
- the GradScaler scale, the LR of every param group, the clip ratio (pre-clip norm / max_norm);
- what the update did to the weights: per parameter the change since the previous w.step (norm,
  ratio to the weight norm, cosine with the weight, fraction of elements with a non-zero grad that
  did not change), which parameters the optimizer holds, optimizer parameters that are not in the
  model (a stale copy), and whether they got a grad or moved.

Then fixed ground-truth rules (`evidence()`, documented in README.md) turn the trace into flags
(the 13 finding kinds of the vocabulary) and update-level evidence. A TorchDispatchMode replay
names the first aten op that produced a non-finite value (build() cases).

usage: python verify.py [case ...] [--seeds 0,1,2] [--controls] [--json PATH] [--no-origin]
                        [--determinism]
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
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

KINDS = ["exploding_gradients", "vanishing_gradients", "dead_relu", "nan_or_inf", "loss_stalled",
         "bad_initial_loss", "amp_scale_collapse", "oscillating_loss", "loss_diverging",
         "loss_spike", "clipping_misuse", "zero_gradient_layer", "saturated_activation"]
LOSS_SHAPE = {"loss_stalled", "oscillating_loss", "loss_diverging", "loss_spike",
              "bad_initial_loss", "clipping_misuse"}
UPDATE_RULES = ["updates_rounded_away", "grad_not_in_optimizer", "optimizer_param_without_grad",
                "model_never_updated", "lr_zero", "update_ratio_tiny", "update_ratio_huge",
                "decay_dominated"]


# ----------------------------------------------------------------------------- tracing
class NonFiniteOrigin(TorchDispatchMode):
    """Records the first aten op whose floating inputs are all finite but whose output is not."""

    def __init__(self):
        super().__init__()
        self.first = None
        self.phase = "forward"
        self.step = -1
        self.paused = False

    @staticmethod
    def _floats(obj):
        return [t for t in tree_leaves(obj)
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 0]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.first is not None or self.paused:
            return func(*args, **kwargs)
        ins = self._floats((args, kwargs))
        ins_finite = all(bool(torch.isfinite(t).all()) for t in ins)
        out = func(*args, **kwargs)
        if ins_finite:
            for t in self._floats(out):
                fin = torch.isfinite(t)
                if not bool(fin.all()):
                    bad = t[~fin]
                    kind = "nan" if bool(torch.isnan(bad).any()) else "inf"
                    self.first = dict(step=self.step, phase=self.phase,
                                      op=str(func.overloadpacket.__name__), kind=kind,
                                      dtype=str(t.dtype))
                    break
        return out


def _f(x):
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _num(x):
    if isinstance(x, str):
        return {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}[x]
    return x


class Tracer:
    """Stands in for nnwatch.watch(model, optimizer, scaler=None, *, num_classes=None, name=None).

    `note()` / `note_clip()` are verification-only hooks; a monitor never gets them.
    """

    def __init__(self, model, optimizer, scaler=None, *, num_classes=None, name=None):
        self.model, self.opt, self.scaler = model, optimizer, scaler
        self.num_classes, self.name = num_classes, name or "run"
        self.findings = []
        self.origin = None
        self.named = list(model.named_parameters())
        model_ids = {id(p) for _, p in self.named}
        opt_params = [p for g in optimizer.param_groups for p in g["params"]]
        self.opt_ids = {id(p) for p in opt_params}
        self.foreign = [p for p in opt_params if id(p) not in model_ids]
        self.prev = [p.detach().clone() for _, p in self.named]
        self.prev_foreign = [p.detach().clone() for p in self.foreign]
        self.pending = {}
        self.dead, self.zero, self.sat = {}, {}, {}
        self.handles = []
        for name, m in model.named_modules():
            if isinstance(m, (nn.ReLU, nn.Sigmoid, nn.Tanh)):
                self.handles.append(m.register_forward_hook(self._hook(name, m)))
        self.tr = dict(name=self.name, num_classes=num_classes, loss=[], grad_norm=[], lr_max=[],
                       lr_min=[], scale=[], clip_ratio=[], clip=None, nonfinite_loss=[],
                       nonfinite_grad=[], nonfinite_param=[], dead={}, zero={}, sat={},
                       param_names=[n for n, _ in self.named],
                       in_optimizer=[id(p) in self.opt_ids for _, p in self.named],
                       n_foreign=len(self.foreign), param_grad={}, trainable={}, upd_ratio={},
                       upd_cos={}, unchanged_with_grad=[], nonzero_grad_elems=[],
                       global_upd_ratio=[], any_update=[], foreign_grad=[], foreign_moved=[],
                       weight_norm=[])
        for n, _ in self.named:
            for k in ("param_grad", "trainable", "upd_ratio", "upd_cos"):
                self.tr[k][n] = []

    # -- forward hooks (activation statistics of the last forward before the step)
    def _hook(self, name, m):
        def hook(mod, inp, out):
            t = out[0] if isinstance(out, (tuple, list)) else out
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                return
            if self.origin is not None:
                self.origin.paused = True
            try:
                with torch.no_grad():
                    tf = t.detach().float()
                    if not bool(torch.isfinite(tf).all()):
                        return
                    if isinstance(m, nn.ReLU):
                        fdim = 1 if tf.dim() in (2, 4) else tf.dim() - 1
                        alive = (tf > 0).transpose(0, fdim).reshape(tf.shape[fdim], -1).any(1)
                        self.dead[name] = 1.0 - float(alive.float().mean())
                        self.zero[name] = float((tf <= 0).float().mean())
                    elif isinstance(m, nn.Sigmoid):
                        self.sat[name] = float((tf * (1 - tf)).mean() / 0.25)
                    else:
                        self.sat[name] = float((1 - tf * tf).mean())
            finally:
                if self.origin is not None:
                    self.origin.paused = False
        return hook

    # -- values the standard loop knows better than the tracer
    def note(self, **kw):
        self.pending.update(kw)

    def note_clip(self, pre_norm, max_norm):
        self.tr["clip"] = max_norm
        self.tr["clip_ratio"].append(_f(pre_norm / max_norm) if max_norm > 0 else "inf")

    def step(self, loss, batch=None):
        tr = self.tr
        with torch.no_grad():
            lv = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
            tr["loss"].append(_f(lv))
            tr["nonfinite_loss"].append(not math.isfinite(lv))
            gsq, any_nan, pf = 0.0, False, True
            tot_unch, tot_nz = 0, 0
            dsq, wsq, moved = 0.0, 0.0, False
            wn = 0.0
            for i, (n, p) in enumerate(self.named):
                trainable = bool(p.requires_grad)
                tr["trainable"][n].append(trainable)
                g = p.grad
                if g is None:
                    tr["param_grad"][n].append(None)
                else:
                    v = float(g.detach().double().norm())
                    tr["param_grad"][n].append(_f(v))
                    if math.isnan(v):
                        any_nan = True
                    else:
                        gsq += v * v
                cur = p.detach()
                if trainable and not bool(torch.isfinite(cur).all()):
                    pf = False
                d = cur.double() - self.prev[i].double()
                w0 = self.prev[i].double()
                dn = float(d.norm())
                wn0 = float(w0.norm())
                if math.isfinite(dn):
                    ratio = _f(dn / wn0) if wn0 > 0 else (0.0 if dn == 0 else "inf")
                    tr["upd_ratio"][n].append(ratio)
                    tr["upd_cos"][n].append(_f(float((d * w0).sum()) / (dn * wn0))
                                            if dn > 0 and wn0 > 0 else None)
                else:
                    tr["upd_ratio"][n].append("nan")
                    tr["upd_cos"][n].append(None)
                if id(p) in self.opt_ids and trainable:
                    if g is not None and math.isfinite(dn):
                        nzg = g.detach() != 0
                        k = int(nzg.sum())
                        tot_nz += k
                        tot_unch += int(((d == 0) & nzg).sum())
                    if math.isfinite(dn):
                        dsq += dn * dn
                        wsq += wn0 * wn0
                    if dn != 0:
                        moved = True
                if id(p) in self.opt_ids and p.dim() >= 2 and math.isfinite(wn0):
                    wn += wn0 * wn0
                self.prev[i] = cur.clone()
            gn = self.pending.pop("grad_norm", None)
            if gn is None:
                gn = math.sqrt(gsq) if math.isfinite(gsq) else float("inf")
                if any_nan:
                    gn = float("nan")
            tr["grad_norm"].append(_f(gn))
            tr["nonfinite_grad"].append(not math.isfinite(gn))
            tr["nonfinite_param"].append(not pf)
            tr["unchanged_with_grad"].append(tot_unch)
            tr["nonzero_grad_elems"].append(tot_nz)
            tr["global_upd_ratio"].append(_f(math.sqrt(dsq / wsq)) if wsq > 0 else None)
            tr["any_update"].append(moved)
            tr["weight_norm"].append(math.sqrt(wn))
            fg, fm = False, False
            for j, p in enumerate(self.foreign):
                if p.grad is not None and bool((p.grad != 0).any()):
                    fg = True
                if not torch.equal(p.detach(), self.prev_foreign[j]):
                    fm = True
                self.prev_foreign[j] = p.detach().clone()
            tr["foreign_grad"].append(fg)
            tr["foreign_moved"].append(fm)
            lrs = self.pending.pop("lrs", None) or [g["lr"] for g in self.opt.param_groups]
            tr["lr_max"].append(float(max(lrs)))
            tr["lr_min"].append(float(min(lrs)))
            if self.scaler is not None:
                tr["scale"].append(_f(self.scaler.get_scale()))
            for k, v in self.dead.items():
                tr["dead"].setdefault(k, []).append(v)
            for k, v in self.zero.items():
                tr["zero"].setdefault(k, []).append(v)
            for k, v in self.sat.items():
                tr["sat"].setdefault(k, []).append(v)
            self.dead, self.zero, self.sat = {}, {}, {}

    def close(self):
        for h in self.handles:
            h.remove()
        self.handles = []

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


# ----------------------------------------------------------------------------- running
def load_case(name):
    return importlib.import_module("cases." + name)


def all_case_names():
    return sorted(f[:-3] for f in os.listdir(os.path.join(HERE, "cases"))
                  if f.endswith(".py") and not f.startswith("_"))


def has_control(mod):
    fn = getattr(mod, "run", None) or mod.build
    return "bug" in inspect.signature(fn).parameters and "healthy" not in mod.CASE["expected"]


def _standard_loop(spec, factory, name, trace_from=None):
    model, opt, loss_fn = spec["model"], spec["optimizer"], spec["loss_fn"]
    batches, steps = spec["batches"], int(spec["steps"])
    scaler, autocast, clip = spec.get("scaler"), spec.get("autocast"), spec.get("clip")
    scheduler, probe = spec.get("scheduler"), spec.get("probe")
    w = factory(model, opt, scaler=scaler, num_classes=spec.get("num_classes"), name=name)
    origin = NonFiniteOrigin() if trace_from is not None else None
    w.origin = origin
    probes = {}
    model.train()
    for step in range(steps):
        x, y = batches(step)
        opt.zero_grad(set_to_none=True)
        ctx = origin if (origin is not None and origin.first is None and step >= trace_from) \
            else None
        if origin is not None:
            origin.step, origin.phase = step, "forward"
        if ctx is not None:
            ctx.__enter__()
        try:
            if autocast:
                with torch.autocast(**autocast):
                    loss = loss_fn(model(x), y)
            else:
                loss = loss_fn(model(x), y)
            if origin is not None:
                origin.phase = "backward"
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
            if origin is not None:
                origin.paused = True
            if scaler is not None:
                scaler.unscale_(opt)
            gsq, bad = 0.0, False
            for p in model.parameters():
                if p.grad is not None:
                    v = float(p.grad.detach().double().norm())
                    if math.isnan(v):
                        bad = True
                    gsq += v * v
            gn = float("nan") if bad else (math.sqrt(gsq) if math.isfinite(gsq) else float("inf"))
            w.note(grad_norm=gn, lrs=[g["lr"] for g in opt.param_groups])
            if clip is not None:
                w.note_clip(gn, clip)
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            if origin is not None:
                origin.paused = False
                origin.phase = "optimizer"
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
        finally:
            if origin is not None:
                origin.paused = False
            if ctx is not None:
                ctx.__exit__(None, None, None)
        if scheduler is not None:
            scheduler.step()
        w.step(loss, batch=(x, y))
        if probe is not None:
            with torch.no_grad():
                for k, v in probe(model).items():
                    probes.setdefault(k, []).append(_f(v))
    w.close()
    return dict(probe=probes)


def _run_once(name, seed, bug, trace_from=None):
    torch.set_num_threads(1)
    mod = load_case(name)
    made = []

    def factory(model, optimizer, scaler=None, *, num_classes=None, name=None):
        t = Tracer(model, optimizer, scaler, num_classes=num_classes, name=name)
        made.append(t)
        return t

    t0, c0 = time.time(), time.process_time()
    if hasattr(mod, "run"):
        extra = mod.run(seed, bug, factory) or {}
    else:
        takes_bug = "bug" in inspect.signature(mod.build).parameters
        spec = mod.build(seed, bug=bug) if takes_bug else mod.build(seed)
        extra = _standard_loop(spec, factory, name, trace_from)
    secs, cpu = time.time() - t0, time.process_time() - c0
    for t in made:
        t.close()
    origin = None
    for t in made:
        if t.origin is not None and t.origin.first is not None:
            origin = t.origin.first
    return dict(case=name, seed=seed, bug=bug, seconds=secs, cpu_seconds=cpu,
                traces=[t.tr for t in made],
                extra=extra, origin=origin, CASE=dict(mod.CASE))


def run_case(name, seed, bug=True, trace_origin=True):
    r = _run_once(name, seed, bug)
    mod = load_case(name)
    if not trace_origin or hasattr(mod, "run"):
        return r
    tr = r["traces"][0]
    flags = [a or b or c for a, b, c in zip(tr["nonfinite_loss"], tr["nonfinite_grad"],
                                            tr["nonfinite_param"], strict=False)]
    s = next((i for i, v in enumerate(flags) if v), None)
    if s is None:
        return r
    r2 = _run_once(name, seed, bug, trace_from=s)
    r2["replay_consistent"] = [str(v) for v in r2["traces"][0]["loss"][:s + 1]] == \
        [str(v) for v in tr["loss"][:s + 1]]
    r2["seconds"], r2["cpu_seconds"] = r["seconds"], r["cpu_seconds"]
    return r2


# ----------------------------------------------------------------------------- evidence
def _finite(xs):
    return [v for v in (_num(x) for x in xs if x is not None) if math.isfinite(v)]


def _first(pred, xs):
    for i, v in enumerate(xs):
        if pred(v):
            return i
    return None


def _osc(series, a, b):
    s = series[a:b]
    if len(s) < 6 or not all(math.isfinite(v) for v in s):
        return None
    d = [q - p for p, q in zip(s, s[1:], strict=False)]
    flips = sum(1 for p, q in zip(d, d[1:], strict=False) if p * q < 0) / max(1, len(d) - 1)
    amp = statistics.mean(abs(v) for v in d) / (abs(statistics.mean(s)) + 1e-12)
    return flips, amp


def evidence(tr, case, probe=None):
    """Fixed ground-truth rules on one trace (see README.md). Returns evidence, flags, steps."""
    probe = probe or {}
    K = tr["num_classes"]
    lnK = math.log(K) if K else None
    loss = [_num(v) for v in tr["loss"]]
    gn = [_num(v) for v in tr["grad_norm"]]
    n = len(loss)
    W = max(10, n // 10)
    ev, sym = {}, {}
    fl = _finite(loss)
    ev["n_steps"] = n
    ev["loss0"] = loss[0] if n else float("nan")
    tail = _finite(loss[-W:])
    ev["loss_tail"] = statistics.mean(tail) if tail else float("nan")
    ev["loss_min"] = min(fl) if fl else float("nan")
    first5 = _finite(loss[:5])
    ev["loss_first5"] = statistics.mean(first5) if first5 else float("nan")
    g0 = statistics.median(_finite(gn[:5]) or [float("nan")])
    ev["gn0"] = g0
    fgn = _finite(gn)
    ev["gn_max"] = max(fgn) if fgn else float("nan")
    ev["gn_med"] = statistics.median(fgn) if fgn else float("nan")
    scale = [_num(v) for v in tr["scale"]]

    # nan_or_inf: loss, grad or parameter non-finite (under a GradScaler: loss and parameters)
    if scale:
        nf = [a or b for a, b in zip(tr["nonfinite_loss"], tr["nonfinite_param"], strict=False)]
    else:
        nf = [a or b or d for a, b, d in zip(tr["nonfinite_loss"], tr["nonfinite_grad"],
                                             tr["nonfinite_param"], strict=False)]
    sym["nan_or_inf"] = _first(bool, nf)
    ev["nonfinite_steps"] = sum(nf)
    if scale:
        ev["scale_min"] = min(scale)
        ev["scale_max"] = max(scale)
        ev["skipped_steps"] = sum(tr["nonfinite_grad"])
        sym["amp_scale_collapse"] = _first(lambda s: s < 1.0, scale)
    else:
        sym["amp_scale_collapse"] = None

    # exploding_gradients: a finite global grad norm >= 100x the median of steps 0-4 (no scaler)
    s = _first(lambda v: math.isfinite(v) and g0 > 0 and v >= 100 * g0, gn)
    sym["exploding_gradients"] = None if scale else s
    ev["gn_growth"] = ev["gn_max"] / g0 if g0 and g0 > 0 else float("nan")

    # per-parameter grad series over the steps where the parameter was trainable
    zsteps = [i for i, v in enumerate(gn) if math.isfinite(v)]
    zero_params = []
    for nme in tr["param_names"]:
        ser, trn = tr["param_grad"][nme], tr["trainable"][nme]
        st = [i for i in zsteps if trn[i]]
        if len(st) < max(5, 0.05 * n):
            continue
        zero = [i for i in st if ser[i] is None or _num(ser[i]) == 0.0]
        if len(zero) >= 0.95 * len(st):
            zero_params.append((nme, zero[0]))
    ev["zero_grad_params"] = [z[0] for z in zero_params]
    sym["zero_gradient_layer"] = min(z[1] for z in zero_params) if zero_params else None

    # vanishing_gradients: median(first weight grad) / median(last weight grad) < 1e-4, over
    # trainable weights that get a non-zero grad (the zero-grad parameters are judged above)
    zp = set(ev["zero_grad_params"])
    ws = []
    for nme in tr["param_names"]:
        if nme in zp or "weight" not in nme.split(".")[-1]:
            continue
        vals = [_num(v) for v, t in zip(tr["param_grad"][nme], tr["trainable"][nme], strict=False)
                if t and v is not None]
        vals = [v for v in vals if math.isfinite(v)]
        if len(vals) >= 0.5 * n:
            ws.append((nme, vals))
    vr = None
    if len(ws) >= 2:
        a, b = statistics.median(ws[0][1]), statistics.median(ws[-1][1])
        if b > 0:
            vr = a / b
    ev["first_last_grad_ratio"] = vr
    sym["vanishing_gradients"] = 0 if (vr is not None and vr < 1e-4) else None

    # dead_relu: an nn.ReLU with >= 90% of its units zero on the whole batch (last 10% mean)
    dead_end = {k: statistics.mean(v[-max(1, len(v) // 10):]) for k, v in tr["dead"].items()}
    ev["dead_max_end"] = max(dead_end.values()) if dead_end else 0.0
    zero_end = {k: statistics.mean(v[-max(1, len(v) // 10):]) for k, v in tr["zero"].items()}
    ev["relu_zero_frac_end"] = max(zero_end.values()) if zero_end else None
    if ev["dead_max_end"] >= 0.9:
        ds = [_first(lambda d: d >= 0.9, v) for k, v in tr["dead"].items() if dead_end[k] >= 0.9]
        sym["dead_relu"] = min(x for x in ds if x is not None)
    else:
        sym["dead_relu"] = None

    # saturated_activation: an nn.Sigmoid/Tanh with mean relative derivative < 0.1 (last 10%)
    sat_end = {k: statistics.mean(v[-max(1, len(v) // 10):]) for k, v in tr["sat"].items()}
    ev["sat_min_end"] = min(sat_end.values()) if sat_end else None
    ss = [_first(lambda d: d < 0.1, v) for k, v in tr["sat"].items() if sat_end[k] < 0.1]
    sym["saturated_activation"] = min(ss) if ss else None

    # clipping_misuse: clip set and pre-clip norm >= 100x the threshold on >= 90% of steps
    cr = [_num(v) for v in tr["clip_ratio"]]
    if cr:
        big = [v >= 100 for v in cr]
        ev["clip_ratio_median"] = statistics.median(_finite(cr) or [float("nan")])
        ev["clip_frac_100x"] = sum(big) / len(big)
        ev["clip_active_frac"] = sum(v > 1 for v in cr) / len(cr)
        sym["clipping_misuse"] = _first(bool, big) if sum(big) >= 0.9 * len(big) else None
    else:
        sym["clipping_misuse"] = None

    # bad_initial_loss: loss[0] > 2 ln K or < 0.5 ln K (classification only)
    bad = bool(lnK) and n > 0 and (not math.isfinite(loss[0]) or loss[0] > 2 * lnK
                                   or loss[0] < 0.5 * lnK)
    sym["bad_initial_loss"] = 0 if bad else None

    # loss_stalled: (a) after the first 10% every loss within 2% of ln K, or (b) flat from s: the
    # W-window rolling mean stays within 3% of m(s) for every later window (s <= 0.7n - W), at a
    # level of no real progress (>= 0.5 ln K; without K: >= 0.5x the mean of steps 0-4, > 0)
    st = None
    if lnK and fl and len(fl) == n:
        after = loss[n // 10:]
        ev["max_rel_dev_lnK"] = max(abs(v - lnK) / lnK for v in after)
        if ev["max_rel_dev_lnK"] <= 0.02:
            st = 0
    if st is None and len(fl) == n and n >= 3 * W:
        m = [statistics.mean(loss[t:t + W]) for t in range(n - W + 1)]
        floor = 0.5 * lnK if lnK else 0.5 * ev["loss_first5"]
        # batch noise allowance: 3 standard errors of a W-step mean (noise from step-to-step
        # differences, so a drift does not widen the band)
        dif = [b - a for a, b in zip(loss[n // 10:], loss[n // 10 + 1:], strict=False)]
        if len(dif) > 1:  # robust (MAD) so that isolated spikes do not widen the band
            md = statistics.median(dif)
            sd = 1.4826 * statistics.median(abs(v - md) for v in dif) / math.sqrt(2)
        else:
            sd = 0.0
        ev["flat_noise_band"] = 3 * sd / math.sqrt(W)
        if floor > 0:
            for s0 in range(0, int(0.7 * n) - W + 1):
                if m[s0] < floor:
                    continue
                tol = 0.03 * m[s0] + ev["flat_noise_band"]
                if all(abs(v - m[s0]) <= tol for v in m[s0:]):
                    st = s0
                    break
    # (c) classification: no real progress - from step s on, every W-window rolling mean stays
    # at >= 0.75 ln K (s <= 0.7n - W); catches a run stuck at a noisy high level
    if lnK and len(fl) == n and n >= 3 * W:
        m = [statistics.mean(loss[t:t + W]) for t in range(n - W + 1)]
        for s0 in range(0, int(0.7 * n) - W + 1):
            if all(v >= 0.75 * lnK for v in m[s0:]):
                st = s0 if st is None else min(st, s0)
                break
    sym["loss_stalled"] = st

    # oscillating_loss (pathologies-2 rule): with an 'eval_loss' probe, >= 40% sign flips and
    # mean |diff| >= 10% in the 2nd half with no rise; else >= 80% flips, >= 25%, no downtrend
    series, fthr, athr = loss, 0.8, 0.25
    if "eval_loss" in probe:
        series, fthr, athr = [_num(v) for v in probe["eval_loss"]], 0.4, 0.10
    h = n // 2
    o = _osc(series, h, n)
    osc_step = None
    if o:
        ev["osc_flip_frac"], ev["osc_rel_amp"] = o
        half = series[h:]
        q = max(1, len(half) // 4)
        trend = statistics.mean(half[-q:]) / (statistics.mean(half[:q]) + 1e-12)
        tlo = 0.0 if "eval_loss" in probe else 0.8
        if o[0] >= fthr and o[1] >= athr and tlo < trend < 1.5:
            for t in range(0, n - 20):
                w = _osc(series, t, t + 20)
                if w and w[0] >= fthr and w[1] >= athr:
                    osc_step = t
                    break
    sym["oscillating_loss"] = osc_step

    # loss_diverging (pathologies-2 rule): rolling mean (window max(10, n/20)) over the finite
    # losses reaches >= 2x its earlier minimum with a rise >= 25% of |mean of steps 0-4| and
    # never comes back below 1.5x that minimum (positive losses only)
    w = max(10, n // 20)
    fidx = [t for t in range(n) if math.isfinite(loss[t])]
    dv, run_min = None, float("inf")
    r = {}
    for j, t in enumerate(fidx):
        win = [loss[u] for u in fidx[max(0, j - w + 1):j + 1]]
        r[t] = statistics.mean(win)
    if fl and min(fl) >= 0:
        for j, t in enumerate(fidx):
            if j >= w and t <= n - w and run_min < float("inf") and r[t] >= 2 * run_min and \
                    r[t] - run_min >= 0.25 * abs(ev["loss_first5"]) and \
                    all(r[u] >= 1.5 * run_min for u in fidx[j:]):
                dv = t
                break
            if j >= w - 1:
                run_min = min(run_min, r[t])
    sym["loss_diverging"] = dv
    rv = [r[t] for t in fidx[w - 1:]] if len(fidx) >= w else []
    ev["loss_max_rolling_over_min"] = (max(rv) / min(rv)) if rv and min(rv) > 0 else None

    # loss_spike: loss[s] >= 5x the median of the previous 20 (positive), higher than it by at
    # least 25% of |mean of steps 0-4| (so noise on a near-zero loss is no spike), and the median
    # of steps s+5..s+24 back within 2x of it
    sp = None
    for t in range(20, n - 25):
        prev = loss[t - 20:t]
        med = statistics.median(prev) if all(math.isfinite(v) for v in prev) else None
        if med and med > 0 and math.isfinite(loss[t]) and loss[t] >= 5 * med and \
                loss[t] - med >= 0.25 * abs(ev["loss_first5"]):
            after = loss[t + 5:t + 25]
            if all(math.isfinite(v) for v in after) and statistics.median(after) <= 2 * med:
                sp = t
                break
    sym["loss_spike"] = sp

    # ---------------------------------------------------------------- update-level evidence
    upd = {}
    lrmax = tr["lr_max"]
    lr_on = [i for i, v in enumerate(lrmax) if v > 0]
    nz = sum(tr["nonzero_grad_elems"][i] for i in lr_on)
    un = sum(tr["unchanged_with_grad"][i] for i in lr_on)
    upd["frac_unchanged_with_grad"] = un / nz if nz else None
    upd["updates_rounded_away"] = nz > 0 and un / nz >= 0.9
    not_opt = []
    for nme, inopt in zip(tr["param_names"], tr["in_optimizer"], strict=False):
        ser = tr["param_grad"][nme]
        k = sum(1 for v, t in zip(ser, tr["trainable"][nme], strict=False) if t and v is not None
                and _num(v) != 0)
        if not inopt and k >= 0.5 * n:
            not_opt.append(nme)
    upd["grad_not_in_optimizer"] = not_opt
    opt_nograd = [nme for nme, inopt in zip(tr["param_names"], tr["in_optimizer"], strict=False)
                  if inopt and all(v is None or _num(v) == 0 for v in tr["param_grad"][nme])]
    if tr["n_foreign"] and not any(tr["foreign_grad"]):
        opt_nograd.append(f"<{tr['n_foreign']} optimizer params not in the model>")
    upd["optimizer_param_without_grad"] = opt_nograd
    upd["frac_steps_model_moved"] = sum(tr["any_update"]) / n if n else None
    upd["model_never_updated"] = n > 0 and sum(tr["any_update"]) <= 0.05 * n
    upd["foreign_params_moved_steps"] = sum(tr["foreign_moved"])
    lr0 = max(lrmax[:1] or [0])
    upd["frac_steps_lr_zero"] = sum(1 for v in lrmax if v <= 1e-12 * max(lr0, 1e-30)) / n \
        if n else None
    upd["lr_zero"] = upd["frac_steps_lr_zero"] is not None and upd["frac_steps_lr_zero"] >= 0.25
    gur = [_num(v) for v in tr["global_upd_ratio"][n // 10:] if v is not None]
    gur = [v for v in gur if math.isfinite(v)]
    upd["median_update_ratio"] = statistics.median(gur) if gur else None
    upd["update_ratio_tiny"] = bool(gur) and statistics.median(gur) < 1e-5
    big = [_num(v) for v in tr["global_upd_ratio"] if v is not None]
    upd["steps_update_ratio_over_0.1"] = sum(1 for v in big if math.isfinite(v) and v > 0.1)
    upd["update_ratio_huge"] = upd["steps_update_ratio_over_0.1"] >= 5
    wnorm = tr["weight_norm"]
    cos_all = []
    for nme in tr["param_names"]:
        cs = [c for c in tr["upd_cos"][nme] if c is not None]
        cos_all.extend(_num(c) for c in cs)
    anti = sum(1 for c in cos_all if c < -0.5) / len(cos_all) if cos_all else 0.0
    upd["frac_updates_anti_aligned"] = anti
    upd["weight_norm_final_over_initial"] = (wnorm[-1] / wnorm[0]) if wnorm and wnorm[0] > 0 \
        else None
    upd["decay_dominated"] = bool(upd["weight_norm_final_over_initial"] is not None
                                  and upd["weight_norm_final_over_initial"] < 0.5 and anti >= 0.5)
    # per-parameter extremes (informational): the parameter that gets a non-zero grad least
    # often (over its trainable steps), the smallest median update/weight ratio among
    # optimizer-held parameters, and parameters that move on steps where they have no grad
    frac, ratios, moved_nograd = [], [], []
    for nme, inopt in zip(tr["param_names"], tr["in_optimizer"], strict=False):
        ser, trn = tr["param_grad"][nme], tr["trainable"][nme]
        upr = [_num(v) if v is not None else 0.0 for v in tr["upd_ratio"][nme]]
        st = [i for i in range(n) if trn[i]]
        if st:
            k = sum(1 for i in st if ser[i] is not None and _num(ser[i]) != 0)
            frac.append((k / len(st), nme))
        if inopt and st:
            on = [upr[i] for i in st if lrmax[i] > 0 and math.isfinite(upr[i])]
            if on:
                ratios.append((statistics.median(on), nme))
        mv = sum(1 for i in range(n) if (ser[i] is None or _num(ser[i]) == 0) and upr[i] > 0)
        if mv >= 0.1 * n:
            moved_nograd.append(nme)
    upd["least_grad_param"] = min(frac) if frac else None
    upd["smallest_update_ratio_param"] = min(ratios) if ratios else None
    upd["moved_without_grad"] = moved_nograd
    ev["update"] = upd

    if case.get("gan"):
        for k in LOSS_SHAPE:
            sym[k] = None
    ev["symptom_step"] = sym
    return ev


def fired_update_rules(ev):
    u = ev["update"]
    return [k for k in UPDATE_RULES if u.get(k)]


def judge(r, control):
    """Combine the evidence of every trace of one run into a verdict."""
    case = r["CASE"]
    probe = dict((r.get("extra") or {}).get("probe") or {})
    evs = [evidence(tr, case, probe) for tr in r["traces"]]
    fired = {}
    for ev in evs:
        for k, v in ev["symptom_step"].items():
            if v is not None:
                fired[k] = min(v, fired.get(k, v))
    upd_fired = sorted({k for ev in evs for k in fired_update_rules(ev)})
    healthy_case = "healthy" in case["expected"]
    lp = case.get("learn_probe")
    if lp:
        ps = _finite(probe.get(lp, []))
        W = max(10, len(ps) // 10)
        first = statistics.mean(ps[:5]) if ps else float("nan")
        tailm = statistics.mean(ps[-W:]) if ps else float("nan")
        learns = bool(ps) and tailm < 0.5 * first
        learn_txt = f"{lp} {first:.4g}->{tailm:.4g}"
    else:
        learns = all(ev["loss_tail"] < 0.5 * ev["loss_first5"] and ev["nonfinite_steps"] == 0
                     for ev in evs)
        learn_txt = "loss " + ", ".join(f"{ev['loss_first5']:.4g}->{ev['loss_tail']:.4g}"
                                        for ev in evs)
    if control or healthy_case:
        ok = learns and not fired
        unexpected = sorted(fired)
        missing_upd = []
    else:
        exp = case["expected"]
        need_upd = case.get("update_evidence", [])
        missing_upd = [k for k in need_upd if k not in upd_fired]
        ok = all(k in fired for k in exp) and not missing_upd
        acc = case.get("acceptable", [])
        unexpected = sorted(k for k in fired if k not in exp and k not in acc)
    labs = list(case.get("onset_labels") or (case["expected"] + case.get("acceptable", [])))
    onset = None
    if not (control or healthy_case):
        cand = [fired[k] for k in labs if k in fired]
        onset = min(cand) if cand else None
    return dict(verified=ok, fired=fired, unexpected=unexpected, update_rules=upd_fired,
                missing_update_evidence=missing_upd, learns=learns, learn=learn_txt,
                onset=onset, evidence=evs)


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


def line(r, j, control):
    c = r["CASE"]
    ev = j["evidence"][0]
    label = c["name"] + ("[fixed]" if control else "")
    exp = "healthy" if control else "+".join(c["expected"])
    parts = [f"{label:44s}", "OK  " if j["verified"] else "FAIL", f"exp={exp}",
             f"onset={j['onset']}", j["learn"],
             f"gn0={fmt(ev['gn0'])} gnmax={fmt(ev['gn_max'])}", f"fired={j['fired']}"]
    if j["update_rules"]:
        parts.append(f"upd={'+'.join(j['update_rules'])}")
    if j["missing_update_evidence"]:
        parts.append(f"MISSING-UPD={j['missing_update_evidence']}")
    if r.get("origin"):
        o = r["origin"]
        parts.append(f"origin={o['op']}/{o['phase']}@{o['step']}")
    if "scale_min" in ev:
        parts.append(f"scale {fmt(ev['scale_max'])}..{fmt(ev['scale_min'])} "
                     f"skipped={ev['skipped_steps']}")
    if j["unexpected"]:
        parts.append(f"{'FLAGS' if control or 'healthy' in c['expected'] else 'ALSO'}="
                     f"{'+'.join(j['unexpected'])}")
    parts.append(f"{r['seconds']:.1f}s (cpu {r['cpu_seconds']:.1f}s)")
    return " | ".join(parts)


def _jsonable(ev):
    out = {}
    for k, v in ev.items():
        if isinstance(v, float) and not math.isfinite(v):
            out[k] = str(v)
        else:
            out[k] = v
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="*")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--controls", action="store_true", help="also verify each fixed control")
    ap.add_argument("--json", default="")
    ap.add_argument("--no-origin", action="store_true")
    ap.add_argument("--determinism", action="store_true",
                    help="run seed 0 of every case twice and compare the losses bit for bit")
    a = ap.parse_args()
    torch.set_num_threads(1)
    names = a.cases or all_case_names()
    if a.determinism:
        bad = 0
        for name in names:
            mod = load_case(name)
            for bug in [True] + ([False] if has_control(mod) else []):
                r1 = _run_once(name, 0, bug)
                r2 = _run_once(name, 0, bug)
                same = all([str(v) for v in t1["loss"]] == [str(v) for v in t2["loss"]]
                           for t1, t2 in zip(r1["traces"], r2["traces"], strict=False))
                bad += not same
                print(f"{name}{'' if bug else '[fixed]'}: {'identical' if same else 'DIFFERENT'}",
                      flush=True)
        print("DETERMINISTIC" if bad == 0 else f"{bad} runs differ")
        return 0 if bad == 0 else 1
    seeds = [int(s) for s in a.seeds.split(",")]
    n_fail, results = 0, {}
    for seed in seeds:
        for name in names:
            mod = load_case(name)
            variants = [False] + ([True] if a.controls and has_control(mod) else [])
            for control in variants:
                r = run_case(name, seed, bug=not control,
                             trace_origin=not a.no_origin and not control)
                j = judge(r, control)
                n_fail += not j["verified"]
                print(f"[seed {seed}] {line(r, j, control)}", flush=True)
                declared = mod.CASE.get("onset_by_seed", {}).get(seed)
                if not control and "healthy" not in mod.CASE["expected"] and \
                        declared is not None and declared != j["onset"]:
                    print(f"    NOTE declared onset_by_seed[{seed}]={declared} != measured "
                          f"{j['onset']}")
                key = f"{name}{'[fixed]' if control else ''}@{seed}"
                results[key] = dict(case=name, control=control, seed=seed,
                                    expected=["healthy"] if control else mod.CASE["expected"],
                                    verified=j["verified"], fired=j["fired"],
                                    unexpected=j["unexpected"], update_rules=j["update_rules"],
                                    onset=j["onset"], learns=j["learns"], learn=j["learn"],
                                    seconds=r["seconds"], cpu_seconds=r["cpu_seconds"],
                                    origin=r.get("origin"),
                                    evidence=[_jsonable(e) for e in j["evidence"]],
                                    extra={k: v for k, v in (r.get("extra") or {}).items()
                                           if k != "probe"})
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(dict(results=results), fh, indent=1, default=str)
        print(f"wrote {a.json}")
    total = len(results)
    print(f"{total - n_fail}/{total} runs verified")
    print("ALL VERIFIED" if n_fail == 0 else f"{n_fail} runs did not verify")
    return 0 if n_fail == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
