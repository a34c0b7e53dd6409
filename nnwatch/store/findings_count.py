"""How many findings a run has: the number a run list shows beside each run.

Counted from ``events.jsonl`` without parsing it (a long run's events file is scanned every few
seconds while it grows), and cached by the file's size and modification time. ``nnwatch ls
--json`` puts the count into each row, so that a run list on another machine (``nnwatch HOST``)
shows the same number as one here.
"""

from __future__ import annotations

import threading
from pathlib import Path

from nnwatch.store.safe_read import iter_lines

_findings_cache: dict[str, tuple[int, int, int]] = {}  # events.jsonl -> (size, mtime_ns, count)
_cache_lock = threading.Lock()


def findings_count(run_dir: str | Path) -> int | None:
    """Findings in a run's ``events.jsonl`` (None if it has none to read)."""
    path = Path(run_dir) / "events.jsonl"
    try:
        st = path.stat()
    except OSError:
        return None
    key = str(path)
    with _cache_lock:
        hit = _findings_cache.get(key)
    if hit is not None and hit[:2] == (st.st_size, st.st_mtime_ns):
        return hit[2]
    n = 0
    try:  # never a link or a FIFO, no line without end, nothing past the file's data
        for line in iter_lines(path):
            n += line is not None and _is_finding_line(line)
    except OSError:
        return None
    with _cache_lock:
        _findings_cache[key] = (st.st_size, st.st_mtime_ns, n)
    return n


def _is_finding_line(line: bytes) -> bool:
    """A finding, as the TUI's ``is_finding`` judges a parsed event: it has a ``kind`` and its
    type is "finding" or absent (snapshots and commands have a type of their own)."""
    if b'"kind"' not in line:
        return False
    return b'"type": "finding"' in line or b'"type":"finding"' in line or b'"type"' not in line
