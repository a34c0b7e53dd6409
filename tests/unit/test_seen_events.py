"""The one de-duplication of events (``nnwatch.sources.seen_events``): a line delivered before is
dropped, the memory of them is bounded and forgets the oldest first. The reconnect that replays a
line, end to end, is tests/tui/test_remote_screen.py (a real ConnectedSource and app) and
tests/integration/test_remote_stream.py (a real trainer's stream)."""

from __future__ import annotations

from nnwatch.sources.seen_events import MAX_SEEN, SeenEvents, event_key
from nnwatch.store.events import CommandApplied


def _command(step: int) -> dict[str, object]:
    return {"type": "command", "name": "pause", "args": {}, "step": step}


def test_a_line_delivered_again_is_dropped_and_the_rest_come_typed_in_order() -> None:
    seen = SeenEvents()
    first = seen.fresh([_command(1), _command(2)])
    assert [e.step for e in first] == [1, 2] and all(isinstance(e, CommandApplied) for e in first)
    again = seen.fresh([_command(2), _command(3), _command(1)])  # a resumed stream's repeats
    assert [e.step for e in again] == [3]
    assert seen.fresh(["not an object", 7, None]) == []  # only JSON objects are events


def test_the_key_is_the_whole_line_in_any_key_order() -> None:
    line = {"type": "finding", "step": 4, "finding": {"kind": "nan_loss", "severity": "error"}}
    assert event_key(line) == event_key(dict(reversed(list(line.items()))))
    assert event_key(line) != event_key({**line, "step": 5})
    (typed,) = SeenEvents().fresh([line])
    assert event_key(typed) == event_key(line)  # a typed event keeps its line as read


def test_memory_is_bounded_and_forgets_the_oldest_first() -> None:
    assert MAX_SEEN >= 10_000
    seen = SeenEvents(limit=3)
    assert len(seen.fresh([_command(s) for s in range(5)])) == 5
    assert len(seen) == 3
    assert seen.fresh([_command(4), _command(3), _command(2)]) == []  # the newest are held
    assert [e.step for e in seen.fresh([_command(0)])] == [0]  # the oldest were forgotten
    assert len(seen) == 3
