"""Command validation: the one gate every byte from a socket passes. Fuzzed with hypothesis."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nnwatch.channel.commands import (
    COMMANDS,
    MAX_REQUEST_BYTES,
    Command,
    CommandError,
    applied_by,
    encode_reply,
    encode_request,
    keyed_commands,
    parse_request,
    validate,
)


@pytest.mark.parametrize(
    ("line", "name", "args"),
    [
        (b'{"cmd": "hello"}', "hello", {}),
        (b'{"cmd": "pause", "id": 3}', "pause", {}),
        (b'{"cmd": "set_clip", "args": {"max_norm": 1.5}}', "set_clip", {"max_norm": 1.5}),
        (b'{"cmd": "set_clip", "args": {"max_norm": 2}}', "set_clip", {"max_norm": 2.0}),
        (b'{"cmd": "set_clip", "args": {"max_norm": null}}', "set_clip", {"max_norm": None}),
        (b'{"cmd": "set_layer_interval", "args": {"n": 5}}', "set_layer_interval", {"n": 5}),
        (b'{"cmd": "set_layer_interval", "args": {"n": 5.0}}', "set_layer_interval", {"n": 5}),
        (b'{"cmd": "anomaly", "args": {"steps": 3}}', "anomaly", {"steps": 3}),
        (b'{"cmd": "snapshot", "args": {"reason": "look"}}', "snapshot", {"reason": "look"}),
        (b'{"cmd": "stop", "args": {}}', "stop", {}),
        (b'{"cmd": "subscribe", "args": {"history": false, "start": "latest"}}', "subscribe",
         {"history": False, "start": "latest"}),
    ],
)  # fmt: skip
def test_valid_requests_are_normalised(line: bytes, name: str, args: dict) -> None:
    cmd = parse_request(line)
    assert cmd.name == name and cmd.args == args


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"args": {}}', 'no "cmd"'),
        (b'{"cmd": "launch_missiles"}', "unknown command 'launch_missiles'"),
        (b'{"cmd": 7}', "cmd must be a command name"),
        (b'{"cmd": "set_clip"}', "needs max_norm"),
        (b'{"cmd": "set_clip", "args": {"max_norm": -1}}', "finite number above 0"),
        (b'{"cmd": "set_clip", "args": {"max_norm": NaN}}', "NaN is not valid JSON"),
        (b'{"cmd": "set_clip", "args": {"max_norm": 1e999}}', "finite number"),
        (b'{"cmd": "set_clip", "args": {"max_norm": "1"}}', "must be a number"),
        (b'{"cmd": "set_clip", "args": {"max_norm": true}}', "must be a number"),
        (b'{"cmd": "set_layer_interval", "args": {"n": 0}}', "between 1 and"),
        (b'{"cmd": "set_layer_interval", "args": {"n": 2.5}}', "whole number"),
        (b'{"cmd": "set_layer_interval", "args": {"n": true}}', "whole number"),
        (b'{"cmd": "pause", "args": {"force": 1}}', "does not take"),
        (b'{"cmd": "pause", "args": [1]}', "must be an object"),
        (b'{"cmd": "pause", "extra": 1}', "unexpected field"),
        (b'{"cmd": "pause", "id": [1]}', "id must be"),
        (b'{"cmd": "pause", "id": true}', "id must be"),
        (b'{"cmd": "snapshot", "args": {"reason": "' + b"x" * 300 + b'"}}', "longer than"),
        (b'{"cmd": "subscribe", "args": {"start": "middle"}}', "start must be"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"[" * 100000, "too large"),
        (b"[" * 30000, "nested too deeply"),
    ],
)
def test_bad_requests_get_a_reason_in_words(line: bytes, reason: str) -> None:
    with pytest.raises(CommandError) as info:
        parse_request(line)
    assert reason in info.value.message


def test_error_keeps_the_request_id_for_the_reply() -> None:
    with pytest.raises(CommandError) as info:
        parse_request(b'{"cmd": "set_clip", "id": 42, "args": {"max_norm": 0}}')
    assert info.value.request_id == 42


def test_every_command_has_a_summary_and_its_positional_argument_is_declared() -> None:
    for name, spec in COMMANDS.items():
        assert spec.summary, name
        if spec.positional is not None:
            assert spec.positional in spec.args, name


def test_every_command_is_applied_where_the_spec_says(tmp_path: Path) -> None:
    """The probe's dispatch table and the server's own answers cover exactly the spec's commands."""
    from nnwatch.channel.server import CommandServer
    from nnwatch.probe.command_handler import CommandHandler

    assert set(CommandHandler.HANDLERS) == set(applied_by("trainer"))
    server = CommandServer(tmp_path / "s.sock", hello={})
    assert set(server.answers) == set(applied_by("server"))


