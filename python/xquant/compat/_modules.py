"""The importable stand-in modules ``torch_npu`` (with ``torch_npu.npu``) and ``mx_driving``."""

from __future__ import annotations

import types

import torch

from .. import _core
from .. import npu as _xnpu
from . import _ops

_STANDIN_FLAG = "__xquant_compat__"


# ---- torch_npu: Python signatures as torch_npu documents them; each calls torch.ops.npu.* ----------------

def npu_quantize(input, scales, zero_points, dtype, axis=1, div_mode=True):
    """torch_npu.npu_quantize (xquant stand-in): y = sat(rint(input / scales + zero_points)) (div_mode=True)
    or sat(rint(input * scales + zero_points)) (div_mode=False); see xquant.npu.npu_quantize."""
    return torch.ops.npu.npu_quantize(input, scales, zero_points, _ops.dtype_code(dtype), axis, div_mode)


def npu_dynamic_quant(x, *, smooth_scales=None, group_index=None, dst_type=None, quant_mode="pertoken",
                      dst_type_max=0.0):
    """torch_npu.npu_dynamic_quant (xquant stand-in, op-plugin 26.x): symmetric dynamic quantization per token,
    tensor or channel, returns (y, scale) with scale = rowMax(|x'|) / DST_MAX and y = sat(rint(x' / scale))
    (float8: the float8 of x' / scale); dst_type a torch dtype or torch_npu's integer code; see
    xquant.npu.npu_dynamic_quant."""
    return torch.ops.npu.npu_dynamic_quant(x, smooth_scales=smooth_scales, group_index=group_index,
                                           dst_type=_ops.dtype_code(dst_type), quant_mode=quant_mode,
                                           dst_type_max=dst_type_max)


def npu_dynamic_quant_asymmetric(x, *, smooth_scales=None, group_index=None, dst_type=None, quant_mode="pertoken",
                                 dst_type_max=0.0):
    """torch_npu.npu_dynamic_quant_asymmetric (xquant stand-in, op-plugin 26.x): returns (y, scale, offset);
    see xquant.npu.npu_dynamic_quant_asymmetric. dst_type_max: only 0.0 (the NPU applies it to hifloat8)."""
    return torch.ops.npu.npu_dynamic_quant_asymmetric(x, smooth_scales=smooth_scales, group_index=group_index,
                                                      dst_type=_ops.dtype_code(dst_type), quant_mode=quant_mode,
                                                      dst_type_max=dst_type_max)


def npu_anti_quant(x, scale, *, offset=None, dst_dtype=None, src_dtype=None):
    """torch_npu.npu_anti_quant (xquant stand-in): out = narrow((x + offset) * scale) to dst_dtype (float16 by
    default); x int8, or int32 words of eight int4 (SPEC section 7)."""
    return torch.ops.npu.npu_anti_quant(x, scale, offset=offset, dst_dtype=_ops.dtype_code(dst_dtype),
                                        src_dtype=_ops.dtype_code(src_dtype))


def npu_quant_matmul(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None, output_dtype=None,
                     x1_dtype=None, x2_dtype=None, pertoken_scale_dtype=None, scale_dtype=None, group_sizes=None,
                     y_scale=None):
    """torch_npu.npu_quant_matmul (xquant stand-in): int8 / int4 x int8 / int4 with exact int32 accumulation and
    the documented epilogue (docs/semantics.md section 9); see xquant.npu.npu_quant_matmul."""
    return torch.ops.npu.npu_quant_matmul(x1, x2, scale, offset=offset, pertoken_scale=pertoken_scale, bias=bias,
                                          output_dtype=output_dtype, x1_dtype=x1_dtype, x2_dtype=x2_dtype,
                                          pertoken_scale_dtype=pertoken_scale_dtype, scale_dtype=scale_dtype,
                                          group_sizes=group_sizes, y_scale=y_scale)


def npu_weight_quant_batchmatmul(x, weight, antiquant_scale, antiquant_offset=None, quant_scale=None,
                                 quant_offset=None, bias=None, antiquant_group_size=0, inner_precise=0,
                                 weight_dtype=None):
    """torch_npu.npu_weight_quant_batchmatmul (xquant stand-in): float16 / bfloat16 x int8 / int4 weights
    dequantized with antiquant_scale / antiquant_offset; see xquant.npu.npu_weight_quant_batchmatmul."""
    return torch.ops.npu.npu_weight_quant_batchmatmul(x, weight, antiquant_scale, antiquant_offset, quant_scale,
                                                      quant_offset, bias, antiquant_group_size, inner_precise,
                                                      weight_dtype)


def npu_trans_quant_param(scale, offset=None, round_mode=0):
    """torch_npu.npu_trans_quant_param (xquant stand-in): the int64 scale (+ offset) words npu_quant_matmul
    takes; see xquant.npu.npu_trans_quant_param."""
    return torch.ops.npu.npu_trans_quant_param(scale, offset, round_mode)


