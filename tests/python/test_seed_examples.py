"""Every seed document's Python example, with device='npu' dropped and the import changed to xquant.npu.

Seeds 01 and 03 keep their examples; the examples of seeds 02 and 04 were lost when the documents were
scraped ("[object Object]") and seed 05 documents only a graph-mode (GE IR) call: for those, the calls
below follow the documented signatures with small inputs whose results are derived by hand in comments.
Every result is also compared bit for bit with the independent NumPy golden (golden.py).
"""

import pytest

pytest.importorskip("torch", reason="torch is not installed (scripts/setup-python installs it)")
pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (scripts/setup-python installs it)")

import numpy as np
import torch

import golden
from golden import F32, assert_same
from tutil import to_numpy
from xquant.npu import (
    acts_ulq,
    npu_dynamic_quant_asymmetric,
    npu_fake_tensor_quant,
    npu_fake_tensor_quant_inplace,
    npu_fake_tensor_quant_with_axis,
    npu_quantize,
    quant,
)
from xquant import QuantMode


# ---- seed 01 -------------------------------------------------------------------------------------------------

def test_seed01_example1_per_tensor_activation():
    inputs = torch.randn(4, 64, 32, 32, dtype=torch.float32)
    amax = inputs.abs().max()
    quantized = npu_fake_tensor_quant(inputs, amax, num_bits=8, is_unsigned=False, narrow_range=True)
    assert quantized.shape == inputs.shape and quantized.dtype == torch.float32
    assert_same(to_numpy(quantized), golden.fake_quant(to_numpy(inputs), to_numpy(amax)), "seed 01 example 1")
    # Hand-derived properties: 8-bit signed narrow range has at most 255 levels k / scale, |k| <= 127,
    # and the element of largest magnitude lands on +-127 / scale.
    scale = F32(127) / F32(amax.item())
    levels = np.rint(to_numpy(quantized) * scale)
    assert np.unique(levels).size <= 255 and np.abs(levels).max() == 127


def test_seed01_example2_inplace():
    inputs = torch.randn(1000, 256, dtype=torch.float32)
    before = to_numpy(inputs)
    ptr = inputs.data_ptr()
    amax = inputs.abs().max()
    quantized = npu_fake_tensor_quant_inplace(inputs, amax, num_bits=8)
    assert quantized is inputs and inputs.data_ptr() == ptr  # the input tensor itself is modified
    assert_same(to_numpy(inputs), golden.fake_quant(before, to_numpy(amax)), "seed 01 example 2")


def test_seed01_example3_per_axis_weight():
    weight = torch.randn(64, 128, 3, 3, dtype=torch.float32)
    amax = weight.abs().amax(dim=[1, 2, 3])  # Shape: [64]
    quantized_weight = npu_fake_tensor_quant_with_axis(
        weight, amax, axis=0, num_bits=8, is_unsigned=False, narrow_range=True
    )
    assert quantized_weight.shape == weight.shape
    assert_same(to_numpy(quantized_weight), golden.fake_quant(to_numpy(weight), to_numpy(amax), axis=0),
                "seed 01 example 3")
    # Each output channel's largest magnitude is its own amax, quantized to +-127 levels.
    for c in (0, 17, 63):
        scale = F32(127) / F32(amax[c].item())
        assert np.abs(np.rint(to_numpy(quantized_weight[c]) * scale)).max() == 127


# ---- seed 02 (examples lost; reconstructed from the documented signature) -------------------------------------

def test_seed02_div_mode_qint8_hand_computed():
    # y = sat(rint(input / scales + zero_points)), per channel on axis 1.
    input = torch.tensor([[-1.0, 0.25, 3.0], [100.0, -0.75, 0.5]], dtype=torch.float32)
    scales = torch.tensor([0.5, 0.25, 2.0], dtype=torch.float32)
    zero_points = torch.tensor([1, -2, 0], dtype=torch.int8)
    out = npu_quantize(input, scales, zero_points, torch.qint8, axis=1, div_mode=True)
    # column 0: -1/0.5 + 1 = -1;  100/0.5 + 1 = 201 -> 127 (saturated)
    # column 1: 0.25/0.25 - 2 = -1;  -0.75/0.25 - 2 = -5
    # column 2: 3/2 = 1.5 -> 2 (half to even);  0.5/2 = 0.25 -> 0
    assert out.dtype == torch.int8
    assert out.tolist() == [[-1, -1, 2], [127, -5, 0]]


