"""Helpers shared by the tests: NumPy <-> torch conversion (bfloat16 included), data generators."""

from __future__ import annotations

import numpy as np
import pytest

from golden import BF16

try:  # the NumPy tests also run without torch (scripts/test-python-numpy): their torch halves skip
    import torch
except ImportError:
    torch = None

NP_DTYPES = [np.dtype(np.float32), np.dtype(np.float16), BF16]
TORCH_OF = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16,
            BF16: torch.bfloat16} if torch is not None else {}
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (the torch-free run of the NumPy "
                                                       "tests, scripts/test-python-numpy)")
FLT_MAX = float(np.finfo(np.float32).max)


def to_torch(a: np.ndarray) -> torch.Tensor:
    """Same bits as a torch tensor (a copy, so that the NumPy array stays untouched)."""
    a = np.asarray(a).copy(order="C")  # (np.ascontiguousarray would turn 0-d into 1-d)
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    if a.dtype == np.uint16:
        raise TypeError("uint16")
    return torch.from_numpy(a)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BF16).copy()
    return t.numpy().copy()


def edge_values() -> np.ndarray:
    """SPEC's edge inputs: ties of both signs, +-0, subnormals, +-FLT_MAX, +-Inf, NaN, ..."""
    ties = [k + 0.5 for k in range(-6, 6)]
    return np.array(ties + [0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-38, 1e-8, -3e-5, 6.1e-5, 65504.0, -65520.0,
                            FLT_MAX, -FLT_MAX, np.inf, -np.inf, np.nan, 1.0, -1.0, 127.0, -128.0, 127.5, -128.5,
                            3.4e38, 1e30],
                    dtype=np.float32)


def random_floats(rng, shape, dtype, scale=3.0) -> np.ndarray:
    with np.errstate(over="ignore"):  # large values become +-Inf in float16 on purpose
        return (rng.standard_normal(shape) * scale).astype(np.float32).astype(dtype)


def with_edges(rng, n, dtype, scale=3.0) -> np.ndarray:
    """n random values with the edge values mixed in at random positions."""
    v = (rng.standard_normal(n) * scale).astype(np.float32)
    e = edge_values()
    pos = rng.choice(n, size=min(n, e.size), replace=False)
    v[pos] = e[: pos.size]
    with np.errstate(over="ignore"):  # FLT_MAX and friends become +-Inf in float16 / bfloat16 on purpose
        return v.astype(dtype)
