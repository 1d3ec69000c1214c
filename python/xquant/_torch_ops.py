"""PyTorch integration: the operators as torch.library custom operators in the namespace ``xquant``.

Registered on import (``import xquant`` does it when torch is already imported, otherwise the first call
with a torch.Tensor does). Each operator has a fake (meta) implementation giving output shapes and dtypes
after the same validation as the eager call (xquant._meta), so it works under
torch.compile(fullgraph=True) and torch.export; the fake-quant family and ActsULQ have autograd formulas
computed by the C++ backward kernels. Plain eager calls of xquant.npu skip these operators (the eager fast
path: xquant.npu, _core.t_*), and eager autograd uses autograd.Functions over the same kernels.

CUDA tensors: every operator also has a kernel for the CUDA dispatch key (_custom_op): the same
implementation after a check that xquant can run on CUDA (_require_cuda). The compiled core runs the C++
library's CUDA backend on torch's current stream of the tensors' device, with that device current, and
allocates the outputs with torch.empty on it (torch's caching allocator). The eager fast path is CPU-only:
CUDA tensors always take these operators (autograd through the registered formulas), and the fake
implementations give outputs on the inputs' device. Tensors of one call must share one device.

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
    torch.ops.xquant.dynamic_quant(x, smooth_scales=None, group_index=None, dst_type=None) -> (y, scale)
    torch.ops.xquant.anti_quant(x, scale, offset=None, dst_dtype=None, src_dtype=None) -> out
    torch.ops.xquant.acts_ulq(x, clamp_min, clamp_max, fixed_min=False, num_bits=8)
        -> (y, clamp_min_mask, clamp_max_mask, x_clamped_loss)
    torch.ops.xquant.acts_ulq_backward(y_grad, x_shape, clamp_min, clamp_max, clamp_min_mask,
                                       clamp_max_mask, x_clamped_loss, fixed_min, num_bits)
        -> (x_grad, clamp_min_grad, clamp_max_grad)
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch import Tensor

from . import _args, _core, _meta
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
# torch dtype -> xquant's dtype name (the dtypes the C++ library reads).
_XQ_DTYPE = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.int8: "int8",
             torch.uint8: "uint8", torch.int32: "int32", torch.int64: "int64"}
_SPARSE_LAYOUTS = tuple(getattr(torch, n) for n in ("sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr",
                                                    "sparse_bsc") if hasattr(torch, n))


# ---- argument helpers -------------------------------------------------------------------------------------

def check_tensor(op: str, name: str, t: Any) -> Tensor:
    """A tensor xquant can read: a plain (strided) CPU, CUDA or meta tensor of a dtype torch can hand over.
    Negative and conjugate views are accepted (materialized by _cpp). (Whether xquant can run on a CUDA
    tensor is checked by the operators' CUDA kernels, _require_cuda: the fake implementations trace CUDA
    programs also where xquant has no CUDA backend.)"""
    if not isinstance(t, Tensor):
        raise fail_type(op, f"{name} is {_args.describe(t)} but expected a torch.Tensor (the kind of the main input)")
    if t.is_nested:
        raise fail_type(op, f"{name} is a nested tensor but expected a dense strided tensor")
    if t.layout != torch.strided:
        kind = "sparse" if t.layout in _SPARSE_LAYOUTS else "non-strided"
        raise fail_type(op, f"{name} is a {kind} tensor (layout {t.layout}) but expected a dense strided tensor "
                            "(call .to_dense() first)")
    if t.device.type not in ("cpu", "cuda", "meta"):  # meta: shape inference through the fake implementations
        raise fail_type(op, f"{name} is on device {t.device} but xquant computes on CPU and CUDA tensors "
                            "(move it with .cpu())")
    if t.is_quantized:
        raise fail_type(op, f"{name} is a quantized tensor (dtype {t.dtype}) but expected a float or integer tensor "
                            "(call .dequantize() or .int_repr() first)")
    if t.dtype == torch.uint16:
        raise fail_type(op, f"{name} has dtype torch.uint16 which xquant does not support "
                            "(float32, float16, bfloat16, int8, uint8, int32, int64)")
    if t.dtype not in _XQ_DTYPE:
        raise fail_type(op, f"{name} has dtype {str(t.dtype)[6:]} which xquant does not support "
                            "(float32, float16, bfloat16, int8, uint8, int32, int64)")
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
    """Every tensor of the call on one device (checked tensors; None skipped), else the C++ library's
    ValueError naming the first argument on another device than the first one. Checked by the eager
    implementations before anything is allocated or written, and by the fake implementations in the same
    place, so that meta / fake tensors get the same error."""
    first_name, first = None, None
    for name, t in tensors.items():
        if t is None:
            continue
        if first is None:
            first_name, first = name, t.device
        elif t.device != first:
            raise fail_value(op, f"{name} is on {_device_str(t.device)} but {first_name} is on {_device_str(first)} "
                                 "(expected every tensor of the call on one device)")


def _require_cuda(op: str, fn: Callable, args: tuple, kwargs: dict) -> None:
    """The CUDA kernels' first step: xquant built with CUDA and a CUDA device usable by it, else TypeError
    naming the first CUDA tensor argument and the reason."""
    if _core.cuda_available():
        return
    name, device = "a tensor", None
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
        for n, v in bound.arguments.items():
            if isinstance(v, Tensor) and v.device.type == "cuda":
                name, device = n, v.device
                break
    except TypeError:  # pragma: no cover - the dispatcher passes the schema's arguments
        pass
    where = f" is on {_device_str(device)}" if device is not None else " is on a CUDA device"
    raise fail_type(op, f"{name}{where} but xquant cannot run on CUDA tensors: {_core.cuda_unavailable_reason()} "
                        "(move the tensors with .cpu(), or install an xquant built with CUDA)")


def _custom_op(name: str, mutates_args: tuple = ()) -> Callable:
    """torch.library.custom_op("xquant::<name>") whose implementation serves CPU tensors (the default
    kernel) and, registered for the CUDA dispatch key, CUDA tensors: the same function, preceded by
    _require_cuda. The compiled core runs CUDA tensors on xquant's CUDA backend, on torch's current stream,
    with outputs from torch's caching allocator."""
    def decorate(fn: Callable):
        op_def = torch.library.custom_op(f"xquant::{name}", mutates_args=mutates_args)(fn)

        @functools.wraps(fn)
        def cuda_kernel(*args, **kwargs):
            _require_cuda(name, fn, args, kwargs)
            device = next((v.device for v in (*args, *kwargs.values()) if isinstance(v, Tensor) and v.is_cuda),
                          None)
            if device is None:  # pragma: no cover - the CUDA key is chosen for a CUDA tensor argument
                return fn(*args, **kwargs)
            # The first CUDA tensor's device is the current one during the call, as in torch's own CUDA
            # kernels (Tensor.__dlpack__, which hands tensors to the core, requires it).
            with torch.cuda.device(device):
                return fn(*args, **kwargs)

        op_def.register_kernel("cuda")(cuda_kernel)
        return op_def
    return decorate


