"""Score nnwatch on this second sealed batch (cases written apart from nnwatch's detectors).

build() cases run in the standard loop with nnwatch attached through its public API only:
    w = nnwatch.watch(model, optimizer, scaler=..., num_classes=K, name=...)
    ... clip_grad_norm_ (when the case clips) ... optimizer/scaler step ... scheduler.step() ... w.step(loss, batch=(x, y))
run() cases get `watch` (the factory) and call it once per watched model themselves.

A bug case counts as detected when any expected kind is found at severity warning or worse.
A healthy case (and each bug case's fixed control, with --controls) is a false alarm when any
pathology kind (loss_diverging included) is found at warning or worse. Notes (info) never count.

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

PATHOLOGIES = {"exploding_gradients", "vanishing_gradients", "dead_relu", "nan_or_inf", "loss_stalled",
               "bad_initial_loss", "amp_scale_collapse", "oscillating_loss", "loss_diverging"}
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
    w = factory(model, opt, scaler=scaler, num_classes=spec.get("num_classes"), name=f"sealed2-{name}")
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
            spec = mod.build(seed) if bug else mod.build(seed, bug=False)
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
            findings.append(dict(watch=wname, kind=_get(f, "kind"), step=_get(f, "step"), severity=sev,
                                 layer=_get(f, "layer")))
    return dict(findings=findings, seconds=time.time() - t0, error=err)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--cases", default="")
    ap.add_argument("--controls", action="store_true", help="also run each bug case's fixed variant")
    ap.add_argument("--json", default="")
    ap.add_argument("--plain", action="store_true", help="no-op watch; never imports nnwatch")
    a = ap.parse_args()
    rd = tempfile.mkdtemp(prefix="nnw-sealed2-")
    os.chmod(rd, 0o700)
    os.environ["NNWATCH_RUN_DIR"] = rd
    torch.set_num_threads(1)
    names = a.cases.split(",") if a.cases else all_case_names()
    rows, detected, bugs, false_alarms, healthy_runs, delays = [], 0, 0, 0, 0, []
    for seed in [int(s) for s in a.seeds.split(",")]:
        for name in names:
            mod = load_case(name)
            case = mod.CASE
            expected = set(case["expected"]) - {"healthy"}
            variants = [(True, expected)]
            fn = getattr(mod, "run", None) or mod.build
            if a.controls and expected and case.get("control", True) and "bug" in inspect.signature(fn).parameters:
                variants.append((False, set()))
            for bug, exp in variants:
                r = run_one(name, seed, bug, a.plain)
                kinds = {f["kind"] for f in r["findings"]}
                label = name if bug else name + "[fixed]"
                if exp:
                    bugs += 1
                    hit = bool(kinds & exp)
                    detected += hit
                    first = [f["step"] for f in r["findings"] if f["kind"] in exp and f["step"] is not None]
                    onset = case.get("onset_by_seed", {}).get(seed, case.get("onset_step"))
                    if hit and first and onset is not None:
                        delays.append(min(first) - onset)
                    verdict = "DETECTED" if hit else "MISSED"
                    extra = sorted(k for k in kinds - exp - set(case.get("acceptable", [])) if k)
                else:
                    healthy_runs += 1
                    bad = sorted(kinds & PATHOLOGIES)
                    false_alarms += bool(bad)
                    verdict = ("FALSE-ALARM " + ",".join(bad)) if bad else "clean"
                    extra = []
                line = f"seed {seed} {label:46s} {verdict:30s} found={sorted(k for k in kinds if k)} {r['seconds']:.1f}s"
                if extra:
                    line += f" extra={extra}"
                if r["error"]:
                    line += " ERROR=" + r["error"].strip().splitlines()[-1][:160]
                print(line, flush=True)
                rows.append(dict(seed=seed, case=label, expected=sorted(exp), **r))
    recall = detected / bugs if bugs else 0.0
    med = statistics.median(delays) if delays else float("nan")
    summary = (f"sealed batch 2{' (plain: no-op watch)' if a.plain else ''}: recall {detected}/{bugs} = {recall:.2f}, "
               f"false alarms {false_alarms}/{healthy_runs}, median delay {med} steps")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(dict(rows=rows, summary=summary), fh, indent=1, default=str)
    print(summary)
    return 0 if recall >= 0.9 and false_alarms == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
