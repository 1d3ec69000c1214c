"""``torch.ops.npu.*``: the Ascend operators' schemas (torch_npu's op-plugin ``op_plugin_functions.yaml``),
backed by xquant.

Each operator has one kernel for every device (CompositeExplicitAutograd: xquant computes on the first
input's device when it can, the CPU or a CUDA device where xquant runs on CUDA; otherwise the inputs are
copied to the CPU and the results returned on the first input's device) and a fake implementation
(output shapes and dtypes), so ``torch.compile(fullgraph=True)`` and ``torch.export`` trace through it.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import _args, _core, npu as _xnpu

# Schemas exactly as torch_npu publishes them (argument names, defaults, keyword-only markers). The
# asymmetric form carries the two arguments the newest op-plugin added (quant_mode, dst_type_max).
SCHEMAS = {
    "npu_quantize": "npu_quantize(Tensor self, Tensor scales, Tensor? zero_points, ScalarType dtype, int axis=1, "
                    "bool div_mode=True) -> Tensor",
    "npu_dynamic_quant": "npu_dynamic_quant(Tensor input, *, Tensor? smooth_scales=None, Tensor? group_index=None, "
                         "ScalarType? dst_type=None) -> (Tensor, Tensor)",
    "npu_dynamic_quant_asymmetric": "npu_dynamic_quant_asymmetric(Tensor input, *, Tensor? smooth_scales=None, "
                                    "Tensor? group_index=None, ScalarType? dst_type=None, "
                                    "str quant_mode=\"pertoken\", float dst_type_max=0.0) -> (Tensor, Tensor, Tensor)",
    "npu_anti_quant": "npu_anti_quant(Tensor x, Tensor scale, *, Tensor? offset=None, ScalarType? dst_dtype=None, "
                      "ScalarType? src_dtype=None) -> Tensor",
    # The quantized matmuls, as op-plugin 26.x declares them (dtypes as integer codes: torch passes a
    # torch.dtype given for an int argument as its ScalarType code).
    "npu_quant_matmul": "npu_quant_matmul(Tensor x1, Tensor x2, Tensor scale, *, Tensor? offset=None, "
                        "Tensor? pertoken_scale=None, Tensor? bias=None, int? output_dtype=None, int? x1_dtype=None, "
                        "int? x2_dtype=None, int? pertoken_scale_dtype=None, int? scale_dtype=None, "
                        "int[]? group_sizes=None, Tensor? y_scale=None) -> Tensor",
    "npu_weight_quant_batchmatmul": "npu_weight_quant_batchmatmul(Tensor x, Tensor weight, Tensor antiquant_scale, "
                                    "Tensor? antiquant_offset=None, Tensor? quant_scale=None, "
                                    "Tensor? quant_offset=None, Tensor? bias=None, int antiquant_group_size=0, "
                                    "int inner_precise=0, int? weight_dtype=None) -> Tensor",
    "npu_trans_quant_param": "npu_trans_quant_param(Tensor scale, Tensor? offset=None, int? round_mode=0) -> Tensor",
    "npu_convert_weight_to_int4pack": "npu_convert_weight_to_int4pack(Tensor weight, int inner_k_tiles=0) -> Tensor",
    # A layout change on the NPU (ND <-> FRACTAL_NZ ...): off the NPU every tensor is dense row-major, so the
    # values are returned as they are (the same tensor), whatever the format.
    "npu_format_cast": "npu_format_cast(Tensor(a) self, int acl_format, *, int? customize_dtype=None) -> Tensor(a)",
}

_QUINT4X2 = getattr(torch, "quint4x2", None)
_QINT8 = getattr(torch, "qint8", torch.int8)


# ---- helpers ----------------------------------------------------------------------------------------------

def _where(main: Tensor) -> torch.device:
    """Where xquant computes a call whose first input is `main`: its device when that is the CPU or a CUDA
    device xquant can run on, else the CPU."""
    if main.device.type == "cuda" and _core.cuda_available():
        return main.device
    return torch.device("cpu")


def _on(t: Optional[Tensor], device: torch.device) -> Optional[Tensor]:
    return t if t is None or t.device == device else t.to(device)


def _back(out, device: torch.device):
    if device.type == "cpu":
        return out
    if isinstance(out, tuple):
        return tuple(o.to(device) for o in out)
    return out.to(device)


def _int4_out(op: str, name: str, d: Optional[torch.dtype]) -> bool:
    if d is None or d in (torch.int8, _QINT8):
        return False
    if _QUINT4X2 is not None and d == _QUINT4X2:
        return True
    raise _args.fail_value(op, f"{name} is {d} but expected None, torch.int8 / torch.qint8 or torch.quint4x2")


def anti_quant_src(op: str, x: Tensor, src_dtype: Optional[torch.dtype]) -> torch.dtype:
    """torch_npu's rule: x int8 -> int8, x int32 -> eight packed int4 (quint4x2); src_dtype, if given,
    must agree with x's dtype."""
    if x.dtype == torch.int32:
        want = _QUINT4X2
    elif x.dtype == torch.int8:
        want = torch.int8
    else:
        raise _args.fail_type(op, f"x has dtype {x.dtype} but expected int8, or int32 words of eight int4")
    if src_dtype is not None and src_dtype != want and not (want == torch.int8 and src_dtype == _QINT8):
        raise _args.fail_value(op, f"src_dtype is {src_dtype} but x has dtype {x.dtype} (expected {want} or None)")
    return want


