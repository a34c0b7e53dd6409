"""``nnwatch replay SNAPSHOT --model module:factory``: re-run a snapshotted step, bit for bit.

Rebuilds the model from the user's factory, loads the snapshot's weights, batch and RNG state
(``torch.load(weights_only=True)``: no pickled code), re-runs forward and backward, and checks that the
loss and gradient norm match the recorded ones bit for bit. ``--anomaly`` re-runs the step under
``torch.autograd.detect_anomaly()`` and prints the op and the source line that produced the NaN.
Exit status: 0 reproduced, 1 not reproduced, 2 the replay could not run.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

COMMAND = "replay"
HELP = "re-run a snapshotted step (bit-for-bit check; --anomaly finds the op and line of a NaN)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from nnwatch.cli._options import FACTORY, FACTORY_HELP, SNAPSHOT_DIR, SNAPSHOT_HELP

    parser.add_argument("snapshot", metavar=SNAPSHOT_DIR, help=SNAPSHOT_HELP)
    parser.add_argument(
        "--model",
        required=True,
        metavar=FACTORY,
        help=f"{FACTORY_HELP} (without loss_fn: cross-entropy on (inputs, targets))",
    )
    parser.add_argument(
        "--anomaly",
        action="store_true",
        help="run under torch.autograd.detect_anomaly() and name the op and line of the NaN",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="device to replay on (default: cpu, where results are bitwise reproducible)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    from nnwatch.diagnosis.replay import ReplayError, load_snapshot, replay

    try:
        snap = load_snapshot(args.snapshot)
        man = snap.manifest
        for note in snap.unverified:
            print(f"nnwatch replay: {note}", file=sys.stderr)
        if not args.json:
            print(
                f"nnwatch replay: step {man.get('step')} of run {man.get('run') or '?'} "
                f"(reason: {man.get('reason')}, torch {man.get('torch_version')}, {man.get('device')})"
            )
        result = replay(snap, args.model, anomaly=args.anomaly, device=args.device)
    except ReplayError as exc:
        print(f"nnwatch replay: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"nnwatch replay: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(_as_dict(result), indent=1, default=str))
    else:
        print(result.report())
        if result.reproduced:
            print("reproduced: the loss and the gradient norm match the original step bit for bit")
        elif result.original_loss is not None:
            print(
                "NOT reproduced: see the differences above (same thread count, device and loss_fn as training?)"
            )
    return 0 if result.reproduced else 1


def _as_dict(result: object) -> dict[str, Any]:
    from dataclasses import asdict

    d: dict[str, Any] = asdict(result)  # type: ignore[call-overload]
    d["reproduced"] = result.reproduced  # type: ignore[attr-defined]
    d["loss_matches"] = result.loss_matches  # type: ignore[attr-defined]
    d["grad_norm_matches"] = result.grad_norm_matches  # type: ignore[attr-defined]
    return d
