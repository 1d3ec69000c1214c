"""The quantized matmuls through the Python face (xquant.npu / torch.ops.xquant): npu_quant_matmul,
npu_weight_quant_batchmatmul, npu_trans_quant_param, npu_convert_weight_to_int4pack, bit for bit against the
independent NumPy goldens of golden.py (docs/semantics.md section 9), for NumPy arrays and torch tensors,
plain and transposed weights, every parameter dtype, ties, saturation, NaN, int4 nibble order, empty and
odd shapes; then an Ascend-style W8A8 linear layer of our own writing against its float layer."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (scripts/setup-python installs it)")

import golden  # noqa: E402
import xquant  # noqa: E402
from golden import BF16, assert_same  # noqa: E402
from tutil import needs_torch, torch  # noqa: E402

RNG = np.random.default_rng(20261202)


def _i8(*shape, lo=-128, hi=128):
    return RNG.integers(lo, hi, size=shape, dtype=np.int64).astype(np.int8)


def _int4_words(*shape):
    """Random int4 values of logical shape `shape` (last dim % 8 == 0), packed, and the values."""
    v = RNG.integers(-8, 8, size=shape, dtype=np.int64)
    return golden.pack_int4(v), v


def _both(f_np, *args, **kwargs):
    """The result for NumPy arrays, and (when torch is there) the same for torch tensors, which must equal it."""
    got = f_np(*args, **kwargs)
    if torch is not None:
        from tutil import to_numpy, to_torch

        def conv1(a):  # a transposed view stays one (torch reads it as stored, as NumPy does)
            if not isinstance(a, np.ndarray):
                return a
            if a.ndim >= 2 and not a.flags.c_contiguous and np.swapaxes(a, -1, -2).flags.c_contiguous:
                return to_torch(np.swapaxes(a, -1, -2)).transpose(-1, -2)
            return to_torch(a)

        conv = [conv1(a) for a in args]
        kw = {k: conv1(v) for k, v in kwargs.items()}
        assert_same(to_numpy(f_np(*conv, **kw)), got, "torch vs NumPy")
    return got


# ---- npu_trans_quant_param / npu_convert_weight_to_int4pack ------------------------------------------------

@pytest.mark.parametrize("round_mode", [0, 1])
def test_trans_quant_param_bits(round_mode):
    scale = np.concatenate([RNG.standard_normal(61).astype(np.float32),
                            np.array([0.0, -0.0, np.inf, np.nan, 1.0458984375, 3.4e38, 1e-45], np.float32)])
    offset = np.concatenate([RNG.uniform(-300, 300, 61), [0.5, 1.5, -2.5, np.nan, np.inf, -np.inf, 255.5]])
    offset = offset.astype(np.float32)
    got = _both(xquant.npu_trans_quant_param, scale, offset, round_mode)
    assert_same(got, golden.trans_quant_param(scale, offset, round_mode))
    assert_same(_both(xquant.npu_trans_quant_param, scale), golden.trans_quant_param(scale))
    # the documented example: scale 1.0458984375, offset 1 -> 0x40203F85E000
    one = xquant.npu_trans_quant_param(np.array([1.0458984375], np.float32), np.array([1.0], np.float32))
    assert one.tolist() == [0x40203F85E000]


def test_trans_quant_param_broadcast_and_2d():
    s1 = np.array([0.5], np.float32)
    off = np.arange(-3, 4, dtype=np.float32)
    assert_same(xquant.npu_trans_quant_param(s1, off), golden.trans_quant_param(np.repeat(s1, 7), off))
    s2 = RNG.standard_normal((1, 5)).astype(np.float32)
    assert xquant.npu_trans_quant_param(s2).shape == (1, 5)
    with pytest.raises(ValueError, match="round_mode is 2"):
        xquant.npu_trans_quant_param(s1, None, 2)


def test_convert_weight_to_int4pack_nibble_order():
    v = RNG.integers(-8, 8, size=(3, 5, 16), dtype=np.int64).astype(np.int32)
    got = _both(xquant.npu_convert_weight_to_int4pack, v)
    assert_same(got, golden.pack_int4(v))
    # element 8k + j in bits [4j, 4j + 3]: [1, -1, 0, ..., 0, 7] -> 0x7000_00F1
    w = np.array([[1, -1, 0, 0, 0, 0, 0, 7]], np.int32)
    assert xquant.npu_convert_weight_to_int4pack(w).view(np.uint32).tolist() == [[0x700000F1]]
    with pytest.raises(ValueError, match="value 8 at flat index 3"):
        xquant.npu_convert_weight_to_int4pack(np.array([[0, 1, 2, 8, 0, 0, 0, 0]], np.int32))
    with pytest.raises(ValueError, match="inner_k_tiles is 2"):
        xquant.npu_convert_weight_to_int4pack(v, inner_k_tiles=2)


# ---- npu_quant_matmul ---------------------------------------------------------------------------------------

SCALES = {
    "float32": lambda n: RNG.uniform(1e-3, 2e-2, n).astype(np.float32),
    "bfloat16": lambda n: RNG.uniform(1e-3, 2e-2, n).astype(np.float32).astype(BF16),
    "int64": lambda n: golden.trans_quant_param(RNG.uniform(1e-3, 2e-2, n).astype(np.float32),
                                                RNG.integers(-5, 6, n).astype(np.float32)),
}


@pytest.mark.parametrize("out", ["int8", "float16", "bfloat16", "int32"])
@pytest.mark.parametrize("scale_kind", sorted(SCALES))
@pytest.mark.parametrize("transposed", [False, True])
def test_quant_matmul_int8_goldens(out, scale_kind, transposed):
    M, K, N = 5, 67, 12
    x1, w = _i8(M, K), _i8(N, K) if transposed else _i8(K, N)
    x2 = w.T if transposed else w  # a transposed view: read as stored
    scale = SCALES[scale_kind](N)
    kw = {}
    if out in ("float16", "bfloat16") and scale_kind != "int64":
        kw["pertoken_scale"] = RNG.uniform(0.5, 2, M).astype(np.float32)
    bias = RNG.integers(-1000, 1000, N).astype(np.int32)
    got = _both(xquant.npu_quant_matmul, x1, x2, scale, bias=bias, output_dtype=out, **kw)
    want = golden.quant_matmul(x1, w, scale, bias=bias, output_dtype=out, x2_transposed=transposed,
                               pertoken_scale=kw.get("pertoken_scale"))
    assert_same(got, want, f"{out} {scale_kind}")


@pytest.mark.parametrize("bias_dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("out", ["float16", "bfloat16"])
def test_quant_matmul_float_bias_and_pertoken(bias_dtype, out):
    M, K, N = 7, 33, 9
    x1, x2 = _i8(M, K), _i8(K, N)
    scale = SCALES["float32"](1)
    pts = RNG.uniform(0.1, 3, M).astype(np.float32)
    bias = RNG.standard_normal(N).astype(np.float32).astype(BF16 if bias_dtype == "bfloat16" else bias_dtype)
    got = _both(xquant.npu_quant_matmul, x1, x2, scale, pertoken_scale=pts, bias=bias, output_dtype=out)
    assert_same(got, golden.quant_matmul(x1, x2, scale, pertoken_scale=pts, bias=bias, output_dtype=out))


def test_quant_matmul_int8_ties_saturation_nan_offset():
    # x1 @ x2 = [[2, 5, 256, -300, 3]]; scale 0.5 gives ties 1.0 / 2.5 (-> 2) and saturation
    x1 = np.array([[2, 1]], np.int8)
    x2 = np.array([[0, 2, 127, -128, 1], [2, 1, 2, -44, 1]], np.int8)
    scale = np.array([0.5, 0.5, 0.5, 0.5, np.nan], np.float32)
    got = _both(xquant.npu_quant_matmul, x1, x2, scale)
    assert got.tolist() == [[1, 2, 127, -128, 0]]
    offset = np.array([0.5, 0.0, -200.0, 0.25, 0.0], np.float32)
    got = _both(xquant.npu_quant_matmul, x1, x2, scale, offset=offset)
    assert_same(got, golden.quant_matmul(x1, x2, scale, offset=offset))
    assert got.tolist() == [[2, 2, -72, -128, 0]]


def test_quant_matmul_int4_plain_and_transposed():
    M, K, N = 3, 32, 16
    x1, a = _int4_words(M, K)
    x2, b = _int4_words(K, N)  # [K, N / 8], packed along N
    scale = SCALES["float32"](N)
    got = _both(xquant.npu_quant_matmul, x1, x2, scale, output_dtype="float16")
    want = golden.quant_matmul(x1, x2, scale, output_dtype="float16", int4=True)
    assert_same(got, want)
    assert_same(got, golden.quant_matmul(a.astype(np.int8), b.astype(np.int8), scale, output_dtype="float16"))
    # an (n, k) weight packed along k, passed as its transposed view
    wt, bt = _int4_words(N, K)
    got = _both(xquant.npu_quant_matmul, x1, wt.T, scale, output_dtype="bfloat16")
    assert_same(got, golden.quant_matmul(a.astype(np.int8), bt.T.astype(np.int8), scale, output_dtype="bfloat16"))


def test_quant_matmul_batch_broadcast_and_batched_bias():
    x1, x2 = _i8(2, 1, 3, 8), _i8(4, 8, 5)
    scale = SCALES["float32"](5)
    got = _both(xquant.npu_quant_matmul, x1, x2, scale, output_dtype="float16")
    assert got.shape == (2, 4, 3, 5)
    assert_same(got, golden.quant_matmul(x1, x2, scale, output_dtype="float16"))
    x1b, x2b = _i8(3, 4, 8), _i8(3, 8, 5)
    bias = RNG.integers(-9, 9, (3, 1, 5)).astype(np.int32)
    got = _both(xquant.npu_quant_matmul, x1b, x2b, scale, bias=bias, output_dtype="int32")
    want = np.matmul(x1b.astype(np.int64), x2b.astype(np.int64)) + bias
    assert_same(got, want.astype(np.int32))


@pytest.mark.parametrize("shape", [(0, 8, 4), (3, 0, 4), (3, 8, 0), (1, 1, 1)])
def test_quant_matmul_empty_and_tiny(shape):
    M, K, N = shape
    x1, x2 = _i8(M, K), _i8(K, N)
    got = _both(xquant.npu_quant_matmul, x1, x2, np.array([0.25], np.float32), output_dtype="float16")
    assert_same(got, golden.quant_matmul(x1, x2, np.array([0.25], np.float32), output_dtype="float16"))


def test_quant_matmul_errors():
    x1, x2, s = _i8(2, 8), _i8(8, 4), np.ones(4, np.float32)
    with pytest.raises(ValueError, match="output_dtype is float32"):
        xquant.npu_quant_matmul(x1, x2, s, output_dtype=np.float32)
    with pytest.raises(ValueError, match="x2 has shape \\[7, 4\\]"):
        xquant.npu_quant_matmul(x1, _i8(7, 4), s)
    with pytest.raises(ValueError, match="group_sizes is \\[1, 1, 256\\] with int8 x1 and x2, but expected \\[0, 0, 0\\]"):
        xquant.npu_quant_matmul(x1, x2, s, group_sizes=[1, 1, 256])
    with pytest.raises(ValueError, match="x1_dtype is float8_e4m3fn but x1 has dtype int8"):
        xquant.npu_quant_matmul(x1, x2, s, x1_dtype="float8_e4m3fn")
    xquant.npu_quant_matmul(x1, x2, s, x1_dtype="int8", x2_dtype=np.int8, scale_dtype="float32")
    with pytest.raises(ValueError, match="offset is given but the output dtype is float16"):
        xquant.npu_quant_matmul(x1, x2, s, offset=s, output_dtype="float16")
    with pytest.raises(TypeError, match="scale has dtype float16"):
        xquant.npu_quant_matmul(x1, x2, s.astype(np.float16))


# ---- npu_quant_matmul, A8W4 per-group mode (int8 x1, int4 x2, group_sizes=[0, 0, G]) ----------------------

@pytest.mark.parametrize("out", ["float16", "bfloat16"])
@pytest.mark.parametrize("scale_kind", ["float32", "int64"])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("pertoken", [None, "1d", "2d"])
def test_quant_matmul_a8w4_goldens(out, scale_kind, transposed, pertoken):
    M, K, N, G = 5, 4 * 32, 24, 32
    x1 = _i8(M, K)
    if transposed:
        wt, _ = _int4_words(N, K)  # an (n, k) weight packed along k, passed as its transposed view
        x2, w_stored = wt.T, wt
    else:
        x2, _ = _int4_words(K, N)
        w_stored = x2
    s32 = RNG.uniform(0, 1, (K // G, N)).astype(np.float32)
    scale = golden.trans_quant_param(s32.reshape(-1)).reshape(K // G, N) if scale_kind == "int64" else s32
    offset = RNG.standard_normal(N).astype(np.float32)
    pts = {None: None, "1d": RNG.uniform(0.001, 0.02, M).astype(np.float32),
           "2d": RNG.uniform(0.001, 0.02, (M, 1)).astype(np.float32)}[pertoken]
    got = _both(xquant.npu_quant_matmul, x1, x2, scale, offset=offset, pertoken_scale=pts, output_dtype=out,
                group_sizes=[0, 0, G])
    want = golden.quant_matmul_a8w4(x1, w_stored, scale, G, offset=offset, pertoken_scale=pts, output_dtype=out,
                                    x2_transposed=transposed)
    assert_same(got, want, f"{out} {scale_kind} transposed={transposed} pertoken={pertoken}")


def test_quant_matmul_a8w4_float16_overflow_nan_and_extremes():
    # x1 at -128 / 127 (hi = -8 / 7, lo = -8 / 7), weights at -8 / 7, large scales: float16 group terms and
    # running sums overflow to +-Inf, Inf - Inf gives NaN; a NaN scale; no offset, no pertoken_scale.
    M, K, N, G = 4, 64, 8, 32
    x1 = np.array([[-128] * K, [127] * K, [-1] * K, list(range(-32, 32))], np.int8)
    v = np.tile(np.array([-8, 7, 7, -8, 1, 0, -1, 3]), (K, 1))
    x2 = golden.pack_int4(v)
    scale = np.array([[1.0, 10.0, 40.0, 3e4, 0.5, np.nan, 1e-8, 65504.0]] * (K // G), np.float32)
    for out in ("float16", "bfloat16"):
        got = _both(xquant.npu_quant_matmul, x1, x2, scale, output_dtype=out, group_sizes=(0, 0, G))
        assert_same(got, golden.quant_matmul_a8w4(x1, x2, scale, G, output_dtype=out))
    got = xquant.npu_quant_matmul(x1, x2, scale, output_dtype="float16", group_sizes=[0, 0, G])
    assert np.isinf(got.astype(np.float32)).any() and np.isnan(got.astype(np.float32)).any()


def test_quant_matmul_a8w4_single_group_and_empty():
    x1, (x2, _) = _i8(3, 16), _int4_words(16, 8)
    scale = RNG.uniform(0, 1, (1, 8)).astype(np.float32)
    got = _both(xquant.npu_quant_matmul, x1, x2, scale, output_dtype="bfloat16", group_sizes=[1, 1, 16])
    assert_same(got, golden.quant_matmul_a8w4(x1, x2, scale, 16, output_dtype="bfloat16"))
    got = xquant.npu_quant_matmul(_i8(0, 16), x2, scale, output_dtype="float16", group_sizes=[0, 0, 16])
    assert got.shape == (0, 8)


def test_quant_matmul_a8w4_errors():
    x1, (x2, _) = _i8(2, 64), _int4_words(64, 8)
    s = np.ones((2, 8), np.float32)
    with pytest.raises(TypeError, match="x2 has dtype int32 but expected int8 .*, or int32 \\(int4\\) with group_sizes"):
        xquant.npu_quant_matmul(x1, x2, s, output_dtype="float16")
    with pytest.raises(ValueError, match="group_sizes is \\[0, 2, 32\\] but expected \\[0 or 1, 0 or 1, G\\]"):
        xquant.npu_quant_matmul(x1, x2, s, output_dtype="float16", group_sizes=[0, 2, 32])
    with pytest.raises(ValueError, match="G > 0 dividing K = 64"):
        xquant.npu_quant_matmul(x1, x2, s, output_dtype="float16", group_sizes=[0, 0, 48])
    with pytest.raises(ValueError, match="output_dtype is int8 but expected float16 or bfloat16"):
        xquant.npu_quant_matmul(x1, x2, s, group_sizes=[0, 0, 32])
    with pytest.raises(ValueError, match="scale has shape \\[8\\]"):
        xquant.npu_quant_matmul(x1, x2, np.ones(8, np.float32), output_dtype="float16", group_sizes=[0, 0, 32])
    with pytest.raises(ValueError, match="bias is given but the A8W4 per-group mode"):
        xquant.npu_quant_matmul(x1, x2, s, bias=np.zeros(8, np.int32), output_dtype="float16", group_sizes=[0, 0, 32])
    with pytest.raises(ValueError, match="x1 has shape \\[1, 2, 64\\] \\(rank 3\\)"):
        xquant.npu_quant_matmul(x1[None], x2, s, output_dtype="float16", group_sizes=[0, 0, 32])
    with pytest.raises(ValueError, match="pertoken_scale has shape \\[2, 2\\]"):
        xquant.npu_quant_matmul(x1, x2, s, pertoken_scale=np.ones((2, 2), np.float32), output_dtype="float16",
                                group_sizes=[0, 0, 32])
    with pytest.raises(ValueError, match="group_sizes is \\[-1, 0, 32\\] but expected non-negative"):
        xquant.npu_quant_matmul(x1, x2, s, output_dtype="float16", group_sizes=[-1, 0, 32])
    with pytest.raises(TypeError, match="group_sizes is .* but expected None or a list of 3 ints"):
        xquant.npu_quant_matmul(x1, x2, s, output_dtype="float16", group_sizes=[32])


# ---- npu_weight_quant_batchmatmul -----------------------------------------------------------------------------

@pytest.mark.parametrize("xdt", ["float16", "bfloat16"])
@pytest.mark.parametrize("kind", ["per_channel", "per_tensor", "per_group"])
@pytest.mark.parametrize("transposed", [False, True])
def test_weight_quant_batchmatmul_int8(xdt, kind, transposed):
    M, K, N = 4, 96, 24
    dt = BF16 if xdt == "bfloat16" else np.dtype(xdt)
    x = RNG.standard_normal((2, M, K)).astype(np.float32).astype(dt)
    w = _i8(N, K) if transposed else _i8(K, N)
    gs = 32 if kind == "per_group" else 0
    pshape = {"per_channel": (N,), "per_tensor": (1,), "per_group": (K // 32, N)}[kind]
    scale = RNG.uniform(0.001, 0.02, pshape).astype(np.float32).astype(dt)
    offset = RNG.uniform(-4, 4, pshape).astype(np.float32).astype(dt)
    bias = RNG.standard_normal(N).astype(np.float32).astype(dt)
    got = _both(xquant.npu_weight_quant_batchmatmul, x, w.T if transposed else w, scale, offset, None, None, bias,
                gs)
    want = golden.weight_quant_batchmatmul(x, w, scale, offset, bias, gs, transposed=transposed)
    assert_same(got, want, f"{xdt} {kind}")


def test_weight_quant_batchmatmul_int4_via_convert():
    M, K, N = 3, 64, 16
    x = RNG.standard_normal((M, K)).astype(np.float16)
    v = RNG.integers(-8, 8, (K, N)).astype(np.int32)
    w = xquant.npu_convert_weight_to_int4pack(v)  # [K, N / 8]
    scale = RNG.uniform(0.01, 0.1, (1, N)).astype(np.float16)
    got = _both(xquant.npu_weight_quant_batchmatmul, x, w, scale)
    assert_same(got, golden.weight_quant_batchmatmul(x, w, scale, int4=True))
    assert_same(got, golden.weight_quant_batchmatmul(x, v.astype(np.int8), scale))


def test_weight_quant_batchmatmul_errors():
    x, w, s = np.ones((2, 64), np.float16), _i8(64, 8), np.ones(8, np.float16)
    with pytest.raises(ValueError, match="quant_scale is .* only quant_scale=None"):
        xquant.npu_weight_quant_batchmatmul(x, w, s, quant_scale=np.ones(8, np.float32))
    with pytest.raises(ValueError, match="antiquant_group_size is 48"):
        xquant.npu_weight_quant_batchmatmul(x, w, np.ones((2, 8), np.float16), antiquant_group_size=48)
    with pytest.raises(ValueError, match="inner_precise is 3"):
        xquant.npu_weight_quant_batchmatmul(x, w, s, inner_precise=3)
    with pytest.raises(TypeError, match="antiquant_scale has dtype float32 but expected float16"):
        xquant.npu_weight_quant_batchmatmul(x, w, s.astype(np.float32))


# ---- torch: the operators, meta / FakeTensor, torch.compile, the stand-in -------------------------------------

@needs_torch
def test_torch_meta_and_compile():
    x1 = torch.randint(-128, 128, (6, 32), dtype=torch.int8)
    w = torch.randint(-128, 128, (10, 32), dtype=torch.int8)  # [N, K], passed as w.t()
    s = torch.rand(10) * 0.01
    eager = xquant.npu_quant_matmul(x1, w.t(), s, output_dtype=torch.bfloat16)
    meta = torch.ops.xquant.quant_matmul(x1.to("meta"), w.to("meta").t(), s.to("meta"), None, None, None,
                                         torch.bfloat16)
    assert meta.shape == eager.shape == (6, 10) and meta.dtype == torch.bfloat16

    def layer(x, w, s):
        q, pts = xquant.npu_dynamic_quant(x)
        return xquant.npu_quant_matmul(q, w.t(), s, pertoken_scale=pts, output_dtype=torch.bfloat16)

    x = torch.randn(6, 32, dtype=torch.bfloat16)
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x, w, s).view(torch.int16), layer(x, w, s).view(torch.int16))


@needs_torch
def test_torch_vmap_is_declined_clearly():
    x1, x2, s = torch.ones(3, 2, 8, dtype=torch.int8), torch.ones(8, 4, dtype=torch.int8), torch.ones(4)
    with pytest.raises(NotImplementedError, match="xquant::quant_matmul: torch.vmap is not supported"):
        torch.vmap(lambda a: torch.ops.xquant.quant_matmul(a, x2, s, None, None, None, None))(x1)


@needs_torch
def test_ascend_style_w8a8_linear_matches_float():
    """A W8A8 dynamic linear layer as Ascend inference code writes one (per-channel int8 weight, symmetric,
    transposed once after loading; per-token dynamic activation quantization; bfloat16 output): its output
    follows the float layer (cosine similarity), and equals our golden bit for bit."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 96, bias=True, dtype=torch.bfloat16)
    w = lin.weight.detach().float()
    w_scale = (w.abs().amax(dim=1) / 127).to(torch.bfloat16)  # [N], the layer's params dtype
    w_q = torch.clamp(torch.round(w / w_scale.float()[:, None]), -128, 127).to(torch.int8)  # [N, K]
    weight = w_q.transpose(0, 1).contiguous()  # process_weights_after_loading: [K, N]
    x = torch.randn(2, 7, 256, dtype=torch.bfloat16)

    q, pts = xquant.npu_dynamic_quant(x)  # [2, 7, 256] int8, [2, 7]
    out = xquant.npu_quant_matmul(q.reshape(-1, 256), weight, w_scale, pertoken_scale=pts.reshape(-1),
                                  bias=lin.bias.detach(), output_dtype=torch.bfloat16).reshape(2, 7, 96)
    ref = lin(x).float()
    cos = torch.nn.functional.cosine_similarity(out.float().flatten(), ref.flatten(), dim=0)
    assert cos > 0.999, cos
    from tutil import to_numpy

    want = golden.quant_matmul(to_numpy(q.reshape(-1, 256)), to_numpy(weight), to_numpy(w_scale),
                               pertoken_scale=to_numpy(pts.reshape(-1)), bias=to_numpy(lin.bias.detach()),
                               output_dtype="bfloat16")
    assert_same(to_numpy(out.reshape(-1, 96)), want)
