"""The ``subscribe`` stream: a run's history, then its live records, events and status, sent down
one socket connection to a monitor that cannot read the run's files (for example through
``ssh -L``).

It reads the ring and the run log from disk like any local reader, so the trainer does no extra
work per monitor. The command server normally runs it in a separate process
(``python -m nnwatch.channel.stream --fd N ...``), which keeps even its CPU time and GIL use away
from the training process, and lets it report the trainer's crash after the trainer is gone.

Resume, never restart: a monitor that reconnects sends what it holds (``after_step``: its last
step; ``start``: the next ring sequence it wants; ``events_offset``: how far into events.jsonl it
has read) and receives only what is new. When the ring no longer holds what the monitor needs (it
was away, or the link stalled), the steps in between are read from the run log; only steps that
neither holds are reported, as a ``gap`` with their count.

A stalled link costs the trainer nothing: the stream writes without blocking into a buffer of at
most ``OUT_LIMIT`` bytes; while it is full it stops reading the ring (which then overwrites what
this stream has not read, counted, and later filled from the log), and it goes on once the link
moves again. Only a monitor that closes its end, or one that takes nothing for ``STALL_LIMIT``
seconds, ends the stream.

Messages, one JSON object per line after the ``subscribe`` reply (whose ``data.meta`` holds the
run's RunMeta JSON, ``data.history_rows`` how many history rows follow and ``data.latest_step``
the trainer's newest step). Rows travel as their little-endian bytes: with ``binary`` the header
line says ``"bytes": B`` (and ``"zlib": true`` when compressed) and B raw bytes follow it;
without, as base64 in ``data``. A message never holds 0 rows::

    {"type": "scalars", "rows": n, ...}   history rows of schema.scalar_dtype()
    {"type": "layers", "rows": n, ...}    history rows of schema.layer_row_dtype()
    {"type": "records", "rows": n, "seq": s, "next_seq": s2, "torn": t, ...}  live records
    {"type": "gap", "after_step": a, "before_step": b, "missing": m}   steps neither ring nor log has
    {"type": "events", "events": [...], "offset": o}   lines of events.jsonl, read up to byte o
    {"type": "status", "state": ..., "message": ..., "latest_step": ..., "caught_up": ..., ...}
    {"type": "end", "state": "finished" | "crashed", "message": ...}   then the stream closes
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np

from nnwatch.channel import stream_summary as summ
from nnwatch.channel.commands import encode_reply
from nnwatch.channel.stream_wire import _Gone, _json_line, _Out, _rows_bytes
from nnwatch.store import overview as ov
from nnwatch.store.event_tail import EventTail
from nnwatch.store.health import Health, Liveness
from nnwatch.store.log_catchup import gap_rows, load_history
from nnwatch.store.ring_layout import RingError
from nnwatch.store.ring_reader import RingReader, RingState
from nnwatch.store.safe_read import read_small_file
from nnwatch.store.schema import FieldName

#: Raw bytes per message; bounds each message a client must buffer.
CHUNK_BYTES = 1024 * 1024
STATUS_EVERY = 0.5
DEFAULT_MAX_HZ = 20.0
#: Backlog (records) under which the stream counts as caught up with the trainer.
CAUGHT_UP_RECORDS = 4096


#: How long a gap's fill waits for the run log to reach the ring (its writer drains ~4x a second).
LOG_WAIT_S = 1.0


class _Stream:
    def __init__(self, out: _Out, reader: RingReader, run_dir: Path, args: dict[str, Any]) -> None:
        self.out = out
        self.reader = reader
        self.run_dir = run_dir
        self.binary = bool(args.get("binary", False))
        after = args.get("after_step")
        #: the last step this monitor holds (-inf: none yet; None: it wants no history at all)
        self.last_step: float | None = float(after) if after is not None else -math.inf
        self.per_message = max(1, CHUNK_BYTES // reader.record_size)
        self.pending_dropped = 0
        self.check_gap = False
        self.missing = 0
        #: overview mode (a far monitor): summaries, a recent window, live aggregates, fetches
        self.overview = bool(args.get("overview", False)) and self.binary
        self.max_buckets = int(args.get("buckets") or summ.DEFAULT_BUCKETS)
        window = args.get("window")
        self.window = int(window) if isinstance(window, int) else summ.DEFAULT_WINDOW
        self.requests = summ.Requests()
        out.on_data = self.requests.feed
        self.agg = summ.LiveAggregator(float(args.get("live_points") or 250.0), summ.LIVE_FIELDS)
        self.last_flush = time.monotonic()
        self.latest_layer: np.ndarray | None = None
        self.meta = reader.meta

    def rows(self, kind: str, rows: np.ndarray, **extra: Any) -> None:
        """Queue rows in messages of at most CHUNK_BYTES; never a message of 0 rows."""
        if not len(rows):
            return
        per = max(1, CHUNK_BYTES // max(1, rows.dtype.itemsize))
        for i in range(0, len(rows), per):
            self.out.put(_rows_bytes(kind, rows[i : i + per], self.binary, **extra))
            while self.out.full:
                self.out.wait(1.0)

    def history(self, scalars: np.ndarray, layers: np.ndarray) -> None:
        after = self.last_step if self.last_step is not None else -math.inf
        self.rows("scalars", scalars[scalars[FieldName.STEP] > after])
        self.rows("layers", layers[layers[FieldName.STEP] > after])
        if len(scalars):
            self.last_step = max(after, float(scalars[FieldName.STEP][-1]))
        self.check_gap = True

    def read_ring(self) -> None:
        """Queue what the ring has, filling from the log what it lost; stop while the link is full."""
        reader, per = self.reader, self.per_message
        while not self.out.full:
            batch = reader.read_batch(max_records=per)
            self.pending_dropped += batch.dropped
            records, seqs = batch.records, batch.seqs
            if len(records) and self.last_step is not None:
                keep = records[FieldName.STEP] > self.last_step
                records, seqs = records[keep], seqs[keep]
            if len(records):
                first = float(records[FieldName.STEP][0])
                last = self.last_step
                if last is None:  # no history wanted: what the ring lost is simply lost
                    if self.pending_dropped:
                        self.report_gap(None, first, self.pending_dropped)
                elif (self.pending_dropped or self.check_gap) and first > last + 1:
                    self.fill_gap(last, first)
                # else: the ring lost only steps this monitor already holds
                self.pending_dropped = 0
                self.check_gap = False
                if self.overview and self.meta is not None:
                    from nnwatch.store.record_split import split_records

                    scalars, layers = split_records(records, self.meta.schema)
                    self.agg.add(scalars)
                    if len(layers):
                        self.latest_layer = layers[-1:]
                else:
                    self.out.put(_rows_bytes(
                        "records", records, self.binary, seq=int(seqs[0]),
                        next_seq=reader.next_seq, torn=batch.torn,
                    ))  # fmt: skip
                self.last_step = float(records[FieldName.STEP][-1])
            if len(batch.records) + batch.dropped + batch.torn < per:
                break
        if self.overview:
            self.flush_live()

    def flush_live(self) -> None:
        """Send what the aggregator holds: rows while few, buckets beyond ``live_points``/s."""
        now = time.monotonic()
        buckets, rows = self.agg.flush(max(1e-3, now - self.last_flush))
        self.last_flush = now
        extra = {"next_seq": self.reader.next_seq, "torn": self.reader.torn}
        if buckets is not None:
            self.out.put(summ.summary_bytes(buckets, self.agg.fields, rows, live=True, **extra))
        elif len(rows):
            self.out.put(_rows_bytes("scalars", rows, self.binary, **extra))
        if self.latest_layer is not None:  # the panes draw the newest layer row
            self.out.put(_rows_bytes("layers", self.latest_layer, self.binary))
            self.latest_layer = None

    def send_overview(self, scalars: np.ndarray, layers: np.ndarray) -> None:
        """The overview of the log's rows after what the monitor holds, and the recent window at
        full resolution, in one message; then the newest layer rows."""
        after = self.last_step if self.last_step is not None else -math.inf
        first = summ.first_row_after(scalars, after)
        n = len(scalars)
        if n > first:
            win = max(first, n - self.window)
            rows = np.array(scalars[win:n])
            if win > first:
                buckets, fields, why = summ.overview_since(
                    self.run_dir, scalars, first, self.max_buckets
                )
                if why:
                    self.out.put(_json_line({"type": "notice", "message": why}))
                self.out.put(summ.summary_bytes(buckets, fields, rows, live=False))
            else:
                self.rows("scalars", rows)
            self.last_step = max(after, float(scalars[FieldName.STEP][n - 1]))
        lay = layers[-64:]
        self.rows("layers", np.array(lay[lay[FieldName.STEP] > after]))
        self.check_gap = True

    def serve_fetches(self, scalars: np.ndarray | None, layers: np.ndarray | None) -> None:
        """Answer the monitor's fetch requests from the log (mapped again when it has grown)."""
        while self.requests.pending and not self.out.full:
            req = self.requests.pending.pop(0)
            rid = req.get("id")
            if scalars is None or layers is None or self._log_short_of(scalars, req):
                if self.meta is None:
                    break
                scalars, layers = self._map_log_up_to(req)
            got = summ.fetch_rows(scalars, layers, req)
            if isinstance(got, str):
                self.out.put(_json_line({"type": "fetched", "id": rid, "error": got, "rows": 0}))
                continue
            self.rows("scalars", got[0], fetch=rid)
            self.rows("layers", got[1], fetch=rid)
            log_last = float(scalars[FieldName.STEP][-1]) if len(scalars) else None
            self.out.put(_json_line({
                "type": "fetched", "id": rid, "rows": int(len(got[0])),
                "first": req.get("first"), "last": req.get("last"), "log_last": log_last,
            }))  # fmt: skip

    @staticmethod
    def _log_short_of(scalars: np.ndarray, req: dict[str, Any]) -> bool:
        last = req.get("last")
        return isinstance(last, (int, float)) and (
            not len(scalars) or last > float(scalars[FieldName.STEP][-1])
        )

    def _map_log_up_to(self, req: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """The log mapped again; when it has not yet reached the steps asked for but the ring
        has (its writer drains a few times a second), it gets a moment to write them, as a gap
        fill does. A fetch past what the ring holds is answered at once with what there is."""
        assert self.meta is not None
        deadline = time.monotonic() + LOG_WAIT_S
        while True:
            scalars, layers = summ.map_log(self.run_dir, self.meta)
            ring_last = self.last_step if self.last_step is not None else -math.inf
            last = float(req.get("last") or 0)
            if not self._log_short_of(scalars, req) or time.monotonic() >= deadline:
                return scalars, layers
            log_last = float(scalars[FieldName.STEP][-1]) if len(scalars) else -math.inf
            if log_last >= min(last, ring_last):
                return scalars, layers
            time.sleep(0.05)

    def fill_gap(self, last: float, first: float) -> None:
        # The log's writer drains a few times a second: at a fast step rate the ring can run
        # ahead of it by thousands of steps. Give it a moment before calling a step missing.
        deadline = time.monotonic() + LOG_WAIT_S
        while True:
            gap = gap_rows(self.run_dir, last, first)
            recovered = len(gap[0]) if gap is not None else 0
            behind = math.isfinite(last) and first - last - 1 - recovered > 0
            if not behind or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if gap is not None:
            if self.overview and recovered > self.window:  # summarised, like any old history
                fields = summ.LIVE_FIELDS
                size = 1 << max(0, int(math.ceil(math.log2(recovered / self.max_buckets))))
                buckets = ov.reduce_rows(gap[0], fields, size)
                self.out.put(summ.summary_bytes(buckets, fields, gap[0][-1:], live=True))
            else:
                self.rows("scalars", gap[0])
                self.rows("layers", gap[1])
        if math.isfinite(last):
            lacking = int(max(0.0, first - last - 1 - recovered))
            missing = min(self.pending_dropped, lacking)
        else:  # nothing held yet: what the log gave back is not missing
            missing = max(0, self.pending_dropped - recovered)
        if missing:
            self.report_gap(last, first, missing)

    def report_gap(self, last: float | None, first: float, missing: int) -> None:
        self.missing += missing
        after = last if last is not None and math.isfinite(last) else None
        self.out.put(_json_line(
            {"type": "gap", "after_step": after, "before_step": first, "missing": missing}
        ))  # fmt: skip


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


def _latest_step(reader: RingReader) -> float | None:
    try:
        rec = reader.latest()
    except Exception:  # noqa: BLE001 - a progress figure only
        return None
    return float(rec[FieldName.STEP][0]) if rec is not None and len(rec) else None


def _serve(
    sock: socket.socket, ring_path: Path, run_dir: Path, request: dict[str, Any], mode: str
) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * 1024 * 1024)
    except OSError:
        pass
    out = _Out(sock)
    rid = request.get("id")
    args = request.get("args") or {}
    history = bool(args.get("history", True))
    period = 1.0 / max(0.1, float(args.get("max_hz", DEFAULT_MAX_HZ)))
    try:
        reader = RingReader(ring_path, start=args.get("start", "oldest"))
    except RingError as exc:
        out.put(encode_reply(rid, ok=False, error=str(exc)))
        out.drain(2.0)
        return
    try:
        meta_json = _meta_json(reader, run_dir)
        stream = _Stream(out, reader, run_dir, args)
        if not history and args.get("after_step") is None:
            stream.last_step = None
        loaded = _history_to_send(stream, run_dir, args, history)
        n_hist = _history_rows(stream, loaded)
        data = {
            "meta": meta_json, "mode": mode, "run_dir": str(run_dir), "ring": str(ring_path),
            "pid": reader.pid, "slots": reader.slots, "record_size": reader.record_size,
            "history_rows": n_hist, "latest_step": _latest_step(reader),
            "published": reader.state().write_seq,
        }  # fmt: skip
        out.put(encode_reply(rid, ok=True, data=data))
        if loaded is not None:
            if stream.overview:
                stream.send_overview(*loaded)
            else:
                stream.history(*loaded)
        log_rows = loaded if stream.overview else None
        del loaded
        _follow(stream, run_dir, args, log_rows, period)
    finally:
        reader.close()


