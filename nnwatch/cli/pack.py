"""``nnwatch pack RUN [STEP]``: a snapshot (or, with ``--run``, a whole run) as a checked stream
on stdout; what ``nnwatch pull HOST:RUN`` runs on the far host through ssh.

RUN is what ``nnwatch ls --all`` lists on this machine (a name or its start, a pid, a run
directory); a name that several finished runs share means the newest of them. STEP picks the
snapshot of that step (``--nearest``: the closest one); without it, the newest snapshot. The
stream is a tar framed by a header and a manifest of sha256s (``nnwatch.store.bundle``), so
``nnwatch pack RUN > run.tar`` also gives a file ``tar x`` reads.

Exit status: 0 sent, 3 no such run (the runs here are named), 4 no such snapshot (the steps there
are named), 1 a file could not be read.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

COMMAND = "pack"
HIDDEN = True  # run on the far host by `pull` over ssh
HELP = (
    "write a run's snapshot (or the whole run) to stdout as a checked stream (nnwatch pull runs it)"
)

EXIT_NO_RUN = 3
EXIT_NO_SNAPSHOT = 4


class PackError(Exception):
    """Nothing to send: no such run or snapshot. ``code`` is the exit status that says which."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run",
        metavar="RUN",
        help="run name (or its start), pid or run directory; '' for the only run",
    )
    add_choice_arguments(parser)
    from nnwatch.cli._options import add_root_argument

    add_root_argument(parser)


def add_choice_arguments(parser: argparse.ArgumentParser) -> None:
    """STEP, --nearest and --run: which snapshot, or the whole run (``pack`` and ``pull``)."""
    parser.add_argument(
        "step", metavar="STEP", nargs="?", type=int, default=None,
        help="the snapshot of this step (default: the newest snapshot)",
    )  # fmt: skip
    parser.add_argument(
        "--nearest", action="store_true", help="without a snapshot at STEP, take the closest one"
    )
    parser.add_argument(
        "--run", dest="whole", action="store_true",
        help="the whole run directory (its log, events and every snapshot), not one snapshot",
    )  # fmt: skip


def _label(r: Any) -> str:
    step = "" if r.step is None else f", step {r.step}"
    return f"{Path(r.run_dir).name} ({r.state}{step})"


def find_run(spec: str, root: Path | None = None) -> Any:
    """The run ``spec`` names among those ``nnwatch ls --all`` lists (a ``RunInfo``); a run
    directory that exists is taken as it is. PackError, naming the runs here, otherwise."""
    from nnwatch.store.registry import inspect_dir, list_runs, recorded_runs

    spec = spec.strip()
    runs = [*list_runs(root), *recorded_runs(root)]
    as_path = Path(spec).expanduser()
    if spec and (as_path / "meta.json").is_file():
        info = inspect_dir(as_path)
        if info is not None:
            return info
    if not runs:
        raise PackError(
            "there are no runs on this host (`nnwatch ls --all` lists none)", EXIT_NO_RUN
        )
    if not spec:
        if len(runs) == 1:
            return runs[0]
        raise PackError(
            f"{len(runs)} runs here: {', '.join(_label(r) for r in runs)}; name one (HOST:RUN)",
            EXIT_NO_RUN,
        )

    def hit(r: Any, exact: bool) -> bool:
        base = Path(r.run_dir).name
        if exact:
            return spec in (str(r.pid), r.run_dir, base, r.name)
        return r.name.startswith(spec) or base.startswith(spec)

    found = [r for r in runs if hit(r, True)] or [r for r in runs if hit(r, False)]
    if not found:
        raise PackError(
            f"no run here matches {spec!r}; the runs here: {', '.join(_label(r) for r in runs)}",
            EXIT_NO_RUN,
        )
    if len(found) > 1:
        if len({r.name for r in found}) == 1 and all(r.world_size <= 1 for r in found):
            return max(found, key=lambda r: r.started)  # the same script run again: the newest
        raise PackError(
            f"{spec!r} matches {len(found)} runs here: {', '.join(_label(r) for r in found)}; "
            "name one by its directory",
            EXIT_NO_RUN,
        )
    return found[0]


def snapshots(run_dir: Path) -> list[tuple[int, Path]]:
    """The complete snapshots of a run, as (step, directory), oldest step first (a step snapshotted
    twice, ``step-N`` and ``step-N.1``, in the order they were written)."""
    from nnwatch.diagnosis.snapshot import MANIFEST, SnapshotError, read_manifest
    from nnwatch.store.paths import SNAPSHOTS_DIR

    root = run_dir / SNAPSHOTS_DIR
    out: list[tuple[int, int, Path]] = []
    try:
        entries = list(os.scandir(root))
    except (FileNotFoundError, NotADirectoryError):
        return []
    for e in entries:
        if e.name.startswith(".") or not e.is_dir(follow_symlinks=False):
            continue  # a snapshot being written, or not a snapshot
        try:
            step = int(read_manifest(Path(e.path) / MANIFEST)["step"])
        except SnapshotError:
            continue
        again = e.name.rpartition(".")[2] if "." in e.name else "0"
        out.append((step, int(again) if again.isdigit() else 0, Path(e.path)))
    return [(s, p) for s, _, p in sorted(out)]


