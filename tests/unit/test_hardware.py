"""nnwatch.sources.hardware: NVML behind one interface, with the no-driver path exercised for real.

This CI machine has nvidia-ml-py installed but no NVIDIA driver, so ``nvmlInit`` really fails
here; on a GPU machine the NVML tests below check real devices instead.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pynvml
import pytest

from nnwatch.sources.hardware import (
    NA,
    GpuReading,
    Hardware,
    HardwareReading,
    HostReading,
    describe_nvml_error,
    is_na,
    normalize_uuid,
    nvml_value,
)


def _nvml_works() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


HAS_NVML = _nvml_works()


@pytest.mark.skipif(HAS_NVML, reason="a driver is present; the no-driver path cannot happen here")
def test_no_driver_is_reported_in_plain_words_and_host_still_reads() -> None:
    with Hardware() as hw:
        assert not hw.nvml_available
        reading = hw.read()
    assert reading.nvml_error == "NVML unavailable: no NVIDIA driver"
    assert reading.gpus == ()
    host = reading.host
    assert host.cpu_count >= 1
    assert 0.0 <= host.cpu_percent <= 100.0
    assert 0 < host.ram_used < host.ram_total


@pytest.mark.skipif(HAS_NVML, reason="NVML initialises here, so its calls do not fail")
def test_nvml_errors_become_na_values() -> None:
    # NVML is not initialised (there is no driver): every call raises a real NVMLError
    with pytest.raises(pynvml.NVMLError):
        pynvml.nvmlDeviceGetCount()
    assert is_na(nvml_value(pynvml.nvmlDeviceGetCount))
    assert nvml_value(pynvml.nvmlDeviceGetCount, default=None) is None
    assert nvml_value(lambda: 7) == 7


def test_nvml_error_codes_are_described_for_users() -> None:
    driver = describe_nvml_error(pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    assert driver == "NVML unavailable: no NVIDIA driver"
    perm = describe_nvml_error(pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION))
    assert perm == "NVML unavailable: no permission to read the GPUs"
    lost = describe_nvml_error(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST))
    assert "stopped answering" in lost
    assert describe_nvml_error(OSError("libnvidia-ml.so.1: cannot open")).endswith(
        "no NVIDIA driver"
    )


def test_disabled_nvml_still_reads_the_host() -> None:
    hw = Hardware(use_nvml=False)
    reading = hw.read()
    assert not hw.nvml_available
    assert "NVML off" in reading.nvml_error
    assert reading.host.ram_total > 0
    hw.close()
    hw.close()  # closing twice is fine
    assert hw.read().host.ram_total > 0  # and reading after close still reports the host


def test_gpus_are_matched_by_uuid_not_by_index() -> None:
    a = GpuReading(index=0, uuid="GPU-aaaa1111-0000-0000-0000-000000000000", name="A")
    b = GpuReading(index=1, uuid="GPU-bbbb2222-0000-0000-0000-000000000000", name="B")
    reading = HardwareReading(0.0, HostReading(1.0, 1, 1.0, 2.0), (a, b))
    # torch spells uuids without the GPU- prefix; CUDA_VISIBLE_DEVICES may renumber devices
    assert reading.gpus_for(["bbbb2222-0000-0000-0000-000000000000"]) == (b,)
    assert reading.gpus_for(["GPU-BBBB2222-0000-0000-0000-000000000000", a.uuid]) == (b, a)
    assert reading.gpus_for(["cccc"]) == ()
    assert normalize_uuid("GPU-AbC") == normalize_uuid("abc") == "abc"


def test_unmeasured_numbers_are_na() -> None:
    g = GpuReading(index=0, uuid="GPU-x", name="x")
    assert all(is_na(v) for v in (g.utilization, g.memory_used, g.temperature, g.power))
    assert math.isnan(NA) and not is_na(0.0)


@pytest.mark.skipif(not HAS_NVML, reason="needs an NVIDIA driver")
def test_real_gpus_have_uuids_and_memory() -> None:
    with Hardware() as hw:
        reading = hw.read()
    assert reading.nvml_error == ""
    assert reading.gpus
    for g in reading.gpus:
        assert g.uuid.startswith("GPU-")
        assert g.memory_total > 0
        assert reading.gpus_for([g.uuid]) == (g,)


def test_hardware_module_imports_no_ui_library() -> None:
    code = "import sys, nnwatch.sources.hardware; print(any(m in sys.modules for m in ('textual', 'rich')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
