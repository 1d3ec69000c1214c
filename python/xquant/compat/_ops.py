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

# Schemas exactly as torch_npu publishes them (argument names, defaults, keyword-only markers). The dynamic
# quantizations are op-plugin 26.x's: integer dtype codes (`int? dst_type`, c10::ScalarType values or
# torch_npu's own codes; torch dtypes are converted by the torch_npu.* functions and by torch itself),
# quant_mode and dst_type_max.
SCHEMAS = {
    "npu_quantize": "npu_quantize(Tensor self, Tensor scales, Tensor? zero_points, int dtype, int axis=1, "
                    "bool div_mode=True) -> Tensor",
    "npu_dynamic_quant": "npu_dynamic_quant(Tensor input, *, Tensor? smooth_scales=None, Tensor? group_index=None, "
                         "int? dst_type=None, str quant_mode=\"pertoken\", float dst_type_max=0.0) -> (Tensor, Tensor)",
    "npu_dynamic_quant_asymmetric": "npu_dynamic_quant_asymmetric(Tensor input, *, Tensor? smooth_scales=None, "
                                    "Tensor? group_index=None, int? dst_type=None, "
                                    "str quant_mode=\"pertoken\", float dst_type_max=0.0) -> (Tensor, Tensor, Tensor)",
    "npu_anti_quant": "npu_anti_quant(Tensor x, Tensor scale, *, Tensor? offset=None, int? dst_dtype=None, "
                      "int? src_dtype=None) -> Tensor",
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
    # A layout change on the NPU (ND <-> FRACTAL_NZ ...) into a new tensor: off the NPU every tensor is dense
    # row-major, so the new tensor holds the same values in the same layout, whatever the format.
    "npu_format_cast": "npu_format_cast(Tensor self, int acl_format, *, int? customize_dtype=None) -> Tensor",
}

_QUINT4X2 = getattr(torch, "quint4x2", None)
_QINT8 = getattr(torch, "qint8", torch.int8)

# torch dtypes as the c10::ScalarType codes an `int` dtype argument of torch_npu carries.
TORCH_DTYPE_CODES = {d: code for name, code in (("uint8", 0), ("int8", 1), ("int16", 2), ("int32", 3), ("int64", 4),
                                                ("float16", 5), ("float32", 6), ("float64", 7), ("bool", 11),
                                                ("qint8", 12), ("quint8", 13), ("qint32", 14), ("bfloat16", 15),
                                                ("quint4x2", 16), ("float8_e5m2", 23), ("float8_e4m3fn", 24))
                     if (d := getattr(torch, name, None)) is not None}


def dtype_code(d):
    """An `int` dtype argument as torch_npu users pass it: a torch dtype -> its c10::ScalarType code; an int
    (or None, or anything else, which the operator then rejects by name) unchanged."""
    if isinstance(d, torch.dtype):
        return TORCH_DTYPE_CODES.get(d, d)
    return d


# Codes -> torch dtypes: c10::ScalarType values, and torch_npu's own codes of the types torch has.
_CODE_DTYPES = {**{code: d for d, code in TORCH_DTYPE_CODES.items()},
                **{c: d for c, name in ((291, "float8_e5m2"), (292, "float8_e4m3fn"))
                   if (d := getattr(torch, name, None)) is not None}}


def code_dtype(op: str, name: str, code):
    """An `int` dtype argument of npu_quantize / npu_anti_quant -> the torch dtype (None stays None); types
    torch lacks and unknown codes are a ValueError naming the argument."""
    if code is None or isinstance(code, torch.dtype):
        return code
    d = _CODE_DTYPES.get(code)
    if d is not None:
        return d
    what = _args.NPU_DTYPES_WITHOUT_TORCH.get(code)
    if what is not None:
        raise _args.fail_value(op, f"{name} is {code} ({what}) but torch has no dtype to hold it, so xquant cannot "
                                   "take it")
    raise _args.fail_value(op, f"{name} is {code} but expected a dtype code such as 1 (int8), 5 (float16), "
                               "15 (bfloat16) (torch_npu: Input dst_type must be valid, but got UNKNOWN_SCALAR)")


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
    dtype = code_dtype("quantize", "dtype", dtype)
    d = _where(self)
    out = _xnpu.npu_quantize(_on(self, d), _on(scales, d), _on(zero_points, d), dtype, axis, div_mode)
    return _back(out, self.device)


