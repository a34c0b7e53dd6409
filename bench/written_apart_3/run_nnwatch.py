"""Score nnwatch on the third sealed batch (cases written apart from nnwatch's detectors).

Adapted from ../written_apart_2/run_nnwatch.py. build() cases run in the standard loop with nnwatch
attached through its public API only:
    w = nnwatch.watch(model, optimizer, scaler=..., num_classes=K, name=...)
    ... clip_grad_norm_ (when the case clips) ... optimizer/scaler step ... scheduler.step()
    ... w.step(loss, batch=(x, y))
run() cases get `watch` (the factory) and call it once per watched model themselves.

Scoring (findings of severity warning or worse; info/note/debug never count):
- a bug case is DETECTED when a finding of an expected or acceptable kind arrives at a step
  >= onset - 2 (onset = CASE['onset_by_seed'][seed], else CASE['onset_step']); the strict count
  uses expected kinds only. Such a finding before onset - 2 is reported as EARLY.
- a healthy case, or a bug case's fixed control (--controls), is a FALSE-ALARM when any finding of
  the 13 vocabulary kinds arrives (loss_spike, clipping_misuse, zero_gradient_layer and
  saturated_activation included). Findings of other kinds at warning or worse are listed and
  counted separately ("other-kind alarms").
- delay = first qualifying step - onset; the median is reported.

    python run_nnwatch.py [--seeds 0,1,2] [--cases a,b] [--controls] [--json out.json] [--plain]

--plain runs the same loops with a no-op watch and never imports nnwatch (tests the harness).
NNWATCH_RUN_DIR is set to a fresh 0700 temp dir.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import statistics
import sys
import tempfile
import time
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

VOCABULARY = {"exploding_gradients", "vanishing_gradients", "dead_relu", "nan_or_inf",
              "loss_stalled", "bad_initial_loss", "amp_scale_collapse", "oscillating_loss",
              "loss_diverging", "loss_spike", "clipping_misuse", "zero_gradient_layer",
              "saturated_activation"}
QUIET = {"info", "note", "debug"}


def all_case_names():
    return sorted(f[:-3] for f in os.listdir(os.path.join(HERE, "cases"))
                  if f.endswith(".py") and not f.startswith("_"))


def load_case(name):
    return importlib.import_module("cases." + name)


class NoopWatch:
    def __init__(self, model, optimizer, scaler=None, *, num_classes=None, name=None):
        self.findings = []

    def step(self, loss, batch=None):
        pass

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


def _get(f, key):
    return f.get(key) if isinstance(f, dict) else getattr(f, key, None)


def make_factory(plain):
    made = []
    if plain:
        base = NoopWatch
    else:
        import nnwatch
        base = nnwatch.watch

    def factory(model, optimizer, scaler=None, *, num_classes=None, name=None):
        w = base(model, optimizer, scaler=scaler, num_classes=num_classes, name=name)
        made.append((name, w))
        return w
    return factory, made


def standard_loop(spec, factory, name):
    model, opt, loss_fn = spec["model"], spec["optimizer"], spec["loss_fn"]
    batches, steps = spec["batches"], int(spec["steps"])
    scaler, autocast, clip = spec.get("scaler"), spec.get("autocast"), spec.get("clip")
    scheduler, zero_grad = spec.get("scheduler"), spec.get("zero_grad", True)
    w = factory(model, opt, scaler=scaler, num_classes=spec.get("num_classes"),
                name=f"sealed3-{name}")
    try:
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
                if clip is not None:
                    scaler.unscale_(opt)
            else:
                loss.backward()
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
    finally:
        w.close()


def run_one(name, seed, bug, plain):
    torch.set_num_threads(1)
    mod = load_case(name)
    factory, made = make_factory(plain)
    t0, err = time.time(), None
    try:
        if hasattr(mod, "run"):
            mod.run(seed, bug, factory)
        else:
            takes_bug = "bug" in inspect.signature(mod.build).parameters
            spec = mod.build(seed, bug=bug) if takes_bug else mod.build(seed)
            standard_loop(spec, factory, name)
    except Exception:
        err = traceback.format_exc(limit=3)
    for _, w in made:  # make sure every watch is closed (run() cases close their own)
        try:
            w.close()
        except Exception:
            pass
    findings = []
    for wname, w in made:
        for f in list(getattr(w, "findings", []) or []):
            sev = _get(f, "severity")
            if sev in QUIET:
                continue
            findings.append(dict(watch=wname, kind=_get(f, "kind"), step=_get(f, "step"),
                                 severity=sev, layer=_get(f, "layer")))
    return dict(findings=findings, seconds=time.time() - t0, error=err)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--cases", default="")
    ap.add_argument("--controls", action="store_true",
                    help="also run each bug case's fixed variant")
    ap.add_argument("--json", default="")
    ap.add_argument("--plain", action="store_true", help="no-op watch; never imports nnwatch")
    a = ap.parse_args()
    rd = tempfile.mkdtemp(prefix="nnw-sealed3-")
    os.chmod(rd, 0o700)
    os.environ["NNWATCH_RUN_DIR"] = rd
    torch.set_num_threads(1)
    names = a.cases.split(",") if a.cases else all_case_names()
    rows, delays = [], []
    n = dict(bugs=0, detected=0, strict=0, early=0, healthy=0, false_alarms=0, other_alarms=0,
             errors=0)
    for seed in [int(s) for s in a.seeds.split(",")]:
        for name in names:
            mod = load_case(name)
            case = mod.CASE
            expected = set(case["expected"]) - {"healthy"}
            accepted = expected | set(case.get("acceptable", []))
            variants = [(True, expected)]
            fn = getattr(mod, "run", None) or mod.build
            if a.controls and expected and case.get("control", True) and \
                    "bug" in inspect.signature(fn).parameters:
                variants.append((False, set()))
            for bug, exp in variants:
                r = run_one(name, seed, bug, a.plain)
                n["errors"] += bool(r["error"])
                kinds = {f["kind"] for f in r["findings"]}
                label = name if bug else name + "[fixed]"
                extra = []
                if exp:
                    n["bugs"] += 1
                    onset = case.get("onset_by_seed", {}).get(seed, case.get("onset_step"))
                    lo = (onset - 2) if onset is not None else None

                    def qualifies(f, ok_kinds, lo=lo):
                        return f["kind"] in ok_kinds and (
                            lo is None or f["step"] is None or f["step"] >= lo)
                    hits = [f for f in r["findings"] if qualifies(f, accepted)]
                    strict = [f for f in r["findings"] if qualifies(f, exp)]
                    early = [f for f in r["findings"] if f["kind"] in accepted and
                             lo is not None and f["step"] is not None and f["step"] < lo]
                    n["detected"] += bool(hits)
                    n["strict"] += bool(strict)
                    n["early"] += bool(early) and not hits
                    steps = [f["step"] for f in hits if f["step"] is not None]
                    if hits and steps and onset is not None:
                        delays.append(min(steps) - onset)
                    if hits:
                        verdict = "DETECTED" + ("" if strict else " (acceptable kind)")
                    else:
                        verdict = "EARLY" if early else "MISSED"
                    extra = sorted(k for k in kinds - accepted if k)
                else:
                    n["healthy"] += 1
                    bad = sorted(kinds & VOCABULARY)
                    other = sorted(k for k in kinds - VOCABULARY if k)
                    n["false_alarms"] += bool(bad)
                    n["other_alarms"] += bool(other) and not bad
                    verdict = ("FALSE-ALARM " + ",".join(bad)) if bad else "clean"
                    extra = other
                line = (f"seed {seed} {label:52s} {verdict:30s} "
                        f"found={sorted(k for k in kinds if k)} {r['seconds']:.1f}s")
                if extra:
                    line += f" extra={extra}"
                if r["error"]:
                    line += " ERROR=" + r["error"].strip().splitlines()[-1][:160]
                print(line, flush=True)
                rows.append(dict(seed=seed, case=label, expected=sorted(exp),
                                 acceptable=sorted(case.get("acceptable", [])) if exp else [],
                                 **r))
    recall = n["detected"] / n["bugs"] if n["bugs"] else 0.0
    med = statistics.median(delays) if delays else float("nan")
    summary = (f"sealed batch 3{' (plain: no-op watch)' if a.plain else ''}: "
               f"recall {n['detected']}/{n['bugs']} = {recall:.2f} "
               f"(strict, expected kinds only: {n['strict']}/{n['bugs']}; early only: "
               f"{n['early']}), false alarms {n['false_alarms']}/{n['healthy']} "
               f"(other-kind alarms on {n['other_alarms']} more), median delay {med} steps, "
               f"errors {n['errors']}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(dict(rows=rows, summary=summary, counts=n), fh, indent=1, default=str)
    print(summary)
    return 0 if recall >= 0.9 and n["false_alarms"] == 0 and n["errors"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
