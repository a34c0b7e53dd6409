"""Numbers as a monitor shows them: short, aligned, and "–" for anything not measured.

Every pane formats through these so that a NaN (nnwatch's "not measured") never reaches the
screen as "nan", and so that widths stay stable while values change.
"""

from __future__ import annotations

import math

NA_TEXT = "–"


def finite(x: float | None) -> bool:
    return x is not None and isinstance(x, int | float) and math.isfinite(x)


def num(x: float | None, digits: int = 3) -> str:
    """A compact number with ``digits`` significant digits: 0.412, 38.0, 2999, 1.20e-5, 6.55e4."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return NA_TEXT
    x = float(x)
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    a = abs(x)
    if a >= 1e5 or a < 1e-3:
        mantissa, exp = f"{x:.{max(digits - 1, 0)}e}".split("e")
        return f"{mantissa}e{int(exp)}"
    decimals = max(0, digits - 1 - math.floor(math.log10(a)))
    return f"{x:.{decimals}f}"


def num_fit(x: float | None, width: int) -> str:
    """``num`` with as many digits as fit in ``width`` cells (axis labels): 1.15e35 -> 1.2e35."""
    for digits in (3, 2, 1):
        text = num(x, digits)
        if len(text) <= width:
            return text
    return text[:width]


def count(n: float | int | None) -> str:
    """An integer with thousands separators: 12,345."""
    if n is None or (isinstance(n, float) and not math.isfinite(n)):
        return NA_TEXT
    return f"{int(n):,}"


def si(x: float | None, unit: str = "") -> str:
    """1.2k, 3.4M: for rates and counts where width matters more than precision."""
    if not finite(x):
        return NA_TEXT
    assert x is not None
    a = abs(x)
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{x / div:.3g}{suffix}{unit}"
    return f"{x:.3g}{unit}"


def nbytes(x: float | None) -> str:
    """Bytes in binary units, as nvidia-smi and htop show them: 3.1G, 512M."""
    if not finite(x):
        return NA_TEXT
    assert x is not None
    a = float(x)
    for div, suffix in ((1 << 40, "T"), (1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")):
        if abs(a) >= div:
            v = a / div
            return f"{v:.1f}{suffix}" if v < 100 else f"{v:.0f}{suffix}"
    return f"{a:.0f}B"


def duration(seconds: float | None) -> str:
    """Elapsed time: 42s, 3:07, 1:02:03, 2d 03:04."""
    if not finite(seconds):
        return NA_TEXT
    assert seconds is not None
    s = int(max(seconds, 0))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d {h:02d}:{m:02d}"
    if h:
        return f"{h}:{m:02d}:{s:02d}"
    if m:
        return f"{m}:{s:02d}"
    return f"{s}s"


def percent(frac: float | None) -> str:
    if not finite(frac):
        return NA_TEXT
    assert frac is not None
    return f"{100 * frac:.0f}%"


def pow2(x: float | None) -> str:
    """An AMP loss scale as the power of two it is: 2^16."""
    if not finite(x) or x is None or x <= 0:
        return NA_TEXT
    e = math.log2(x)
    return f"2^{e:.0f}" if abs(e - round(e)) < 1e-6 else f"2^{e:.1f}"


def shorten_middle(name: str, width: int) -> str:
    """A dotted layer name cut from the middle so that the block index and the leaf both stay:
    ``transformer.h.0.mlp.c_fc`` in 10 cells is ``h.0…c_fc``. Tries, in order: the head up to
    the first numeric part with as many trailing parts as fit, then fewer leading parts of that
    head (keeping the index and the part before it), then the index alone, then the tail."""
    if width <= 0:
        return ""
    if len(name) <= width:
        return name
    parts = name.split(".")
    if len(parts) >= 2:
        idx = next((i for i, p in enumerate(parts[:-1]) if p.isdigit()), None)
        heads: list[list[str]] = []
        if idx is not None:
            head = parts[: idx + 1]
            for start in range(0, max(idx, 1)):  # drop leading parts, keep "h.0"
                heads.append(head[start:])
            heads.append(head[-1:])
        else:
            heads.append(parts[:1])
        for head in heads:
            h = ".".join(head)
            rest = parts[len(parts) - 1 :] if idx is None else parts[(idx or 0) + 1 :]
            # as many trailing parts as fit after the head: "h.0…mlp.c_fc" before "h.0…c_fc"
            for k in range(len(rest), 0, -1):
                tail = ".".join(rest[-k:])
                candidate = f"{h}…{tail}"
                if len(candidate) <= width and tail:
                    return candidate
    if width == 1:
        return "…"
    return "…" + name[-(width - 1) :]
