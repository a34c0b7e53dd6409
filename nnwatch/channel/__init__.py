"""The way between a training process and its monitors: ring file, registry, command socket.

- :mod:`~nnwatch.channel.ring`: one mmap'd ring file per rank; the trainer publishes one record
  per step without ever waiting, readers follow it and count what they missed.
- :mod:`~nnwatch.channel.registry`: one atomically written entry per live run, so monitors can
  find runs; liveness is pid + process start time + heartbeat.
- :mod:`~nnwatch.channel.server` / :mod:`~nnwatch.channel.client`: a Unix socket with a small,
  validated JSON command set (:mod:`~nnwatch.channel.commands`), applied by the training thread
  at step boundaries; ``subscribe`` streams a run to a remote monitor (:mod:`~nnwatch.channel.stream`).

Nothing here imports torch or a UI library.
"""

from __future__ import annotations

from nnwatch.channel.client import ChannelClient, ChannelError, Subscription
from nnwatch.channel.commands import COMMANDS, Command, CommandError, parse_request, validate
from nnwatch.channel.health import Health, Liveness
from nnwatch.channel.registry import RunInfo, build_entry, gc, list_runs, register, unregister
from nnwatch.channel.ring import RingBatch, RingError, RingReader, RingState, RingWriter
from nnwatch.channel.server import CommandServer, PendingCommand

__all__ = [
    "COMMANDS",
    "ChannelClient",
    "ChannelError",
    "Command",
    "CommandError",
    "CommandServer",
    "Health",
    "Liveness",
    "PendingCommand",
    "RingBatch",
    "RingError",
    "RingReader",
    "RingState",
    "RingWriter",
    "RunInfo",
    "Subscription",
    "build_entry",
    "gc",
    "list_runs",
    "parse_request",
    "register",
    "unregister",
    "validate",
]
