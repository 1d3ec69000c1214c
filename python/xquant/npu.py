"""The seeds' Python API, name for name and argument for argument, off the NPU.

Code written for Ascend runs by changing its import::

    from mx_driving import npu_fake_tensor_quant      ->  from xquant.npu import npu_fake_tensor_quant
    torch_npu.npu_quantize(...)                        ->  xquant.npu.npu_quantize(...)
    torch_npu.npu_dynamic_quant_asymmetric(...)        ->  xquant.npu.npu_dynamic_quant_asymmetric(...)
    torch_npu.npu_dynamic_quant(...)                   ->  xquant.npu.npu_dynamic_quant(...)
    torch_npu.npu_anti_quant(...)                      ->  xquant.npu.npu_anti_quant(...)
    pypto_pro.language.quant(out, src, scale, ...)     ->  xquant.npu.quant(out, src, scale, ...)
    ActsULQ (CANN graph operator)                      ->  xquant.npu.acts_ulq(...)

Every function takes NumPy arrays or PyTorch CPU tensors and returns the same kind (NumPy in, NumPy out;
torch in, torch out). Contiguous data is not copied; non-contiguous inputs are made contiguous for the
caller (in-place calls on non-contiguous data raise instead). float32, float16 and bfloat16 (torch, or
NumPy through ml_dtypes) are accepted everywhere. The GIL is released while the C++ kernels run (on the
torch fast path from 32 Ki elements on).
Arithmetic is float32 with the exact operation order and round-half-to-even of docs/semantics (SPEC.md);
errors of the C++ library arrive as TypeError (a dtype the operator does not accept) or ValueError
(everything else) with the library's message. For torch tensors the functions are torch.library custom
operators (torch.ops.xquant.*) with fake implementations and autograd defined in C++ (xquant._torch_ext, see xquant._torch_ops);
plain eager calls skip their dispatch (the fast path below).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from . import _args, _core, _numpy
from ._args import QuantMode

__all__ = [
    "npu_fake_tensor_quant",
    "npu_fake_tensor_quant_inplace",
    "npu_fake_tensor_quant_with_axis",
    "npu_quantize",
    "npu_dynamic_quant_asymmetric",
    "npu_dynamic_quant",
    "npu_anti_quant",
    "quant",
    "acts_ulq",
    "npu_quant_matmul",
    "npu_weight_quant_batchmatmul",
    "npu_trans_quant_param",
    "npu_convert_weight_to_int4pack",
    "QuantMode",
]

_torch_backend = None  # xquant._torch_ops once torch is in use


class _NoTensor:  # the fast-path types until torch is in use: nothing is of this type
    pass


# The eager fast path: when the main input is a plain torch.Tensor (or nn.Parameter) and torch is not
# tracing (torch.compile / torch.export constant-fold torch.compiler.is_compiling() to True), each function
# first calls the operator's C++ implementation directly (_fast.f_<op>, xquant._torch_ext): it computes when
# nothing else is needed (no autograd recording, no dispatch / function mode, functorch transform, JIT trace
# or profiler, dense CPU tensors of supported dtypes, Python values of the expected types) and otherwise
# returns None, and the call takes the full path (argument conversion, then the torch.ops.xquant operator
# through the dispatcher, which records autograd, traces, batches). Results are identical on both paths (the
# same C++ kernel); only the per-call cost differs.
_Tensor: type = _NoTensor
_Parameter: type = _NoTensor


def _never() -> bool:
    return True


_is_compiling = _never  # -> torch.compiler.is_compiling once torch is in use
_fast: Any = None  # -> xquant._torch_ext once torch is in use
_torch_error: ImportError | None = None  # why the torch side could not be imported (raised on use)


def _load_torch_backend():
    """xquant._torch_ops (registering the operators' autograd and batching rules) if torch has been imported,
    else None. Where the torch side cannot be imported (xquant built without torch, or against another
    torch), the ImportError saying how to rebuild is raised here, on the first use with a torch tensor (and by
    xquant.register_torch_ops), while NumPy calls keep working."""
    global _torch_backend, _Tensor, _Parameter, _is_compiling, _fast, _torch_error
    if _torch_error is not None:
        raise _torch_error
    if _torch_backend is None and "torch" in sys.modules:
        try:
            from . import _torch_ops
        except ImportError as e:
            if "torch" not in str(e):
                raise
            _torch_error = e
            raise
        import torch

        _torch_backend = _torch_ops
        _is_compiling = torch.compiler.is_compiling
        _fast = _torch_ops.FAST
        _Tensor, _Parameter = torch.Tensor, torch.nn.Parameter
    return _torch_backend


def _backend(op: str, name: str, x: Any):
    """The front end for the kind of the main input: NumPy or torch; anything else is a TypeError."""
    if isinstance(x, np.ndarray):
        return _numpy
    tb = _torch_backend if _torch_backend is not None else _load_torch_backend()
    if tb is not None and isinstance(x, tb.Tensor):
        return tb
    raise _args.fail_type(op, f"{name} is {_args.describe(x)} but expected a numpy.ndarray or a torch.Tensor")


def _fq_options(op: str, num_bits: Any, is_unsigned: Any, narrow_range: Any) -> tuple[int, bool, bool]:
    return (_args.as_int(op, "num_bits", num_bits), _args.as_bool(op, "is_unsigned", is_unsigned),
            _args.as_bool(op, "narrow_range", narrow_range))


# ---- seed 01: mx_driving.npu_fake_tensor_quant* -----------------------------------------------------------

def npu_fake_tensor_quant(inputs, amax, num_bits: int = 8, is_unsigned: bool = False, narrow_range: bool = True):
    """Per-tensor fake quantization (quantize, then dequantize) for quantization-aware training.

    Formula (float32, SPEC section 1)::

        bound     = 2^(num_bits - 1 + is_unsigned) - 1           (exact integers)
        max_bound = bound
        min_bound = -(bound + (narrow_range ? 0 : 1))            (also unsigned: it doubles the bound only)
        scale     = max_bound / amax                              (float32 division)
        out       = clamp(rint(inputs * scale), min_bound, max_bound) / scale

    ``rint`` rounds half to even. ``amax`` has exactly one element (a 0-d or [1] tensor, or a Python
    number), finite and >= 0; where scale is not finite or is 0 the output is 0 (NaN stays NaN).
    ``num_bits`` in [1, 32]. Returns a new array/tensor of ``inputs``' dtype and shape.

    float16 ``inputs`` follow the Ascend kernel's half arithmetic: every step above rounded to float16
    (``M, m = f16(max_bound), f16(min_bound)``, ``scale = f16(M / amax)``, ``f16(x * scale)``, ...), and
    ``amax`` must be exactly representable in float16 (else ValueError); docs/semantics.md section 2.1.

    Autograd (torch): straight-through with clipping, ``grad_in = grad_out`` where
    ``min_bound/scale <= x <= max_bound/scale`` else 0; if ``amax`` requires grad it gets
    ``sum(grad_out * (x > max_bound/scale ? 1 : x < min_bound/scale ? min_bound/max_bound : 0))``.
    """
    if (type(inputs) is _Tensor or type(inputs) is _Parameter) and not _is_compiling():
        out = _fast.f_fake_tensor_quant(inputs, amax, None, num_bits, is_unsigned, narrow_range)
        if out is not None:
            return out
    op = "fake_tensor_quant"
    b = _backend(op, "inputs", inputs)
    return b.fake_tensor_quant(op, inputs, amax, None, *_fq_options(op, num_bits, is_unsigned, narrow_range))


def npu_fake_tensor_quant_inplace(inputs, amax, num_bits: int = 8, is_unsigned: bool = False,
                                  narrow_range: bool = True):
    """:func:`npu_fake_tensor_quant` written into ``inputs``, which is returned (same object, same memory).

    ``inputs`` must be contiguous and writable (else ValueError); on any error it is left unmodified. No
    autograd: a torch tensor that requires grad (grad mode on) is refused with ValueError; train with
    npu_fake_tensor_quant.
    """
    if (type(inputs) is _Tensor or type(inputs) is _Parameter) and not _is_compiling():
        out = _fast.f_fake_tensor_quant_inplace(inputs, amax, num_bits, is_unsigned, narrow_range)
        if out is not None:
            return out
    op = "fake_tensor_quant_inplace"
    b = _backend(op, "inputs", inputs)
    return b.fake_tensor_quant_inplace(op, inputs, amax, *_fq_options(op, num_bits, is_unsigned, narrow_range))


def npu_fake_tensor_quant_with_axis(inputs, amax, axis: int, num_bits: int = 8, is_unsigned: bool = False,
                                    narrow_range: bool = True):
    """Per-axis (per-channel) fake quantization: the formula of :func:`npu_fake_tensor_quant` with
    ``amax[c]`` (1-D, ``inputs.shape[axis]`` elements) for every slice ``c`` along ``axis``.

    ``axis`` may be negative (Python style). Autograd as for the per-tensor form, ``amax``'s gradient
    reduced per channel.
    """
    if (type(inputs) is _Tensor or type(inputs) is _Parameter) and not _is_compiling():
        out = _fast.f_fake_tensor_quant(inputs, amax, axis, num_bits, is_unsigned, narrow_range)
        if out is not None:
            return out
    op = "fake_tensor_quant_with_axis"
    b = _backend(op, "inputs", inputs)
    ax = _args.as_int(op, "axis", axis)
    return b.fake_tensor_quant(op, inputs, amax, ax, *_fq_options(op, num_bits, is_unsigned, narrow_range))


# ---- seed 02: torch_npu.npu_quantize ------------------------------------------------------------------------

def npu_quantize(input, scales, zero_points, dtype, axis: int = 1, div_mode: bool = True):
    """Static quantization to plain integer outputs (SPEC section 2)::

        div_mode=True : y = sat(rint(input / scales + zero_points))   dtype qint8, quint8, qint32 / int32
        div_mode=False: y = sat(rint(input * scales + zero_points))   dtype qint8 or quint4x2

    (division / multiplication, then addition, in float32; one rounding, half to even; NaN -> 0, +-Inf and
    out-of-range values saturate.) ``dtype``: torch.qint8, torch.quint8, torch.qint32 or torch.int32,
    torch.quint4x2 (NumPy: np.int8, np.uint8, np.int32, or the strings 'qint8', 'quint8', 'qint32' /
    'int32', 'quint4x2'). Outputs are int8, uint8, int32, and for quint4x2 int32 words each packing eight
    int4 (element 8k+j in bits [4j, 4j+3] of word k; the last dimension divided by 8).

    div_mode=True: ``scales`` is 1-D with 1 element (per-tensor, axis ignored) or ``input.shape[axis]``
    elements; axis wraps Python style; ``zero_points`` None, or scales' shape, int8 / uint8 / int32 /
    floating. div_mode=False: ``axis == -2`` selects the second-to-last dimension, any other axis > -2 the
    last one; ``scales`` 1-D or of input's rank with 1s except on that axis; ``zero_points`` matches scales.
    """
    if (type(input) is _Tensor or type(input) is _Parameter) and not _is_compiling():
        out = _fast.f_quantize(input, scales, zero_points, dtype, axis, div_mode)
        if out is not None:
            return out
    op = "quantize"
    b = _backend(op, "input", input)
    return b.quantize(op, input, scales, zero_points, dtype, _args.as_int(op, "axis", axis),
                      _args.as_bool(op, "div_mode", div_mode))


# ---- seed 03: pypto_pro.language.quant ----------------------------------------------------------------------

def quant(out, src, scale, mode: Any = QuantMode.SYM, offset=None) -> None:
    """Tile quantization FP32 -> INT8 (SYM) / UINT8 (ASYM), written into ``out`` (SPEC section 3)::

        SYM : out[i, j] = sat_int8 (rint(src[i, j] * scale[i, 0]))
        ASYM: out[i, j] = sat_uint8(rint(src[i, j] * scale[i, 0] + offset[i, 0]))   (one rounding)

    ``src`` float32 [M, N]; ``scale`` (a multiplier, 1/s) and ``offset`` float32 [M, 1]; ``out`` int8
    (SYM) or uint8 (ASYM) [M, N]. ``out`` may be a row slice of a wider array (its row pitch is taken from
    its strides); only its [M, N] region is written. ``mode``: 'SYM' / 'ASYM' or xquant.QuantMode.
    ``offset`` is required for ASYM and rejected for SYM. Returns None, like pypto.
    """
    if (type(out) is _Tensor or type(out) is _Parameter) and not _is_compiling():
        if _fast.f_tile_quant(out, src, scale, mode, offset) is not None:
            return None
    op = "tile_quant"
    b = _backend(op, "out", out)
    _args.quant_mode(op, mode)  # checked before the arrays, for both kinds
    b.tile_quant(op, out, src, scale, mode, offset)


# ---- seed 04: torch_npu.npu_dynamic_quant_asymmetric ------------------------------------------------------

def npu_dynamic_quant_asymmetric(x, *, smooth_scales=None, group_index=None, dst_type=None,
                                 quant_mode: str = "pertoken", dst_type_max: float = 0.0):
    """Dynamic asymmetric quantization per token (row), per tensor or per channel; returns
    ``(y, scale, offset)`` (torch_npu / op-plugin 26.x signature)::

        x'     = smooth_scales ? x * smooth_scales[expert(row)] : x               (float32)
        scale  = max((rowMax(x') - rowMin(x')) / (DST_MAX - DST_MIN), 1e-12)
        offset = DST_MAX - rowMax(x') / scale
        y      = sat(rint(x' / scale + offset))       (float8: float8(x' / scale + offset), see below)

    ``x`` rank >= 2 (rows: every dimension but the last). ``smooth_scales`` [H], or [E, H] with
    ``group_index`` (int32 / int64 [E], non-decreasing cumulative row ends, the last == rows).
    ``dst_type``: a torch dtype or torch_npu's integer code: None / torch.int8 / torch.qint8 / 1 -> int8
    [-128, 127]; torch.quint4x2 / 16 -> int4 [-8, 7] packed eight per int32 (H % 8 == 0);
    torch.float8_e4m3fn / 24 / 292 and torch.float8_e5m2 / 23 / 291 -> float8 with DST = +-448 / +-57344,
    y = the round-to-nearest-even float8 of x' / scale + offset without saturation (NaN -> NaN).
    torch_npu.hifloat8 (290) and the other types torch has no dtype for are a ValueError.
    ``quant_mode``: "pertoken" (scale / offset of shape x.shape[:-1]), "pertensor" ((1,), no
    smooth_scales) or "perchannel" (x seen as [B, S, H]: min / max down each column of each batch, scale /
    offset of shape x.shape[:-2] + (H,), ``smooth_scales`` [S] scaling row s, no group_index, no int4).
    ``dst_type_max``: 0.0 only (on the NPU it sets the range of hifloat8 outputs). A row containing NaN gets
    NaN scale / offset and y = 0 (float8: NaN).
    """
    if (type(x) is _Tensor or type(x) is _Parameter) and not _is_compiling() and dst_type_max == 0.0:
        out = _fast.f_dynamic_quant_asymmetric(x, smooth_scales, group_index, dst_type, quant_mode)
        if out is not None:
            return out
    op = "dynamic_quant_asymmetric"
    b = _backend(op, "x", x)
    _args.dynamic_mode(op, quant_mode)
    return b.dynamic_quant_asymmetric(op, x, smooth_scales, group_index, dst_type, quant_mode, dst_type_max)


# ---- companions of seeds 02 / 04: torch_npu.npu_dynamic_quant and torch_npu.npu_anti_quant -----------------

def npu_dynamic_quant(x, *, smooth_scales=None, group_index=None, dst_type=None, quant_mode: str = "pertoken",
                      dst_type_max: float = 0.0):
    """Dynamic symmetric quantization per token (row), per tensor or per channel; returns ``(y, scale)``
    (SPEC section 6; torch_npu / op-plugin 26.x signature)::

        x'    = smooth_scales ? x * smooth_scales[expert(row)] : x                (float32)
        scale = rowMax(|x'|) / DST_MAX                                             (float32 division)
        y     = sat(rint(x' / scale))                  (float8: float8(x' / scale))

    ``x``, ``smooth_scales``, ``group_index``, ``dst_type``, ``quant_mode`` and ``dst_type_max`` as for
    :func:`npu_dynamic_quant_asymmetric` (DST_MAX 127 for int8, 7 for int4, 448 for float8_e4m3fn, 57344
    for float8_e5m2). ``scale`` is float32 of shape x.shape[:-1] (pertoken), (1,) (pertensor) or
    x.shape[:-2] + (H,) (perchannel). A row of zeros gets scale 0 and y = 0 (float8: NaN, 0 / 0); a row
    containing NaN gets a NaN scale and y = 0 (float8: NaN).
    """
    if (type(x) is _Tensor or type(x) is _Parameter) and not _is_compiling() and dst_type_max == 0.0:
        out = _fast.f_dynamic_quant(x, smooth_scales, group_index, dst_type, quant_mode)
        if out is not None:
            return out
    op = "dynamic_quant"
    b = _backend(op, "x", x)
    _args.dynamic_mode(op, quant_mode)
    return b.dynamic_quant(op, x, smooth_scales, group_index, dst_type, quant_mode, dst_type_max)


def npu_anti_quant(x, scale, *, offset=None, dst_dtype=None, src_dtype=None):
    """Dequantization of int8 or packed int4 values (SPEC section 7)::

        out = narrow((float(x) + offset) * scale)        (a float32 add, then a float32 multiply)

    ``x``: int8 (``src_dtype`` None / torch.qint8 / torch.int8), or int32 words each holding eight int4
    (``src_dtype`` torch.quint4x2; element 8k+j in bits [4j, 4j+3] of word k), rank >= 1; the logical last
    dimension H of packed input is 8x the stored one. ``scale``: 1-D [1] or [H], float32 or bfloat16;
    ``offset``: None (0) or the same shape and dtype as ``scale``. ``dst_dtype``: None / float16 (default),
    bfloat16 or float32 (torch or NumPy dtypes, or their names). Returns x's logical shape in ``dst_dtype``;
    the result is narrowed once, round to nearest even.
    """
    if (type(x) is _Tensor or type(x) is _Parameter) and not _is_compiling():
        out = _fast.f_anti_quant(x, scale, offset, dst_dtype, src_dtype)
        if out is not None:
            return out
    op = "anti_quant"
    b = _backend(op, "x", x)
    return b.anti_quant(op, x, scale, offset, dst_dtype, src_dtype)


# ---- seed 05: ActsULQ ---------------------------------------------------------------------------------------

def acts_ulq(x, clamp_min, clamp_max, fixed_min: bool = False, num_bits: int = 8):
    """ActsULQ: learnable-clip fake quantization with masks and quantization loss (SPEC section 5).
    Returns ``(y, clamp_min_mask, clamp_max_mask, x_clamped_loss)``, all of the broadcast shape of the
    inputs and x's dtype::

        LEVELS  = 2^num_bits - 1,  EPS = 1.192092896e-7
        ori_min = fixed_min ? 0 : min(clamp_min, 0);   ori_max = max(clamp_max, LEVELS * EPS)
        s       = (ori_max - ori_min) / LEVELS;        off = rint(ori_min / s)
        clip_lo = s * off;  clip_hi = s * (off + LEVELS);  xc = min(max(x, clip_lo), clip_hi)
        clamp_min_mask = x >= clip_lo;                 clamp_max_mask = x <= clip_hi
        raw = xc / s;  rx = rint(raw);                 y = rx * s
        x_clamped_loss = both masks ? (rx - raw) / LEVELS : (rint(ori_min / s) - ori_min / s) / LEVELS

    ``x``, ``clamp_min``, ``clamp_max`` broadcast NumPy style (rank <= 8) and share one floating dtype
    (clamps may also be Python numbers). ``num_bits`` in [2, 16] (the NPU documents 8).

    Autograd (torch), through y only (the masks and the loss are not differentiable)::

        x_grad         = y_grad * clamp_min_mask * clamp_max_mask
        clamp_min_grad = sum(y_grad * ((1 - clamp_min_mask) - x_clamped_loss)), 0 where fixed_min or clamp_min > 0
        clamp_max_grad = sum(y_grad * (x_clamped_loss + (1 - clamp_max_mask))), 0 where clamp_max < LEVELS * EPS

    each summed down to the shape of its input.
    """
    if (type(x) is _Tensor or type(x) is _Parameter) and not _is_compiling():
        out = _fast.f_acts_ulq(x, clamp_min, clamp_max, fixed_min, num_bits)
        if out is not None:
            return out
    op = "acts_ulq"
    b = _backend(op, "x", x)
    return b.acts_ulq(op, x, clamp_min, clamp_max, _args.as_bool(op, "fixed_min", fixed_min),
                      _args.as_int(op, "num_bits", num_bits))


# ---- the quantized matmuls: torch_npu.npu_quant_matmul, npu_weight_quant_batchmatmul, npu_trans_quant_param,
# npu_convert_weight_to_int4pack (docs/semantics.md section 9) -------------------------------------------------

def _none_only(op: str, **kwargs) -> None:
    for name, v in kwargs.items():
        if v is not None:
            raise _args.fail_value(op, f"{name} is {v!r} but xquant supports only {name}=None here (" +
                                   _NONE_ONLY_WHY.get(name, "not implemented off the NPU") + ")")


_NONE_ONLY_WHY = {
    "y_scale": "the Ascend 950's output scaling is not implemented",
    "quant_scale": "quantizing the output to int8 is not implemented; quantize the result with npu_quantize",
    "quant_offset": "quantizing the output to int8 is not implemented; quantize the result with npu_quantize",
}


def npu_quant_matmul(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None, output_dtype=None,
                     x1_dtype=None, x2_dtype=None, pertoken_scale_dtype=None, scale_dtype=None, group_sizes=None,
                     y_scale=None):
    """Quantized matrix multiplication (W8A8 / W4A4 linear layers): x1 @ x2 with exact int32 accumulation,
    then per element, in this order (float32, no fused multiply-add; docs/semantics.md section 9)::

        a = acc + bias                       (int32 bias; int32 output stops here)
        v = float(a) * scale[n]              (scale float32 / bfloat16, or the int64 of npu_trans_quant_param)
        v = v * pertoken_scale[m]            (when given)
        v = v + bias[n]                      (float bias: float16 / bfloat16 output)
        v = v + offset[n]                    (int8 output: offset, or the one an int64 scale carries)
        out = int8: sat(rint(v)) | float16 / bfloat16: narrowed once, round to nearest even

    ``x1``: int8 [..., M, K], or int32 [..., M, K / 8] words of eight int4 (element 8k+j in bits [4j, 4j+3]);
    ``x2``: the same dtype, [..., K, N] (int4: [..., K, N / 8]), or the transposed view of a dense
    [..., N, K] tensor (``w.t()``, int4 ``[N, K / 8].t()``), read as stored without a copy. Batch
    dimensions broadcast. ``scale``: [1] or [N] (also [1, 1] / [1, N]); ``offset``: float32 [1] / [N];
    ``pertoken_scale``: float32 [M]; ``bias``: int32, or float32 / float16 / bfloat16 for float output, [N]
    (or [B, 1, N] for 3-D output). ``output_dtype``: None / int8 (default), float16, bfloat16 or int32.

    A8W4 per-group mode (int8 ``x1`` [M, K] with int4 ``x2`` [K, N / 8], ``group_sizes=[0, 0, G]``;
    docs/semantics.md 9.3.1): ``scale`` float32 / int64 [K / G, N]; x1's two int4 halves are multiplied per
    k group, the scaled group terms summed in float16; then ``+ offset[n]`` (float32), ``* pertoken_scale[m]``
    ([M] or [M, 1]); no bias; float16 / bfloat16 output.

    torch_npu's Ascend 950 keywords (``x1_dtype`` ... ``scale_dtype`` re-interpreting storage as float8 /
    HiFloat8 / MX, ``y_scale``) must be None or name the stored dtype.
    """
    op = "quant_matmul"
    b = _backend(op, "x1", x1)
    _none_only(op, y_scale=y_scale)
    groups = _args.int_triple(op, "group_sizes", group_sizes)
    for name, d, t in (("x1_dtype", x1_dtype, x1), ("x2_dtype", x2_dtype, x2), ("scale_dtype", scale_dtype, scale),
                       ("pertoken_scale_dtype", pertoken_scale_dtype, pertoken_scale)):
        if d is not None:
            if t is None:
                raise _args.fail_value(op, f"{name} is {d} but {name[:-6]} is None (expected {name}=None)")
            _args.same_dtype(op, name, d, _args.dtype_key(op, name, t.dtype), name[:-6])
    return b.quant_matmul(op, x1, x2, scale, offset, pertoken_scale, bias, _args.matmul_out_name(op, output_dtype),
                          groups)


def npu_weight_quant_batchmatmul(x, weight, antiquant_scale, antiquant_offset=None, quant_scale=None,
                                 quant_offset=None, bias=None, antiquant_group_size=0, inner_precise=0,
                                 weight_dtype=None):
    """Weight-only quantized matmul (W8A16 / W4A16 linear layers): y = x @ dequant(weight) + bias, with
    (docs/semantics.md section 9)::

        w[k, n] = narrow_x(narrow_x(q[k, n] + antiquant_offset[g, n]) * antiquant_scale[g, n])     g = k // group
        y[m, n] = narrow_x(sum_k float32(x[m, k]) * float32(w[k, n]) + bias[n])

    the float32 sum taken in increasing k, each product and sum rounded (no FMA): one order on every backend,
    so results are bit-identical across SIMD targets, thread counts and CUDA. ``x``: float16 / bfloat16
    [..., M, K]; ``weight``: int8 [K, N], or int32 [K, N / 8] words of eight int4, or the transposed view
    of a dense [N, K] (int4 [N, K / 8]) tensor; ``antiquant_scale`` (and ``antiquant_offset``): x's dtype,
    [1] / [N] (also [1, 1] / [1, N]) or, with ``antiquant_group_size`` (a multiple of 32 in [32, K - 1]),
    [ceil(K / group), N]; ``bias``: float [N] / [1, N]. ``inner_precise`` (0 or 1, the NPU's speed /
    precision switch) does not change xquant's arithmetic. ``quant_scale`` / ``quant_offset`` (int8 output)
    are not implemented; ``weight_dtype`` must be None or name the stored dtype.
    """
    op = "weight_quant_batchmatmul"
    b = _backend(op, "x", x)
    _none_only(op, quant_scale=quant_scale, quant_offset=quant_offset)
    precise = _args.as_int(op, "inner_precise", inner_precise)
    if precise not in (0, 1):
        raise _args.fail_value(op, f"inner_precise is {precise} but expected 0 (precision) or 1 (speed)")
    if weight_dtype is not None:
        _args.same_dtype(op, "weight_dtype", weight_dtype, _args.dtype_key(op, "weight", weight.dtype), "weight")
    return b.weight_quant_batchmatmul(op, x, weight, antiquant_scale, antiquant_offset, bias,
                                      _args.as_int(op, "antiquant_group_size", antiquant_group_size))


def npu_trans_quant_param(scale, offset=None, round_mode=0):
    """The int64 form of a dequantization scale (and offset) that npu_quant_matmul takes: per element::

        bits = float32 bits of scale, round_mode 0: & 0xFFFFE000 (truncated to 10 mantissa bits),
               round_mode 1: rounded to 10 mantissa bits (nearest, ties away from zero)
        word = bits | 1 << 46 | (offset ? (rint(clamp(offset, -256, 255)) & 0x1FF) << 37 : 0)

    ``scale``: float32 [t] or [1, n]; ``offset``: float32 [t'] (t == t' or either 1) or scale's 2-D shape.
    Returns int64 of scale's shape (1-D: [max(t, t')]).
    """
    op = "trans_quant_param"
    b = _backend(op, "scale", scale)
    return b.trans_quant_param(op, scale, offset, _args.as_int(op, "round_mode", round_mode))


def npu_convert_weight_to_int4pack(weight, inner_k_tiles=0):
    """Packs int32 values in [-8, 7] eight to an int32 word along the last dimension (element 8k+j in bits
    [4j, 4j+3] of word k): int32 [..., C] -> int32 [..., C / 8], C % 8 == 0. ``inner_k_tiles``: 0 (reserved
    by torch_npu)."""
    op = "convert_weight_to_int4pack"
    b = _backend(op, "weight", weight)
    if _args.as_int(op, "inner_k_tiles", inner_k_tiles) != 0:
        raise _args.fail_value(op, f"inner_k_tiles is {inner_k_tiles} but expected 0 (reserved by torch_npu)")
    return b.convert_weight_to_int4pack(op, weight)