def test_seed02_div_mode_quint8_and_int32():
    input = torch.tensor([[2.5, -1.0, 1000.0, 3.5]], dtype=torch.float32)
    scales = torch.tensor([1.0], dtype=torch.float32)  # one element: per-tensor, axis ignored
    assert npu_quantize(input, scales, torch.tensor([10], dtype=torch.uint8), torch.quint8).tolist() == [
        [12, 9, 255, 14]]  # 12.5 -> 12, 9, 1010 -> 255, 13.5 -> 14
    q32 = npu_quantize(input * 1e7, scales, None, torch.int32)
    assert q32.dtype == torch.int32
    assert q32.tolist() == [[25000000, -10000000, 2147483647, 35000000]]  # 1e10 saturates


def test_seed02_mul_mode_qint8_bfloat16():
    # The classic torch_npu call: npu_quantize(x, scale, None, torch.qint8, -1, False) on bfloat16.
    x = torch.randn(1, 1, 12).bfloat16()
    scale = torch.tensor([0.1] * 12).bfloat16()
    out = npu_quantize(x, scale, None, torch.qint8, -1, False)
    assert out.dtype == torch.int8 and out.shape == (1, 1, 12)
    assert_same(to_numpy(out), golden.quantize(to_numpy(x), to_numpy(scale), None, "qint8", -1, False), "seed 02")


def test_seed02_mul_mode_quint4x2_hand_packed():
    # Eight int4 per int32, element 8k + j in bits [4j, 4j + 3] of word k (first element lowest).
    x = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, -1.0, -2.0, -8.0, 9.0, 0.4, 0.5, 1.5, -0.5]])
    scale = torch.tensor([1.0])
    out = npu_quantize(x, scale, None, torch.quint4x2, -1, False)
    assert out.dtype == torch.int32 and out.shape == (1, 2)
    # word 0: nibbles 0..7 -> 0x76543210; word 1: -1 -> F, -2 -> E, -8 -> 8, 9 -> 7 (saturated), 0.4 -> 0,
    # 0.5 -> 0 (half to even), 1.5 -> 2, -0.5 -> 0: 0x020078EF read from the highest nibble down.
    assert out[0, 0].item() == 0x76543210
    assert out[0, 1].item() == 0x020078EF
    assert_same(to_numpy(out), golden.quantize(to_numpy(x), to_numpy(scale), None, "quint4x2", -1, False))


# ---- seed 03 -------------------------------------------------------------------------------------------------

def _seed03_src():
    i = np.arange(64, dtype=np.float32)[:, None]
    j = np.arange(128, dtype=np.float32)[None, :]
    return (F32(-16) + F32(32) * i + F32(0.25) * j).astype(np.float32)  # rows -16, 16, 48, 80, ... step 0.25


def test_seed03_measured_example_numpy():
    src = _seed03_src()
    scale = np.full((64, 1), 4.0, dtype=np.float32)
    out = np.zeros((64, 128), dtype=np.int8)
    assert quant(out, src, scale, mode=QuantMode.SYM) is None  # pypto returns nothing
    assert out[0, :8].tolist() == [-64, -63, -62, -61, -60, -59, -58, -57]
    assert out[1, :8].tolist() == [64, 65, 66, 67, 68, 69, 70, 71]
    assert out[2, :8].tolist() == [127] * 8
    assert out[3, :8].tolist() == [127] * 8
    assert_same(out, golden.tile_quant(src, scale), "seed 03")