def _quantize_fake(self, scales, zero_points, dtype, axis=1, div_mode=True):
    from .. import _torch_ops

    code = _torch_ops._code("quantize", "dtype", code_dtype("quantize", "dtype", dtype))
    return self.new_empty(_args.quantized_shape(tuple(self.shape), code), dtype=_torch_ops._STORAGE[code])


# The two dynamic quantizations: dst_type an integer code (xquant.npu maps it, and names hifloat8 and the
# other types torch lacks in its error), quant_mode and dst_type_max as op-plugin 26.x.
def _dynamic_quant(input, *, smooth_scales=None, group_index=None, dst_type=None, quant_mode="pertoken",
                   dst_type_max=0.0):
    d = _where(input)
    out = _xnpu.npu_dynamic_quant(_on(input, d), smooth_scales=_on(smooth_scales, d), group_index=_on(group_index, d),
                                  dst_type=dst_type, quant_mode=quant_mode, dst_type_max=dst_type_max)
    return _back(tuple(out), input.device)


def _dynamic_shapes_fake(op: str, input, dst_type, quant_mode, dst_type_max):
    from .. import _torch_ops

    _args.dst_type_max(op, dst_type_max)
    code = _args.dst_type_code(op, dst_type)
    y_shape, p_shape = _args.dynamic_shapes(tuple(input.shape), code, _args.dynamic_mode(op, quant_mode))
    return input.new_empty(y_shape, dtype=_torch_ops._STORAGE[code]), p_shape


def _dynamic_quant_fake(input, *, smooth_scales=None, group_index=None, dst_type=None, quant_mode="pertoken",
                        dst_type_max=0.0):
    y, p_shape = _dynamic_shapes_fake("dynamic_quant", input, dst_type, quant_mode, dst_type_max)
    return y, input.new_empty(p_shape, dtype=torch.float32)


def _dynamic_quant_asymmetric(input, *, smooth_scales=None, group_index=None, dst_type=None, quant_mode="pertoken",
                              dst_type_max=0.0):
    d = _where(input)
    out = _xnpu.npu_dynamic_quant_asymmetric(_on(input, d), smooth_scales=_on(smooth_scales, d),
                                             group_index=_on(group_index, d), dst_type=dst_type,
                                             quant_mode=quant_mode, dst_type_max=dst_type_max)
    return _back(tuple(out), input.device)


def _dynamic_quant_asymmetric_fake(input, *, smooth_scales=None, group_index=None, dst_type=None,
                                   quant_mode="pertoken", dst_type_max=0.0):
    y, p_shape = _dynamic_shapes_fake("dynamic_quant_asymmetric", input, dst_type, quant_mode, dst_type_max)
    return y, input.new_empty(p_shape, dtype=torch.float32), input.new_empty(p_shape, dtype=torch.float32)


def _anti_quant(x, scale, *, offset=None, dst_dtype=None, src_dtype=None):
    dst_dtype = code_dtype("anti_quant", "dst_dtype", dst_dtype)
    src = anti_quant_src("anti_quant", x, code_dtype("anti_quant", "src_dtype", src_dtype))
    d = _where(x)
    out = _xnpu.npu_anti_quant(_on(x, d), _on(scale, d), offset=_on(offset, d),
                               dst_dtype=torch.float16 if dst_dtype is None else dst_dtype, src_dtype=src)
    return _back(out, x.device)


def _anti_quant_fake(x, scale, *, offset=None, dst_dtype=None, src_dtype=None):
    dst_dtype = code_dtype("anti_quant", "dst_dtype", dst_dtype)
    src = anti_quant_src("anti_quant", x, code_dtype("anti_quant", "src_dtype", src_dtype))
    shape = tuple(x.shape)
    if src != torch.int8 and shape:
        shape = shape[:-1] + (shape[-1] * 8,)
    return x.new_empty(shape, dtype=torch.float16 if dst_dtype is None else dst_dtype)


