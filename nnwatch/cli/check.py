"""``nnwatch check module:factory``: the pre-flight checklist as one command;
``nnwatch check RUN_DIR``: the detectors over a recorded run, and the log put beside ``end.json``
and ``events.jsonl`` (exit 1 on an error-level finding, or on steps, records or checksums the
record cannot account for).

The factory takes no arguments and returns ``{"model", "loss_fn", "batch"}`` plus, optionally,
``num_classes``, ``loader``, ``decode`` and ``optimizer`` (the user's, to reproduce its class,
hyper-parameters and parameter membership), or the tuple ``(model, loss_fn, batch)``. The current
directory is put on ``sys.path`` first, as ``python -m`` does, so ``nnwatch check train:factory``
works next to ``train.py``. Exit status: 0 all checks passed, 1 a check failed, 2 the factory could
not be loaded or returned the wrong things.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

COMMAND = "check"
HELP = "run the pre-flight checks (initial loss, overfit one batch, gradients, LR range, batch)"

REQUIRED = ("model", "loss_fn", "batch")
OPTIONAL = ("num_classes", "loader", "decode", "optimizer")


class FactoryError(Exception):
    """The factory could not be imported, called or understood; the message says how to fix it."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target",
        metavar="MODULE:FACTORY | RUN_DIR",
        help="a zero-argument function returning {'model', 'loss_fn', 'batch', ...}, or the "
        "directory of a recorded run to diagnose",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--seed", type=int, default=0, help="seed for every check (default 0)")
    parser.add_argument("--max-norm", type=float, default=1.0, help="clip threshold (default 1.0)")
    parser.add_argument(
        "--overfit-steps", type=int, default=200, help="single-batch steps (default 200)"
    )
    parser.add_argument("--lr-steps", type=int, default=100, help="LR sweep steps (default 100)")
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="CHECK",
        help="skip a check: initial_loss, single_batch, gradient, lr_range or batch (repeatable)",
    )
    parser.add_argument("--no-plot", action="store_true", help="do not draw the LR curve")
    parser.add_argument(
        "--brief", action="store_true", help="only the table, without causes, curve and samples"
    )


