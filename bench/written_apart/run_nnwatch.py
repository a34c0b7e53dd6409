#!/usr/bin/env python
"""Score a training monitor (nnwatch) on the sealed cases, through its public API only.

build() cases run in the standard loop below:
    w = nnwatch.watch(model, optimizer, scaler=..., num_classes=K, name=...)
    zero_grad -> forward (+autocast) -> backward (scaled) -> [unscale_ + clip_grad_norm_ when the
    case clips] -> step / scaler.step+update -> scheduler.step() -> w.step(loss, batch=(x, y))
run() cases run their own loop and call the watch factory they are given for every watched model
(several watches for a GAN); the findings of all of them are pooled.

Scoring (as the external suite's run_nnwatch.py): only findings of severity warning or worse count
(info / note / debug do not). A bug case is DETECTED when any of its expected kinds is found. A healthy
case, and each bug case's fixed control (--controls, build/run(seed, bug=False)), is a FALSE ALARM when
any pathology kind is found: the 8 kinds of the external suite plus loss_diverging.

    python run_nnwatch.py [--seeds 0,1,2] [--controls] [--cases a,b] [--json out.json] [--plain]

--plain runs every case with a no-op watch instead of nnwatch (it never imports nnwatch), to check
the runner and the cases themselves. Exit status: 0 when recall >= 0.9 and there are no false alarms
(--plain: 0 when no case crashed).
"""
from __future__ import annotations

import argparse
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
from cases._common import no_watch  # noqa: E402
from verify import all_case_names, load_case  # noqa: E402

PATHOLOGIES = {"exploding_gradients", "vanishing_gradients", "dead_relu", "nan_or_inf", "loss_stalled",
               "bad_initial_loss", "amp_scale_collapse", "oscillating_loss", "loss_diverging"}
NOT_ALARMS = {"info", "note", "debug"}


def _get(f, key):
    return f.get(key) if isinstance(f, dict) else getattr(f, key, None)


def make_factory(plain: bool, case_name: str, created: list):
    if plain:
        def factory(model, optimizer=None, *a, **kw):
            w = no_watch()
            created.append(("plain", w))
            return w
        return factory
    import nnwatch

    def factory(model, optimizer=None, *a, **kw):
        sub = kw.get("name")
        kw["name"] = f"sealed-{case_name}" + (f"-{sub}" if sub else "")
        w = nnwatch.watch(model, optimizer, *a, **kw)
        created.append((sub or "", w))
        return w
    return factory


def standard_loop(spec, factory, name):
    model, opt, loss_fn = spec["model"], spec["optimizer"], spec["loss_fn"]
    batches, steps = spec["batches"], int(spec["steps"])
    scaler, autocast, clip = spec.get("scaler"), spec.get("autocast"), spec.get("clip")
    scheduler, zero_grad = spec.get("scheduler"), spec.get("zero_grad", True)
    w = factory(model, opt, scaler=scaler, num_classes=spec.get("num_classes"))
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
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)  # as real code clips
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


def run_one(name: str, seed: int, bug: bool, plain: bool) -> dict:
    mod = load_case(name)
    kw = {} if bug else {"bug": False}
    created = []
    factory = make_factory(plain, name, created)
    t0 = time.time()
    err = None
    try:
        if hasattr(mod, "run"):
            mod.run(seed, watch=factory, **kw)
        else:
            standard_loop(mod.build(seed, **kw), factory, name)
    except Exception:
        err = traceback.format_exc(limit=3)
    for _, w in created:  # close any watch a crashed run left open (close() is idempotent in real code)
        try:
            w.close()
        except Exception:
            pass
    findings = []
    for sub, w in created:
        for f in list(getattr(w, "findings", []) or []):
            findings.append(dict(watch=sub, kind=_get(f, "kind"), step=_get(f, "step"), layer=_get(f, "layer"),
                                 severity=_get(f, "severity")))
    findings = [f for f in findings if str(f["severity"]).lower() not in NOT_ALARMS]
    return dict(findings=findings, seconds=time.time() - t0, error=err, watches=len(created))


def has_control(mod):
    fn = mod.run if hasattr(mod, "run") else mod.build
    return "bug" in inspect.signature(fn).parameters and mod.CASE.get("control", True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--cases", default="")
    ap.add_argument("--controls", action="store_true", help="also run each bug case's fixed variant")
    ap.add_argument("--json", default="")
    ap.add_argument("--plain", action="store_true", help="no-op watch instead of nnwatch (runner self-check)")
    a = ap.parse_args()
    run_dir = tempfile.mkdtemp(prefix="nnw-sealed-")  # fresh, mode 0700
    os.chmod(run_dir, 0o700)
    os.environ["NNWATCH_RUN_DIR"] = run_dir
    torch.set_num_threads(1)
    names = a.cases.split(",") if a.cases else all_case_names()
    rows, detected, bugs, false_alarms, healthy_runs, delays, errors = [], 0, 0, 0, 0, [], 0
    for seed in [int(s) for s in a.seeds.split(",")]:
        for name in names:
            mod = load_case(name)
            case = mod.CASE
            expected = set(case["expected"]) - {"healthy"}
            variants = [(True, expected)]
            if a.controls and expected and has_control(mod):
                variants.append((False, set()))
            for bug, exp in variants:
                r = run_one(name, seed, bug, a.plain)
                kinds = {f["kind"] for f in r["findings"]} - {None}
                label = name if bug else name + "[fixed]"
                errors += bool(r["error"])
                extra = []
                if exp:
                    bugs += 1
                    hit = bool(kinds & exp)
                    detected += hit
                    first = [f["step"] for f in r["findings"] if f["kind"] in exp and f["step"] is not None]
                    onset = case.get("onset_by_seed", {}).get(seed, case.get("onset_step"))
                    if hit and first and onset is not None:
                        delays.append(min(first) - onset)
                    verdict = "DETECTED" if hit else "MISSED"
                    extra = sorted(kinds & PATHOLOGIES - exp - set(case.get("acceptable", [])))
                else:
                    healthy_runs += 1
                    bad = sorted(kinds & PATHOLOGIES)
                    false_alarms += bool(bad)
                    verdict = ("FALSE-ALARM " + ",".join(bad)) if bad else "clean"
                line = f"seed {seed} {label:42s} {verdict:32s} found={sorted(kinds)}"
                if extra:
                    line += f" extra={extra}"
                if r["error"]:
                    line += " ERROR=" + r["error"].strip().splitlines()[-1][:160]
                line += f" ({r['seconds']:.1f}s)"
                print(line, flush=True)
                rows.append(dict(seed=seed, case=label, expected=sorted(exp), **r))
    recall = detected / bugs if bugs else 0.0
    med = statistics.median(delays) if delays else float("nan")
    mode = "PLAIN (no monitor)" if a.plain else "nnwatch"
    summary = (f"sealed suite [{mode}]: recall {detected}/{bugs} = {recall:.2f}, false alarms "
               f"{false_alarms}/{healthy_runs}, median delay {med} steps, crashed runs {errors}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(dict(rows=rows, summary=summary), fh, indent=1, default=str)
    print(summary)
    if a.plain:
        return 0 if errors == 0 else 1
    return 0 if recall >= 0.9 and false_alarms == 0 and errors == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
