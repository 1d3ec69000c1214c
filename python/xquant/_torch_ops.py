"""PyTorch integration: the xquant.npu functions for torch tensors, over the operators torch.ops.xquant.*.

The operators are defined once, in C++, by the torch extension xquant._torch_ext (python/src/torch_ext.cpp):
their schemas, one CPU / CUDA kernel each and one Meta kernel each, both of which start with the C++
library's planning entry (xquant/plan.hpp), so eager calls, meta tensors, FakeTensor, torch.compile and
torch.export report the same errors from the same code. This module adds what is registered in Python,
once per operator: the batching rules for torch.vmap (or a clear refusal). (Autograd is registered in C++
too: fake_tensor_quant, fake_tensor_quant_with_axis and acts_ulq have autograd kernels whose backward passes
are the C++ operators fake_tensor_quant_backward / acts_ulq_backward.) It also turns the xquant.npu arguments (Python numbers, dtype
spellings, ...) into the operators' arguments. Plain eager calls skip the dispatcher: xquant.npu calls
_torch_ext.f_<op> (the same C++ implementation) first.

Imported by ``import xquant`` when torch is already imported, else on the first call with a torch tensor.
Where xquant._torch_ext was not built (torch not importable when xquant was installed) or was built against
another torch than the running one, importing this module raises ImportError saying how to rebuild.

    torch.ops.xquant.fake_tensor_quant(inputs, amax, num_bits=8, is_unsigned=False, narrow_range=True)
    torch.ops.xquant.fake_tensor_quant_with_axis(inputs, amax, axis, num_bits=8, is_unsigned=False,
                                                 narrow_range=True)
    torch.ops.xquant.fake_tensor_quant_inplace(inputs, amax, num_bits=8, ...)       (mutates inputs)
    torch.ops.xquant.fake_tensor_quant_backward(grad_out, inputs, amax, axis, num_bits, is_unsigned,
                                                narrow_range, want_grad_amax) -> (grad_inputs, grad_amax)
    torch.ops.xquant.quantize(input, scales, zero_points, dtype, axis=1, div_mode=True)
    torch.ops.xquant.tile_quant(out, src, scale, tile_mode="SYM", offset=None)      (mutates out)
    torch.ops.xquant.dynamic_quant_asymmetric(x, smooth_scales=None, group_index=None, dst_type=None,
                                              quant_mode="pertoken", dst_type_max=0.0) -> (y, scale, offset)
    torch.ops.xquant.dynamic_quant(x, smooth_scales=None, group_index=None, dst_type=None,
                                   quant_mode="pertoken", dst_type_max=0.0) -> (y, scale)
    torch.ops.xquant.anti_quant(x, scale, offset=None, dst_dtype=None, src_dtype=None) -> out
    torch.ops.xquant.acts_ulq(x, clamp_min, clamp_max, fixed_min=False, num_bits=8)
        -> (y, clamp_min_mask, clamp_max_mask, x_clamped_loss)
    torch.ops.xquant.acts_ulq_backward(y_grad, x_shape, clamp_min, clamp_max, clamp_min_mask,
                                       clamp_max_mask, x_clamped_loss, fixed_min, num_bits)
        -> (x_grad, clamp_min_grad, clamp_max_grad)
    torch.ops.xquant.quant_matmul(x1, x2, scale, offset=None, pertoken_scale=None, bias=None,
                                  output_dtype=None, group_sizes=None) -> out     (not differentiable)
    torch.ops.xquant.weight_quant_batchmatmul(x, weight, antiquant_scale, antiquant_offset=None, bias=None,
                                              antiquant_group_size=0) -> out      (not differentiable)
    torch.ops.xquant.trans_quant_param(scale, offset=None, round_mode=0) -> int64 words
    torch.ops.xquant.convert_weight_to_int4pack(weight) -> int32 words

The matmuls read a transposed view of a dense [..., N, K] x2 / weight as stored (the library's transpose
flag), as torch_npu does.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor

from . import _args
from ._args import QINT8, QINT32, QUINT4X2, QUINT8, fail_type, fail_value
from ._build_info import TORCH_VERSION as _BUILT_FOR


def _rebuild_hint() -> str:
    return ("rebuild xquant against the torch in use: python -m pip install --no-build-isolation --no-deps "
            "--force-reinstall <the xquant source directory> (scripts/setup-python does this), with torch "
            "importable by that Python")


def _load_extension():
    """xquant._torch_ext, if it was built against the running torch; else ImportError saying how to rebuild.
    (The build-time version is read from xquant/_build_info.py before the binary is loaded: a module built
    for another torch is never imported, its C++ ABI may differ.)"""
    if not _BUILT_FOR:
        raise ImportError("xquant was installed without its PyTorch operators (torch was not importable when it "
                          f"was built), so it cannot compute on torch tensors; {_rebuild_hint()}")
    if _BUILT_FOR != torch.__version__:
        raise ImportError(f"xquant's PyTorch operators were built against torch {_BUILT_FOR} but torch "
                          f"{torch.__version__} is running; {_rebuild_hint()}")
    from . import _torch_ext

    return _torch_ext


EXT = _load_extension()
"""xquant._torch_ext: registers torch.ops.xquant.* on import; f_<op> are the eager fast path."""

# torch dtypes accepted as quantized output kinds, and the integer dtype storing each. (getattr: PyTorch has
# deprecated its quantized dtypes; a release without them still gets the plain integer spellings.)
_QDTYPES = {d: code for name, code in (("qint8", QINT8), ("int8", QINT8), ("quint8", QUINT8), ("uint8", QUINT8),
                                       ("qint32", QINT32), ("int32", QINT32), ("quint4x2", QUINT4X2),
                                       ("float8_e4m3fn", _args.FLOAT8_E4M3FN), ("float8_e5m2", _args.FLOAT8_E5M2))
            if (d := getattr(torch, name, None)) is not None}
_CODE_TO_TORCH = {code: d for code, d in ((QINT8, getattr(torch, "qint8", torch.int8)),
                                          (QUINT8, getattr(torch, "quint8", torch.uint8)),
                                          (QINT32, getattr(torch, "qint32", torch.int32)),
                                          (QUINT4X2, getattr(torch, "quint4x2", None)),
                                          (_args.FLOAT8_E4M3FN, getattr(torch, "float8_e4m3fn", None)),
                                          (_args.FLOAT8_E5M2, getattr(torch, "float8_e5m2", None))) if d is not None}
_STORAGE = {QINT8: torch.int8, QUINT8: torch.uint8, QINT32: torch.int32, QUINT4X2: torch.int32,
            **{c: d for c, d in _CODE_TO_TORCH.items() if c in (_args.FLOAT8_E4M3FN, _args.FLOAT8_E5M2)}}
_SPARSE_LAYOUTS = tuple(getattr(torch, n) for n in ("sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr",
                                                    "sparse_bsc") if hasattr(torch, n))
_FLOAT_TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


# ---- argument helpers (what kind of Python object each argument is; the operators check the rest) --------

def check_tensor(op: str, name: str, t: Any) -> Tensor:
    """A tensor the operators can take: a plain (strided) CPU, CUDA or meta tensor, not quantized. (Its dtype,
    shape and, for CUDA, whether xquant can run there are checked by the operators in C++.)"""
    if not isinstance(t, Tensor):
        raise fail_type(op, f"{name} is {_args.describe(t)} but expected a torch.Tensor (the kind of the main input)")
    if t.is_nested:
        raise fail_type(op, f"{name} is a nested tensor but expected a dense strided tensor")
    if t.layout != torch.strided:
        kind = "sparse" if t.layout in _SPARSE_LAYOUTS else "non-strided"
        raise fail_type(op, f"{name} is a {kind} tensor (layout {t.layout}) but expected a dense strided tensor "
                            "(call .to_dense() first)")
    if t.device.type not in ("cpu", "cuda", "meta"):  # meta: shape inference through the Meta kernels
        raise fail_type(op, f"{name} is on device {t.device} but xquant computes on CPU and CUDA tensors "
                            "(move it with .cpu())")
    if t.is_quantized:
        raise fail_type(op, f"{name} is a quantized tensor (dtype {t.dtype}) but expected a float or integer tensor "
                            "(call .dequantize() or .int_repr() first)")
    return t


def opt_tensor(op: str, name: str, t: Any) -> Optional[Tensor]:
    return None if t is None else check_tensor(op, name, t)


def param(op: str, name: str, v: Any, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A parameter tensor that may also be given as a Python / NumPy real number (-> 0-d tensor on
    `device`, the main input's)."""
    if isinstance(v, (float, int, np.floating, np.integer)) and not isinstance(v, (bool, np.bool_)):
        return torch.tensor(float(v), dtype=dtype, device=device)
    return check_tensor(op, name, v)


