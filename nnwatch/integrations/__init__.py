"""Callbacks that attach nnwatch to training frameworks that own the loop (Lightning, Hugging Face).

Each module imports its framework only when used, so ``import nnwatch`` never pulls them in:
``nnwatch.integrations.lightning.NNWatch`` and ``nnwatch.integrations.transformers.NNWatchCallback``.
"""

from __future__ import annotations
