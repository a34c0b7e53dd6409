"""Which source opens a run the monitor was pointed at: a run from the registry's list (the
picker, the ``o`` chooser), or a name or directory on the command line (``--compare``). Live
runs are followed through their files and socket, the rest read from their logs. No UI library
is imported here, so the command line can use it before Textual starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nnwatch.sources.base import RunSource, SourceError
from nnwatch.sources.live import LiveSource
from nnwatch.sources.recorded import RecordedSource
from nnwatch.store.paths import default_root
from nnwatch.store.registry import list_runs, recorded_runs


def gpu_uuids_for(device: str, visible: list[str]) -> list[str]:
    """The uuid of the run's device ("cuda:1") among the uuids the trainer could see."""
    if not visible or not device.startswith("cuda"):
        return []
    index = device.partition(":")[2]
    i = int(index) if index.isdigit() else 0
    return [visible[i]] if i < len(visible) else []


def source_for(info: Any) -> tuple[RunSource, list[str]]:
    """The source for a listed run: live through its files and socket, else its recorded log;
    and the uuids of its GPUs when the registry knows them."""
    if info.live:
        source = LiveSource.from_info(info)
        return source, gpu_uuids_for(source.meta.device, list(info.cuda_devices))
    return RecordedSource(info.run_dir), []


def open_run_spec(spec: str, root: Path | None = None) -> RunSource:
    """A run named on the command line: a live run of that name (followed live), else a run
    directory, else a finished or crashed run of that name on disk. ``SourceError`` says why not."""
    base = root if root is not None else default_root()
    try:
        live = [r for r in list_runs(base) if r.live]
    except OSError:
        live = []
    for r in live:
        if spec in (r.name, Path(r.run_dir).name):
            return source_for(r)[0]
    path = Path(spec).expanduser()
    if path.is_dir():
        return RecordedSource(path)
    try:
        on_disk = recorded_runs(base) + recorded_runs(base / "runs")
    except OSError:
        on_disk = []
    for r in on_disk:
        if spec in (r.name, Path(r.run_dir).name):
            return RecordedSource(r.run_dir)
    for r in on_disk:
        if Path(r.run_dir).name.startswith(spec):
            return RecordedSource(r.run_dir)
    raise SourceError(
        f"{spec} is neither a live run, a run directory nor a run name; "
        "`nnwatch ls --all` lists the runs"
    )
