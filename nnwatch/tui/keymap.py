"""The user's key remapping: binding ids to keys, from ~/.config/nnwatch/keys.json, then
$NNWATCH_KEYS, then ``--keys``. Every dashboard binding has an id (``?`` lists them) so a user
whose terminal or habits clash with a key can move it without editing code."""

from __future__ import annotations

import json
import os
from pathlib import Path

KEYS_ENV = "NNWATCH_KEYS"
KEYS_FILE = Path("~/.config/nnwatch/keys.json")


def parse_keymap(spec: str) -> dict[str, str]:
    """``"snapshot=S,quit=ctrl+q"`` -> {"snapshot": "S", "quit": "ctrl+q"}; bad items raise."""
    out: dict[str, str] = {}
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        if "=" not in item:
            raise ValueError(f"key mapping {item!r} is not of the form id=key (e.g. snapshot=S)")
        bid, key = (s.strip() for s in item.split("=", 1))
        if not bid or not key:
            raise ValueError(f"key mapping {item!r} has an empty id or key")
        out[bid] = key
    return out


def load_keymap(
    cli_spec: str | None = None, *, environ: dict[str, str] | None = None
) -> dict[str, str]:
    """The user's keymap: ~/.config/nnwatch/keys.json, then $NNWATCH_KEYS, then ``--keys``."""
    env = os.environ if environ is None else environ
    keymap: dict[str, str] = {}
    path = KEYS_FILE.expanduser()
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except ValueError as exc:
            raise ValueError(
                f'{path} is not valid JSON ({exc}); expected {{"snapshot": "S"}}'
            ) from exc
        if not isinstance(data, dict):
            raise ValueError(f"{path} must hold a JSON object of binding id -> key")
        keymap.update({str(k): str(v) for k, v in data.items()})
    if env.get(KEYS_ENV):
        keymap.update(parse_keymap(env[KEYS_ENV]))
    if cli_spec:
        keymap.update(parse_keymap(cli_spec))
    return keymap
