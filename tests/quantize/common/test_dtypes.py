"""The compute dtype for calibration and reference models: the checkpoint's own,
unless it is half precision on a CPU that has no fast half-precision matmul."""
import pytest
import torch

from quantize.common import dtypes
from quantize.common.errors import UserError


@pytest.fixture
def cpu_only(monkeypatch):
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)


def test_half_checkpoint_computes_in_float32_on_cpu_without_native_half(cpu_only, monkeypatch):
    monkeypatch.setattr(dtypes, "cpu_native_half", lambda: frozenset())
    assert dtypes.compute_dtype(torch.bfloat16) == torch.float32
    assert dtypes.compute_dtype(torch.float16) == torch.float32
    assert dtypes.compute_dtype(torch.float32) == torch.float32


def test_half_checkpoint_keeps_its_dtype_where_half_is_fast(cpu_only, monkeypatch):
    monkeypatch.setattr(dtypes, "cpu_native_half", lambda: frozenset({"bfloat16"}))
    assert dtypes.compute_dtype(torch.bfloat16) == torch.bfloat16


def test_half_checkpoint_keeps_its_dtype_on_an_accelerator(monkeypatch):
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(dtypes, "cpu_native_half", lambda: frozenset())
    assert dtypes.compute_dtype(torch.bfloat16) == torch.bfloat16


def test_an_explicit_dtype_wins(cpu_only, monkeypatch):
    monkeypatch.setattr(dtypes, "cpu_native_half", lambda: frozenset())
    assert dtypes.compute_dtype(torch.bfloat16, "bfloat16") == torch.bfloat16
    assert dtypes.compute_dtype(torch.float32, "float16") == torch.float16


@pytest.mark.parametrize("bad", ["int8", "fp32", "nonsense"])
def test_unknown_dtype_is_a_one_line_error(bad):
    with pytest.raises(UserError, match="unknown dtype"):
        dtypes.compute_dtype(torch.bfloat16, bad)
