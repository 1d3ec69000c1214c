"""PyTorch integration: the operators as torch.library custom operators in the namespace ``xquant``.

Registered on import (``import xquant`` does it when torch is already imported, otherwise the first call
with a torch.Tensor does). Each operator has a fake (meta) implementation giving output shapes and dtypes,
so it works under torch.compile(fullgraph=True) and torch.export; the fake-quant family and ActsULQ have
autograd formulas computed by the C++ backward kernels.

    torch.ops.xquant.fake_tensor_quant(inputs, amax, num_bits=8, is_unsigned=False, narrow_range=True)
    torch.ops.xquant.fake_tensor_quant_with_axis(inputs, amax, axis, num_bits=8, is_unsigned=False,
                                                 narrow_range=True)
    torch.ops.xquant.fake_tensor_quant_inplace(inputs, amax, num_bits=8, ...)       (mutates inputs)
    torch.ops.xquant.fake_tensor_quant_backward(grad_out, inputs, amax, axis, num_bits, is_unsigned,
                                                narrow_range, want_grad_amax) -> (grad_inputs, grad_amax)
    torch.ops.xquant.quantize(input, scales, zero_points, dtype, axis=1, div_mode=True)
    torch.ops.xquant.tile_quant(out, src, scale, tile_mode="SYM", offset=None)      (mutates out)
    torch.ops.xquant.dynamic_quant_asymmetric(x, smooth_scales=None, group_index=None, dst_type=None,
                                              quant_mode="pertoken") -> (y, scale, offset)
    torch.ops.xquant.acts_ulq(x, clamp_min, clamp_max, fixed_min=False, num_bits=8)
        -> (y, clamp_min_mask, clamp_max_mask, x_clamped_loss)
    torch.ops.xquant.acts_ulq_backward(y_grad, x_shape, clamp_min, clamp_max, clamp_min_mask,
                                       clamp_max_mask, x_clamped_loss, fixed_min, num_bits)
        -> (x_grad, clamp_min_grad, clamp_max_grad)
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor

from . import _args, _core
from ._args import QINT8, QINT32, QUINT4X2, QUINT8, fail_type, fail_value

# torch dtypes accepted as quantized output kinds, and the integer dtype storing each. (getattr: PyTorch has
# deprecated its quantized dtypes; a release without them still gets the plain integer spellings.)
_QDTYPES = {d: code for name, code in (("qint8", QINT8), ("int8", QINT8), ("quint8", QUINT8), ("uint8", QUINT8),
                                       ("qint32", QINT32), ("int32", QINT32), ("quint4x2", QUINT4X2))
            if (d := getattr(torch, name, None)) is not None}
_CODE_TO_TORCH = {code: d for code, d in ((QINT8, getattr(torch, "qint8", torch.int8)),
                                          (QUINT8, getattr(torch, "quint8", torch.uint8)),
                                          (QINT32, getattr(torch, "qint32", torch.int32)),
                                          (QUINT4X2, getattr(torch, "quint4x2", None))) if d is not None}
_STORAGE = {QINT8: torch.int8, QUINT8: torch.uint8, QINT32: torch.int32, QUINT4X2: torch.int32}


# ---- argument helpers -------------------------------------------------------------------------------------

def check_tensor(op: str, name: str, t: Any) -> Tensor:
    if not isinstance(t, Tensor):
        raise fail_type(op, f"{name} is {_args.describe(t)} but expected a torch.Tensor (the kind of the main input)")
    if t.device.type not in ("cpu", "meta"):  # meta: shape inference through the fake implementations
        raise fail_type(op, f"{name} is on device {t.device} but xquant computes on the CPU (move it with .cpu())")
    if t.dtype == torch.uint16:
        raise fail_type(op, f"{name} has dtype torch.uint16 which xquant does not support "
                            "(float32, float16, bfloat16, int8, uint8, int32, int64)")
    return t


def opt_tensor(op: str, name: str, t: Any) -> Optional[Tensor]:
    return None if t is None else check_tensor(op, name, t)


def param(op: str, name: str, v: Any, dtype: torch.dtype) -> Tensor:
    """A parameter tensor that may also be given as a Python / NumPy real number (-> 0-d tensor)."""
    if isinstance(v, (float, int, np.floating, np.integer)) and not isinstance(v, (bool, np.bool_)):
        return torch.tensor(float(v), dtype=dtype)
    return check_tensor(op, name, v)


def _cpp(op: str, name: str, t: Tensor) -> Tensor:
    """What C++ reads: detached (DLPack refuses tensors that require grad), dense (a copy only if not)."""
    check_tensor(op, name, t)
    return t.detach().contiguous()


def _opt_cpp(op: str, name: str, t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else _cpp(op, name, t)


def _dense_out(op: str, name: str, t: Tensor) -> Tensor:
    """A tensor written in place: must already be dense (never copied)."""
    check_tensor(op, name, t)
    if not t.is_contiguous():
        raise fail_value(
            op,
            f"{name} is not contiguous; an in-place call cannot make it contiguous for you "
            "(call .contiguous() first and use the result)",
        )
    return t.detach()


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


# Outputs of at least this many bytes are allocated by xquant (huge-page backed, reused across calls by
# its allocation cache) rather than by torch.empty: fresh 4 KiB pages cost a fault and a zero-fill each.
_XQ_ALLOC_MIN_BYTES = 2 << 20
_TORCH_DTYPE_NAME = {torch.float32: ("float32", 4), torch.float16: ("float16", 2), torch.bfloat16: ("bfloat16", 2),
                     torch.int8: ("int8", 1), torch.uint8: ("uint8", 1), torch.int32: ("int32", 4)}


def _empty(shape, dtype: torch.dtype) -> Tensor:
    shape = [int(d) for d in shape]
    n = 1
    for d in shape:
        n *= d
    entry = _TORCH_DTYPE_NAME.get(dtype)
    if entry is None or n * entry[1] < _XQ_ALLOC_MIN_BYTES:
        return torch.empty(shape, dtype=dtype)
    return _core.empty_torch(shape, entry[0])


def _empty_like(x: Tensor) -> Tensor:
    return _empty(x.shape, x.dtype)


def _code(op: str, name: str, d: torch.dtype) -> int:
    code = _QDTYPES.get(d)
    if code is None:
        _args.quant_dtype_code(op, name, d)  # raises
        raise AssertionError  # pragma: no cover
    return code


# ---- fake tensor quant ------------------------------------------------------------------------------------

@torch.library.custom_op("xquant::fake_tensor_quant", mutates_args=())
def _fake_tensor_quant(inputs: Tensor, amax: Tensor, num_bits: int = 8, is_unsigned: bool = False,
                       narrow_range: bool = True) -> Tensor:
    op = "fake_tensor_quant"
    x, a = _cpp(op, "inputs", inputs), _cpp(op, "amax", amax)
    out = _empty_like(x)
    _core.fake_tensor_quant(out, x, a, None, num_bits, is_unsigned, narrow_range)
    return out


@_fake_tensor_quant.register_fake
def _(inputs, amax, num_bits=8, is_unsigned=False, narrow_range=True):
    return torch.empty_like(inputs, memory_format=torch.contiguous_format)


@torch.library.custom_op("xquant::fake_tensor_quant_with_axis", mutates_args=())
def _fake_tensor_quant_with_axis(inputs: Tensor, amax: Tensor, axis: int, num_bits: int = 8,
                                 is_unsigned: bool = False, narrow_range: bool = True) -> Tensor:
    op = "fake_tensor_quant_with_axis"
    x, a = _cpp(op, "inputs", inputs), _cpp(op, "amax", amax)
    out = _empty_like(x)
    _core.fake_tensor_quant(out, x, a, axis, num_bits, is_unsigned, narrow_range)
    return out


@_fake_tensor_quant_with_axis.register_fake
def _(inputs, amax, axis, num_bits=8, is_unsigned=False, narrow_range=True):
    return torch.empty_like(inputs, memory_format=torch.contiguous_format)


@torch.library.custom_op("xquant::fake_tensor_quant_inplace", mutates_args=("inputs",))
def _fake_tensor_quant_inplace(inputs: Tensor, amax: Tensor, num_bits: int = 8, is_unsigned: bool = False,
                               narrow_range: bool = True) -> None:
    op = "fake_tensor_quant_inplace"
    x = _dense_out(op, "inputs", inputs)
    _core.fake_tensor_quant_inplace(x, _cpp(op, "amax", amax), num_bits, is_unsigned, narrow_range)


@_fake_tensor_quant_inplace.register_fake
def _(inputs, amax, num_bits=8, is_unsigned=False, narrow_range=True):
    return None


@torch.library.custom_op("xquant::fake_tensor_quant_backward", mutates_args=())
def _fake_tensor_quant_backward(grad_out: Tensor, inputs: Tensor, amax: Tensor, axis: Optional[int],
                                num_bits: int, is_unsigned: bool, narrow_range: bool,
                                want_grad_amax: bool) -> tuple[Tensor, Tensor]:
    op = "fake_tensor_quant_backward"
    g, x, a = _cpp(op, "grad_out", grad_out), _cpp(op, "inputs", inputs), _cpp(op, "amax", amax)
    grad_inputs = _empty_like(x)
    grad_amax = torch.empty_like(a) if want_grad_amax else a.new_empty((0,))
    _core.fake_tensor_quant_backward(grad_inputs, grad_amax if want_grad_amax else None, g, x, a, axis, num_bits,
                                     is_unsigned, narrow_range)
    return grad_inputs, grad_amax


@_fake_tensor_quant_backward.register_fake
def _(grad_out, inputs, amax, axis, num_bits, is_unsigned, narrow_range, want_grad_amax):
    grad_amax = (torch.empty_like(amax, memory_format=torch.contiguous_format) if want_grad_amax
                 else amax.new_empty((0,)))
    return torch.empty_like(inputs, memory_format=torch.contiguous_format), grad_amax


def _fq_setup(ctx, inputs, output):
    x, amax = inputs[0], inputs[1]
    ctx.save_for_backward(x, amax)
    ctx.axis = None if len(inputs) == 5 else inputs[2]
    ctx.options = tuple(inputs[-3:])  # num_bits, is_unsigned, narrow_range


def _fq_backward(ctx, grad):
    # Straight-through with clipping for inputs; the PACT-style learnable-amax gradient when amax needs it.
    x, amax = ctx.saved_tensors
    want = bool(ctx.needs_input_grad[1])
    gi, ga = torch.ops.xquant.fake_tensor_quant_backward(grad, x, amax, ctx.axis, *ctx.options, want)
    ga = ga if want else None
    if ctx.axis is None:
        return gi, ga, None, None, None
    return gi, ga, None, None, None, None


torch.library.register_autograd("xquant::fake_tensor_quant", _fq_backward, setup_context=_fq_setup)
torch.library.register_autograd("xquant::fake_tensor_quant_with_axis", _fq_backward, setup_context=_fq_setup)


def fake_tensor_quant(op: str, inputs: Tensor, amax: Any, axis: Optional[int], num_bits: int, is_unsigned: bool,
                      narrow_range: bool) -> Tensor:
    check_tensor(op, "inputs", inputs)
    a = param(op, "amax", amax, torch.float32)
    if axis is None:
        return torch.ops.xquant.fake_tensor_quant(inputs, a, num_bits, is_unsigned, narrow_range)
    return torch.ops.xquant.fake_tensor_quant_with_axis(inputs, a, axis, num_bits, is_unsigned, narrow_range)


def fake_tensor_quant_inplace(op: str, inputs: Tensor, amax: Any, num_bits: int, is_unsigned: bool,
                              narrow_range: bool) -> Tensor:
    _dense_out(op, "inputs", inputs)
    if inputs.requires_grad and torch.is_grad_enabled():
        # An in-place quantization would silently pass gradients through unchanged: refuse.
        raise fail_value(op, "inputs requires grad but the in-place fake quantization has no autograd "
                             "(use npu_fake_tensor_quant, or call it under torch.no_grad())")
    a = param(op, "amax", amax, torch.float32)
    torch.ops.xquant.fake_tensor_quant_inplace(inputs, a, num_bits, is_unsigned, narrow_range)
    return inputs


def fake_tensor_quant_backward(op: str, grad_out: Tensor, inputs: Tensor, amax: Any, axis: Optional[int],
                               num_bits: int, is_unsigned: bool, narrow_range: bool,
                               want_grad_amax: bool) -> tuple[Tensor, Optional[Tensor]]:
    a = param(op, "amax", amax, torch.float32)
    gi, ga = torch.ops.xquant.fake_tensor_quant_backward(check_tensor(op, "grad_out", grad_out), inputs, a, axis,
                                                         num_bits, is_unsigned, narrow_range, want_grad_amax)
    return gi, (ga if want_grad_amax else None)


# ---- npu_quantize -------------------------------------------------------------------------------------------

@torch.library.custom_op("xquant::quantize", mutates_args=())
def _quantize(input: Tensor, scales: Tensor, zero_points: Optional[Tensor], dtype: torch.dtype, axis: int = 1,
              div_mode: bool = True) -> Tensor:
    op = "quantize"
    code = _code(op, "dtype", dtype)
    x = _cpp(op, "input", input)
    out = _empty(_args.quantized_shape(tuple(x.shape), code), _STORAGE[code])
    _core.quantize(out, x, _cpp(op, "scales", scales), _opt_cpp(op, "zero_points", zero_points), code, axis,
                   div_mode)
    return out


@_quantize.register_fake
def _(input, scales, zero_points, dtype, axis=1, div_mode=True):
    code = _code("quantize", "dtype", dtype)
    return input.new_empty(_args.quantized_shape(tuple(input.shape), code), dtype=_STORAGE[code])


def quantize(op: str, input: Tensor, scales: Any, zero_points: Any, dtype: Any, axis: int,
             div_mode: bool) -> Tensor:
    check_tensor(op, "input", input)
    d = quant_dtype(op, "dtype", dtype)
    return torch.ops.xquant.quantize(input, check_tensor(op, "scales", scales),
                                     opt_tensor(op, "zero_points", zero_points), d, axis, div_mode)


# ---- pypto tile quant -------------------------------------------------------------------------------------

def _tile_ok(t: Tensor) -> bool:
    """Row-major rows with unit column stride, possibly padded (a slice of a wider tensor)."""
    if t.dim() != 2 or t.numel() == 0:
        return True  # not 2-D: C++ reports the shape; empty: nothing is read or written
    rows, cols = t.shape
    return (cols <= 1 or t.stride(1) == 1) and (rows <= 1 or t.stride(0) >= 0)


def _tile_in(op: str, name: str, t: Tensor) -> Tensor:
    check_tensor(op, name, t)
    t = t.detach()
    return t if _tile_ok(t) else t.contiguous()


@torch.library.custom_op("xquant::tile_quant", mutates_args=("out",))
def _tile_quant(out: Tensor, src: Tensor, scale: Tensor, tile_mode: str = "SYM",
                offset: Optional[Tensor] = None) -> None:
    # (The parameter is not called "mode": torch's auto-functionalization of mutable operators passes its
    # own "mode" argument.)
    op = "tile_quant"
    asym = _args.quant_mode(op, tile_mode)
    check_tensor(op, "out", out)
    if not _tile_ok(out):
        raise fail_value(op, "out must be a 2-D row-major tensor with unit column stride (rows may be padded); "
                             "it is written in place")
    sc = _tile_in(op, "scale", scale)
    off = None if offset is None else _tile_in(op, "offset", offset)
    if off is not None and sc.dim() == 2 and off.dim() == 2 and sc.stride(0) != off.stride(0):
        # The NPU needs scale and offset in tiles of one physical shape; off the NPU, give both a dense layout.
        sc, off = sc.contiguous(), off.contiguous()
    _core.tile_quant(out.detach(), _tile_in(op, "src", src), sc, asym, off)


@_tile_quant.register_fake
def _(out, src, scale, tile_mode="SYM", offset=None):
    return None


def tile_quant(op: str, out: Tensor, src: Any, scale: Any, mode: Any, offset: Any) -> None:
    asym = _args.quant_mode(op, mode)
    check_tensor(op, "out", out)
    torch.ops.xquant.tile_quant(out, check_tensor(op, "src", src), check_tensor(op, "scale", scale),
                                "ASYM" if asym else "SYM", opt_tensor(op, "offset", offset))


# ---- npu_dynamic_quant_asymmetric --------------------------------------------------------------------------

@torch.library.custom_op("xquant::dynamic_quant_asymmetric", mutates_args=())
def _dynamic_quant_asymmetric(x: Tensor, smooth_scales: Optional[Tensor] = None,
                              group_index: Optional[Tensor] = None, dst_type: Optional[torch.dtype] = None,
                              quant_mode: str = "pertoken") -> tuple[Tensor, Tensor, Tensor]:
    op = "dynamic_quant_asymmetric"
    code = QINT8 if dst_type is None else _code(op, "dst_type", dst_type)
    per_tensor = _args.dynamic_mode(op, quant_mode)
    xv = _cpp(op, "x", x)
    y_shape, p_shape = _args.dynamic_shapes(tuple(xv.shape), code, per_tensor)
    y = _empty(y_shape, _STORAGE[code])
    scale = torch.empty(p_shape, dtype=torch.float32)
    offset = torch.empty(p_shape, dtype=torch.float32)
    _core.dynamic_quant_asymmetric(y, scale, offset, xv, _opt_cpp(op, "smooth_scales", smooth_scales),
                                   _opt_cpp(op, "group_index", group_index), code, per_tensor)
    return y, scale, offset


@_dynamic_quant_asymmetric.register_fake
def _(x, smooth_scales=None, group_index=None, dst_type=None, quant_mode="pertoken"):
    op = "dynamic_quant_asymmetric"
    code = QINT8 if dst_type is None else _code(op, "dst_type", dst_type)
    per_tensor = _args.dynamic_mode(op, quant_mode)
    y_shape, p_shape = _args.dynamic_shapes(tuple(x.shape), code, per_tensor)
    return (x.new_empty(y_shape, dtype=_STORAGE[code]), x.new_empty(p_shape, dtype=torch.float32),
            x.new_empty(p_shape, dtype=torch.float32))


def dynamic_quant_asymmetric(op: str, x: Tensor, smooth_scales: Any, group_index: Any, dst_type: Any,
                             quant_mode: str) -> tuple[Tensor, Tensor, Tensor]:
    check_tensor(op, "x", x)
    d = None if dst_type is None else quant_dtype(op, "dst_type", dst_type)
    return torch.ops.xquant.dynamic_quant_asymmetric(
        x, smooth_scales=opt_tensor(op, "smooth_scales", smooth_scales),
        group_index=opt_tensor(op, "group_index", group_index), dst_type=d, quant_mode=quant_mode)


# ---- ActsULQ ------------------------------------------------------------------------------------------------

def _broadcast(*shapes) -> tuple:
    try:
        return tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        return tuple(shapes[0])  # the C++ library reports the mismatch, naming the argument


@torch.library.custom_op("xquant::acts_ulq", mutates_args=())
def _acts_ulq(x: Tensor, clamp_min: Tensor, clamp_max: Tensor, fixed_min: bool = False,
              num_bits: int = 8) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    op = "acts_ulq"
    xv, lo, hi = _cpp(op, "x", x), _cpp(op, "clamp_min", clamp_min), _cpp(op, "clamp_max", clamp_max)
    shape = _broadcast(xv.shape, lo.shape, hi.shape)
    y, m0, m1, loss = (_empty(shape, xv.dtype) for _ in range(4))
    _core.acts_ulq(y, m0, m1, loss, xv, lo, hi, fixed_min, num_bits)
    return y, m0, m1, loss


@_acts_ulq.register_fake
def _(x, clamp_min, clamp_max, fixed_min=False, num_bits=8):
    shape = torch.broadcast_shapes(x.shape, clamp_min.shape, clamp_max.shape)
    return tuple(x.new_empty(shape) for _ in range(4))


@torch.library.custom_op("xquant::acts_ulq_backward", mutates_args=())
def _acts_ulq_backward(y_grad: Tensor, x_shape: list[int], clamp_min: Tensor, clamp_max: Tensor,
                       clamp_min_mask: Tensor, clamp_max_mask: Tensor, x_clamped_loss: Tensor, fixed_min: bool,
                       num_bits: int) -> tuple[Tensor, Tensor, Tensor]:
    op = "acts_ulq_backward"
    lo, hi = _cpp(op, "clamp_min", clamp_min), _cpp(op, "clamp_max", clamp_max)
    dt = lo.dtype
    x_grad = _empty(list(x_shape), dt)
    g0, g1 = torch.empty_like(lo), torch.empty_like(hi)
    _core.acts_ulq_backward(x_grad, g0, g1, _cpp(op, "y_grad", y_grad), lo, hi,
                            _cpp(op, "clamp_min_mask", clamp_min_mask), _cpp(op, "clamp_max_mask", clamp_max_mask),
                            _cpp(op, "x_clamped_loss", x_clamped_loss), fixed_min, num_bits)
    return x_grad, g0, g1


@_acts_ulq_backward.register_fake
def _(y_grad, x_shape, clamp_min, clamp_max, clamp_min_mask, clamp_max_mask, x_clamped_loss, fixed_min, num_bits):
    return (clamp_min.new_empty(list(x_shape)), torch.empty_like(clamp_min, memory_format=torch.contiguous_format),
            torch.empty_like(clamp_max, memory_format=torch.contiguous_format))


def _ulq_setup(ctx, inputs, output):
    x, clamp_min, clamp_max, fixed_min, num_bits = inputs
    _, m0, m1, loss = output
    ctx.save_for_backward(clamp_min, clamp_max, m0, m1, loss)
    ctx.x_shape = list(x.shape)
    ctx.options = (fixed_min, num_bits)
    # Only y carries a gradient (the CANN gradient operators take y_grad alone).
    ctx.mark_non_differentiable(m0, m1, loss)


def _ulq_backward(ctx, y_grad, _m0_grad, _m1_grad, _loss_grad):
    clamp_min, clamp_max, m0, m1, loss = ctx.saved_tensors
    x_grad, g0, g1 = torch.ops.xquant.acts_ulq_backward(y_grad, ctx.x_shape, clamp_min, clamp_max, m0, m1, loss,
                                                        *ctx.options)
    return x_grad, g0, g1, None, None


torch.library.register_autograd("xquant::acts_ulq", _ulq_backward, setup_context=_ulq_setup)


def acts_ulq(op: str, x: Tensor, clamp_min: Any, clamp_max: Any, fixed_min: bool,
             num_bits: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    check_tensor(op, "x", x)
    lo = param(op, "clamp_min", clamp_min, x.dtype)
    hi = param(op, "clamp_max", clamp_max, x.dtype)
    return torch.ops.xquant.acts_ulq(x, lo, hi, fixed_min, num_bits)


def acts_ulq_backward(op: str, y_grad: Tensor, x_shape: tuple, clamp_min: Tensor, clamp_max: Tensor,
                      clamp_min_mask: Tensor, clamp_max_mask: Tensor, x_clamped_loss: Tensor, fixed_min: bool,
                      num_bits: int) -> tuple[Tensor, Tensor, Tensor]:
    return torch.ops.xquant.acts_ulq_backward(
        check_tensor(op, "y_grad", y_grad), list(x_shape), check_tensor(op, "clamp_min", clamp_min),
        check_tensor(op, "clamp_max", clamp_max), check_tensor(op, "clamp_min_mask", clamp_min_mask),
        check_tensor(op, "clamp_max_mask", clamp_max_mask), check_tensor(op, "x_clamped_loss", x_clamped_loss),
        fixed_min, num_bits)
