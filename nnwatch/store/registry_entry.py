"""A registry entry: where it goes, what it holds, and the check every reader makes of it.

The writing side (``build_entry``, ``register``, ``unregister``, the entry and socket paths) is
what a trainer's endpoint uses; :func:`validate_entry` is what every reader runs before it uses a
field. :mod:`nnwatch.store.registry` reads the entries back into runs (``list_runs``), and
:mod:`nnwatch.store.registry_gc` removes those of runs that are gone (``gc``).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any, cast

from nnwatch._version import __version__
from nnwatch.store.identity import namespace_tag, own_start_time, pid_namespace, this_host
from nnwatch.store.paths import default_root, ensure_private_dir, own_dir, write_private_file
from nnwatch.store.schema import MAX_WORLD_SIZE, RunMeta

REGISTRY_DIR = "registry"
SOCKET_DIR = "s"
ENTRY_VERSION = 1
#: sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107

def registry_dir(root: Path | None = None) -> Path:
    return (Path(root) if root is not None else default_root()) / REGISTRY_DIR


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:64] or "host"


def _instance_suffix(instance: int) -> str:
    """The first open watch of a process has no suffix; a second one at the same time (two
    models watched in one notebook) gets ``-w2``, and so on, so that each is its own run."""
    return "" if int(instance) <= 1 else f"-w{int(instance)}"


def entry_path(host: str, pid: int, rank: int, root: Path | None = None, instance: int = 1) -> Path:
    """Where this process's entry goes: host, pid (with :func:`namespace_tag`: pid 1 of two
    containers sharing /dev/shm are two runs), rank and instance."""
    name = f"{_safe(host)}-{int(pid)}{namespace_tag()}-r{int(rank)}{_instance_suffix(instance)}"
    return registry_dir(root) / f"{name}.json"


def socket_path(pid: int, rank: int, root: Path | None = None, instance: int = 1) -> Path:
    """Where a run's command socket goes: ``<root>/s/<pid>-r<rank>.sock`` (``-w2`` and up for
    further watches open at once in one process), or a short private directory under /tmp when
    the root is too deep for a Unix socket path."""
    root = Path(root) if root is not None else default_root()
    name = f"{int(pid)}{namespace_tag()}-r{int(rank)}{_instance_suffix(instance)}.sock"
    path = root / SOCKET_DIR / name
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
        ensure_private_dir(path.parent)
        return path
    short = own_dir(Path("/tmp"), f"nnwatch-{os.getuid()}-s")  # never another user's
    ensure_private_dir(short)
    return short / name


def cuda_device_uuids() -> list[str]:
    """UUIDs of the visible CUDA devices, without initialising CUDA just for this."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return []
        return [
            str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())
        ]
    except Exception:  # noqa: BLE001 - a broken driver must not stop registration
        return []


def build_entry(
    meta: RunMeta,
    *,
    run_dir: Path,
    ring: Path,
    socket: Path | None,
    cuda_devices: list[str] | None = None,
) -> dict[str, Any]:
    """The registry entry for the calling process's run (pass it to :func:`register`)."""
    return {
        "entry_version": ENTRY_VERSION,
        "name": meta.name,
        "pid": os.getpid(),
        "pid_ns": pid_namespace(),
        "start_time": own_start_time(),
        "started": meta.started,
        "host": this_host(),
        "cmdline": list(sys.argv),
        "executable": sys.executable,
        "cwd": os.getcwd(),
        "rank": meta.rank,
        "local_rank": meta.local_rank,
        "world_size": meta.world_size,
        "cuda_devices": cuda_device_uuids() if cuda_devices is None else list(cuda_devices),
        "device": meta.device,
        "run_dir": str(run_dir),
        "ring": str(ring),
        "socket": str(socket) if socket is not None else None,
        "meta": str(Path(run_dir) / "meta.json"),
        "layer_names": list(meta.schema.layer_names),
        "nnwatch_version": meta.nnwatch_version or __version__,
    }


def register(entry: dict[str, Any], root: Path | None = None) -> Path:
    """Write ``entry`` atomically (mode 0600) and return its path."""
    reg = ensure_private_dir(registry_dir(root))
    instance = entry.get("instance", 1)
    path = reg / entry_path(
        entry["host"], entry["pid"], entry.get("rank", 0),
        instance=instance if isinstance(instance, int) else 1,
    ).name
    write_private_file(path, (json.dumps(entry, indent=1, sort_keys=True) + "\n").encode())
    return path


def unregister(path: Path) -> None:
    """Remove an entry (at a clean close). A missing entry is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class EntryError(ValueError):
    """A registry entry that cannot be used; the message says which field is wrong."""


#: (key, accepted JSON types) of the entry fields that readers use, checked before any use.
_ENTRY_FIELDS: tuple[tuple[str, tuple[type, ...]], ...] = (
    ("name", (str,)), ("host", (str,)), ("start_time", (int, float)), ("started", (int, float)),
    ("rank", (int,)), ("local_rank", (int,)), ("world_size", (int,)), ("run_dir", (str,)),
    ("ring", (str,)), ("socket", (str, type(None))), ("cwd", (str,)), ("cmdline", (list,)),
    ("cuda_devices", (list,)), ("layer_names", (list,)), ("nnwatch_version", (str,)),
    ("instance", (int,)), ("pid_ns", (int,)),
)  # fmt: skip


def validate_entry(entry: Any) -> dict[str, Any]:
    """Check every field a reader takes from a registry entry; raise :class:`EntryError` naming
    the first bad one. Unknown keys are kept (newer writers may add some)."""
    if not isinstance(entry, dict):
        raise EntryError("it is not a JSON object")
    pid = entry.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < 1 << 31:
        raise EntryError(f"pid must be a positive whole number, got {_show(pid)}")
    for key, kinds in _ENTRY_FIELDS:
        if key not in entry:
            continue
        value: Any = entry[key]
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            raise EntryError(f"{key} has the wrong type ({type(value).__name__})")
        if isinstance(value, float) and not math.isfinite(value):
            raise EntryError(f"{key} is not a finite number")
        value = cast(Any, value)  # its kind was checked above
        if isinstance(value, int) and key in ("rank", "local_rank", "instance") and not 0 <= value < 1 << 31:
            raise EntryError(f"{key} is out of range ({value})")
        if key == "world_size" and not 1 <= value <= MAX_WORLD_SIZE:
            raise EntryError(f"world_size is out of range ({value})")
        if isinstance(value, str) and "\0" in value:
            raise EntryError(f"{key} holds a NUL byte")
    if not entry.get("ring") or not entry.get("run_dir"):
        raise EntryError("it names no ring or run directory")
    return entry


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
