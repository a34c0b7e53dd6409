"""The probe: what runs inside the training process. It never imports a UI library."""

from __future__ import annotations