def _steps(found: list[tuple[int, Path]]) -> str:
    steps = list(dict.fromkeys(s for s, _ in found))
    shown = ", ".join(str(s) for s in steps[:30])
    return shown + (f" and {len(steps) - 30} more" if len(steps) > 30 else "")


def choose_snapshot(run_dir: Path, step: int | None, *, nearest: bool = False) -> tuple[int, Path]:
    """The snapshot of ``step`` (the newest of that step), the closest one with ``nearest``, or
    the newest without a step; PackError naming the steps there otherwise."""
    found = snapshots(run_dir)
    name = Path(run_dir).name
    if not found:
        raise PackError(
            f"{name} has no snapshot (take one with `s` in the monitor, "
            "`nnwatch ctl RUN snapshot` or w.request_snapshot(); --run copies the whole run)",
            EXIT_NO_SNAPSHOT,
        )
    if step is None:
        return found[-1]
    exact = [f for f in found if f[0] == step]
    if exact:
        return exact[-1]
    close = min(found, key=lambda f: (abs(f[0] - step), -f[0]))
    if nearest:
        return close
    raise PackError(
        f"{name} has no snapshot at step {step}; its snapshots are at steps {_steps(found)} "
        f"(--nearest takes the closest, step {close[0]})",
        EXIT_NO_SNAPSHOT,
    )


def redundant_rings(run_dir: Path) -> dict[str, str]:
    """The ring files (16 MiB each) whose every step the log already holds: a whole-run pull
    leaves them out. A ring with a step the log lacks (a crash, a live run's newest steps), or one
    that cannot be read, is sent."""
    import numpy as np

    from nnwatch.store.ring_layout import RingError, ring_path
    from nnwatch.store.ring_reader import RingReader
    from nnwatch.store.run_reader import load_run
    from nnwatch.store.runlog import RunLogError

    try:
        run = load_run(run_dir)
        path = ring_path(run_dir, run.meta.rank)
        with RingReader(path, start="oldest") as reader:
            records = reader.read()
    except (RunLogError, RingError, OSError, ValueError):
        return {}
    if any(w.startswith("recovered the last") for w in run.warnings):
        return {}  # load_run took steps from the ring that the log lacks
    logged = set(np.asarray(run.scalars["step"]).tolist()) if len(run.scalars) else set()
    ring_steps = np.asarray(records["step"]) if len(records) else np.zeros(0)
    if reader.torn or not np.isfinite(ring_steps).all():
        return {}
    if all(float(s) in logged for s in ring_steps.tolist()):
        return {path.name: "every step it holds is in the log"}
    return {}


def run(args: argparse.Namespace) -> int:
    from nnwatch.store.bundle import write_bundle
    from nnwatch.store.disk_errors import describe_os_error

    if args.whole and args.step is not None:
        print("nnwatch pack: --run copies the whole run; give no STEP with it", file=sys.stderr)
        return 2
    if sys.stdout.isatty():
        print(
            "nnwatch pack: this writes a tar stream; redirect it (nnwatch pack RUN > run.tar) "
            "or run `nnwatch pull HOST:RUN` on the machine that wants the files",
            file=sys.stderr,
        )
        return 2
    try:
        info = find_run(args.run, args.root)
        run_dir = Path(info.run_dir)
        header: dict[str, Any] = {
            "host": socket.gethostname(), "run": info.name, "run_dir": str(run_dir.resolve()),
            "state": info.state, "live": bool(info.live), "last_step": info.step,
            "status": info.status, "message": info.message, "judged_at": time.time(),
        }  # fmt: skip
        leave_out: dict[str, str] = {}
        if args.whole:
            header.update(kind="run", source=header["run_dir"])
            source = run_dir
            leave_out = redundant_rings(run_dir)
        else:
            step, source = choose_snapshot(run_dir, args.step, nearest=args.nearest)
            header.update(
                kind="snapshot", step=step, asked_step=args.step, name=source.name,
                source=str(source.resolve()),
            )  # fmt: skip
    except PackError as exc:
        print(f"nnwatch pack: {exc}", file=sys.stderr)
        return exc.code
    except OSError as exc:
        print(f"nnwatch pack: cannot read the runs here: {exc}", file=sys.stderr)
        return 1
    try:
        write_bundle(sys.stdout.buffer, source, header, leave_out)
    except OSError as exc:
        print(f"nnwatch pack: stopped: {describe_os_error(exc, source)}", file=sys.stderr)
        return 1
    return 0