def _resolve(target: str) -> Callable[[], Any]:
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise FactoryError(f"expected MODULE:FACTORY (e.g. train:make_checks), got {target!r}")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise FactoryError(
                f"cannot find module {module_name!r} (looked in {cwd} and on PYTHONPATH); run "
                "the command from the directory that holds it, or use a dotted package path"
            ) from exc
        raise FactoryError(
            f"importing {module_name!r} failed: {exc} (a dependency of your module is missing)"
        ) from exc
    except Exception as exc:
        raise FactoryError(
            f"importing {module_name!r} raised {type(exc).__name__}: {exc}\n"
            + "".join(traceback.format_exception(exc)[-3:]).rstrip()
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(
                n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))
            )
            raise FactoryError(
                f"module {module_name!r} has no {attr!r}; callables it defines: "
                f"{', '.join(public[:12]) or 'none'}"
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise FactoryError(f"{target} is a {type(obj).__name__}, not a function")
    factory: Callable[[], Any] = obj
    return factory


def _call(factory: Callable[[], Any], target: str) -> dict[str, Any]:
    import inspect

    try:
        sig = inspect.signature(factory)
        sig.bind()
    except TypeError as exc:
        raise FactoryError(f"{target} must take no arguments: {exc}") from exc
    except ValueError:
        pass  # builtins without a signature: just call
    try:
        made = factory()
    except Exception as exc:
        raise FactoryError(
            f"{target} raised {type(exc).__name__}: {exc}\n"
            + "".join(traceback.format_exception(exc)[-3:]).rstrip()
        ) from exc
    return _validate(made, target)


def _validate(made: Any, target: str) -> dict[str, Any]:
    import torch

    if isinstance(made, (tuple, list)):
        if len(made) != 3:
            raise FactoryError(
                f"{target} returned a {type(made).__name__} of {len(made)} items; a tuple must be "
                "(model, loss_fn, batch)"
            )
        made = dict(zip(REQUIRED, made, strict=True))
    if not isinstance(made, dict):
        raise FactoryError(
            f"{target} returned {type(made).__name__}; return a dict with keys "
            f"{', '.join(REQUIRED)} (optional: {', '.join(OPTIONAL)}) or (model, loss_fn, batch)"
        )
    missing = [k for k in REQUIRED if k not in made]
    if missing:
        raise FactoryError(
            f"{target} returned a dict without {', '.join(missing)} (it has "
            f"{', '.join(sorted(map(str, made))) or 'no keys'})"
        )
    unknown = sorted(set(made) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise FactoryError(
            f"{target} returned unknown key(s) {', '.join(map(str, unknown))}; allowed: "
            f"{', '.join(REQUIRED + OPTIONAL)}"
        )
    if not isinstance(made["model"], torch.nn.Module):
        raise FactoryError(f"'model' must be a torch.nn.Module, got {type(made['model']).__name__}")
    if not callable(made["loss_fn"]):
        raise FactoryError(f"'loss_fn' must be callable, got {type(made['loss_fn']).__name__}")
    opt = made.get("optimizer")
    if opt is not None and not isinstance(opt, torch.optim.Optimizer):
        raise FactoryError(f"'optimizer' must be a torch.optim.Optimizer, got {type(opt).__name__}")
    if made.get("decode") is not None and not callable(made["decode"]):
        raise FactoryError("'decode' must be a function of one sample")
    return made


def diagnose_recorded(path: str, as_json: bool) -> int:
    """Run every detector over a recorded run's log, put the log beside ``end.json`` and
    ``events.jsonl``, and print the findings and what the log is missing. Exit 1 on an
    error-level finding or on any gap or damage that cannot be ruled out."""
    from nnwatch.diagnosis import diagnose_run
    from nnwatch.store.completeness import audit
    from nnwatch.store.run_reader import load_run

    try:
        run = load_run(path)
    except Exception as exc:  # noqa: BLE001 - any unreadable run is reported in plain words
        print(
            f"nnwatch check: error: {path} is not a readable nnwatch run ({exc}); pass the "
            "directory `nnwatch ls` shows for the run",
            file=sys.stderr,
        )
        return 2
    gaps = audit(run)
    findings = diagnose_run(run) if len(run.scalars) else []
    found = {(f.kind, f.step) for f in findings}
    recorded = [e for e in gaps.recorded_findings if (e.finding.kind, e.step) not in found]
    bad = [f for f in findings if f.severity in ("error", "critical")]
    errors = len(bad) + len(recorded) + len(gaps.problems)
    if as_json:
        report = {
            "run": str(path),
            "steps": len(run.scalars),
            "steps_expected": gaps.steps_expected,
            "missing_steps": gaps.missing_steps,
            "findings": [f.to_dict() for f in findings],
            "recorded_findings": [e.to_json() for e in recorded],
            "problems": gaps.problems,
            "notes": gaps.notes,
            "errors": errors,
        }
        print(json.dumps(report, allow_nan=False, default=str))
        return 1 if errors else 0
    total = (
        f"{len(run.scalars)} steps" if gaps.steps_expected is None
        else f"{len(run.scalars)} of {gaps.steps_expected} steps in the log"
    )  # fmt: skip
    if not findings and not recorded and not gaps.problems:
        print(f"{path}: {total}, no problem found")
    else:
        print(f"{path}: {total}, {len(findings) + len(recorded)} finding(s), "
              f"{len(gaps.problems)} problem(s) with the record")  # fmt: skip
    for f in findings:
        print(f"[{f.severity}] {f.message}")
    for e in recorded:
        f = e.finding
        text = f.summary or f.kind or "a finding"  # an older line's message is its summary
        print(f"[{f.severity}] step {f.step}: {text} (recorded during the run)")
    for line in gaps.problems:
        print(f"[record] {line}")
    for line in gaps.notes:
        print(f"note: {line}")
    return 1 if errors else 0


def run(args: argparse.Namespace) -> int:
    from nnwatch.checks import CHECK_NAMES, run_all

    if ":" not in args.target and os.path.isdir(args.target):
        return diagnose_recorded(args.target, args.json)

    bad = [s for s in args.skip if s not in CHECK_NAMES]
    if bad:
        print(
            f"nnwatch check: error: unknown check {', '.join(bad)}; choose from "
            f"{', '.join(CHECK_NAMES)}",
            file=sys.stderr,
        )
        return 2
    try:
        spec = _call(_resolve(args.target), args.target)
    except FactoryError as exc:
        print(f"nnwatch check: error: {exc}", file=sys.stderr)
        return 2
    report = run_all(
        spec["model"],
        spec["loss_fn"],
        spec["batch"],
        num_classes=spec.get("num_classes"),
        loader=spec.get("loader"),
        decode=spec.get("decode"),
        optimizer=spec.get("optimizer"),
        max_norm=args.max_norm,
        overfit_steps=args.overfit_steps,
        lr_steps=args.lr_steps,
        skip=args.skip,
        seed=args.seed,
    )
    if args.json:
        print(json.dumps(report.to_dict(), allow_nan=False))
    else:
        print(report.format_text(plot=not args.no_plot, details=not args.brief))
    return report.exit_code