def test_ctl_help_and_arguments_come_from_the_spec(capsys: pytest.CaptureFixture[str]) -> None:
    from nnwatch.cli import main
    from nnwatch.cli.ctl import _parse_arg

    with pytest.raises(SystemExit):
        main(["ctl", "--help"])
    out = capsys.readouterr().out
    for name, spec in COMMANDS.items():
        if spec.not_for_ctl:
            assert f"\n  {name} " not in out
            with pytest.raises(CommandError, match=spec.not_for_ctl[:20]):
                _parse_arg(name, None)
        else:
            assert f"\n  {spec.usage(name)} " in out and spec.summary in out, name
    assert _parse_arg("set_clip", "off") == {"max_norm": None}
    assert _parse_arg("set_clip", "2.5") == {"max_norm": 2.5}
    assert _parse_arg("anomaly", "3") == {"steps": 3}
    assert _parse_arg("snapshot", "look here") == {"reason": "look here"}
    with pytest.raises(CommandError, match="set_clip needs a number or 'off', got 'x'"):
        _parse_arg("set_clip", "x")
    with pytest.raises(CommandError, match="set_layer_interval needs a whole number"):
        _parse_arg("set_layer_interval", "2.5")
    with pytest.raises(CommandError, match="pause takes no argument"):
        _parse_arg("pause", "1")


def test_the_tui_keys_are_in_the_spec() -> None:
    keys = {name: spec.key for name, spec in keyed_commands().items()}
    assert keys == {"snapshot": "s", "pause": "p", "set_clip": "c", "anomaly": "a"}
    assert all(COMMANDS[name].applied_by == "trainer" for name in keys)


def test_reply_encoding_survives_values_json_cannot_hold() -> None:
    import numpy as np

    line = encode_reply(1, ok=True, applies_at_step=5, data={"x": np.float32(2.5), "y": math.nan})
    obj = json.loads(line)
    assert line.endswith(b"\n") and obj["data"]["x"] == 2.5 and math.isnan(obj["data"]["y"])


# -- fuzzing ---------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_never_raise_anything_but_command_error(data: bytes) -> None:
    try:
        cmd = parse_request(data)
    except CommandError as exc:
        assert exc.message and isinstance(exc.message, str)
    else:
        assert cmd.name in COMMANDS


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(st.sampled_from(list(COMMANDS)), st.text(max_size=12), json_values),
    st.one_of(st.none(), json_values, st.dictionaries(
        st.sampled_from(["max_norm", "n", "steps", "reason", "history", "start", "max_hz", "x"]),
        json_values, max_size=3,
    )),
    st.one_of(st.none(), st.integers(), st.text(max_size=80), json_values),
)  # fmt: skip
def test_arbitrary_json_requests_are_validated_or_refused(
    cmd: object, args: object, rid: object
) -> None:
    body: dict = {"cmd": cmd, "args": args}
    if rid is not None:
        body["id"] = rid
    line = json.dumps(body).encode()
    try:
        command = parse_request(line)
    except CommandError as exc:
        assert exc.message
        return
    spec = COMMANDS[command.name]
    assert set(command.args) <= set(spec.args)
    assert set(spec.required) <= set(command.args)
    for value in command.args.values():  # nothing non-finite gets through to the trainer
        assert not (isinstance(value, float) and not math.isfinite(value))


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["set_clip", "set_layer_interval", "anomaly", "snapshot", "pause", "stop"]),
    st.floats(min_value=1e-6, max_value=1e6),
    st.integers(min_value=1, max_value=1000),
    st.text(max_size=50),
    st.one_of(st.none(), st.integers(min_value=-(2**62), max_value=2**62), st.text(max_size=10)),
)
def test_client_encoding_round_trips_through_the_server_parser(
    name: str, norm: float, n: int, reason: str, rid: int | str | None
) -> None:
    args = {
        "set_clip": {"max_norm": norm},
        "set_layer_interval": {"n": n},
        "anomaly": {"steps": n},
        "snapshot": {"reason": reason},
    }.get(name, {})
    sent = validate(name, args, rid)
    line = encode_request(sent)
    assert len(line) < MAX_REQUEST_BYTES
    assert parse_request(line) == Command(sent.name, sent.args, rid)
