"""Hostile run directories, and a process that runs every reader over them.

A case is a copy of a real run root (a finished run's log, events, overview, ring, registry
entry) in which some files were replaced by what another program or person could put there: a
FIFO, a symlink to a device (``/dev/zero``, ``/dev/urandom``) or to a directory, a directory, a
file extended by a hole to gigabytes, one cut short or with bytes flipped, JSON nested a hundred
thousand deep, and JSON with numbers past any bound (a world size of 10^9, a pid of 2^63).

``python -m tests.hostile_runs CASES...`` runs every reader over each case: the store's
(``load_run``, ``inspect_dir``, ``list_runs``, ``recorded_runs``, ``read_end``, the ring, the event
tail, the overview), the monitor's recorded source, and the commands a user runs (``check``,
``ls --all --json``, ``export``) in process. It prints one JSON line per reader call before it
makes it (so a hang names its reader) and a last line ``{"failures": [...]}``: every exception a
reader raised that is not its own documented error. The parent (``tests/unit/test_fuzz_hostile.py``)
runs it with a timeout and a memory limit: a hang, a crash by a signal or a balloon fail it too.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

RUN = "runs/victim"
#: The files of the base run a case may replace (relative to the root).
FILES = (
    f"{RUN}/meta.json", f"{RUN}/end.json", f"{RUN}/events.jsonl", f"{RUN}/scalars.bin",
    f"{RUN}/layers.bin", f"{RUN}/scalars.crc", f"{RUN}/layers.crc", f"{RUN}/overview.bin",
    f"{RUN}/ring", f"{RUN}/copied.json", f"{RUN}/first_stop.json", "registry/victim.json",
    "registry/extra.json",
)  # fmt: skip
KINDS = (
    "fifo", "zero", "urandom", "dir-link", "dir", "hole", "cut", "flip", "deep", "huge", "empty",
)  # fmt: skip
HUGE = {"world_size": 10**9, "pid": 2**63, "rank": 2**40, "steps": 10**400, "step": -(2**70),
        "started": 1e308, "start_time": -1e308, "version": 2**64, "slots": 2**62}  # fmt: skip


def make_base(root: Path) -> Path:
    """A real run root: a finished run of 300 steps with events and an overview, its ring, and a
    registry entry naming it (the run's pid: this process, so it reads as this machine's)."""
    from nnwatch.store.ring import RingWriter
    from nnwatch.testing.fixture import FixtureSource, write_run

    run_dir = write_run(FixtureSource(300), root / RUN)
    meta = FixtureSource(300).meta
    ring = RingWriter(run_dir / "ring", meta.schema.record_size, slots=64, meta_json=meta.to_json())
    for rec in FixtureSource(300).records(250, 300):
        ring.publish(memoryview(rec.tobytes()))
    ring.close("finished")
    (root / "registry").mkdir(mode=0o700)
    entry = {"pid": os.getpid(), "name": "victim", "host": os.uname().nodename, "rank": 0,
             "world_size": 1, "run_dir": str(run_dir), "ring": str(run_dir / "ring"),
             "started": time.time(), "start_time": 0.0, "socket": None}  # fmt: skip
    for name in ("victim", "extra"):
        path = root / "registry" / f"{name}.json"
        path.write_text(json.dumps(entry))
        path.chmod(0o600)
    (run_dir / "copied.json").write_text(json.dumps({"host": "elsewhere", "copied": time.time()}))
    (run_dir / "first_stop.json").write_text(json.dumps({"rank": 0, "seen_at": time.time()}))
    os.chmod(root, 0o700)
    return root


def plant(root: Path, rel: str, kind: str, seed: int) -> None:
    """Replace ``root/rel`` by one hostile kind of thing (see the module's docstring)."""
    path = root / rel
    rng = random.Random(seed)
    old = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
    if os.path.lexists(path):
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    if kind == "fifo":
        os.mkfifo(path, 0o600)
    elif kind in ("zero", "urandom"):
        path.symlink_to(f"/dev/{kind}")
    elif kind == "dir-link":
        path.symlink_to(root)
    elif kind == "dir":
        path.mkdir()
    elif kind == "hole":
        path.write_bytes(old)
        os.truncate(path, len(old) + rng.choice((1 << 20, 1 << 30, 3 << 30)))
    elif kind == "cut":
        path.write_bytes(old[: rng.randrange(len(old) + 1)] if old else b"")
    elif kind == "flip":
        data = bytearray(old or b"\0" * 64)
        for _ in range(rng.randrange(1, 9)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        path.write_bytes(bytes(data))
    elif kind == "deep":
        depth = rng.choice((1000, 100_000))
        path.write_bytes(b"[" * depth + b"]" * depth if rng.random() < 0.5 else b'{"a":' * depth)
    elif kind == "huge":
        try:
            doc = json.loads(old)
        except ValueError:
            doc = {}
        doc = doc if isinstance(doc, dict) else {}
        doc.update(rng.sample(sorted(HUGE.items()), rng.randrange(1, len(HUGE) + 1)))
        path.write_text(json.dumps(doc))
    else:
        path.write_bytes(b"")
    if path.exists() and not path.is_symlink():
        os.chmod(path, 0o700 if path.is_dir() else 0o600)


# -- the child: every reader over every case ------------------------------------------------------


def _readers(root: Path) -> list[tuple[str, Any, tuple[type[BaseException], ...]]]:
    """(name, call, the errors it may raise: its own, with a message) for every reader."""
    from nnwatch.cli import main as cli
    from nnwatch.sources.base import SourceError
    from nnwatch.sources.recorded import RecordedSource
    from nnwatch.store import overview, registry
    from nnwatch.store.event_tail import EventTail
    from nnwatch.store.health import read_end
    from nnwatch.store.ring_layout import RingError
    from nnwatch.store.ring_reader import RingReader
    from nnwatch.store.run_reader import iter_events, load_run
    from nnwatch.store.runlog import RunLogError

    run = root / RUN

    def ring() -> None:
        with RingReader(run / "ring") as reader:
            reader.read()
            reader.latest()

    def recorded() -> None:
        source = RecordedSource(run)
        try:
            for _ in range(3):
                source.poll()
        finally:
            source.close()

    def quiet(*argv: str) -> Any:
        def call() -> None:
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                cli(list(argv))
            if "Traceback" in out.getvalue():
                raise AssertionError(out.getvalue()[-2000:])

        return call

    fields = ("loss", "grad_norm")
    return [
        ("load_run", lambda: load_run(run), (RunLogError,)),
        ("read_end", lambda: read_end(run), ()),
        ("inspect_dir", lambda: registry.inspect_dir(run), ()),
        ("list_runs", lambda: registry.list_runs(root, problems=[]), ()),
        ("recorded_runs", lambda: registry.recorded_runs(root, problems=[]), ()),
        ("iter_events", lambda: list(iter_events(run / "events.jsonl", [])), ()),
        ("event_tail", lambda: EventTail(run / "events.jsonl").read_events(), ()),
        ("ring", ring, (RingError,)),
        ("overview", lambda: overview.read_stored(run / "overview.bin", fields, 8), (ValueError, OSError)),
        ("recorded_source", recorded, (SourceError, RunLogError)),
        ("cli check", quiet("check", str(run), "--no-plot", "--json"), (SystemExit,)),
        ("cli ls", quiet("ls", "--all", "--json", "--root", str(root)), (SystemExit,)),
        ("cli export", quiet("export", "tensorboard", str(run), str(root.parent / (root.name + "-tb"))), (SystemExit,)),
    ]  # fmt: skip


def main(roots: list[str]) -> int:
    failures: list[str] = []
    for text in roots:
        root = Path(text)
        for name, call, allowed in _readers(root):
            print(json.dumps({"case": text, "reader": name}), flush=True)
            try:
                call()
            except allowed as exc:
                if not str(exc) and not isinstance(exc, SystemExit):
                    failures.append(f"{text} {name}: {type(exc).__name__} without a message")
            except BaseException as exc:  # noqa: BLE001 - every other one is a finding
                tb = "".join(traceback.format_exception(exc))[-1500:]
                failures.append(f"{text} {name}: {type(exc).__name__}: {exc}\n{tb}")
    print(json.dumps({"failures": failures}), flush=True)
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main(sys.argv[1:]))