# ---- kernels ----------------------------------------------------------------------------------------------

def _quantize(self, scales, zero_points, dtype, axis=1, div_mode=True):
    d = _where(self)
    out = _xnpu.npu_quantize(_on(self, d), _on(scales, d), _on(zero_points, d), dtype, axis, div_mode)
    return _back(out, self.device)


def _quantize_fake(self, scales, zero_points, dtype, axis=1, div_mode=True):
    from .. import _torch_ops

    code = _torch_ops._code("quantize", "dtype", dtype)
    return self.new_empty(_args.quantized_shape(tuple(self.shape), code), dtype=_torch_ops._STORAGE[code])


def _dynamic_quant(input, *, smooth_scales=None, group_index=None, dst_type=None):
    int4 = _int4_out("dynamic_quant", "dst_type", dst_type)
    d = _where(input)
    y, scale = _xnpu.npu_dynamic_quant(_on(input, d), smooth_scales=_on(smooth_scales, d),
                                       group_index=_on(group_index, d), dst_type=_QUINT4X2 if int4 else torch.int8)
    return _back((y, scale), input.device)


def _dynamic_quant_fake(input, *, smooth_scales=None, group_index=None, dst_type=None):
    int4 = _int4_out("dynamic_quant", "dst_type", dst_type)
    shape = tuple(input.shape)
    y_shape = shape[:-1] + (shape[-1] // 8,) if int4 and shape else shape
    return (input.new_empty(y_shape, dtype=torch.int32 if int4 else torch.int8),
            input.new_empty(shape[:-1], dtype=torch.float32))


def _check_dst_type_max(v: float) -> None:
    if v != 0.0:
        raise _args.fail_value("dynamic_quant_asymmetric", f"dst_type_max is {v!r} but only 0.0 (the maximum of "
                               "dst_type) is supported off the NPU")


def _dynamic_quant_asymmetric(input, *, smooth_scales=None, group_index=None, dst_type=None, quant_mode="pertoken",
                              dst_type_max=0.0):
    _check_dst_type_max(dst_type_max)
    d = _where(input)
    out = _xnpu.npu_dynamic_quant_asymmetric(_on(input, d), smooth_scales=_on(smooth_scales, d),
                                             group_index=_on(group_index, d), dst_type=dst_type,
                                             quant_mode=quant_mode)
    return _back(tuple(out), input.device)


def _dynamic_quant_asymmetric_fake(input, *, smooth_scales=None, group_index=None, dst_type=None,
                                   quant_mode="pertoken", dst_type_max=0.0):
    from .. import _torch_ops

    op = "dynamic_quant_asymmetric"
    _check_dst_type_max(dst_type_max)
    code = _args.QINT8 if dst_type is None else _torch_ops._code(op, "dst_type", dst_type)
    y_shape, p_shape = _args.dynamic_shapes(tuple(input.shape), code, _args.dynamic_mode(op, quant_mode))
    return (input.new_empty(y_shape, dtype=_torch_ops._STORAGE[code]), input.new_empty(p_shape, dtype=torch.float32),
            input.new_empty(p_shape, dtype=torch.float32))


def _anti_quant(x, scale, *, offset=None, dst_dtype=None, src_dtype=None):
    src = anti_quant_src("anti_quant", x, src_dtype)
    d = _where(x)
    out = _xnpu.npu_anti_quant(_on(x, d), _on(scale, d), offset=_on(offset, d),
                               dst_dtype=torch.float16 if dst_dtype is None else dst_dtype, src_dtype=src)
    return _back(out, x.device)


def _anti_quant_fake(x, scale, *, offset=None, dst_dtype=None, src_dtype=None):
    src = anti_quant_src("anti_quant", x, src_dtype)
    shape = tuple(x.shape)
    if src != torch.int8 and shape:
        shape = shape[:-1] + (shape[-1] * 8,)
    return x.new_empty(shape, dtype=torch.float16 if dst_dtype is None else dst_dtype)


# ---- dtype codes (the int arguments of the op-plugin schemas) ------------------------------------------------

def _code_table() -> dict:
    """ScalarType code -> torch dtype, read from torch itself: an int schema argument given a torch.dtype
    receives its code, so a one-line identity operator reports each dtype's code."""
    lib = torch.library.Library("xquant_compat_dtype_codes", "FRAGMENT")
    try:
        lib.define("code(int x) -> int")
        lib.impl("code", lambda x: x, "CompositeExplicitAutograd")
        table = {}
        for name in ("uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "bfloat16", "bool",
                     "qint8", "quint8", "qint32", "quint4x2", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                     "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2", "complex64", "complex128"):
            d = getattr(torch, name, None)
            if d is not None:
                table[int(torch.ops.xquant_compat_dtype_codes.code(d))] = d
        return table
    finally:
        lib._destroy()
        torch.ops.__dict__.pop("xquant_compat_dtype_codes", None)


_CODES: dict = {}


def dtype_of_code(op: str, name: str, v) -> Optional[torch.dtype]:
    """An op-plugin dtype argument (an int code; None stays None) as a torch dtype. Codes torch has no dtype
    for are torch_npu's own types (HiFloat8, ...), which xquant does not implement."""
    if v is None or isinstance(v, torch.dtype):
        return v
    if not _CODES:
        _CODES.update(_code_table())
    d = _CODES.get(int(v))
    if d is None:
        raise _args.fail_value(op, f"{name} is the dtype code {v}, which names no torch dtype (torch_npu's own types "
                                   "such as hifloat8 exist only on the NPU; xquant does not implement them)")
    return d


def _quant_matmul(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None, output_dtype=None, x1_dtype=None,
                  x2_dtype=None, pertoken_scale_dtype=None, scale_dtype=None, group_sizes=None, y_scale=None):
    op = "quant_matmul"
    d = _where(x1)
    out = _xnpu.npu_quant_matmul(
        _on(x1, d), _on(x2, d), _on(scale, d), offset=_on(offset, d), pertoken_scale=_on(pertoken_scale, d),
        bias=_on(bias, d), output_dtype=dtype_of_code(op, "output_dtype", output_dtype),
        x1_dtype=dtype_of_code(op, "x1_dtype", x1_dtype), x2_dtype=dtype_of_code(op, "x2_dtype", x2_dtype),
        pertoken_scale_dtype=dtype_of_code(op, "pertoken_scale_dtype", pertoken_scale_dtype),
        scale_dtype=dtype_of_code(op, "scale_dtype", scale_dtype), group_sizes=group_sizes, y_scale=y_scale)
    return _back(out, x1.device)


def _weight_quant_batchmatmul(x, weight, antiquant_scale, antiquant_offset=None, quant_scale=None, quant_offset=None,
                              bias=None, antiquant_group_size=0, inner_precise=0, weight_dtype=None):
    d = _where(x)
    out = _xnpu.npu_weight_quant_batchmatmul(
        _on(x, d), _on(weight, d), _on(antiquant_scale, d), _on(antiquant_offset, d), _on(quant_scale, d),
        _on(quant_offset, d), _on(bias, d), antiquant_group_size, inner_precise,
        dtype_of_code("weight_quant_batchmatmul", "weight_dtype", weight_dtype))
    return _back(out, x.device)


def _trans_quant_param(scale, offset=None, round_mode=0):
    d = _where(scale)
    out = _xnpu.npu_trans_quant_param(_on(scale, d), _on(offset, d), 0 if round_mode is None else round_mode)
    return _back(out, scale.device)


def _convert_weight_to_int4pack(weight, inner_k_tiles=0):
    d = _where(weight)
    return _back(_xnpu.npu_convert_weight_to_int4pack(_on(weight, d), inner_k_tiles), weight.device)


def _format_cast(self, acl_format, *, customize_dtype=None):
    return self


# The matmuls' fake implementations are the xquant operators themselves on the fake tensors (their Meta
# kernels run the library's planning), without the device moves of the real kernels.
def _quant_matmul_fake(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None, output_dtype=None,
                       x1_dtype=None, x2_dtype=None, pertoken_scale_dtype=None, scale_dtype=None, group_sizes=None,
                       y_scale=None):
    op = "quant_matmul"
    return _xnpu.npu_quant_matmul(
        x1, x2, scale, offset=offset, pertoken_scale=pertoken_scale, bias=bias,
        output_dtype=dtype_of_code(op, "output_dtype", output_dtype), x1_dtype=dtype_of_code(op, "x1_dtype", x1_dtype),
        x2_dtype=dtype_of_code(op, "x2_dtype", x2_dtype),
        pertoken_scale_dtype=dtype_of_code(op, "pertoken_scale_dtype", pertoken_scale_dtype),
        scale_dtype=dtype_of_code(op, "scale_dtype", scale_dtype), group_sizes=group_sizes, y_scale=y_scale)


def _weight_quant_batchmatmul_fake(x, weight, antiquant_scale, antiquant_offset=None, quant_scale=None,
                                   quant_offset=None, bias=None, antiquant_group_size=0, inner_precise=0,
                                   weight_dtype=None):
    return _xnpu.npu_weight_quant_batchmatmul(
        x, weight, antiquant_scale, antiquant_offset, quant_scale, quant_offset, bias, antiquant_group_size,
        inner_precise, dtype_of_code("weight_quant_batchmatmul", "weight_dtype", weight_dtype))


def _trans_quant_param_fake(scale, offset=None, round_mode=0):
    return _xnpu.npu_trans_quant_param(scale, offset, 0 if round_mode is None else round_mode)


def _format_cast_fake(self, acl_format, *, customize_dtype=None):
    return self


_KERNELS = {
    "npu_quantize": (_quantize, _quantize_fake),
    "npu_dynamic_quant": (_dynamic_quant, _dynamic_quant_fake),
    "npu_dynamic_quant_asymmetric": (_dynamic_quant_asymmetric, _dynamic_quant_asymmetric_fake),
    "npu_anti_quant": (_anti_quant, _anti_quant_fake),
    "npu_quant_matmul": (_quant_matmul, _quant_matmul_fake),
    "npu_weight_quant_batchmatmul": (_weight_quant_batchmatmul, _weight_quant_batchmatmul_fake),
    "npu_trans_quant_param": (_trans_quant_param, _trans_quant_param_fake),
    "npu_convert_weight_to_int4pack": (_convert_weight_to_int4pack, _xnpu.npu_convert_weight_to_int4pack),
    "npu_format_cast": (_format_cast, _format_cast_fake),
}


def register() -> torch.library.Library:
    """Defines torch.ops.npu.* (a FRAGMENT library: undone by ``unregister(lib)``)."""
    lib = torch.library.Library("npu", "FRAGMENT")
    try:
        for name, schema in SCHEMAS.items():
            kernel, fake = _KERNELS[name]
            lib.define(schema)
            lib.impl(name, kernel, "CompositeExplicitAutograd")
            torch.library.register_fake(f"npu::{name}", fake, lib=lib)
    except Exception:
        unregister(lib)
        raise
    return lib


def unregister(lib: torch.library.Library) -> None:
    """Removes the definitions, kernels and fakes of ``register`` and the cached torch.ops.npu attributes."""
    lib._destroy()
    ns = torch.ops.__dict__.get("npu")
    if ns is not None:
        for name in SCHEMAS:
            ns.__dict__.pop(name, None)