def _cpp(op: str, name: str, t: Tensor) -> Tensor:
    """What C++ reads: detached, dense (a copy only if not), negative / conjugate views materialized."""
    check_tensor(op, name, t)
    return t.detach().contiguous().resolve_neg().resolve_conj()


def _opt_cpp(op: str, name: str, t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else _cpp(op, name, t)


def _dense_out(op: str, name: str, t: Tensor, lazy_views: bool = True) -> Tensor:
    """A tensor written in place: must already be dense (never copied), and hold its own values (checked
    by the operator itself; lazy_views=False in the wrappers that torch.compile traces)."""
    check_tensor(op, name, t)
    if not t.is_contiguous():
        raise fail_value(
            op,
            f"{name} is not contiguous; an in-place call cannot make it contiguous for you "
            "(call .contiguous() first and use the result)",
        )
    if lazy_views:
        _no_lazy_view(op, name, t)
    return t.detach()


def _no_lazy_view(op: str, name: str, t: Tensor) -> None:
    """A tensor written in place must hold its own values: a negative (or conjugate) view's memory holds
    the negated ones, so writing the result through it would store the wrong values."""
    if t.is_neg() or t.is_conj():
        raise fail_value(op, f"{name} is a {'negative' if t.is_neg() else 'conjugate'} view (its memory holds "
                             "transformed values); an in-place call cannot write through it (call .resolve_neg() / "
                             ".resolve_conj() first and use the result)")


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


def _empty(shape, dtype: torch.dtype, device: torch.device) -> Tensor:
    """An output on `device`: CUDA outputs from torch's caching allocator (torch.empty)."""
    shape = [int(d) for d in shape]
    if device.type != "cpu":
        return torch.empty(shape, dtype=dtype, device=device)
    n = 1
    for d in shape:
        n *= d
    entry = _TORCH_DTYPE_NAME.get(dtype)
    if entry is None or n * entry[1] < _XQ_ALLOC_MIN_BYTES:
        return torch.empty(shape, dtype=dtype)
    return _core.empty_torch(shape, entry[0])


def _empty_like(x: Tensor) -> Tensor:
    return _empty(x.shape, x.dtype, x.device)


def _code(op: str, name: str, d: torch.dtype) -> int:
    code = _QDTYPES.get(d)
    if code is None:
        _args.quant_dtype_code(op, name, d)  # raises
        raise AssertionError  # pragma: no cover
    return code


def _m(t: Tensor) -> tuple:
    """What the data-free validation (xquant._meta) sees of a checked tensor: (dtype name, shape)."""
    return _XQ_DTYPE[t.dtype], tuple(t.shape)


def _opt_m(t: Optional[Tensor]) -> Optional[tuple]:
    return None if t is None else _m(t)


def _check_all(op: str, **tensors: Optional[Tensor]) -> None:
    """check_tensor for each, then _one_device for all (the fake implementations' first step)."""
    for name, t in tensors.items():
        if t is not None:
            check_tensor(op, name, t)
    _one_device(op, **tensors)


# ---- fake tensor quant ------------------------------------------------------------------------------------
#
# Each operator: the eager implementation (checked, dense tensors handed to the compiled core without
# DLPack: _core.t_*(..., strict=True)), and the fake implementation, which validates shapes, dtypes and
# arguments exactly as the eager call does (xquant._meta) before it returns outputs without data.

@_custom_op("fake_tensor_quant", mutates_args=())
def _fake_tensor_quant(inputs: Tensor, amax: Tensor, num_bits: int = 8, is_unsigned: bool = False,
                       narrow_range: bool = True) -> Tensor:
    op = "fake_tensor_quant"
    x, a = _cpp(op, "inputs", inputs), _cpp(op, "amax", amax)
    _one_device(op, inputs=x, amax=a)
    return _core.t_fake_tensor_quant(x, a, None, num_bits, is_unsigned, narrow_range, True)


@_fake_tensor_quant.register_fake
def _(inputs, amax, num_bits=8, is_unsigned=False, narrow_range=True):
    op = "fake_tensor_quant"
    _check_all(op, inputs=inputs, amax=amax)
    _meta.fake_quant(op, _m(inputs), _m(amax), None, num_bits)
    return torch.empty_like(inputs, memory_format=torch.contiguous_format)


@_custom_op("fake_tensor_quant_with_axis", mutates_args=())
def _fake_tensor_quant_with_axis(inputs: Tensor, amax: Tensor, axis: int, num_bits: int = 8,
                                 is_unsigned: bool = False, narrow_range: bool = True) -> Tensor:
    op = "fake_tensor_quant_with_axis"
    x, a = _cpp(op, "inputs", inputs), _cpp(op, "amax", amax)
    _one_device(op, inputs=x, amax=a)
    return _core.t_fake_tensor_quant(x, a, axis, num_bits, is_unsigned, narrow_range, True)


@_fake_tensor_quant_with_axis.register_fake
def _(inputs, amax, axis, num_bits=8, is_unsigned=False, narrow_range=True):
    op = "fake_tensor_quant_with_axis"
    _check_all(op, inputs=inputs, amax=amax)
    _meta.fake_quant(op, _m(inputs), _m(amax), axis, num_bits)
    return torch.empty_like(inputs, memory_format=torch.contiguous_format)


@_custom_op("fake_tensor_quant_inplace", mutates_args=("inputs",))
def _fake_tensor_quant_inplace(inputs: Tensor, amax: Tensor, num_bits: int = 8, is_unsigned: bool = False,
                               narrow_range: bool = True) -> None:
    op = "fake_tensor_quant_inplace"
    x = _dense_out(op, "inputs", inputs)
    a = _cpp(op, "amax", amax)
    _one_device(op, inputs=x, amax=a)
    _core.t_fake_tensor_quant_inplace(x, a, num_bits, is_unsigned, narrow_range, True)


@_fake_tensor_quant_inplace.register_fake
def _(inputs, amax, num_bits=8, is_unsigned=False, narrow_range=True):
    op = "fake_tensor_quant_inplace"
    _dense_out(op, "inputs", inputs)
    check_tensor(op, "amax", amax)
    _one_device(op, inputs=inputs, amax=amax)
    _meta.fake_quant(op, _m(inputs), _m(amax), None, num_bits)
    return None


@_custom_op("fake_tensor_quant_backward", mutates_args=())
def _fake_tensor_quant_backward(grad_out: Tensor, inputs: Tensor, amax: Tensor, axis: Optional[int],
                                num_bits: int, is_unsigned: bool, narrow_range: bool,
                                want_grad_amax: bool) -> tuple[Tensor, Tensor]:
    op = "fake_tensor_quant_backward"
    g, x, a = _cpp(op, "grad_out", grad_out), _cpp(op, "inputs", inputs), _cpp(op, "amax", amax)
    _one_device(op, grad_out=g, inputs=x, amax=a)
    grad_inputs = _empty_like(x)
    grad_amax = torch.empty_like(a) if want_grad_amax else a.new_empty((0,))
    _core.fake_tensor_quant_backward(grad_inputs, grad_amax if want_grad_amax else None, g, x, a, axis, num_bits,
                                     is_unsigned, narrow_range)
    return grad_inputs, grad_amax


@_fake_tensor_quant_backward.register_fake
def _(grad_out, inputs, amax, axis, num_bits, is_unsigned, narrow_range, want_grad_amax):
    _check_all("fake_tensor_quant_backward", grad_out=grad_out, inputs=inputs, amax=amax)
    _meta.fake_quant_backward(_m(grad_out), _m(inputs), _m(amax), axis, num_bits)
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


class _FakeQuantFn(torch.autograd.Function):
    """Eager autograd without the custom operator's dispatch (see _eager_autograd): the same kernels and the
    same backward operator as the registered autograd formula."""

    @staticmethod
    def forward(ctx, inputs, amax, axis, num_bits, is_unsigned, narrow_range):
        # (grad mode is off inside forward: plain tensors take the lenient call, the others are densified)
        out = FAST.t_fake_tensor_quant(inputs, amax, axis, num_bits, is_unsigned, narrow_range)
        if out is None:
            op = "fake_tensor_quant" if axis is None else "fake_tensor_quant_with_axis"
            out = _core.t_fake_tensor_quant(_cpp(op, "inputs", inputs), _cpp(op, "amax", amax), axis, num_bits,
                                            is_unsigned, narrow_range, True)
        ctx.save_for_backward(inputs, amax)
        ctx.axis, ctx.options = axis, (num_bits, is_unsigned, narrow_range)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, amax = ctx.saved_tensors
        want = bool(ctx.needs_input_grad[1])
        gi, ga = torch.ops.xquant.fake_tensor_quant_backward(grad, x, amax, ctx.axis, *ctx.options, want)
        return gi, (ga if want else None), None, None, None, None


def _eager_autograd(*tensors: Tensor) -> bool:
    """Autograd recording in plain eager mode on CPU tensors: an autograd.Function calling the compiled core
    costs a fraction of the custom operator's dispatch. Tracing (torch.compile / export), modes, functorch
    transforms, meta and subclassed tensors keep the custom operators."""
    if not FAST_PATH or torch.compiler.is_compiling() or not torch.is_grad_enabled():
        return False
    if not any(t.requires_grad for t in tensors):
        return False
    return all((type(t) is Tensor or type(t) is torch.nn.Parameter) and t.is_cpu for t in tensors) and \
        _core.plain_modes()


def fake_quant_autograd(inputs: Tensor, amax: Any, axis: Optional[int], num_bits: int, is_unsigned: bool,
                        narrow_range: bool) -> Tensor:
    """The fast path's hand-over when autograd must record (the compiled core has checked every argument's
    kind; amax may still be a Python number)."""
    if not isinstance(amax, Tensor):
        amax = torch.tensor(float(amax), dtype=torch.float32)
    return _FakeQuantFn.apply(inputs, amax, axis, num_bits, is_unsigned, narrow_range)


def fake_tensor_quant(op: str, inputs: Tensor, amax: Any, axis: Optional[int], num_bits: int, is_unsigned: bool,
                      narrow_range: bool) -> Tensor:
    check_tensor(op, "inputs", inputs)
    a = param(op, "amax", amax, torch.float32, inputs.device)
    if _eager_autograd(inputs, a):
        return _FakeQuantFn.apply(inputs, a, axis, num_bits, is_unsigned, narrow_range)
    if axis is None:
        return torch.ops.xquant.fake_tensor_quant(inputs, a, num_bits, is_unsigned, narrow_range)
    return torch.ops.xquant.fake_tensor_quant_with_axis(inputs, a, axis, num_bits, is_unsigned, narrow_range)


def fake_tensor_quant_inplace(op: str, inputs: Tensor, amax: Any, num_bits: int, is_unsigned: bool,
                              narrow_range: bool) -> Tensor:
    # (is_neg() is not traceable by torch.compile; there the operator's fake implementation checks it)
    _dense_out(op, "inputs", inputs, lazy_views=not torch.compiler.is_compiling())
    if inputs.requires_grad and torch.is_grad_enabled():
        # An in-place quantization would silently pass gradients through unchanged: refuse.
        raise fail_value(op, "inputs requires grad but the in-place fake quantization has no autograd "
                             "(use npu_fake_tensor_quant, or call it under torch.no_grad())")
    a = param(op, "amax", amax, torch.float32, inputs.device)
    torch.ops.xquant.fake_tensor_quant_inplace(inputs, a, num_bits, is_unsigned, narrow_range)
    return inputs


def fake_tensor_quant_backward(op: str, grad_out: Tensor, inputs: Tensor, amax: Any, axis: Optional[int],
                               num_bits: int, is_unsigned: bool, narrow_range: bool,
                               want_grad_amax: bool) -> tuple[Tensor, Optional[Tensor]]:
    a = param(op, "amax", amax, torch.float32, inputs.device)
    gi, ga = torch.ops.xquant.fake_tensor_quant_backward(check_tensor(op, "grad_out", grad_out), inputs, a, axis,
                                                         num_bits, is_unsigned, narrow_range, want_grad_amax)
    return gi, (ga if want_grad_amax else None)


# ---- npu_quantize -------------------------------------------------------------------------------------------

@_custom_op("quantize", mutates_args=())
def _quantize(input: Tensor, scales: Tensor, zero_points: Optional[Tensor], dtype: torch.dtype, axis: int = 1,
              div_mode: bool = True) -> Tensor:
    op = "quantize"
    _code(op, "dtype", dtype)
    x, s, zp = _cpp(op, "input", input), _cpp(op, "scales", scales), _opt_cpp(op, "zero_points", zero_points)
    _one_device(op, input=x, scales=s, zero_points=zp)
    return _core.t_quantize(x, s, zp, dtype, axis, div_mode, True)


@_quantize.register_fake
def _(input, scales, zero_points, dtype, axis=1, div_mode=True):
    op = "quantize"
    code = _code(op, "dtype", dtype)
    _check_all(op, input=input, scales=scales, zero_points=zero_points)
    shape = _meta.quantize(_m(input), _m(scales), _opt_m(zero_points), code, axis, div_mode)
    return input.new_empty(shape, dtype=_STORAGE[code])


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
    t = t.detach().resolve_neg()
    return t if _tile_ok(t) else t.contiguous()


@_custom_op("tile_quant", mutates_args=("out",))
def _tile_quant(out: Tensor, src: Tensor, scale: Tensor, tile_mode: str = "SYM",
                offset: Optional[Tensor] = None) -> None:
    # (The parameter is not called "mode": torch's auto-functionalization of mutable operators passes its
    # own "mode" argument.)
    op = "tile_quant"
    asym = _args.quant_mode(op, tile_mode)
    check_tensor(op, "out", out)
    _no_lazy_view(op, "out", out)
    if not _tile_ok(out):
        raise fail_value(op, "out must be a 2-D row-major tensor with unit column stride (rows may be padded); "
                             "it is written in place")
    sc = _tile_in(op, "scale", scale)
    off = None if offset is None else _tile_in(op, "offset", offset)
    if off is not None and sc.dim() == 2 and off.dim() == 2 and sc.stride(0) != off.stride(0):
        # The NPU needs scale and offset in tiles of one physical shape; off the NPU, give both a dense layout.
        sc, off = sc.contiguous(), off.contiguous()
    src_t = _tile_in(op, "src", src)
    _one_device(op, out=out, src=src_t, scale=sc, offset=off)
    _core.tile_quant(out.detach(), src_t, sc, asym, off)


@_tile_quant.register_fake
def _(out, src, scale, tile_mode="SYM", offset=None):
    op = "tile_quant"
    asym = _args.quant_mode(op, tile_mode)
    check_tensor(op, "out", out)
    _no_lazy_view(op, "out", out)
    if not _tile_ok(out):
        raise fail_value(op, "out must be a 2-D row-major tensor with unit column stride (rows may be padded); "
                             "it is written in place")
    _check_all(op, out=out, src=src, scale=scale, offset=offset)
    _meta.tile_quant(_m(out), _m(src), _m(scale), asym, _opt_m(offset))
    return None


def tile_quant(op: str, out: Tensor, src: Any, scale: Any, mode: Any, offset: Any) -> None:
    asym = _args.quant_mode(op, mode)
    check_tensor(op, "out", out)
    if not torch.compiler.is_compiling():
        _no_lazy_view(op, "out", out)
    torch.ops.xquant.tile_quant(out, check_tensor(op, "src", src), check_tensor(op, "scale", scale),
                                "ASYM" if asym else "SYM", opt_tensor(op, "offset", offset))


# ---- npu_dynamic_quant_asymmetric --------------------------------------------------------------------------

@_custom_op("dynamic_quant_asymmetric", mutates_args=())
def _dynamic_quant_asymmetric(x: Tensor, smooth_scales: Optional[Tensor] = None,
                              group_index: Optional[Tensor] = None, dst_type: Optional[torch.dtype] = None,
                              quant_mode: str = "pertoken") -> tuple[Tensor, Tensor, Tensor]:
    op = "dynamic_quant_asymmetric"
    if dst_type is not None:
        _code(op, "dst_type", dst_type)
    _args.dynamic_mode(op, quant_mode)
    xc, sm = _cpp(op, "x", x), _opt_cpp(op, "smooth_scales", smooth_scales)
    gi = _opt_cpp(op, "group_index", group_index)
    _one_device(op, x=xc, smooth_scales=sm, group_index=gi)
    return _core.t_dynamic_quant_asymmetric(xc, sm, gi, dst_type, quant_mode, True)


@_dynamic_quant_asymmetric.register_fake
def _(x, smooth_scales=None, group_index=None, dst_type=None, quant_mode="pertoken"):
    op = "dynamic_quant_asymmetric"
    code = QINT8 if dst_type is None else _code(op, "dst_type", dst_type)
    per_tensor = _args.dynamic_mode(op, quant_mode)
    _check_all(op, x=x, smooth_scales=smooth_scales, group_index=group_index)
    y_shape, p_shape = _meta.dynamic_quant(_m(x), _opt_m(smooth_scales), _opt_m(group_index), code, per_tensor)
    return (x.new_empty(y_shape, dtype=_STORAGE[code]), x.new_empty(p_shape, dtype=torch.float32),
            x.new_empty(p_shape, dtype=torch.float32))


def dynamic_quant_asymmetric(op: str, x: Tensor, smooth_scales: Any, group_index: Any, dst_type: Any,
                             quant_mode: str) -> tuple[Tensor, Tensor, Tensor]:
    check_tensor(op, "x", x)
    d = None if dst_type is None else quant_dtype(op, "dst_type", dst_type)
    return torch.ops.xquant.dynamic_quant_asymmetric(
        x, smooth_scales=opt_tensor(op, "smooth_scales", smooth_scales),
        group_index=opt_tensor(op, "group_index", group_index), dst_type=d, quant_mode=quant_mode)


# ---- npu_dynamic_quant (symmetric) -----------------------------------------------------------------------

@_custom_op("dynamic_quant", mutates_args=())
def _dynamic_quant(x: Tensor, smooth_scales: Optional[Tensor] = None, group_index: Optional[Tensor] = None,
                   dst_type: Optional[torch.dtype] = None) -> tuple[Tensor, Tensor]:
    op = "dynamic_quant"
    if dst_type is not None:
        _code(op, "dst_type", dst_type)
    xc, sm = _cpp(op, "x", x), _opt_cpp(op, "smooth_scales", smooth_scales)
    gi = _opt_cpp(op, "group_index", group_index)
    _one_device(op, x=xc, smooth_scales=sm, group_index=gi)
    return _core.t_dynamic_quant(xc, sm, gi, dst_type, True)


@_dynamic_quant.register_fake
def _(x, smooth_scales=None, group_index=None, dst_type=None):
    op = "dynamic_quant"
    code = QINT8 if dst_type is None else _code(op, "dst_type", dst_type)
    _check_all(op, x=x, smooth_scales=smooth_scales, group_index=group_index)
    y_shape, p_shape = _meta.dynamic_quant_sym(_m(x), _opt_m(smooth_scales), _opt_m(group_index), code)
    return x.new_empty(y_shape, dtype=_STORAGE[code]), x.new_empty(p_shape, dtype=torch.float32)


def dynamic_quant(op: str, x: Tensor, smooth_scales: Any, group_index: Any, dst_type: Any) -> tuple[Tensor, Tensor]:
    check_tensor(op, "x", x)
    d = None if dst_type is None else quant_dtype(op, "dst_type", dst_type)
    return torch.ops.xquant.dynamic_quant(x, smooth_scales=opt_tensor(op, "smooth_scales", smooth_scales),
                                          group_index=opt_tensor(op, "group_index", group_index), dst_type=d)


# ---- npu_anti_quant -----------------------------------------------------------------------------------------

_FLOAT_TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _dst_dtype(op: str, d: Optional[torch.dtype]) -> torch.dtype:
    return _FLOAT_TORCH[_args.float_dtype_name(op, "dst_dtype", d)]


@_custom_op("anti_quant", mutates_args=())
def _anti_quant(x: Tensor, scale: Tensor, offset: Optional[Tensor] = None, dst_dtype: Optional[torch.dtype] = None,
                src_dtype: Optional[torch.dtype] = None) -> Tensor:
    op = "anti_quant"
    dst = _dst_dtype(op, dst_dtype)
    if src_dtype is not None:
        _code(op, "src_dtype", src_dtype)
    xc, sc, off = _cpp(op, "x", x), _cpp(op, "scale", scale), _opt_cpp(op, "offset", offset)
    _one_device(op, x=xc, scale=sc, offset=off)
    return _core.t_anti_quant(xc, sc, off, dst, src_dtype, True)


@_anti_quant.register_fake
def _(x, scale, offset=None, dst_dtype=None, src_dtype=None):
    op = "anti_quant"
    dst = _dst_dtype(op, dst_dtype)
    code = QINT8 if src_dtype is None else _code(op, "src_dtype", src_dtype)
    _check_all(op, x=x, scale=scale, offset=offset)
    shape = _meta.anti_quant(_m(x), _m(scale), _opt_m(offset), code)
    return x.new_empty(shape, dtype=dst)


def anti_quant(op: str, x: Tensor, scale: Any, offset: Any, dst_dtype: Any, src_dtype: Any) -> Tensor:
    check_tensor(op, "x", x)
    dst = _dst_dtype(op, dst_dtype)
    src = None if src_dtype is None else quant_dtype(op, "src_dtype", src_dtype)
    return torch.ops.xquant.anti_quant(x, check_tensor(op, "scale", scale), offset=opt_tensor(op, "offset", offset),
                                       dst_dtype=dst, src_dtype=src)


# ---- ActsULQ ------------------------------------------------------------------------------------------------

@_custom_op("acts_ulq", mutates_args=())
def _acts_ulq(x: Tensor, clamp_min: Tensor, clamp_max: Tensor, fixed_min: bool = False,
              num_bits: int = 8) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    op = "acts_ulq"
    xc, lo, hi = _cpp(op, "x", x), _cpp(op, "clamp_min", clamp_min), _cpp(op, "clamp_max", clamp_max)
    _one_device(op, x=xc, clamp_min=lo, clamp_max=hi)
    return _core.t_acts_ulq(xc, lo, hi, fixed_min, num_bits, True)


@_acts_ulq.register_fake
def _(x, clamp_min, clamp_max, fixed_min=False, num_bits=8):
    op = "acts_ulq"
    _check_all(op, x=x, clamp_min=clamp_min, clamp_max=clamp_max)
    shape = _meta.acts_ulq(_m(x), _m(clamp_min), _m(clamp_max), num_bits)
    return tuple(x.new_empty(shape) for _ in range(4))


def _x_shape(op: str, x_shape) -> list:
    shape = [int(d) for d in x_shape]
    if any(d < 0 for d in shape):
        raise fail_value(op, f"x_shape is {_meta.shape_str(shape)} with a negative dimension")
    return shape


@_custom_op("acts_ulq_backward", mutates_args=())
def _acts_ulq_backward(y_grad: Tensor, x_shape: list[int], clamp_min: Tensor, clamp_max: Tensor,
                       clamp_min_mask: Tensor, clamp_max_mask: Tensor, x_clamped_loss: Tensor, fixed_min: bool,
                       num_bits: int) -> tuple[Tensor, Tensor, Tensor]:
    op = "acts_ulq_backward"
    shape = _x_shape(op, x_shape)
    lo, hi = _cpp(op, "clamp_min", clamp_min), _cpp(op, "clamp_max", clamp_max)
    dy, m0, m1 = _cpp(op, "y_grad", y_grad), _cpp(op, "clamp_min_mask", clamp_min_mask), \
        _cpp(op, "clamp_max_mask", clamp_max_mask)
    loss = _cpp(op, "x_clamped_loss", x_clamped_loss)
    _one_device(op, clamp_min=lo, clamp_max=hi, y_grad=dy, clamp_min_mask=m0, clamp_max_mask=m1,
                x_clamped_loss=loss)
    x_grad = _empty(shape, lo.dtype, lo.device)
    g0, g1 = torch.empty_like(lo), torch.empty_like(hi)
    _core.acts_ulq_backward(x_grad, g0, g1, dy, lo, hi, m0, m1, loss, fixed_min, num_bits)
    return x_grad, g0, g1


@_acts_ulq_backward.register_fake
def _(y_grad, x_shape, clamp_min, clamp_max, clamp_min_mask, clamp_max_mask, x_clamped_loss, fixed_min, num_bits):
    op = "acts_ulq_backward"
    shape = _x_shape(op, x_shape)
    _check_all(op, clamp_min=clamp_min, clamp_max=clamp_max, y_grad=y_grad, clamp_min_mask=clamp_min_mask,
               clamp_max_mask=clamp_max_mask, x_clamped_loss=x_clamped_loss)
    _meta.acts_ulq_backward(_m(y_grad), tuple(shape), _m(clamp_min), _m(clamp_max), _m(clamp_min_mask),
                            _m(clamp_max_mask), _m(x_clamped_loss), num_bits)
    return (clamp_min.new_empty(shape), torch.empty_like(clamp_min, memory_format=torch.contiguous_format),
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


class _ActsUlqFn(torch.autograd.Function):
    """Eager autograd of acts_ulq without the custom operator's dispatch (see _eager_autograd)."""

    @staticmethod
    def forward(ctx, x, clamp_min, clamp_max, fixed_min, num_bits):
        outs = _core.t_acts_ulq(x, clamp_min, clamp_max, fixed_min, num_bits, False)  # (as _FakeQuantFn)
        if outs is None:
            op = "acts_ulq"
            outs = _core.t_acts_ulq(_cpp(op, "x", x), _cpp(op, "clamp_min", clamp_min),
                                    _cpp(op, "clamp_max", clamp_max), fixed_min, num_bits, True)
        y, m0, m1, loss = outs
        ctx.save_for_backward(clamp_min, clamp_max, m0, m1, loss)
        ctx.x_shape = list(x.shape)
        ctx.options = (fixed_min, num_bits)
        ctx.mark_non_differentiable(m0, m1, loss)
        return y, m0, m1, loss

    @staticmethod
    def backward(ctx, y_grad, _m0_grad, _m1_grad, _loss_grad):
        return _ulq_backward(ctx, y_grad, _m0_grad, _m1_grad, _loss_grad)


def acts_ulq_autograd(x: Tensor, clamp_min: Any, clamp_max: Any, fixed_min: bool,
                      num_bits: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The fast path's hand-over when autograd must record (clamps may be Python numbers: float32 x)."""
    lo = clamp_min if isinstance(clamp_min, Tensor) else torch.tensor(float(clamp_min), dtype=x.dtype)
    hi = clamp_max if isinstance(clamp_max, Tensor) else torch.tensor(float(clamp_max), dtype=x.dtype)
    return _ActsUlqFn.apply(x, lo, hi, fixed_min, num_bits)


def acts_ulq(op: str, x: Tensor, clamp_min: Any, clamp_max: Any, fixed_min: bool,
             num_bits: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    check_tensor(op, "x", x)
    lo = param(op, "clamp_min", clamp_min, x.dtype, x.device)
    hi = param(op, "clamp_max", clamp_max, x.dtype, x.device)
    if _eager_autograd(x, lo, hi):
        return _ActsUlqFn.apply(x, lo, hi, fixed_min, num_bits)
    return torch.ops.xquant.acts_ulq(x, lo, hi, fixed_min, num_bits)


def acts_ulq_backward(op: str, y_grad: Tensor, x_shape: tuple, clamp_min: Tensor, clamp_max: Tensor,
                      clamp_min_mask: Tensor, clamp_max_mask: Tensor, x_clamped_loss: Tensor, fixed_min: bool,
                      num_bits: int) -> tuple[Tensor, Tensor, Tensor]:
    return torch.ops.xquant.acts_ulq_backward(
        check_tensor(op, "y_grad", y_grad), list(x_shape), check_tensor(op, "clamp_min", clamp_min),
        check_tensor(op, "clamp_max", clamp_max), check_tensor(op, "clamp_min_mask", clamp_min_mask),
        check_tensor(op, "clamp_max_mask", clamp_max_mask), check_tensor(op, "x_clamped_loss", x_clamped_loss),
        fixed_min, num_bits)


# ---- the eager fast path -------------------------------------------------------------------------------------
#
# xquant.npu calls _core.t_* directly (lenient mode) when nothing but the computation is needed: plain CPU
# tensors, no autograd recording, no tracing. The probes below tell the compiled core when torch would
# need the custom operators instead; each returns something falsy in plain eager mode.

def _mode_probes() -> Optional[list]:
    """None where this PyTorch lacks one of the (private) probes: the fast path then stays off."""
    C = torch._C
    try:
        return [C._are_functorch_transforms_active, C._len_torch_dispatch_stack, C._is_torch_function_mode_enabled,
                C._get_tracing_state, C._autograd._profiler_enabled]
    except AttributeError:  # pragma: no cover - depends on the PyTorch release
        return None


def _cuda_functions() -> dict:
    """What the compiled core calls around an operator on CUDA tensors (xquant._core CudaScope): torch's
    current raw stream of a device, and the exchange of the current device (torch.cuda.device's own
    functions). None where this torch has no CUDA support (then no CUDA tensor can reach the core)."""
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    exchange = getattr(torch.cuda, "_exchange_device", None)
    maybe_exchange = getattr(torch.cuda, "_maybe_exchange_device", None)
    if raw_stream is None or exchange is None or maybe_exchange is None:
        return {"cuda_raw_stream": None}
    return {"cuda_raw_stream": raw_stream, "cuda_exchange_device": exchange,
            "cuda_maybe_exchange_device": maybe_exchange}


_PROBES = _mode_probes()
_core.init_torch({
    "Tensor": torch.Tensor, "Parameter": torch.nn.Parameter, "strided": torch.strided, "empty": torch.empty,
    "empty_like": torch.empty_like, "is_grad_enabled": torch.is_grad_enabled,
    "increment_version": torch._C._increment_version, "mode_probes": _PROBES,
    "dtypes": {name: getattr(torch, name) for name in ("float32", "float16", "bfloat16", "int8", "uint8", "int32",
                                                        "int64")},
    "qdtypes": dict(_QDTYPES),
    **_cuda_functions(),
})
FAST_PATH: bool = _PROBES is not None


def _load_torch_fast(torch_version: str) -> Optional[Any]:
    """xquant._torch_fast (the fast path compiled against PyTorch's C++ API) when it was built (pip install
    with torch importable) for exactly this torch version and XQUANT_TORCH_FAST is not 0; else None. The
    version is read from a Python file installed beside the module before the binary is loaded: a module
    built for another torch is never imported (its C++ ABI may differ)."""
    if os.environ.get("XQUANT_TORCH_FAST", "1") == "0":
        return None
    try:
        from ._torch_fast_info import TORCH_VERSION
        if TORCH_VERSION != torch_version:
            return None
        from . import _torch_fast
    except ImportError:
        return None
    if getattr(_torch_fast, "TORCH_VERSION", None) != torch_version:
        return None
    _torch_fast.init(dict(_QDTYPES))
    return _torch_fast


TORCH_FAST = _load_torch_fast(torch.__version__) if FAST_PATH else None
FAST: Any = TORCH_FAST if TORCH_FAST is not None else _core
"""The module whose t_* functions the eager fast path calls (xquant._torch_fast or xquant._core): the same
signatures (lenient mode), the same results."""
