"""xquant: Huawei Ascend quantization operators, exact, off the NPU (NumPy and PyTorch front ends).

``xquant.npu`` is the compatibility contract: the seeds' names and signatures
(npu_fake_tensor_quant, npu_fake_tensor_quant_inplace, npu_fake_tensor_quant_with_axis, npu_quantize,
npu_dynamic_quant_asymmetric, quant, acts_ulq), the companions npu_dynamic_quant and npu_anti_quant, and
the quantized matmuls real Ascend code calls next (npu_quant_matmul, npu_weight_quant_batchmatmul,
npu_trans_quant_param, npu_convert_weight_to_int4pack).
This namespace re-exports them and adds shorter names
(fake_tensor_quant, ..., tile_quant) and the backward functions. For torch tensors the operators are also
available as ``torch.ops.xquant.*`` custom operators (torch.compile / torch.export / autograd).
"""

from __future__ import annotations

import sys as _sys

from . import _args, _core, npu
from ._args import QuantMode
from ._backward import acts_ulq_backward, fake_tensor_quant_backward
from .npu import (
    acts_ulq,
    npu_anti_quant,
    npu_convert_weight_to_int4pack,
    npu_dynamic_quant,
    npu_dynamic_quant_asymmetric,
    npu_fake_tensor_quant,
    npu_fake_tensor_quant_inplace,
    npu_fake_tensor_quant_with_axis,
    npu_quant_matmul,
    npu_quantize,
    npu_trans_quant_param,
    npu_weight_quant_batchmatmul,
    quant,
)

__version__: str = _core.__version__


_MAX_THREADS = 1024  # xquant::kMaxThreads: the C++ library's limit on set_num_threads


def set_num_threads(n: int) -> None:
    """Worker threads of xquant's CPU kernels (1 <= n <= 1024, or 0 for OpenMP's default). Results are
    bit-identical for every thread count. (Independent of torch.set_num_threads.)"""
    n = _args.as_int("set_num_threads", "n", n)
    if n > _MAX_THREADS:
        raise _args.fail_value("set_num_threads", f"n is {n} but expected a thread count of at most {_MAX_THREADS} "
                                                  "(xquant's limit), >= 1, or 0 for the default")
    _core.set_num_threads(n)


def get_num_threads() -> int:
    """The thread count xquant's CPU kernels use."""
    return _core.get_num_threads()


def set_backend(backend: str) -> None:
    """'cpu' (SIMD + OpenMP, the default) or 'reference' (the scalar reference kernels): bit-identical."""
    if not isinstance(backend, str):
        raise _args.fail_type("set_backend", f"backend is {_args.describe(backend)} but expected 'cpu' or 'reference'")
    _core.set_backend(backend)


def get_backend() -> str:
    return _core.get_backend()


def simd_target() -> str:
    """The SIMD target the 'cpu' backend runs on this machine, e.g. 'AVX2'."""
    return _core.simd_target()


def cuda_built() -> bool:
    """True when this xquant was compiled with its CUDA backend (the wheel is built with it where nvcc was
    found at build time)."""
    return _core.cuda_built()


def cuda_available() -> bool:
    """True when xquant can run operators on torch CUDA tensors: built with CUDA and a CUDA device usable
    (probed once, on the first call; a CUDA build loads and runs CPU-only without a GPU or driver)."""
    return _core.cuda_available()


def cuda_unavailable_reason() -> str:
    """Why :func:`cuda_available` is False ('' when it is True): e.g. 'xquant was built without CUDA
    (CMake option XQUANT_CUDA)' or the CUDA runtime's message ('no CUDA-capable device is detected')."""
    return _core.cuda_unavailable_reason()


def set_memory_cache_limit(nbytes: int) -> None:
    """Bytes of freed large (>= 2 MiB) output buffers xquant keeps for reuse (default 2 GiB; 0 disables and
    releases them). Reused buffers skip the page faults and zero-fill of fresh memory."""
    n = _args.as_int("set_memory_cache_limit", "nbytes", nbytes)
    if n < 0:
        raise _args.fail_value("set_memory_cache_limit", f"nbytes is {n} but expected a byte count >= 0")
    _core.set_memory_cache_limit(n)


def get_memory_cache_limit() -> int:
    return _core.get_memory_cache_limit()


# Shorter names (same functions).
fake_tensor_quant = npu_fake_tensor_quant
fake_tensor_quant_inplace = npu_fake_tensor_quant_inplace
fake_tensor_quant_with_axis = npu_fake_tensor_quant_with_axis
quantize = npu_quantize
dynamic_quant_asymmetric = npu_dynamic_quant_asymmetric
dynamic_quant = npu_dynamic_quant
anti_quant = npu_anti_quant
tile_quant = quant
quant_matmul = npu_quant_matmul
weight_quant_batchmatmul = npu_weight_quant_batchmatmul
trans_quant_param = npu_trans_quant_param
convert_weight_to_int4pack = npu_convert_weight_to_int4pack

__all__ = [
    "npu",
    "QuantMode",
    "npu_fake_tensor_quant",
    "npu_fake_tensor_quant_inplace",
    "npu_fake_tensor_quant_with_axis",
    "npu_quantize",
    "npu_dynamic_quant_asymmetric",
    "npu_dynamic_quant",
    "npu_anti_quant",
    "quant",
    "acts_ulq",
    "fake_tensor_quant",
    "fake_tensor_quant_inplace",
    "fake_tensor_quant_with_axis",
    "fake_tensor_quant_backward",
    "quantize",
    "dynamic_quant_asymmetric",
    "dynamic_quant",
    "anti_quant",
    "tile_quant",
    "acts_ulq_backward",
    "npu_quant_matmul",
    "npu_weight_quant_batchmatmul",
    "npu_trans_quant_param",
    "npu_convert_weight_to_int4pack",
    "quant_matmul",
    "weight_quant_batchmatmul",
    "trans_quant_param",
    "convert_weight_to_int4pack",
    "register_torch_ops",
    "set_num_threads",
    "set_memory_cache_limit",
    "get_memory_cache_limit",
    "get_num_threads",
    "set_backend",
    "get_backend",
    "simd_target",
    "cuda_built",
    "cuda_available",
    "cuda_unavailable_reason",
]


def register_torch_ops() -> None:
    """Imports torch and xquant's torch extension, which registers the torch.ops.xquant.* operators, and
    their autograd formulas and batching rules (done automatically when torch was imported before xquant,
    or on the first call with a torch.Tensor; call this before using torch.ops.xquant directly). Raises
    ImportError, saying how to rebuild, where xquant was built without torch or against another torch."""
    import torch  # noqa: F401

    npu._load_torch_backend()


if "torch" in _sys.modules:
    try:
        npu._load_torch_backend()
    except ImportError:
        pass  # xquant built without torch, or against another torch: raised on the first call with a torch tensor