def _device_str(d: torch.device) -> str:
    """A device as the C++ library names it: 'cpu', 'cuda:0'."""
    return f"{d.type}:{d.index if d.index is not None else 0}" if d.type == "cuda" else d.type


def _one_device(op: str, **tensors: Optional[Tensor]) -> None:
    """Every tensor of the call on one device, checked before dispatch (the dispatcher would pick the CUDA
    kernel for a CPU / CUDA mix, and a Meta kernel cannot see a FakeTensor's device): the message of the C++
    library's own check (xquant::detail::common_device), which the CPU / CUDA kernels still make."""
    first_name, first = None, None
    for name, t in tensors.items():
        if t is None:
            continue
        if first is None:
            first_name, first = name, t.device
        elif t.device != first:
            raise fail_value(op, f"{name} is on {_device_str(t.device)} but {first_name} is on {_device_str(first)} "
                                 "(expected every tensor of the call on one device)")


def quant_dtype(op: str, name: str, d: Any) -> torch.dtype:
    """Any accepted spelling of a quantized output kind -> the torch dtype naming it."""
    if isinstance(d, torch.dtype):
        if d not in _QDTYPES:
            _args.quant_dtype_code(op, name, d)  # raises the ValueError listing what is accepted
        return d
    code = _args.quant_dtype_code(op, name, d)
    t = _CODE_TO_TORCH.get(code)
    if t is None:  # pragma: no cover - a PyTorch without torch.quint4x2
        raise fail_value(op, f"{name} is {d!r} but this PyTorch has no torch.{_args.QDTYPE_NAME[code]}")
    return t