def test_seed03_measured_example_torch_and_asym():
    src = torch.from_numpy(_seed03_src())
    scale = torch.full((64, 1), 4.0)
    out = torch.zeros(64, 128, dtype=torch.int8)
    quant(out, src, scale, mode="SYM")
    assert out[1, :8].tolist() == [64, 65, 66, 67, 68, 69, 70, 71]
    offset = torch.full((64, 1), 128.0)
    out_u8 = torch.zeros(64, 128, dtype=torch.uint8)
    quant(out_u8, src, scale, mode="ASYM", offset=offset)
    # -16 * 4 + 128 = 64 ... ; -15.875 would be a tie: 0.25 steps give exact integers here.
    assert out_u8[0, :4].tolist() == [64, 65, 66, 67] and out_u8[1, 0].item() == 192 and out_u8[2, 0].item() == 255
    assert_same(to_numpy(out_u8), golden.tile_quant(src.numpy(), scale.numpy(), "ASYM", offset.numpy()))


# ---- seed 04 (examples lost; reconstructed from the documented signature) -------------------------------------

def test_seed04_pertoken_int8_hand_checked():
    x = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], [-2.0, -1.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0]])
    y, scale, offset = npu_dynamic_quant_asymmetric(x)
    assert y.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (2,) and offset.shape == (2,)
    # scale = (rowMax - rowMin) / 255, offset = 127 - rowMax / scale: the row minimum maps to -128 and the
    # maximum to 127.
    assert scale[0].item() == float(F32(7) / F32(255)) and scale[1].item() == float(F32(4) / F32(255))
    assert y[0, 0].item() == -128 and y[0, 7].item() == 127 and y[1, 0].item() == -128 and y[1, 7].item() == 127
    gy, gs, go = golden.dynamic_quant(x.numpy())
    assert_same(y.numpy(), gy), assert_same(scale.numpy(), gs), assert_same(offset.numpy(), go)


def test_seed04_documented_calls():
    torch.manual_seed(4)
    x = torch.rand((3, 8), dtype=torch.float16)
    # only x, int8
    y, scale, offset = npu_dynamic_quant_asymmetric(x)
    for got, want in zip((y, scale, offset), golden.dynamic_quant(to_numpy(x))):
        assert_same(to_numpy(got), want)
    # only x, int4
    y, scale, offset = npu_dynamic_quant_asymmetric(x, dst_type=torch.quint4x2)
    assert y.dtype == torch.int32 and y.shape == (3, 1)
    for got, want in zip((y, scale, offset), golden.dynamic_quant(to_numpy(x), dst="quint4x2")):
        assert_same(to_numpy(got), want)
    # smooth_scales, no MoE
    smooth_scales = torch.rand((8,), dtype=torch.float16)
    out = npu_dynamic_quant_asymmetric(x, smooth_scales=smooth_scales)
    for got, want in zip(out, golden.dynamic_quant(to_numpy(x), to_numpy(smooth_scales))):
        assert_same(to_numpy(got), want)
    # MoE: smooth_scales [E, H] and group_index (cumulative row ends): rows 0 -> expert 0, rows 1-2 -> 1
    smooth_scales = torch.rand((2, 8), dtype=torch.float16)
    group_index = torch.tensor([1, 3], dtype=torch.int32)
    out = npu_dynamic_quant_asymmetric(x, smooth_scales=smooth_scales, group_index=group_index)
    for got, want in zip(out, golden.dynamic_quant(to_numpy(x), to_numpy(smooth_scales), group_index.numpy())):
        assert_same(to_numpy(got), want)
    # pertensor
    y, scale, offset = npu_dynamic_quant_asymmetric(x, quant_mode="pertensor")
    assert scale.shape == (1,) and offset.shape == (1,)
    for got, want in zip((y, scale, offset), golden.dynamic_quant(to_numpy(x), quant_mode="pertensor")):
        assert_same(to_numpy(got), want)


# ---- seed 05 (graph-mode only in the document; the formula by hand) -------------------------------------------

