"""The way between a training process and its monitors: the command socket and the stream.

- :mod:`~nnwatch.channel.server` / :mod:`~nnwatch.channel.client`: a Unix socket with a small,
  validated JSON command set (:mod:`~nnwatch.channel.commands`), applied by the training thread
  at step boundaries; ``subscribe`` streams a run to a remote monitor (:mod:`~nnwatch.channel.stream`).
- :mod:`~nnwatch.channel.endpoint`: the trainer's side of it all (ring, registry entry, socket).

The files it serves (ring, registry, run log) live one floor down, in :mod:`nnwatch.store`.
Nothing here imports torch or a UI library.
"""

from __future__ import annotations

from nnwatch.channel.client import ChannelClient, ChannelError, Subscription
from nnwatch.channel.commands import COMMANDS, Command, CommandError, parse_request, validate
from nnwatch.channel.server import CommandServer, PendingCommand

__all__ = [
    "COMMANDS",
    "ChannelClient",
    "ChannelError",
    "Command",
    "CommandError",
    "CommandServer",
    "PendingCommand",
    "Subscription",
    "parse_request",
    "validate",
]
