"""The GPU pane: NVML's view of each GPU the run uses (found by uuid, never by index, since CUDA
and NVML can number devices differently), the run's own torch memory from its records, and the
host's CPU and RAM, which is all there is to show when NVML is unavailable."""

from __future__ import annotations

import math
from typing import Any

from rich.style import Style
from rich.text import Text
from textual.app import RenderResult

from nnwatch.sources.hardware import GpuReading, HardwareReading
from nnwatch.store.schema import FieldName
from nnwatch.tui import format as fmt
from nnwatch.tui.widgets.base import Palette, Pane

_PARTIAL = " ▏▎▍▌▋▊▉"


def bar(frac: float, width: int, style: Style, empty: Style) -> Text:
    """A horizontal bar of ``width`` cells, with eighth-cell resolution; "–" when unknown."""
    width = max(width, 1)
    if not math.isfinite(frac):
        return Text("–".center(width), style=empty)
    frac = min(max(frac, 0.0), 1.0)
    eighths = int(round(frac * width * 8))
    full, part = divmod(eighths, 8)
    filled = "█" * full + (_PARTIAL[part] if part and full < width else "")
    t = Text(filled, style=style)
    t.append("░" * (width - len(filled)), style=empty)
    return t


def load_style(frac: float, pal: Palette) -> Style:
    if not math.isfinite(frac):
        return pal.muted
    return pal.error if frac >= 0.9 else pal.warning if frac >= 0.7 else pal.success


def run_gpu_uuids(meta_extra: dict[str, Any]) -> list[str]:
    """The uuids the run recorded for its devices (``gpu_uuids`` list or a single ``gpu_uuid``)."""
    uuids = meta_extra.get("gpu_uuids") or meta_extra.get("gpu_uuid") or []
    return [uuids] if isinstance(uuids, str) else [str(u) for u in uuids]