def test_seed05_acts_ulq_hand_computed():
    # clamp_min = 0, clamp_max = 255: scale = 1, offset = 0, clip range [0, 255].
    x = torch.tensor([-3.0, 0.5, 1.5, 2.4, 254.6, 300.0])
    y, min_mask, max_mask, loss = acts_ulq(x, torch.tensor([0.0]), torch.tensor([255.0]), fixed_min=False,
                                           num_bits=8)
    assert y.tolist() == [0.0, 0.0, 2.0, 2.0, 255.0, 255.0]  # rint: 0.5 -> 0, 1.5 -> 2 (half to even)
    assert min_mask.tolist() == [0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert max_mask.tolist() == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    # (rint(raw) - raw) / 255 inside; loss_m = (rint(0 / 1) - 0) / 255 = 0 where a mask is 0.
    f = np.float32
    want = [0.0, (f(0) - f(0.5)) / f(255), (f(2) - f(1.5)) / f(255), (f(2) - f(2.4)) / f(255),
            (f(255) - f(254.6)) / f(255), 0.0]
    assert loss.numpy().tolist() == np.array(want, dtype=np.float32).tolist()


def test_seed05_acts_ulq_signed_range_and_golden():
    # clamp_min = -128, clamp_max = 127: s = 255 / 255 = 1, off = -128, clip range [-128, 127].
    x = np.array([[-200.0, -128.0, -0.5, 0.5, 126.5, 127.0, 127.25]], dtype=np.float32)
    y, m0, m1, loss = acts_ulq(x, np.float32(-128.0), np.float32(127.0))
    assert y.tolist() == [[-128.0, -128.0, -0.0, 0.0, 126.0, 127.0, 127.0]]
    assert m0.tolist() == [[0, 1, 1, 1, 1, 1, 1]] and m1.tolist() == [[1, 1, 1, 1, 1, 1, 0]]
    for got, want in zip((y, m0, m1, loss), golden.acts_ulq(x, np.float32(-128.0), np.float32(127.0))):
        assert_same(got, want)


def test_signatures_are_the_seeds():
    """xquant.npu is the compatibility contract: the seeds' parameter names, order, kinds and defaults."""
    import inspect

    import xquant.npu as npu

    def sig(f):
        return [(p.name, p.kind.name, p.default) for p in inspect.signature(f).parameters.values()]

    E, P, K = inspect.Parameter.empty, "POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY"
    fq = [("num_bits", P, 8), ("is_unsigned", P, False), ("narrow_range", P, True)]
    assert sig(npu.npu_fake_tensor_quant) == [("inputs", P, E), ("amax", P, E)] + fq
    assert sig(npu.npu_fake_tensor_quant_inplace) == [("inputs", P, E), ("amax", P, E)] + fq
    assert sig(npu.npu_fake_tensor_quant_with_axis) == [("inputs", P, E), ("amax", P, E), ("axis", P, E)] + fq
    assert sig(npu.npu_quantize) == [("input", P, E), ("scales", P, E), ("zero_points", P, E), ("dtype", P, E),
                                     ("axis", P, 1), ("div_mode", P, True)]
    # (then op-plugin 26.x's keyword-only dst_type_max=0.0, which the seed does not have: an addition at the end)
    assert sig(npu.npu_dynamic_quant_asymmetric)[:5] == [("x", P, E), ("smooth_scales", K, None),
                                                         ("group_index", K, None), ("dst_type", K, None),
                                                         ("quant_mode", K, "pertoken")]
    assert sig(npu.npu_dynamic_quant_asymmetric)[5:] == [("dst_type_max", K, 0.0)]
    assert sig(npu.quant) == [("out", P, E), ("src", P, E), ("scale", P, E), ("mode", P, "SYM"), ("offset", P, None)]
    assert sig(npu.acts_ulq) == [("x", P, E), ("clamp_min", P, E), ("clamp_max", P, E), ("fixed_min", P, False),
                                 ("num_bits", P, 8)]
    assert set(npu.__all__) >= {"npu_fake_tensor_quant", "npu_fake_tensor_quant_inplace",
                                "npu_fake_tensor_quant_with_axis", "npu_quantize", "npu_dynamic_quant_asymmetric",
                                "quant", "acts_ulq"}