def _meta_json(reader: RingReader, run_dir: Path) -> str:
    """The run's RunMeta JSON for the reply: the ring's copy, else meta.json (a ring written
    before the meta was known holds none), else empty."""
    meta_json = reader.meta_json
    if not meta_json:
        try:
            meta_json = read_small_file(run_dir / "meta.json").decode()
        except (OSError, UnicodeDecodeError):
            meta_json = ""
    return meta_json


def _history_to_send(
    stream: _Stream, run_dir: Path, args: dict[str, Any], history: bool
) -> tuple[np.ndarray, np.ndarray] | None:
    """The log's rows this monitor is sent before the live records (mapped, not read, in
    overview mode), or None when it wants none or its resume is still covered by the ring."""
    reader = stream.reader
    start = args.get("start")
    resumed_in_ring = (
        isinstance(start, int) and reader.next_seq == start
        and reader.state().write_seq - start <= reader.slots
    )  # fmt: skip
    # a resume the ring still covers needs nothing from the log
    if stream.overview and stream.meta is not None:
        return summ.map_log(run_dir, stream.meta) if history and not resumed_in_ring else None
    return load_history(run_dir) if history and not resumed_in_ring else None


def _history_rows(stream: _Stream, loaded: tuple[np.ndarray, np.ndarray] | None) -> int:
    """How many history rows the reply announces: those after what the monitor holds (in
    overview mode at most the full-resolution window)."""
    after = stream.last_step if stream.last_step is not None else -math.inf
    n_hist = int(np.count_nonzero(loaded[0][FieldName.STEP] > after)) if loaded is not None else 0
    if stream.overview:
        n_hist = min(n_hist, stream.window)
    return n_hist


