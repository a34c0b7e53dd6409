"""The ground floor: every file a run leaves behind, and nothing else of nnwatch.

- :mod:`~nnwatch.store.schema`, :mod:`~nnwatch.store.summary`: the record layout of one step.
- :mod:`~nnwatch.store.paths`: where runs live, and files opened without following symlinks.
- :mod:`~nnwatch.store.safe_read`, :mod:`~nnwatch.store.clean_text`: every reader opens a run's
  files there (no link, no FIFO, sized by their data) and cleans their strings for terminals.
- :mod:`~nnwatch.store.child_python`: how a Python process of nnwatch's own is started, never
  importing from the working directory.
- :mod:`~nnwatch.store.runlog`: the append-only run log (scalars, layer rows, end), and
  :mod:`~nnwatch.store.event_appender`, its ``events.jsonl`` (appended from any thread).
- :mod:`~nnwatch.store.ring` (writer), :mod:`~nnwatch.store.ring_reader`,
  :mod:`~nnwatch.store.ring_layout` (the bytes both agree on): one mmap'd ring per rank, written
  without ever waiting.
- :mod:`~nnwatch.store.registry`, :mod:`~nnwatch.store.health`, :mod:`~nnwatch.store.identity`:
  which runs exist and whether their process is alive.
- :mod:`~nnwatch.store.finding`: the record a detector writes.

Nothing here imports torch, a UI library, or any other part of nnwatch; every other layer
builds on it.
"""
