"""Folding many ranks' stacks into what a person reads, and the note of how a process ended."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from nnwatch.channel.stacks import own_stacks
from nnwatch.sources.job_stacks import RankStacks, describe, group, span
from nnwatch.store.exit_note import ending_for_status, read_exit_note, write_exit_note


def _thread(name: str, *funcs: str, main: bool = False, own: bool = False) -> dict[str, object]:
    frames = [["train.py", 10 + i, f, f"{f}()"] for i, f in enumerate(funcs)]
    return {"name": name, "main": main, "own": own, "frames": frames}


def test_identical_stacks_fold_into_one_group_per_place() -> None:
    waiting = _thread("MainThread", "main", "step", "all_reduce", main=True)
    loading = _thread("MainThread", "main", "load_batch", main=True)
    beat = _thread("nnwatch-heartbeat", "beat", own=True)
    stacks = [RankStacks(r, threads=(waiting, beat)) for r in (0, 1, 2, 4)]
    stacks += [RankStacks(3, threads=(loading, beat)), RankStacks(5, error="no answer within 1.5 s")]
    groups = group(stacks)
    assert [(g.ranks, g.where) for g in groups] == [
        ((0, 1, 2, 4), "all_reduce (train.py:12)"), ((3,), "load_batch (train.py:11)")]
    assert span((0, 1, 2, 4)) == "ranks 0-2, 4" and span((3,)) == "rank 3"
    text = "\n".join(describe(stacks))
    assert text.startswith("rank 5: no answer within 1.5 s")
    assert "ranks 0-2, 4 · all_reduce (train.py:12)" in text and "rank 3 · load_batch" in text
    assert "Thread nnwatch-heartbeat" not in text and "left out: nnwatch-heartbeat" in text
    assert "Thread nnwatch-heartbeat" in "\n".join(describe(stacks, own=True))
    sent = RankStacks(0, "node01", 12, (waiting,), taken_at=100.0)
    assert RankStacks.from_dict(json.loads(json.dumps(sent.to_dict()))) == sent


def test_own_stacks_name_every_thread_and_the_main_one_first() -> None:
    got = own_stacks()
    assert got["threads"][0]["main"] and got["threads"][0]["name"] == "MainThread"
    funcs = [f[2] for f in got["threads"][0]["frames"]]
    assert funcs[-2:] == ["test_own_stacks_name_every_thread_and_the_main_one_first", "own_stacks"]


def test_an_exit_status_becomes_words_and_end_json_always_wins(tmp_path: Path) -> None:
    assert ending_for_status(signal.SIGKILL)["reason"] == "killed by SIGKILL (signal 9)"
    assert ending_for_status(signal.SIGTERM)["status"] == "interrupted"
    assert ending_for_status(3 << 8) == {"status": "crashed", "exit_code": 3,
                                         "reason": "the process exited with status 3"}
    assert ending_for_status(0)["status"] == "finished"
    assert write_exit_note(tmp_path, ending_for_status(signal.SIGKILL), "rank 3 (pid 7) on this node")
    note = read_exit_note(tmp_path)
    assert note is not None and note["signal"] == "SIGKILL" and note["status"] == "crashed"
    assert note["observed_by"] == "rank 3 (pid 7) on this node" and isinstance(note["ended"], float)
    assert not write_exit_note(tmp_path, ending_for_status(signal.SIGTERM), "later")  # first wins
    other = tmp_path / "other"
    other.mkdir()
    (other / "end.json").write_text("{}")
    assert not write_exit_note(other, ending_for_status(signal.SIGKILL), "x")  # the run said it
    (other / "exit.json").write_text('{"status": "weird"}')
    assert read_exit_note(other) is None  # a note that is not one is not read