def _follow(
    stream: _Stream,
    run_dir: Path,
    args: dict[str, Any],
    log_rows: tuple[np.ndarray, np.ndarray] | None,
    period: float,
) -> None:
    """The live loop: ring records, fetches, new events and status, until the run has ended
    and everything is sent (then ``end``) or the monitor goes away (``_Gone``)."""
    out, reader = stream.out, stream.reader
    events = EventTail(run_dir / "events.jsonl")
    events.offset = int(args.get("events_offset") or 0)
    meta = reader.meta
    liveness = Liveness(host=meta.host if meta else None, run_dir=run_dir)
    shown: tuple[str, str, bool] | None = None
    last_status = 0.0
    while True:
        stream.read_ring()
        if stream.requests.pending:
            stream.serve_fetches(*(log_rows or (None, None)))
        if not out.full:
            new_events = events.read()
            if new_events:
                out.put(_json_line(
                    {"type": "events", "events": new_events, "offset": events.offset}
                ))  # fmt: skip
        now = time.time()
        state = reader.state()
        health = liveness.judge(state, now)
        caught_up = reader.pending < CAUGHT_UP_RECORDS and not out.full
        key = (health.state, health.message, caught_up)
        if not out.full and (key != shown or now - last_status >= STATUS_EVERY):
            shown, last_status = key, now
            out.put(_status_line(stream, state, health, caught_up, now))
        if health.ended and reader.pending == 0 and not out.full:
            out.put(_json_line(
                {"type": "end", "state": health.state, "message": health.message}
            ))  # fmt: skip
            out.drain(5.0)
            return
        out.wait(period)


def _status_line(
    stream: _Stream, state: RingState, health: Health, caught_up: bool, now: float
) -> bytes:
    """The ``status`` message: the run's health and how far behind the trainer this stream is."""
    reader, out = stream.reader, stream.out
    return _json_line({
        "type": "status", "state": health.state, "message": health.message,
        "heartbeat_age": health.heartbeat_age, "last_step_age": health.last_step_age,
        "step_interval": health.step_interval, "published": state.write_seq,
        "latest_step": _latest_step(reader), "caught_up": caught_up,
        "missing": stream.missing, "torn": reader.torn, "time": now,
        "buffered": len(out.buf),
    })  # fmt: skip


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