class GpuPane(Pane):
    key = "gpu"

    def build(self) -> RenderResult:
        st, pal = self.ctx.state, self.ctx.palette
        w, _h = self.size
        with st.lock:
            reading = st.hardware
            h = st.history
            alloc, resv, peak = (
                h.latest(f) for f in (FieldName.CUDA_ALLOCATED, FieldName.CUDA_RESERVED, FieldName.CUDA_PEAK)
            )
            cpu, rss = h.latest_finite(FieldName.CPU_PERCENT), h.latest_finite(FieldName.RSS)
        meta = st.meta
        if _h <= 2:
            return self._one_line(reading, alloc, pal)
        lines: list[Text] = []
        narrow = w < 60
        barw = 8 if narrow else 12
        if reading is None:
            lines.append(Text(self._no_reading(), style=pal.muted))
        else:
            lines += self._gpu_lines(reading, self._uuids(), meta.device, pal, barw, narrow)
        # the run's own view of its memory, from its records
        run = Text("run   ", style=pal.muted)
        if math.isfinite(alloc) or math.isfinite(resv):
            run.append(
                f"torch alloc {fmt.nbytes(alloc)}  resv {fmt.nbytes(resv)}  peak {fmt.nbytes(peak)}"
            )
        else:
            run.append(f"on {meta.device}: no CUDA memory stats", style=pal.muted)
        lines.append(run)
        trainer = Text("      ", style=pal.muted)
        cpu_text = f"{cpu:.0f}" if math.isfinite(cpu) else fmt.NA_TEXT
        trainer.append(f"trainer CPU {cpu_text}%  RSS {fmt.nbytes(rss)}")
        lines.append(trainer)
        if reading is not None:
            hr = reading.host
            host = Text("host  ", style=pal.muted)
            frac = hr.cpu_percent / 100.0
            host.append("CPU ")
            host.append_text(bar(frac, barw, load_style(frac, pal), pal.bar_empty))
            host.append(f" {fmt.percent(hr.cpu_percent / 100.0):>4} ×{hr.cpu_count}")
            if narrow:
                lines.append(host)
                host = Text("      ")
            else:
                host.append("  ")
            rfrac = hr.ram_used / hr.ram_total if hr.ram_total else math.nan
            host.append("RAM ")
            host.append_text(bar(rfrac, barw, load_style(rfrac, pal), pal.bar_empty))
            host.append(f" {fmt.nbytes(hr.ram_used)}/{fmt.nbytes(hr.ram_total)}")
            lines.append(host)
        gpus = len(reading.gpus) if reading else 0
        self.border_title = "[b]GPU[/b]" if gpus else "[b]GPU · host[/b]"
        source = "NVML" if reading is not None and not reading.nvml_error else "psutil"
        ended = st.status.state in ("finished", "interrupted", "crashed", "lost")
        self.border_subtitle = f"{source}, now (the run has ended)" if ended else source
        return Text("\n").join(lines)

    def _one_line(self, reading: HardwareReading | None, alloc: float, pal: Palette) -> Text:
        """The narrow layout's summary: the run's GPU(s) if NVML answers, else why not, plus host."""
        self.border_title = "[b]GPU[/b]"
        self.border_subtitle = ""
        line = Text(no_wrap=True, overflow="ellipsis")
        if reading is None:
            return Text(self._no_reading(), style=pal.muted)
        uuids = self._uuids()
        gpus = reading.gpus_for(uuids) if uuids else reading.gpus
        if reading.nvml_error:
            line.append(
                reading.nvml_error.replace("NVML unavailable: ", "NVML: "), style=pal.warning
            )
        elif gpus:
            for g in gpus:
                util = f"{g.utilization:.0f}%" if math.isfinite(g.utilization) else "–"
                line.append(f"GPU{g.index} ", style=Style(bold=True))
                line.append(f"{util} {fmt.nbytes(g.memory_used)}/{fmt.nbytes(g.memory_total)}  ")
        else:
            line.append("no GPU of this run here", style=pal.muted)
        hr = reading.host
        line.append(
            f"  CPU {fmt.percent(hr.cpu_percent / 100.0)} RAM {fmt.nbytes(hr.ram_used)}",
            style=pal.muted,
        )
        if math.isfinite(alloc):
            line.append(f"  torch {fmt.nbytes(alloc)}", style=pal.muted)
        return line

    def _no_reading(self) -> str:
        sampling = getattr(self.app, "sampler", None) is not None
        return "reading NVML and psutil…" if sampling else "hardware sampling is off"

    def _uuids(self) -> list[str]:
        if self.ctx.gpu_uuids:
            return list(self.ctx.gpu_uuids)
        return run_gpu_uuids(self.ctx.state.meta.extra)

    def _gpu_lines(
        self,
        reading: HardwareReading,
        uuids: list[str],
        device: str,
        pal: Palette,
        barw: int,
        narrow: bool,
    ) -> list[Text]:
        if reading.nvml_error:
            return [Text(reading.nvml_error, style=pal.warning)]
        if uuids:
            gpus = reading.gpus_for(uuids)
            if not gpus:
                return [Text("the run's GPU is not on this host", style=pal.muted)]
            note = None
        elif device.startswith("cuda"):
            gpus = reading.gpus
            note = Text("run did not record its GPU uuid: showing all", style=pal.muted)
        else:
            return [Text(f"run is on {device}; no GPU to show", style=pal.muted)]
        lines = [self._gpu_line(g, pal, barw, narrow) for g in gpus]
        out: list[Text] = []
        for line in lines:
            out += line
        if note is not None:
            out.append(note)
        return out

    def _gpu_line(self, g: GpuReading, pal: Palette, barw: int, narrow: bool) -> list[Text]:
        head = Text(f"GPU{g.index} ", style=pal.text + Style(bold=True))
        head.append(g.name.replace("NVIDIA ", "")[: 14 if narrow else 24], style=pal.muted)
        util = g.utilization / 100.0
        a = Text("util ")
        a.append_text(bar(util, barw, load_style(util, pal), pal.bar_empty))
        a.append(f" {fmt.num(g.utilization, 2) if math.isfinite(g.utilization) else '–':>3}%")
        mfrac = g.memory_used / g.memory_total if g.memory_total else math.nan
        b = Text("mem  ")
        b.append_text(bar(mfrac, barw, load_style(mfrac, pal), pal.bar_empty))
        b.append(f" {fmt.nbytes(g.memory_used)}/{fmt.nbytes(g.memory_total)}")
        temp = f"{g.temperature:.0f}°C" if math.isfinite(g.temperature) else "–°C"
        power = f"{g.power:.0f}/{g.power_limit:.0f}W" if math.isfinite(g.power) else "–W"
        c = Text(f"     {temp}  {power}", style=pal.muted)
        if narrow:
            return [head, a, b, c]
        head.append("  ")
        head.append_text(a)
        head.append("  ")
        head.append_text(b)
        head.append(f"  {temp}  {power}", style=pal.muted)
        return [head]