def _code(op: str, name: str, d: torch.dtype) -> int:
    """A torch dtype of a quantized output kind -> its QuantDType code (ValueError listing the accepted ones)."""
    code = _QDTYPES.get(d)
    if code is None:
        _args.quant_dtype_code(op, name, d)  # raises
        raise AssertionError  # pragma: no cover
    return code


# ---- the functions of xquant.npu (full path: everything that is not plain eager) -----------------------------

def fake_tensor_quant(op: str, inputs: Tensor, amax: Any, axis: Optional[int], num_bits: int, is_unsigned: bool,
                      narrow_range: bool) -> Tensor:
    check_tensor(op, "inputs", inputs)
    a = param(op, "amax", amax, torch.float32, inputs.device)
    _one_device(op, inputs=inputs, amax=a)
    if axis is None:
        return torch.ops.xquant.fake_tensor_quant(inputs, a, num_bits, is_unsigned, narrow_range)
    return torch.ops.xquant.fake_tensor_quant_with_axis(inputs, a, axis, num_bits, is_unsigned, narrow_range)


def fake_tensor_quant_inplace(op: str, inputs: Tensor, amax: Any, num_bits: int, is_unsigned: bool,
                              narrow_range: bool) -> Tensor:
    check_tensor(op, "inputs", inputs)
    if inputs.requires_grad and torch.is_grad_enabled():
        # An in-place quantization would silently pass gradients through unchanged: refuse.
        raise fail_value(op, "inputs requires grad but the in-place fake quantization has no autograd "
                             "(use npu_fake_tensor_quant, or call it under torch.no_grad())")
    if not torch.compiler.is_compiling():  # (is_neg() is not traceable; there the Meta kernel checks it)
        EXT.check_writable(op, "inputs", inputs)
    a = param(op, "amax", amax, torch.float32, inputs.device)
    _one_device(op, inputs=inputs, amax=a)
    torch.ops.xquant.fake_tensor_quant_inplace(inputs, a, num_bits, is_unsigned, narrow_range)
    return inputs


