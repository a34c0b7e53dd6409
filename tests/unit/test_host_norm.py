"""The CPU norms through numpy: the light step's global norm (``host_sum_of_squares``), numpy's BLAS
dot where the gradients are plain float32/float64 buffers and ``global_norm`` (torch's) everywhere
else; the measured step's per-gradient squares and their per-layer fold."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nnwatch.tensors import grad_norms
from nnwatch.tensors.grad_norms import (
    LayerReducer,
    global_norm,
    host_squared_norms,
    host_sum_of_squares,
)

CPU = torch.device("cpu")


def _grads(dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(64, 33), (33,), (5, 4, 3, 3), (1,), (1000,)]
    return [(torch.randn(s, generator=gen) * 10 ** (i - 2)).to(dtype) for i, s in enumerate(shapes)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_numpy_norm_agrees_with_torch(dtype: torch.dtype) -> None:
    grads = _grads(dtype)
    expected = float(torch.nn.utils.get_total_norm(grads))
    got = math.sqrt(host_sum_of_squares(grads) or math.nan)
    assert isinstance(got, float)
    assert got == pytest.approx(expected, rel=1e-6 if dtype == torch.float32 else 1e-12)


def test_a_non_contiguous_gradient_counts_whole() -> None:
    g = torch.randn(40, 30).t()  # a transposed view: not contiguous
    assert not g.is_contiguous()
    assert host_sum_of_squares([g]) == pytest.approx(float(g.square().sum()), rel=1e-6)


def test_a_channels_last_gradient_is_read_in_memory_order() -> None:
    # a conv weight's gradient in channels_last: one dense block, not C-contiguous; read in C
    # order numpy would copy it first (40x slower than the dot)
    g = torch.randn(64, 32, 3, 3).contiguous(memory_format=torch.channels_last)
    assert not g.is_contiguous() and g.numpy().ravel(order="K").base is not None
    assert host_sum_of_squares([g]) == pytest.approx(float(g.double().square().sum()), rel=1e-6)


def test_missing_gradients_count_as_nothing_and_none_at_all_is_none() -> None:
    g = torch.full((3,), 2.0)
    assert host_sum_of_squares([None, g, None]) == pytest.approx(12.0)
    assert host_sum_of_squares([None, None]) is None
    assert host_sum_of_squares([]) is None


@pytest.mark.parametrize(
    "grad",
    [
        torch.ones(4, dtype=torch.bfloat16),  # numpy has no bfloat16
        torch.ones(4, dtype=torch.float16),  # a half-precision dot would overflow early
        torch.ones(4, requires_grad=True),  # part of a graph (create_graph=True)
        torch.ones(4).to_sparse(),
    ],
    ids=["bf16", "fp16", "in-a-graph", "sparse"],
)
def test_other_kinds_of_gradient_take_torchs_norm(grad: torch.Tensor) -> None:
    assert host_sum_of_squares([torch.ones(3), grad]) is None
    assert global_norm([torch.ones(3), grad], CPU) == pytest.approx(math.sqrt(7.0))


def test_a_tensor_subclass_is_left_to_torch() -> None:
    class Tagged(torch.Tensor):
        pass

    g = torch.ones(4).as_subclass(Tagged)
    assert host_sum_of_squares([g]) is None


def _host_norm(grads: list[torch.Tensor]) -> float:
    return math.sqrt(host_sum_of_squares(grads) or math.nan)


def test_non_finite_gradients_give_a_non_finite_norm() -> None:
    assert math.isnan(_host_norm([torch.tensor([1.0, float("nan")])]))
    assert math.isinf(_host_norm([torch.tensor([1.0, float("inf")])]))
    # float32 squares that overflow are summed again in float64: finite elements, a finite norm
    assert _host_norm([torch.tensor([3e38, 3e38])]) == pytest.approx(math.hypot(3e38, 3e38))


# -- the measured step's per-gradient squares and per-layer fold ---------------------------------
def test_the_measured_steps_squares_sum_to_the_light_norm_bit_for_bit() -> None:
    for dtype in (torch.float32, torch.float64):
        grads = _grads(dtype, seed=3)
        squares, total = host_squared_norms(grads) or (None, math.nan)
        assert squares is not None and squares.dtype == np.float64
        assert total == host_sum_of_squares(grads)  # the same sums, in the same order
        expect = [float(torch.dot(g.reshape(-1), g.reshape(-1)).double()) for g in grads]
        assert squares.tolist() == pytest.approx(expect, rel=1e-5)
    assert host_squared_norms([torch.ones(3), torch.ones(3, dtype=torch.bfloat16)]) is None
    assert host_squared_norms([]) is None


def _fold(reducer: LayerReducer, squares: np.ndarray, present: list[int], layers: int) -> list[float]:
    out = np.full(layers, -1.0, dtype=np.float32)
    reducer.write_host(squares, present, out)
    return out.tolist()


@pytest.mark.parametrize("seed", range(40))
def test_folding_layers_in_python_gives_numpys_values(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small models fold their per-layer norms in Python, large ones in numpy: the same numbers,
    non-finite gradients (+Inf), layers without a gradient (NaN) and float64 saturation included."""
    rng = np.random.default_rng(seed)
    layers = int(rng.integers(1, 9))
    owner = tuple(int(x) for x in np.sort(rng.integers(0, layers, size=int(rng.integers(1, 20)))))
    present = sorted(int(i) for i in rng.choice(len(owner), size=int(rng.integers(1, len(owner) + 1)), replace=False))
    dtype = np.float64 if seed % 2 else np.float32
    squares = (rng.random(len(present)) * 10.0 ** rng.integers(-6, 6)).astype(dtype)
    if seed % 5 == 0:
        squares[int(rng.integers(0, len(present)))] = np.nan
    if seed % 7 == 0:
        squares[int(rng.integers(0, len(present)))] = np.inf
    if seed % 9 == 0 and dtype == np.float64:
        squares[0] = 1e300  # a float64 layer norm beyond float32's range: saturated, not Inf
    python = _fold(LayerReducer(owner, layers), squares, present, layers)
    monkeypatch.setattr(grad_norms, "PYTHON_FOLD", -1)
    in_numpy = _fold(LayerReducer(owner, layers), squares, present, layers)
    np.testing.assert_array_equal(np.array(python), np.array(in_numpy))
    assert any(math.isnan(v) for v in python) == (len({owner[i] for i in present}) < layers)
