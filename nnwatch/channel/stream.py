"""The ``subscribe`` stream: a run's history, then its live records, events and status, sent down
one socket connection to a monitor that cannot read the run's files (for example through
``ssh -L``).

It reads the ring and the run log from disk like any local reader, so the trainer does no extra
work per monitor. The command server normally runs it in a separate process
(``python -m nnwatch.channel.stream --fd N ...``), which keeps even its CPU time and GIL use away
from the training process, and lets it report the trainer's crash after the trainer is gone.

Messages, one JSON object per line after the ``subscribe`` reply (whose ``data.meta`` holds the
run's RunMeta JSON). Binary rows travel as base64 of their little-endian bytes::

    {"type": "scalars", "rows": n, "data": ...}   history rows of schema.scalar_dtype()
    {"type": "layers", "rows": n, "data": ...}    history rows of schema.layer_row_dtype()
    {"type": "records", "rows": n, "seq": s, "dropped": d, "torn": t, "data": ...}  live records
    {"type": "events", "events": [...]}           lines of events.jsonl
    {"type": "status", "state": ..., "message": ..., "heartbeat_age": ..., ...}
    {"type": "end", "state": "finished" | "crashed", "message": ...}   then the stream closes
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import select
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np

from nnwatch.channel.commands import encode_reply
from nnwatch.channel.health import Liveness
from nnwatch.channel.history import gap_rows, load_history
from nnwatch.channel.ring import RingError, RingReader
from nnwatch.channel.tail import EventTail

#: A monitor that accepts nothing for this long is cut off (it only loses its own stream).
SEND_TIMEOUT = 10.0
#: Raw bytes per message, before base64; bounds each line a client must buffer.
CHUNK_BYTES = 1024 * 1024
STATUS_EVERY = 0.5
DEFAULT_MAX_HZ = 20.0


class _Gone(Exception):
    """The monitor closed its end or stopped reading."""


def _send(sock: socket.socket, message: dict[str, Any] | bytes) -> None:
    line = message if isinstance(message, bytes) else (json.dumps(message) + "\n").encode()
    try:
        sock.sendall(line)
    except OSError as exc:  # includes the send timeout
        raise _Gone from exc


def _rows_message(kind: str, rows: np.ndarray, **extra: Any) -> dict[str, Any]:
    data = base64.b64encode(np.ascontiguousarray(rows).tobytes()).decode("ascii")
    return {"type": kind, "rows": int(len(rows)), **extra, "data": data}


def _send_rows(sock: socket.socket, kind: str, rows: np.ndarray) -> None:
    per = max(1, CHUNK_BYTES // max(1, rows.dtype.itemsize))
    for i in range(0, len(rows), per):
        _send(sock, _rows_message(kind, rows[i : i + per]))


def _send_history(sock: socket.socket, run_dir: Path) -> float | None:
    """Send the run log's scalars and layer rows; returns the last step sent, if any."""
    loaded = load_history(run_dir)
    if loaded is None:
        return None
    scalars, layers = loaded
    _send_rows(sock, "scalars", scalars)
    _send_rows(sock, "layers", layers)
    return float(scalars["step"][-1]) if len(scalars) else None


def serve_subscription(
    sock: socket.socket,
    *,
    ring_path: Path,
    run_dir: Path,
    request: dict[str, Any],
    mode: str,
) -> None:
    """Stream until the run ends (then send ``end``) or the monitor goes away. Never raises."""
    try:
        _serve(sock, Path(ring_path), Path(run_dir), request, mode)
    except _Gone:
        pass


