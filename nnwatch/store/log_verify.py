"""Judging the rows of a mapped log file: their checksums, a zero tail, a header that does not fit.

:func:`nnwatch.store.run_reader.load_run` maps a log's rows and must never trust them: this is
how it tells which rows a checksum vouches for, which failed theirs (damage on disk), which are
zeros a crash or a copy left past the last row, and why a header does not describe the rows
``meta.json`` does. Each check only reads, and says what it found in words for the warnings.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

from nnwatch.store.runlog import CRC_ENTRY, HEADER_SIZE, KIND_LAYERS, KIND_SCALARS, crc_path
from nnwatch.store.safe_read import read_held


def _checksummed(path: Path) -> int:
    """How many rows from the first the checksum file beside ``path`` covers, in order."""
    try:
        table = read_held(crc_path(path), limit=1 << 31)
    except OSError:
        return 0
    covered = 0
    for first, count, _crc in CRC_ENTRY.iter_unpack(table[: len(table) - len(table) % CRC_ENTRY.size]):
        if first != covered:
            break
        covered += count
    return covered


def _zero_tail(rows: np.ndarray, chunk: int = 4096) -> int:
    """How many rows at the end of ``rows`` are all zero bytes (no row nnwatch writes is: its
    step and rates are set), read back from the end a chunk at a time."""
    if not len(rows):
        return 0
    raw = rows.view(np.uint8).reshape(len(rows), -1) if rows.flags.c_contiguous else None
    if raw is None:
        return 0
    end = len(rows)
    while end > 0:
        start = max(0, end - chunk)
        filled = np.flatnonzero(raw[start:end].any(axis=1))
        if len(filled):
            return len(rows) - (start + int(filled[-1]) + 1)
        end = start
    return len(rows)


def _header_mismatch(path: Path, size: int, row_size: int, file_kind: int, want: int) -> str:
    """Why a log's header does not describe the rows ``meta.json`` does, in the words that fit:
    a header that cannot be a log's (a kind that does not exist, rows that do not divide the
    file while the meta's rows do) is damaged; a whole other layout is another run's file."""
    body = size - HEADER_SIZE
    plausible = file_kind in (KIND_SCALARS, KIND_LAYERS) and 0 < row_size <= 1 << 24 and row_size % 4 == 0
    if not plausible or (body % row_size != 0 and body % want == 0):
        return (
            f"{path}: its header is damaged (it says {row_size}-byte rows of kind {file_kind}; "
            f"meta.json describes {want}-byte rows); its rows cannot be lined up safely"
        )
    return (
        f"{path} holds rows of {row_size} bytes but meta.json describes {want}; "
        "the run directory mixes files from different runs"
    )


def _failed_checksums(
    path: Path, rows: np.ndarray, warnings: list[str], *, ended: bool = True
) -> np.ndarray | None:
    """A mask of the rows whose block checksum fails, or None when every checked block is good.

    Rows that no checksum entry covers are kept but named (``ended``: the run will write no
    more): an empty or short ``.crc`` is what a disk that filled between the rows and their
    checksums leaves, and saying nothing would load damaged bytes as if they were verified.
    """
    try:
        table = read_held(crc_path(path), limit=1 << 31)  # a hole at its end is no checksum
    except FileNotFoundError:
        warnings.append(f"{path.name}: its checksums ({crc_path(path).name}) are missing; rows not verified")
        return None
    except OSError as exc:
        warnings.append(f"{crc_path(path).name} cannot be read ({exc.strerror or exc}); rows not verified")
        return None
    raw = rows.view(np.uint8).reshape(-1) if rows.flags.c_contiguous else np.ascontiguousarray(rows).view(np.uint8)
    row_size = rows.dtype.itemsize
    n = len(rows)
    bad: np.ndarray | None = None
    expected = 0
    inconsistent = cut = False
    for first, count, crc in CRC_ENTRY.iter_unpack(table[: len(table) - len(table) % CRC_ENTRY.size]):
        if first != expected or count == 0 or first + count > n:
            if first + count > n and first == expected:
                cut = True
                break  # the rows of the last block were cut short (a killed writer)
            warnings.append(f"{crc_path(path).name} is inconsistent with {path.name}; later rows not verified")
            inconsistent = True
            break
        chunk = raw[first * row_size : (first + count) * row_size]
        if zlib.crc32(chunk.data) != crc:  # the mapped bytes, not a copy
            if bad is None:
                bad = np.zeros(n, dtype=bool)
            bad[first : first + count] = True
        expected = first + count
    if ended and not inconsistent and expected < n:
        why = (
            "it is empty" if not table
            else "their block's rows are cut short" if cut
            else "it ends mid-entry" if len(table) % CRC_ENTRY.size
            else "its entries stop before them"
        )  # fmt: skip
        warnings.append(
            f"{n - expected} of the {n} row(s) in {path.name} (from row {expected}) have no "
            f"checksum in {crc_path(path).name} ({why}) and are not verified: a disk that filled "
            "up, or a writer killed between its rows and their checksum"
        )
    return bad
