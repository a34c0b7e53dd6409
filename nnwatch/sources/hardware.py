"""What the monitor's own machine can tell about its GPUs (NVML) and host (psutil), behind one interface.

The monitor samples this in a background thread; the trainer never calls it. Every NVML failure,
from a missing driver at start-up to a GPU that falls off the bus mid-run, becomes a value
(``NA``, a NaN, or a plain-words ``nvml_error``) rather than an exception, so that a broken
driver can never take the dashboard down with it. Nothing here imports a UI library.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import psutil

#: "Not available": NVML could not say. A NaN, like every not-measured number in nnwatch.
NA: float = math.nan

T = TypeVar("T")


def is_na(value: float) -> bool:
    return value != value  # NaN is the only value unequal to itself


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one instant. Numbers NVML could not read are ``NA``."""

    index: int  # NVML's index; it can differ from CUDA's, which is why runs are matched by uuid
    uuid: str  # as NVML spells it, "GPU-xxxxxxxx-..."
    name: str
    utilization: float = NA  # percent of time a kernel ran over NVML's last sample period
    memory_used: float = NA  # bytes
    memory_total: float = NA  # bytes
    temperature: float = NA  # degrees Celsius
    power: float = NA  # watts
    power_limit: float = NA  # watts


@dataclass(frozen=True)
class HostReading:
    """The monitor's host: what is left to show when there is no NVIDIA driver."""

    cpu_percent: float  # all cores together, 0-100, since the previous reading
    cpu_count: int
    ram_used: float  # bytes
    ram_total: float  # bytes


@dataclass(frozen=True)
class HardwareReading:
    time: float
    host: HostReading
    gpus: tuple[GpuReading, ...] = ()
    nvml_error: str = ""  # "" when NVML answered; otherwise why not, in words for the GPU pane

    def gpus_for(self, uuids: Iterable[str]) -> tuple[GpuReading, ...]:
        """The GPUs whose uuid is in ``uuids``, in that order (a run names its devices by uuid)."""
        by_uuid = {normalize_uuid(g.uuid): g for g in self.gpus}
        return tuple(by_uuid[u] for u in map(normalize_uuid, uuids) if u in by_uuid)


def normalize_uuid(uuid: str) -> str:
    """NVML says "GPU-3f2a...", torch's ``device_properties.uuid`` says "3f2a...": compare the hex."""
    u = str(uuid).strip().lower()
    for prefix in ("gpu-", "mig-"):
        if u.startswith(prefix):
            u = u[len(prefix) :]
    return u


def describe_nvml_error(exc: BaseException) -> str:
    """NVML's exception, in words a user can act on."""
    import pynvml

    code = getattr(exc, "value", None)
    reasons = {
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "no NVIDIA driver",  # libnvidia-ml.so not found
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "no NVIDIA driver",  # library present, module not loaded
        pynvml.NVML_ERROR_NO_PERMISSION: "no permission to read the GPUs",
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "driver and NVML library versions differ",
        pynvml.NVML_ERROR_GPU_IS_LOST: "a GPU stopped answering",
    }
    reason = reasons.get(code) if code is not None else None
    if reason is None and isinstance(exc, OSError | ImportError):
        reason = "no NVIDIA driver"
    return f"NVML unavailable: {reason or str(exc) or type(exc).__name__}"


def nvml_value(fn: Callable[..., T], *args: Any, default: Any = NA) -> T | Any:
    """``fn(*args)``, or ``default`` when NVML raises: one GPU's bad sensor hides one number only."""
    import pynvml

    try:
        return fn(*args)
    except pynvml.NVMLError:
        return default


class Hardware:
    """GPUs through NVML and the host through psutil; ``read()`` never raises.

    Open one per monitor process and close it when done. NVML is initialised once in the
    constructor; when that fails (no driver, as on CPU-only machines) ``nvml_error`` says why and
    ``read()`` still reports the host.
    """

    def __init__(self, *, use_nvml: bool = True) -> None:
        self._nvml = None
        self.nvml_error = "NVML off (--no-nvml): host CPU and RAM only" if not use_nvml else ""
        self._lock = threading.Lock()
        if use_nvml:
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
            except Exception as exc:  # NVMLError, or a broken/missing package
                self.nvml_error = describe_nvml_error(exc)
        psutil.cpu_percent(interval=None)  # the first call only starts psutil's interval

    @property
    def nvml_available(self) -> bool:
        return self._nvml is not None

    def read(self) -> HardwareReading:
        with self._lock:
            host = self._read_host()
            gpus: tuple[GpuReading, ...] = ()
            error = self.nvml_error
            if self._nvml is not None:
                try:
                    gpus = self._read_gpus()
                except self._nvml.NVMLError as exc:
                    error = describe_nvml_error(exc)
            return HardwareReading(time=time.time(), host=host, gpus=gpus, nvml_error=error)

    def close(self) -> None:
        with self._lock:
            if self._nvml is not None:
                nvml_value(self._nvml.nvmlShutdown, default=None)
                self._nvml = None
                self.nvml_error = "NVML closed"

    def __enter__(self) -> Hardware:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read_host(self) -> HostReading:
        vm = psutil.virtual_memory()
        return HostReading(
            cpu_percent=float(psutil.cpu_percent(interval=None)),
            cpu_count=psutil.cpu_count() or 1,
            ram_used=float(vm.total - vm.available),
            ram_total=float(vm.total),
        )

    def _read_gpus(self) -> tuple[GpuReading, ...]:
        nv = self._nvml
        assert nv is not None
        out = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nvml_value(nv.nvmlDeviceGetHandleByIndex, i, default=None)
            if h is None:
                continue
            mem = nvml_value(nv.nvmlDeviceGetMemoryInfo, h, default=None)
            util = nvml_value(nv.nvmlDeviceGetUtilizationRates, h, default=None)
            power_mw = nvml_value(nv.nvmlDeviceGetPowerUsage, h)
            limit_mw = nvml_value(nv.nvmlDeviceGetEnforcedPowerLimit, h)
            out.append(
                GpuReading(
                    index=i,
                    uuid=_text(nvml_value(nv.nvmlDeviceGetUUID, h, default="")),
                    name=_text(nvml_value(nv.nvmlDeviceGetName, h, default="GPU")),
                    utilization=float(util.gpu) if util is not None else NA,
                    memory_used=float(mem.used) if mem is not None else NA,
                    memory_total=float(mem.total) if mem is not None else NA,
                    temperature=float(
                        nvml_value(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
                    ),
                    power=float(power_mw) / 1000.0,
                    power_limit=float(limit_mw) / 1000.0,
                )
            )
        return tuple(out)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
