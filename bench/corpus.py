"""What nnwatch costs the corpus programs: training scripts written the way public projects write them.

Each program in ``tests/corpus/`` (except ``crash.py``) runs as a subprocess, ``--rounds`` times
bare (``NNWATCH_DISABLE=1``: ``watch()`` returns an inert watch, no hooks, no files) and as many
times watched, a bare and a watched run side by side in every round (which goes first flips every
round, so that the machine's drift hits both alike). Each program prints
``CORPUS_TRAIN_SECONDS``, the wall time of its training loop only (the ``with nnwatch.watch()``
block, so the watch's set-up and close are paid for; imports and data set-up are not). The
report gives, per program, the median bare and watched seconds and the per-round ratio, and the
steady step (the median time between updates over the second half of a run) bare and watched.
Each program runs longer than its test does (its own options, ``LONGER``), so that the steady
step is past nnwatch's warm-up; ``--short`` runs them as the tests do. Their steps are small (a
millisecond to tens of milliseconds on a CPU), so nnwatch's fixed per-step work weighs more here
than in a real run, and a ratio near 1.0 is within the noise of a shared machine: compare with
the spread.

    python bench/corpus.py                  # every program, 5 rounds
    python bench/corpus.py --programs vae gpt_accum --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "tests" / "corpus"
PROGRAMS = [
    "gpt_accum", "rnn_lm", "mnist_cnn", "vae", "dcgan", "hf_style", "manual_rescale", "amp_timm",
    "accelerate_glue", "diverging",
]
MARK = "CORPUS_TRAIN_SECONDS"
STEP_MARK = "CORPUS_STEP_SECONDS"
#: Each program's own options for a longer run (what its tests run is a few dozen updates, all
#: inside nnwatch's warm-up, where every step is measured in full): the steady step the report
#: gives is then the cost of a run past its start. ``diverging`` ends by itself.
LONGER: dict[str, list[str]] = {
    "gpt_accum": ["--max_iters=400"],
    "rnn_lm": ["--epochs", "8"],
    "mnist_cnn": ["--epochs", "8"],
    "vae": ["--epochs", "16"],
    "dcgan": ["--niter", "8"],
    "hf_style": ["--num_train_epochs", "8"],
    "manual_rescale": ["--epochs", "20"],
    "amp_timm": ["--epochs", "12"],
    "accelerate_glue": ["--num_train_epochs", "10"],
}


class ProgramFailed(RuntimeError):
    """A corpus program exited non-zero or printed no training time."""


def train_seconds(
    name: str, *, watched: bool, workdir: Path, short: bool = False
) -> tuple[float, float, float]:
    """Run one program once, in its own working and run directory: its training-loop seconds and
    its steady step time (the median between updates over the second half of the run)."""
    env = dict(os.environ)
    env.pop("CORPUS_OUT", None)  # no test plumbing: the plain program
    env.update(
        NNWATCH_RUN_DIR=str(workdir / "nnw"),
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
        CORPUS_TIMES="1",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    if watched:
        env.pop("NNWATCH_DISABLE", None)
    else:
        env["NNWATCH_DISABLE"] = "1"
    proc = subprocess.run(
        [sys.executable, str(CORPUS / f"{name}.py"), *([] if short else LONGER.get(name, []))],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=600,
    )
    found = {line.split()[0]: float(line.split()[1]) for line in proc.stdout.splitlines()
             if line.startswith((MARK, STEP_MARK))}
    if proc.returncode == 0 and MARK in found:
        return found[MARK], found.get(STEP_MARK, float("nan")), _own_share(workdir) if watched else float("nan")
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
    raise ProgramFailed(f"{name} ({'watched' if watched else 'bare'}) exited {proc.returncode}:\n{tail}")


Runs = tuple[list[tuple[float, float, float]], list[tuple[float, float, float]]]


def _own_share(workdir: Path) -> float:
    """What nnwatch's own work cost the watched run, as the probe timed it (end.json)."""
    for end in (workdir / "nnw" / "runs").glob("*/end.json"):
        try:
            return float(json.loads(end.read_text()).get("nnwatch_own_share", "nan"))
        except (OSError, ValueError, TypeError):
            continue
    return float("nan")


def measure(name: str, rounds: int, root: Path, short: bool = False) -> Runs:
    """(bare, watched) (seconds, step seconds), one of each per round, the order flipped every round."""
    bare: list[tuple[float, float]] = []
    watched: list[tuple[float, float]] = []
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        for w in order:
            workdir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
            (watched if w else bare).append(
                train_seconds(name, watched=w, workdir=workdir, short=short)
            )
        print(f"  {name}: round {r + 1}/{rounds} done", flush=True)
    return bare, watched


def report(results: dict[str, Runs]) -> list[str]:
    lines = [
        f"  {'program':<16} {'bare s':>8} {'watched s':>10} {'ratio':>7} "
        f"{'min':>7} {'max':>7} {'step ms':>8} {'step ratio':>11} {'min':>7} {'max':>7} {'own':>7}"
    ]
    for name, (bare, watched) in results.items():
        per_round = [w[0] / b[0] for b, w in zip(bare, watched, strict=True)]
        per_step = [w[1] / b[1] for b, w in zip(bare, watched, strict=True)]
        lines.append(
            f"  {name:<16} {statistics.median(b[0] for b in bare):8.3f} "
            f"{statistics.median(w[0] for w in watched):10.3f} {statistics.median(per_round):7.3f} "
            f"{min(per_round):7.3f} {max(per_round):7.3f} "
            f"{statistics.median(b[1] for b in bare) * 1e3:8.2f} {statistics.median(per_step):11.3f} "
            f"{min(per_step):7.3f} {max(per_step):7.3f} "
            f"{100 * statistics.median(w[2] for w in watched):6.2f}%"
        )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", nargs="+", default=PROGRAMS, choices=PROGRAMS)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--short", action="store_true", help="the programs' own lengths, as the tests run them")
    args = ap.parse_args()
    print(f"{len(args.programs)} corpus programs, {args.rounds} rounds, 1 torch thread each")
    results: dict[str, Runs] = {}
    with tempfile.TemporaryDirectory(prefix="nnw-corpus-bench-") as tmp:
        for name in args.programs:
            try:
                results[name] = measure(name, args.rounds, Path(tmp), args.short)
            except ProgramFailed as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
    print("\n".join(report(results)))
    print("\nbare s / watched s = median over the rounds of the training loop's wall time "
          "(CORPUS_TRAIN_SECONDS: the watch's set-up and close included), bare with "
          "NNWATCH_DISABLE=1; ratio = median (min, max) of each round's watched / bare; step ms = "
          "the bare program's steady step (median time between updates over the second half of "
          "a run); step ratio = median (min, max) of each round's watched / bare steady step; "
          "own = nnwatch's own time on the training thread as a share of the time between steps, "
          "as the probe timed it (end.json's nnwatch_own_share), median over the watched runs.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
