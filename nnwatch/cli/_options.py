"""The CLI's shared vocabulary: one metavar and one help text for each thing a command names.

The same thing is spelled the same way in every command's ``--help`` (a snapshot is always
SNAPSHOT_DIR, a model factory MODULE:FACTORY, a forwarded socket SOCKET), and the options that
several commands share are added here, so that they cannot drift apart.
``tests/unit/test_cli_help.py`` walks every command's help and holds the words to this module.
"""

from __future__ import annotations

import argparse
from pathlib import Path

#: The metavar of each thing a command names.
RUN = "RUN"
HOST_RUN = "HOST:RUN"
RUN_DIR = "RUN_DIR"
SNAPSHOT_DIR = "SNAPSHOT_DIR"
FACTORY = "MODULE:FACTORY"
FUNCTION = "MODULE:FUNCTION"
SOCKET = "SOCKET"
ROOT = "ROOT"
SECONDS = "SECONDS"
JOB = "JOB"
HOST = "HOST"
STEP = "STEP"

FACTORY_HELP = (
    "the model factory, 'pkg.module:make' or 'path/to/train.py:make': it returns the model, or "
    "{'model': model, 'loss_fn': loss_fn} where loss_fn(model, batch) computes the loss exactly as "
    "the training loop does"
)
SNAPSHOT_HELP = "a snapshot (<run>/snapshots/step-N) or a run directory (its newest snapshot)"


def add_root_argument(parser: argparse.ArgumentParser) -> None:
    """``--root``: where runs are looked up, for every command that looks runs up by name."""
    parser.add_argument(
        "--root", type=Path, default=None, metavar=ROOT,
        help="where runs live (default: $NNWATCH_RUN_DIR, else /dev/shm/nnwatch-$UID)",
    )  # fmt: skip


def add_connect_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """``--connect SOCKET``: a run's command socket forwarded by hand (``ssh -L``)."""
    parser.add_argument(
        "--connect", metavar=SOCKET,
        help=f"{what} through this socket (a run's socket forwarded with ssh -L) instead of a RUN",
    )  # fmt: skip