def _quant_matmul(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None, output_dtype=None, x1_dtype=None,
                  x2_dtype=None, pertoken_scale_dtype=None, scale_dtype=None, group_sizes=None, y_scale=None):
    op = "quant_matmul"
    d = _where(x1)
    out = _xnpu.npu_quant_matmul(
        _on(x1, d), _on(x2, d), _on(scale, d), offset=_on(offset, d), pertoken_scale=_on(pertoken_scale, d),
        bias=_on(bias, d), output_dtype=code_dtype(op, "output_dtype", output_dtype),
        x1_dtype=code_dtype(op, "x1_dtype", x1_dtype), x2_dtype=code_dtype(op, "x2_dtype", x2_dtype),
        pertoken_scale_dtype=code_dtype(op, "pertoken_scale_dtype", pertoken_scale_dtype),
        scale_dtype=code_dtype(op, "scale_dtype", scale_dtype), group_sizes=group_sizes, y_scale=y_scale)
    return _back(out, x1.device)


def _weight_quant_batchmatmul(x, weight, antiquant_scale, antiquant_offset=None, quant_scale=None, quant_offset=None,
                              bias=None, antiquant_group_size=0, inner_precise=0, weight_dtype=None):
    d = _where(x)
    out = _xnpu.npu_weight_quant_batchmatmul(
        _on(x, d), _on(weight, d), _on(antiquant_scale, d), _on(antiquant_offset, d), _on(quant_scale, d),
        _on(quant_offset, d), _on(bias, d), antiquant_group_size, inner_precise,
        code_dtype("weight_quant_batchmatmul", "weight_dtype", weight_dtype))
    return _back(out, x.device)


def _trans_quant_param(scale, offset=None, round_mode=0):
    d = _where(scale)
    out = _xnpu.npu_trans_quant_param(_on(scale, d), _on(offset, d), 0 if round_mode is None else round_mode)
    return _back(out, scale.device)


def _convert_weight_to_int4pack(weight, inner_k_tiles=0):
    d = _where(weight)
    return _back(_xnpu.npu_convert_weight_to_int4pack(_on(weight, d), inner_k_tiles), weight.device)


def _format_cast(self, acl_format, *, customize_dtype=None):
    return self.clone()


# The matmuls' fake implementations are the xquant operators themselves on the fake tensors (their Meta
# kernels run the library's planning), without the device moves of the real kernels.
def _quant_matmul_fake(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None, output_dtype=None,
                       x1_dtype=None, x2_dtype=None, pertoken_scale_dtype=None, scale_dtype=None, group_sizes=None,
                       y_scale=None):
    op = "quant_matmul"
    return _xnpu.npu_quant_matmul(
        x1, x2, scale, offset=offset, pertoken_scale=pertoken_scale, bias=bias,
        output_dtype=code_dtype(op, "output_dtype", output_dtype), x1_dtype=code_dtype(op, "x1_dtype", x1_dtype),
        x2_dtype=code_dtype(op, "x2_dtype", x2_dtype),
        pertoken_scale_dtype=code_dtype(op, "pertoken_scale_dtype", pertoken_scale_dtype),
        scale_dtype=code_dtype(op, "scale_dtype", scale_dtype), group_sizes=group_sizes, y_scale=y_scale)


def _weight_quant_batchmatmul_fake(x, weight, antiquant_scale, antiquant_offset=None, quant_scale=None,
                                   quant_offset=None, bias=None, antiquant_group_size=0, inner_precise=0,
                                   weight_dtype=None):
    return _xnpu.npu_weight_quant_batchmatmul(
        x, weight, antiquant_scale, antiquant_offset, quant_scale, quant_offset, bias, antiquant_group_size,
        inner_precise, code_dtype("weight_quant_batchmatmul", "weight_dtype", weight_dtype))


def _trans_quant_param_fake(scale, offset=None, round_mode=0):
    return _xnpu.npu_trans_quant_param(scale, offset, 0 if round_mode is None else round_mode)


def _format_cast_fake(self, acl_format, *, customize_dtype=None):
    return torch.empty_like(self)


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