def fake_tensor_quant_backward(op: str, grad_out: Tensor, inputs: Tensor, amax: Any, axis: Optional[int],
                               num_bits: int, is_unsigned: bool, narrow_range: bool,
                               want_grad_amax: bool) -> tuple[Tensor, Optional[Tensor]]:
    check_tensor(op, "inputs", inputs)
    a = param(op, "amax", amax, torch.float32, inputs.device)
    g = check_tensor(op, "grad_out", grad_out)
    _one_device(op, grad_out=g, inputs=inputs, amax=a)
    gi, ga = torch.ops.xquant.fake_tensor_quant_backward(g, inputs, a, axis, num_bits, is_unsigned, narrow_range,
                                                         want_grad_amax)
    return gi, (ga if want_grad_amax else None)


def quantize(op: str, input: Tensor, scales: Any, zero_points: Any, dtype: Any, axis: int,
             div_mode: bool) -> Tensor:
    check_tensor(op, "input", input)
    d = quant_dtype(op, "dtype", dtype)
    s, zp = check_tensor(op, "scales", scales), opt_tensor(op, "zero_points", zero_points)
    _one_device(op, input=input, scales=s, zero_points=zp)
    return torch.ops.xquant.quantize(input, s, zp, d, axis, div_mode)


def tile_quant(op: str, out: Tensor, src: Any, scale: Any, mode: Any, offset: Any) -> None:
    asym = _args.quant_mode(op, mode)
    check_tensor(op, "out", out)
    if not torch.compiler.is_compiling():  # (as for fake_tensor_quant_inplace)
        EXT.check_writable(op, "out", out)
    s, sc, off = check_tensor(op, "src", src), check_tensor(op, "scale", scale), opt_tensor(op, "offset", offset)
    _one_device(op, out=out, src=s, scale=sc, offset=off)
    torch.ops.xquant.tile_quant(out, s, sc, "ASYM" if asym else "SYM", off)


def dynamic_quant_asymmetric(op: str, x: Tensor, smooth_scales: Any, group_index: Any, dst_type: Any,
                             quant_mode: str, dst_type_max: Any = 0.0) -> tuple[Tensor, Tensor, Tensor]:
    check_tensor(op, "x", x)
    d = None if dst_type is None else quant_dtype(op, "dst_type", _args.dynamic_dst_name(op, dst_type))
    _args.dst_type_max(op, dst_type_max)
    sm, gi = opt_tensor(op, "smooth_scales", smooth_scales), opt_tensor(op, "group_index", group_index)
    _one_device(op, x=x, smooth_scales=sm, group_index=gi)
    return torch.ops.xquant.dynamic_quant_asymmetric(x, smooth_scales=sm, group_index=gi, dst_type=d,
                                                     quant_mode=quant_mode, dst_type_max=float(dst_type_max))


def dynamic_quant(op: str, x: Tensor, smooth_scales: Any, group_index: Any, dst_type: Any,
                  quant_mode: str = "pertoken", dst_type_max: Any = 0.0) -> tuple[Tensor, Tensor]:
    check_tensor(op, "x", x)
    d = None if dst_type is None else quant_dtype(op, "dst_type", _args.dynamic_dst_name(op, dst_type))
    _args.dst_type_max(op, dst_type_max)
    sm, gi = opt_tensor(op, "smooth_scales", smooth_scales), opt_tensor(op, "group_index", group_index)
    _one_device(op, x=x, smooth_scales=sm, group_index=gi)
    return torch.ops.xquant.dynamic_quant(x, smooth_scales=sm, group_index=gi, dst_type=d, quant_mode=quant_mode,
                                          dst_type_max=float(dst_type_max))


def anti_quant(op: str, x: Tensor, scale: Any, offset: Any, dst_dtype: Any, src_dtype: Any) -> Tensor:
    check_tensor(op, "x", x)
    dst = _FLOAT_TORCH[_args.float_dtype_name(op, "dst_dtype", dst_dtype)]
    src = None if src_dtype is None else quant_dtype(op, "src_dtype", src_dtype)
    s, off = check_tensor(op, "scale", scale), opt_tensor(op, "offset", offset)
    _one_device(op, x=x, scale=s, offset=off)
    return torch.ops.xquant.anti_quant(x, s, offset=off, dst_dtype=dst, src_dtype=src)