def _serve(
    sock: socket.socket, ring_path: Path, run_dir: Path, request: dict[str, Any], mode: str
) -> None:
    sock.settimeout(SEND_TIMEOUT)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * 1024 * 1024)
    except OSError:
        pass
    rid = request.get("id")
    args = request.get("args") or {}
    history = bool(args.get("history", True))
    period = 1.0 / float(args.get("max_hz", DEFAULT_MAX_HZ))
    try:
        reader = RingReader(ring_path, start=args.get("start", "oldest"))
    except RingError as exc:
        _send(sock, encode_reply(rid, ok=False, error=str(exc)))
        return
    try:
        meta_json = reader.meta_json
        if not meta_json:
            try:
                meta_json = (run_dir / "meta.json").read_text()
            except OSError:
                meta_json = ""
        data = {
            "meta": meta_json, "mode": mode, "run_dir": str(run_dir), "ring": str(ring_path),
            "pid": reader.pid, "slots": reader.slots, "record_size": reader.record_size,
        }  # fmt: skip
        _send(sock, encode_reply(rid, ok=True, data=data))
        last_step = _send_history(sock, run_dir) if history else None
        check_gap = last_step is not None
        events = EventTail(run_dir / "events.jsonl")
        meta = reader.meta
        liveness = Liveness(host=meta.host if meta else None, run_dir=run_dir)
        per_message = max(1, CHUNK_BYTES // reader.record_size)
        shown: tuple[str, str] | None = None
        last_status = 0.0
        while True:
            while True:
                batch = reader.read_batch(max_records=per_message)
                records, seqs = batch.records, batch.seqs
                if last_step is not None and len(records) and meta is not None:
                    keep = records["step"] > last_step
                    records, seqs = records[keep], seqs[keep]
                    first = float(records["step"][0]) if len(records) else last_step
                    if check_gap and first > last_step + 1:
                        gap = gap_rows(run_dir, last_step, first)
                        if gap is not None:
                            _send_rows(sock, "scalars", gap[0])
                            _send_rows(sock, "layers", gap[1])
                    check_gap = False
                    if len(records):
                        last_step = float(records["step"][-1])
                if len(records) or batch.dropped or batch.torn:
                    first = int(seqs[0]) if len(seqs) else reader.next_seq
                    _send(sock, _rows_message(
                        "records", records, seq=first, dropped=batch.dropped, torn=batch.torn
                    ))  # fmt: skip
                if len(batch.records) + batch.dropped + batch.torn < per_message:
                    break
            new_events = events.read()
            if new_events:
                _send(sock, {"type": "events", "events": new_events})
            now = time.time()
            state = reader.state()
            health = liveness.judge(state, now)
            if (health.state, health.message) != shown or now - last_status >= STATUS_EVERY:
                shown, last_status = (health.state, health.message), now
                _send(sock, {
                    "type": "status", "state": health.state, "message": health.message,
                    "heartbeat_age": health.heartbeat_age, "last_step_age": health.last_step_age,
                    "step_interval": health.step_interval, "published": state.write_seq,
                    "dropped": reader.dropped, "torn": reader.torn, "time": now,
                })  # fmt: skip
            if health.ended and reader.pending == 0:
                _send(sock, {"type": "end", "state": health.state, "message": health.message})
                return
            ready, _, _ = select.select([sock], [], [], period)
            if ready:
                try:
                    if not sock.recv(4096):
                        return  # the monitor closed its end
                except OSError:
                    return
    finally:
        reader.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point of the stream process the command server starts for each subscriber."""
    parser = argparse.ArgumentParser(description="nnwatch: stream one run to one subscriber")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--ring", required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--request", default="{}")
    args = parser.parse_args(argv)
    try:
        os.nice(10)  # it may share the trainer's pinned cores: let the trainer go first
    except OSError:
        pass
    sock = socket.socket(fileno=args.fd)
    try:
        sock.setblocking(True)
        request = json.loads(args.request)
        serve_subscription(sock, ring_path=Path(args.ring), run_dir=Path(args.run_dir),
                           request=request, mode="process")  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - tell the monitor, in words, rather than vanish
        try:
            sock.sendall(encode_reply(None, ok=False, error=f"the stream failed: {exc!r}"))
        except OSError:
            pass
        return 1
    finally:
        sock.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
