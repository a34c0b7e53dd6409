"""One image sample drawn in the terminal: real pixels through textual-image where the terminal
speaks a graphics protocol (kitty's TGP, Sixel), else two pixels per cell with the upper half
block ``▀`` (foreground: the upper pixel, background: the lower one), which every terminal, the
browser view and the SVG screenshots can show.

Pixels are scaled against the whole batch, not each image on its own, so an all-zero image looks
black next to its neighbours instead of being stretched into noise; NaN/Inf pixels are red.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from rich.style import Style
from rich.text import Text

NONFINITE_RGB = (230, 40, 60)


def to_rgb(x: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """(H, W, 3) uint8 pixels and an (H, W) non-finite mask from a (C, H, W) or (H, W) sample."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 3:
        a = np.moveaxis(a, 0, -1)  # C, H, W -> H, W, C
        if a.shape[-1] == 1:
            a = a[..., 0]
        elif a.shape[-1] == 4:
            a = a[..., :3]
    bad: np.ndarray = ~np.isfinite(a)
    if a.ndim == 3:
        bad = np.asarray(bad.any(axis=-1))
    span = hi - lo if hi > lo else 1.0
    v = np.clip((np.where(np.isfinite(a), a, lo) - lo) / span, 0.0, 1.0)
    px = (v * 255 + 0.5).astype(np.uint8)
    if px.ndim == 2:
        px = np.repeat(px[..., None], 3, axis=-1)
    px[bad] = NONFINITE_RGB
    return px, bad


def scale_to_fit(px: np.ndarray, max_cols: int, max_rows: int) -> np.ndarray:
    """Nearest-neighbour upscaling by a whole factor (or downscaling by striding) so the image
    fits ``max_cols`` cells wide and ``max_rows`` cells (2 pixels each) high."""
    h, w = px.shape[:2]
    k = max(1, min(max_cols // max(w, 1), (2 * max_rows) // max(h, 1)))
    if k > 1:
        return px.repeat(k, axis=0).repeat(k, axis=1)
    step = max(1, -(-w // max(max_cols, 1)), -(-h // max(2 * max_rows, 1)))
    return px[::step, ::step]


def halfblock(px: np.ndarray) -> Text:
    """(H, W, 3) uint8 pixels as ceil(H/2) lines of W cells."""
    h = px.shape[0]
    if h % 2:
        px = np.concatenate([px, np.zeros((1, *px.shape[1:]), dtype=px.dtype)])
    text = Text(no_wrap=True, overflow="crop", end="")
    for r in range(0, px.shape[0], 2):
        if r:
            text.append("\n")
        for top, bottom in zip(px[r], px[r + 1], strict=True):
            style = Style(color=_hex(top), bgcolor=_hex(bottom))
            text.append("▀", style=style)
    return text


def _hex(rgb: Any) -> str:
    return "#{:02x}{:02x}{:02x}".format(*(int(c) for c in rgb[:3]))


def graphics_image_class() -> Any:
    """textual-image's widget class when the terminal speaks a graphics protocol, else None.

    textual-image asks the terminal about itself when it is imported, which it cannot do once
    Textual owns the terminal; ``nnwatch.tui.launch`` imports it before the app starts, and this
    only uses it when that happened."""
    mod = sys.modules.get("textual_image.widget")
    renderable = sys.modules.get("textual_image.renderable")
    if mod is None or renderable is None:
        return None
    auto = getattr(renderable, "Image", None)
    name = getattr(auto, "__module__", "")
    if name.endswith((".tgp", ".sixel")):
        return getattr(mod, "Image", None)
    return None


def pil_image(px: np.ndarray) -> Any:
    from PIL import Image

    return Image.fromarray(px, mode="RGB")