def acts_ulq(op: str, x: Tensor, clamp_min: Any, clamp_max: Any, fixed_min: bool,
             num_bits: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    check_tensor(op, "x", x)
    lo = param(op, "clamp_min", clamp_min, x.dtype, x.device)
    hi = param(op, "clamp_max", clamp_max, x.dtype, x.device)
    _one_device(op, x=x, clamp_min=lo, clamp_max=hi)
    return torch.ops.xquant.acts_ulq(x, lo, hi, fixed_min, num_bits)


_MATMUL_OUT_TORCH = {"int8": torch.int8, "float16": torch.float16, "bfloat16": torch.bfloat16, "int32": torch.int32}


def quant_matmul(op: str, x1: Tensor, x2: Any, scale: Any, offset: Any, pertoken_scale: Any, bias: Any,
                 output_dtype: str, group_sizes: tuple = (0, 0, 0)) -> Tensor:
    check_tensor(op, "x1", x1)
    w, s = check_tensor(op, "x2", x2), check_tensor(op, "scale", scale)
    off, pts, b = (opt_tensor(op, "offset", offset), opt_tensor(op, "pertoken_scale", pertoken_scale),
                   opt_tensor(op, "bias", bias))
    _one_device(op, x1=x1, x2=w, scale=s, offset=off, pertoken_scale=pts, bias=b)
    return torch.ops.xquant.quant_matmul(x1, w, s, off, pts, b, _MATMUL_OUT_TORCH[output_dtype], list(group_sizes))


def weight_quant_batchmatmul(op: str, x: Tensor, weight: Any, antiquant_scale: Any, antiquant_offset: Any, bias: Any,
                             antiquant_group_size: int) -> Tensor:
    check_tensor(op, "x", x)
    w, s = check_tensor(op, "weight", weight), check_tensor(op, "antiquant_scale", antiquant_scale)
    off, b = opt_tensor(op, "antiquant_offset", antiquant_offset), opt_tensor(op, "bias", bias)
    _one_device(op, x=x, weight=w, antiquant_scale=s, antiquant_offset=off, bias=b)
    return torch.ops.xquant.weight_quant_batchmatmul(x, w, s, off, b, antiquant_group_size)


def trans_quant_param(op: str, scale: Tensor, offset: Any, round_mode: int) -> Tensor:
    check_tensor(op, "scale", scale)
    off = opt_tensor(op, "offset", offset)
    _one_device(op, scale=scale, offset=off)
    return torch.ops.xquant.trans_quant_param(scale, off, round_mode)


def convert_weight_to_int4pack(op: str, weight: Tensor) -> Tensor:
    check_tensor(op, "weight", weight)
    return torch.ops.xquant.convert_weight_to_int4pack(weight)


def acts_ulq_backward(op: str, y_grad: Tensor, x_shape: tuple, clamp_min: Tensor, clamp_max: Tensor,
                      clamp_min_mask: Tensor, clamp_max_mask: Tensor, x_clamped_loss: Tensor, fixed_min: bool,
                      num_bits: int) -> tuple[Tensor, Tensor, Tensor]:
    ts = {"clamp_min": clamp_min, "clamp_max": clamp_max, "y_grad": y_grad, "clamp_min_mask": clamp_min_mask,
          "clamp_max_mask": clamp_max_mask, "x_clamped_loss": x_clamped_loss}
    for name, t in ts.items():
        check_tensor(op, name, t)
    _one_device(op, **ts)
    return torch.ops.xquant.acts_ulq_backward(y_grad, list(x_shape), clamp_min, clamp_max, clamp_min_mask,
                                              clamp_max_mask, x_clamped_loss, fixed_min, num_bits)


# ---- autograd ---------------------------------------------------------------------------------------------------
#
# Registered once per differentiable operator, in C++ (xquant._torch_ext: a torch::autograd::Function on the
# Autograd key for fake_tensor_quant, fake_tensor_quant_with_axis and acts_ulq, whose backward calls the
# backward operator): the eager fast path calls the same function directly when autograd records.

# ---- torch.vmap: batching rules where the operator batches naturally, a clear refusal elsewhere ------------

def _to_front(t: Tensor, bdim: Optional[int], size: int) -> Tensor:
    """t with its batch dimension first (an unbatched t expanded to the batch)."""
    if bdim is None:
        return t.unsqueeze(0).expand(size, *t.shape)
    return t.movedim(bdim, 0)


# (The dispatcher leaves out trailing arguments equal to their schema defaults: the defaults are repeated.)
def _vmap_fake_tensor_quant(info, in_dims, inputs, amax, num_bits=8, is_unsigned=False, narrow_range=True):
    x_bdim, a_bdim = in_dims[0], in_dims[1]
    if a_bdim is None:  # one amax for the whole batch: the operator itself, elementwise
        return torch.ops.xquant.fake_tensor_quant(inputs, amax, num_bits, is_unsigned, narrow_range), x_bdim
    a = amax.movedim(a_bdim, 0)
    if a[0].numel() != 1:  # each example's amax must have one element: the operator says so
        torch.ops.xquant.fake_tensor_quant(_to_front(inputs, x_bdim, info.batch_size)[0], a[0], num_bits,
                                           is_unsigned, narrow_range)
    # amax per example: per-channel quantization along the batch dimension (the same parameters per slice).
    x = _to_front(inputs, x_bdim, info.batch_size)
    return torch.ops.xquant.fake_tensor_quant_with_axis(x, a.reshape(info.batch_size), 0, num_bits, is_unsigned,
                                                        narrow_range), 0


def _vmap_fake_tensor_quant_with_axis(info, in_dims, inputs, amax, axis, num_bits=8, is_unsigned=False,
                                      narrow_range=True):
    x_bdim, a_bdim = in_dims[0], in_dims[1]
    if a_bdim is not None:
        raise NotImplementedError("xquant::fake_tensor_quant_with_axis: torch.vmap over amax (one amax per example) "
                                  "is not supported; vmap over inputs only, or loop over the batch")
    x = _to_front(inputs, x_bdim, info.batch_size)
    rank = x.dim() - 1
    ax = axis + rank if -rank <= axis < 0 else axis  # out-of-range axes: the operator reports them below
    return torch.ops.xquant.fake_tensor_quant_with_axis(x, amax, ax + 1 if 0 <= ax < rank else axis, num_bits,
                                                        is_unsigned, narrow_range), 0


def _vmap_acts_ulq(info, in_dims, x, clamp_min, clamp_max, fixed_min=False, num_bits=8):
    # Broadcasting: each batched argument gets its batch dimension first and 1s up to the examples' common
    # rank; the unbatched ones broadcast against that from the right.
    ts = (x, clamp_min, clamp_max)
    rank = max(t.dim() - (d is not None) for t, d in zip(ts, in_dims[:3]))
    args = []
    for t, d in zip(ts, in_dims[:3]):
        if d is None:
            args.append(t)
        else:
            t = t.movedim(d, 0)
            args.append(t.reshape(t.shape[0], *([1] * (rank - (t.dim() - 1))), *t.shape[1:]))
    return torch.ops.xquant.acts_ulq(*args, fixed_min, num_bits), (0, 0, 0, 0)


torch.library.register_vmap("xquant::fake_tensor_quant", _vmap_fake_tensor_quant)
torch.library.register_vmap("xquant::fake_tensor_quant_with_axis", _vmap_fake_tensor_quant_with_axis)
torch.library.register_vmap("xquant::acts_ulq", _vmap_acts_ulq)

_NO_VMAP = ("fake_tensor_quant_inplace", "fake_tensor_quant_backward", "quantize", "tile_quant",
            "dynamic_quant_asymmetric", "dynamic_quant", "anti_quant", "acts_ulq_backward", "quant_matmul",
            "weight_quant_batchmatmul", "trans_quant_param", "convert_weight_to_int4pack")
_vmap_lib = torch.library.Library("xquant", "IMPL")  # held: the registrations live as long as it does


def _decline_vmap(name: str):
    def kernel(*args, **kwargs):
        raise NotImplementedError(f"xquant::{name}: torch.vmap is not supported by this operator (it has no "
                                  "batching rule); call it on the whole batch, or loop over the batch")
    return kernel


for _name in _NO_VMAP:
    _vmap_lib.impl(_name, _decline_vmap(_name), "FuncTorchBatched")
del _name


# ---- the eager fast path -------------------------------------------------------------------------------------

FAST = EXT
"""The module whose f_<op> functions xquant.npu's eager fast path calls (xquant._torch_ext)."""
