"""``nnwatch export tensorboard RUN_DIR OUT_DIR``: a run's history as TensorBoard event files.

It reads the run log only (the same records the live ``watch(..., tensorboard=OUT_DIR)`` export
writes from), so it works on finished, crashed and still-running runs alike. Each run becomes one
TensorBoard run in ``OUT_DIR/<run directory name>``; open it with ``tensorboard --logdir OUT_DIR``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

COMMAND = "export"
HELP = "export a run's history to another tool's format (tensorboard)"

FORMATS = ("tensorboard",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("format", choices=FORMATS, help="output format")
    parser.add_argument(
        "run_dir", type=Path, nargs="+", metavar="RUN_DIR", help="run directories to export"
    )
    parser.add_argument("out_dir", type=Path, metavar="OUT_DIR", help="TensorBoard log directory")
    parser.add_argument(
        "--histogram-every",
        type=int,
        default=100,
        metavar="N",
        help="write the across-layer histograms every N steps (0: none; default 100)",
    )
    parser.add_argument("--no-layers", action="store_true", help="leave out the per-layer scalars")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier export of the same run in OUT_DIR",
    )


def run(args: argparse.Namespace) -> int:
    from nnwatch.export.tensorboard import ExportError, export_run

    if args.histogram_every < 0:
        print("nnwatch export: --histogram-every must be 0 or more", file=sys.stderr)
        return 2
    failed = 0
    for run_dir in args.run_dir:
        try:
            result = export_run(
                run_dir,
                args.out_dir,
                histogram_every=args.histogram_every,
                per_layer=not args.no_layers,
                overwrite=args.overwrite,
            )
        except (ExportError, OSError) as exc:
            print(f"nnwatch export: {run_dir}: {exc}", file=sys.stderr)
            failed += 1
            continue
        print(
            f"{run_dir} -> {result.out_dir}: {result.steps} steps, {result.layer_rows} layer rows, "
            f"{result.histograms} histograms, {result.findings} findings"
        )
    if failed < len(args.run_dir):
        print(f"open with: tensorboard --logdir {args.out_dir}")
    return 1 if failed else 0
