"""The light step's global norm on the CPU (``host_sum_of_squares``): numpy's BLAS dot where the
gradients are plain float32/float64 buffers; ``global_norm`` (torch's) everywhere else."""

from __future__ import annotations

import math

import pytest
import torch

from nnwatch.tensors.grad_norms import global_norm, host_sum_of_squares

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
    assert math.isinf(_host_norm([torch.tensor([3e38, 3e38])]))  # float32 squares overflow
