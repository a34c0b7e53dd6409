"""Exporters: nnwatch's records, written out in formats other tools read (TensorBoard).

An exporter only ever reads step records, from a finished run's log or, live, from the batches
the run log's writer thread hands its observers. It is never a second path through the hooks, so
exporting costs the training thread nothing. ``tensorboard`` is imported only when used.
"""

from __future__ import annotations

from nnwatch.export.tensorboard import ExportError, ExportSummary, TensorBoard, export_run

__all__ = ["ExportError", "ExportSummary", "TensorBoard", "export_run"]