def npu_convert_weight_to_int4pack(weight, inner_k_tiles=0):
    """torch_npu.npu_convert_weight_to_int4pack (xquant stand-in): int32 values in [-8, 7] packed eight per int32
    word along the last dimension."""
    return torch.ops.npu.npu_convert_weight_to_int4pack(weight, inner_k_tiles)


def npu_format_cast(input, acl_format, customize_dtype=None):
    """torch_npu.npu_format_cast (xquant stand-in): on the NPU a change of internal layout (ND, FRACTAL_NZ, ...)
    into a new tensor with the same values; off the NPU every tensor is dense row-major, so the new tensor is a
    copy."""
    return torch.ops.npu.npu_format_cast(input, acl_format, customize_dtype=customize_dtype)


TORCH_NPU_FUNCTIONS = (npu_quantize, npu_dynamic_quant, npu_dynamic_quant_asymmetric, npu_anti_quant,
                       npu_quant_matmul, npu_weight_quant_batchmatmul, npu_trans_quant_param,
                       npu_convert_weight_to_int4pack, npu_format_cast)


def make_torch_npu(npu_namespace: types.ModuleType, version: str) -> types.ModuleType:
    m = types.ModuleType("torch_npu", "xquant.compat stand-in for torch_npu (quantization operators only, "
                         "computed by xquant off the NPU).")
    m.__version__ = f"0+xquant.compat.{version}"
    setattr(m, _STANDIN_FLAG, True)
    for f in TORCH_NPU_FUNCTIONS:
        g = types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, f.__closure__)
        g.__kwdefaults__ = f.__kwdefaults__
        g.__doc__, g.__module__, g.__qualname__ = f.__doc__, "torch_npu", f.__name__
        # torch_npu's functions are torch.ops.npu operator packets: code inspects their schemas (amct asks
        # `"x1_dtype" in torch_npu.npu_quant_matmul._schemas[...]` to tell op-plugin versions apart)
        g._schemas = dict(getattr(torch.ops.npu, f.__name__)._schemas)
        setattr(m, f.__name__, g)
    m.npu = npu_namespace
    return m


# ---- mx_driving: the seed's signatures; xquant.npu's functions (autograd included) -----------------------
#
# Computed where the inputs are when xquant can compute there (the CPU; a CUDA device where xquant runs on
# CUDA); on any other device the inputs are copied to the CPU and the results back.

def _on_cpu(t):
    return t.cpu() if isinstance(t, torch.Tensor) and t.device.type != "cpu" else t


def _native(inputs) -> bool:
    return (not isinstance(inputs, torch.Tensor) or inputs.device.type == "cpu"
            or (inputs.device.type == "cuda" and _core.cuda_available()))


def _beside(t, inputs):
    """t on inputs' device (a tensor parameter; Python numbers stay)."""
    if isinstance(t, torch.Tensor) and isinstance(inputs, torch.Tensor) and t.device != inputs.device:
        return t.to(inputs.device)
    return t


def npu_fake_tensor_quant(inputs, amax, num_bits=8, is_unsigned=False, narrow_range=True):
    if _native(inputs):
        return _xnpu.npu_fake_tensor_quant(inputs, _beside(amax, inputs), num_bits, is_unsigned, narrow_range)
    return _xnpu.npu_fake_tensor_quant(inputs.cpu(), _on_cpu(amax), num_bits, is_unsigned,
                                       narrow_range).to(inputs.device)


def npu_fake_tensor_quant_inplace(inputs, amax, num_bits=8, is_unsigned=False, narrow_range=True):
    if _native(inputs):
        return _xnpu.npu_fake_tensor_quant_inplace(inputs, _beside(amax, inputs), num_bits, is_unsigned,
                                                   narrow_range)
    host = inputs.cpu()
    _xnpu.npu_fake_tensor_quant_inplace(host, _on_cpu(amax), num_bits, is_unsigned, narrow_range)
    return inputs.copy_(host)


def npu_fake_tensor_quant_with_axis(inputs, amax, axis, num_bits=8, is_unsigned=False, narrow_range=True):
    if _native(inputs):
        return _xnpu.npu_fake_tensor_quant_with_axis(inputs, _beside(amax, inputs), axis, num_bits, is_unsigned,
                                                     narrow_range)
    return _xnpu.npu_fake_tensor_quant_with_axis(inputs.cpu(), _on_cpu(amax), axis, num_bits, is_unsigned,
                                                 narrow_range).to(inputs.device)


MX_DRIVING = (npu_fake_tensor_quant, npu_fake_tensor_quant_inplace, npu_fake_tensor_quant_with_axis)


def make_mx_driving(version: str) -> types.ModuleType:
    m = types.ModuleType("mx_driving", "xquant.compat stand-in for mx_driving (npu_fake_tensor_quant family, "
                         "computed by xquant off the NPU).")
    m.__version__ = f"0+xquant.compat.{version}"
    setattr(m, _STANDIN_FLAG, True)
    for f in MX_DRIVING:
        f.__doc__ = getattr(_xnpu, f.__name__).__doc__
        setattr(m, f.__name__, f)
    return m
