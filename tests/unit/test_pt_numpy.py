"""Tensors saved by torch.save, read back as numpy without torch, equal to torch.load's; and a
file that holds anything else is refused in words, with no code run from it."""

from __future__ import annotations

import collections
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from nnwatch.diagnosis.pt_numpy import PtReadError, load


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
     torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64],
)  # fmt: skip
def test_every_dtype_strided_views_and_containers_read_as_torch_reads_them(
    dtype: torch.dtype, tmp_path: Path
) -> None:
    g = torch.Generator().manual_seed(0)
    base = (torch.randn(6, 8, generator=g) * 50).to(dtype)
    batch = {
        "x": base.t()[1:, ::2],  # a strided view with an offset
        "pair": (base[0], base[-1]),
        "od": collections.OrderedDict(a=base[2:4]),
        "n": 3,
    }
    path = tmp_path / "batch.pt"
    torch.save(batch, path)
    want = torch.load(path, weights_only=True)
    got = load(path)

    def same(a: np.ndarray, t: torch.Tensor) -> None:
        ref = t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()
        assert a.shape == ref.shape and a.dtype == ref.dtype
        assert np.array_equal(a, ref, equal_nan=True)

    same(got["x"], want["x"])
    same(got["pair"][0], want["pair"][0])
    same(got["od"]["a"], want["od"]["a"])
    assert got["n"] == 3


class Payload:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("ran",))


def test_anything_but_tensors_is_refused_and_never_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "evil.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps(Payload()))
    with pytest.raises(PtReadError, match="needs torch"):
        load(path)
    assert "ran" not in capsys.readouterr().out
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a zip")
    with pytest.raises(PtReadError, match="not a torch.save zip file"):
        load(bad)
