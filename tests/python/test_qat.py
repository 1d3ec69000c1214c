"""xquant.qat (issue 20): quantizers, calibrators against NumPy, states, state_dict, learnable-amax
gradients against finite differences, the weight quantizer against an independent NumPy reading of the
compressed-tensors rule, target matching, configs, torch.compile / torch.export."""

import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import xquant.qat as xqat  # noqa: E402
from xquant.qat import targets as tg  # noqa: E402

F32 = np.float32


# ---------------------------------------------------------------------------------------------------------
# NumPy references (independent of the implementation: explicit loops where the code vectorizes)

def np_fake_quant(x, amax, num_bits=8, unsigned=False, narrow=True):
    bound = 2 ** (num_bits - 1 + int(unsigned)) - 1
    lo = -(bound + (0 if narrow else 1))
    x = np.asarray(x, F32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = F32(bound) / F32(amax)
        if not np.isfinite(s) or s == 0:
            return np.zeros_like(x)
        return (np.clip(np.rint((x * s).astype(F32)), lo, bound).astype(F32) / s).astype(F32)


def np_histogram(batches, nbins):
    """width from the first batch with a non-zero max; bins appended when a batch exceeds the range."""
    width, hist, zeros = None, None, 0
    for b in batches:
        a = np.abs(np.asarray(b, F32)).ravel()
        m = a.max()
        if width is None:
            if m == 0:
                zeros += a.size
                continue
            width = F32(m) / F32(nbins)
            hist = np.zeros(nbins, np.int64)
            hist[0] += zeros
        if float(m) > float(width) * hist.size:
            hist = np.concatenate([hist, np.zeros(math.ceil(float(m) / float(width)) - hist.size, np.int64)])
        for v in a:
            i = int(np.floor(F32(v) / width))
            hist[min(i, hist.size - 1)] += 1
    return width, hist


def edge(i, width):
    return float(F32(i * float(F32(width))))


def np_percentile(hist, width, p):
    total, run = hist.sum(), 0
    for i, c in enumerate(hist):
        run += c
        if run / total >= p / 100:
            return edge(i + 1, width)
    return edge(hist.size, width)


def np_mse(hist, width, start, num_bits):
    best, best_err = None, None
    centres = ((np.arange(hist.size) + 0.5) * float(F32(width))).astype(F32)
    for i in range(start, hist.size + 1):
        a = edge(i, width)
        err = float(np.sum(hist * (np_fake_quant(centres, a, num_bits).astype(np.float64) - centres) ** 2))
        if best_err is None or err < best_err:
            best, best_err = a, err
    return best


def np_entropy(hist, width, start, num_bits):
    levels = 2 ** (num_bits - 1) - 1
    best, best_kl = edge(hist.size, width), None
    for i in range(max(start, levels), hist.size + 1):
        p = hist[:i].astype(np.float64).copy()
        p[-1] += hist[i:].sum()
        q = np.zeros(i)
        for g in range(levels):
            members = [j for j in range(i) if (j * levels) // i == g]
            nz = [j for j in members if hist[j] > 0]
            for j in nz:
                q[j] = hist[members].sum() / len(nz)
        p, q = p / p.sum(), q / q.sum()
        if np.any((p > 0) & (q == 0)):
            continue
        kl = sum(p[j] * math.log(p[j] / q[j]) for j in range(i) if p[j] > 0)
        if best_kl is None or kl < best_kl:
            best, best_kl = edge(i, width), kl
    return best


def calibrated(method, batches, **opt):
    q = xqat.TensorQuantizer(calibrator=method, calib_options=opt)
    q.enable_calib()
    for b in batches:
        assert q(torch.from_numpy(b)) is not None
    assert q.load_calib_amax()
    return float(q.amax)


# ---------------------------------------------------------------------------------------------------------
# Calibrators

def test_max_calibrator_per_tensor_and_per_channel(rng):
    bs = [rng.standard_normal((6, 5, 7)).astype(F32) * s for s in (1, 3, 0.5)]
    assert calibrated("max", bs) == float(max(np.abs(b).max() for b in bs))
    q = xqat.TensorQuantizer(axis=1)
    q.enable_calib()
    for b in bs:
        q(torch.from_numpy(b))
    q.load_calib_amax()
    want = np.max([np.abs(b).max(axis=(0, 2)) for b in bs], axis=0)
    assert np.array_equal(q.amax.numpy(), want.astype(F32))


@pytest.mark.parametrize("method", ["percentile", "mse", "entropy"])
def test_histogram_calibrators_against_numpy(rng, method):
    # the second batch exceeds the first's range: bins are appended
    bs = [rng.standard_normal(700).astype(F32), (rng.standard_normal(500) * 2.5).astype(F32)]
    nb = 64
    width, hist = np_histogram(bs, nb)
    assert hist.size > nb
    c = xqat.HistogramCalibrator(method, num_bins=nb, percentile=99.0, start_bin=16)
    for b in bs:
        c.collect(torch.from_numpy(b))
    assert float(c.width) == float(width) and np.array_equal(c.hist.numpy(), hist)
    got = calibrated(method, bs, num_bins=nb, start_bin=16, **({"percentile": 99.0} if method == "percentile" else {}))
    want = {"percentile": lambda: np_percentile(hist, width, 99.0), "mse": lambda: np_mse(hist, width, 16, 8),
            "entropy": lambda: np_entropy(hist, width, 16, 8)}[method]()
    assert got == want, (method, got, want)
    assert 0 < got <= edge(hist.size, width)


@pytest.mark.parametrize("method", list(xqat.CALIBRATORS))
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_calibration_refuses_non_finite(method, bad):
    x = np.ones(10, F32)
    x[3] = bad
    q = xqat.TensorQuantizer(calibrator=method)
    q.qname = "layer.input_quantizer"
    q.enable_calib()
    with pytest.raises(ValueError, match=r"layer\.input_quantizer: the calibration data has 1 NaN / Inf value\(s\) of 10"):
        q(torch.from_numpy(x))


@pytest.mark.parametrize("method", list(xqat.CALIBRATORS))
def test_all_zero_calibration_gives_zero_amax_and_zero_output(method):
    q = xqat.TensorQuantizer(calibrator=method)
    q.enable_calib()
    q(torch.zeros(4, 8))
    q.load_calib_amax()
    assert float(q.amax) == 0.0
    q.enable_quant()
    assert torch.equal(q(torch.randn(4, 8)), torch.zeros(4, 8))


def test_zeros_before_the_first_non_zero_batch_land_in_bin_0():
    c = xqat.HistogramCalibrator("percentile", num_bins=8)
    c.collect(torch.zeros(5))
    c.collect(torch.tensor([0.0, 4.0]))
    assert c.hist.tolist() == [6, 0, 0, 0, 0, 0, 0, 1] and float(c.width) == 0.5


def test_histogram_range_growth_is_bounded():
    # a first batch of tiny values, then a huge one: the bins are merged instead of growing without bound
    c = xqat.HistogramCalibrator("percentile", num_bins=16, percentile=100.0)
    c.collect(torch.full((10,), 1e-3))
    c.collect(torch.tensor([1e3, 5e-4]))
    assert c.hist.numel() <= c.max_bins == 16 * 64 and int(c.hist.sum()) == 12
    w0 = np.float32(1e-3) / np.float32(16)
    k = math.log2(float(c.width) / float(w0))
    assert k == int(k) and k > 0  # the width doubled k times
    assert float(c.compute_amax()) >= 1e3
    with pytest.raises(ValueError, match="max_bins is 8 but expected an int >= num_bins=16"):
        xqat.HistogramCalibrator("mse", num_bins=16, max_bins=8)


def test_quantizer_argument_errors():
    with pytest.raises(ValueError, match=r"quantizer \(TensorQuantizer\): num_bits is 0 but expected an int in \[1, 32\]"):
        xqat.TensorQuantizer(num_bits=0)
    with pytest.raises(TypeError, match=r"quantizer \(TensorQuantizer\): axis is 1.5 but expected None"):
        xqat.TensorQuantizer(axis=1.5)
    with pytest.raises(ValueError, match=r"quantizer \(ActsULQQuantizer\): num_bits is 1 but expected an int in \[2, 16\]"):
        xqat.ActsULQQuantizer(num_bits=1)
    with pytest.raises(ValueError, match="strategy is 'row' but expected 'channel', 'group' or 'tensor'"):
        xqat.WeightQuantizer(strategy="row")
    with pytest.raises(ValueError, match="give both clamp_min and clamp_max"):
        xqat.ActsULQQuantizer(clamp_min=-1.0)


def test_calibrator_argument_errors():
    with pytest.raises(ValueError, match="calibrator is 'minmax' but expected one of"):
        xqat.TensorQuantizer(calibrator="minmax")
    with pytest.raises(ValueError, match="calibrator 'mse' computes one amax per tensor, but the quantizer has axis=0"):
        xqat.TensorQuantizer(axis=0, calibrator="mse")
    with pytest.raises(ValueError, match=r"percentile is 101 but expected a number in \(0, 100\]"):
        xqat.TensorQuantizer(calibrator="percentile", calib_options={"percentile": 101})
    with pytest.raises(ValueError, match="num_bins is 1 but expected an int >= 2"):
        xqat.TensorQuantizer(calibrator="entropy", calib_options={"num_bins": 1})


# ---------------------------------------------------------------------------------------------------------
# States, state_dict, repr

def test_state_transitions():
    q = xqat.TensorQuantizer(num_bits=8)
    q.qname = "m.input_quantizer"
    x = torch.randn(16, 4)
    with pytest.raises(RuntimeError, match=r"m\.input_quantizer has no amax: calibrate the model first"):
        q(x)
    q.disable()
    assert q(x) is x
    q.enable_calib()
    assert q(x) is x and q.amax is None  # collects, passes through
    assert q.load_calib_amax() and float(q.amax) == float(x.abs().max())
    q.enable_quant()
    assert torch.equal(q(x), torch.from_numpy(np_fake_quant(x.numpy(), float(q.amax))))
    with pytest.raises(ValueError, match="mode is 'train' but expected one of"):
        q.mode = "train"
    with pytest.raises(ValueError, match=r"amax\[0\] is -1.0 but expected a finite value >= 0"):
        q.set_amax(-1.0)
    with pytest.raises(ValueError, match="amax has 2 elements but a per-tensor quantizer expects 1"):
        q.set_amax([1.0, 2.0])


@pytest.mark.parametrize("learn", [False, True])
def test_state_dict_round_trip(learn):
    def make():
        torch.manual_seed(3)
        m = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
        return xqat.prepare(m, {"weights": {"num_bits": 4, "strategy": "channel", "learn_amax": learn},
                                "input_activations": {"num_bits": 8, "learn_amax": learn}})
    a, b = make(), make()
    x = torch.randn(32, 16)
    xqat.calibrate(a, lambda m: m(x))
    with torch.no_grad():
        a[0].weight_quantizer.amax.mul_(0.9)
    sd = a.state_dict()
    assert "0.input_quantizer.amax" in sd and "2.weight_quantizer.amax" in sd
    assert b[0].input_quantizer.amax is None  # uncalibrated: takes the saved shape on load
    b.load_state_dict(sd)
    assert torch.equal(a(x), b(x))
    assert isinstance(b[0].input_quantizer.amax, torch.nn.Parameter) == learn
    r = repr(a[0].input_quantizer)
    assert "num_bits=8" in r and f"learn_amax={learn}" in r and "amax=" in r and "mode=quantize" in r
    assert "strategy=channel" in repr(a[0].weight_quantizer) and "x (8,)" in repr(a[0].weight_quantizer)


# ---------------------------------------------------------------------------------------------------------
# Learnable amax: the operator's gradient against finite differences

def test_learnable_amax_gradient_matches_finite_differences(rng):
    # every input clipped: out = clamp -> +-amax exactly, so d out / d amax = sign(x) (narrow range)
    x = (rng.choice([-1, 1], 200) * (2 + rng.random(200))).astype(F32)
    w = rng.standard_normal(200).astype(F32)
    q = xqat.TensorQuantizer(num_bits=8, learn_amax=True, amax=1.25)
    xt = torch.from_numpy(x)
    (q(xt) * torch.from_numpy(w)).sum().backward()
    f = lambda a: float(np.sum(np_fake_quant(x, a).astype(np.float64) * w))  # noqa: E731
    h = 1e-3
    fd = (f(1.25 + h) - f(1.25 - h)) / (2 * h)
    assert abs(float(q.amax.grad) - fd) < 1e-3 * max(1, abs(fd))
    # a mixture: the operator's gradient is the clipped part only (PACT-style), the in-range part excluded
    x2 = (rng.standard_normal(300) * 1.5).astype(F32)
    q2 = xqat.TensorQuantizer(num_bits=8, learn_amax=True, amax=1.25)
    (q2(torch.from_numpy(x2)) * torch.from_numpy(w[:1].repeat(300))).sum().backward()
    clipped = np.abs(x2) > 1.25
    fd2 = (np.sum(np.where(clipped, np.sign(x2) * (1.25 + h), 0)) - np.sum(np.where(clipped, np.sign(x2) * (1.25 - h), 0))) / (2 * h) * w[0]
    assert abs(float(q2.amax.grad) - fd2) < 1e-3 * max(1, abs(fd2))


def test_weight_amax_gradient_matches_finite_differences(rng):
    wq = xqat.WeightQuantizer(num_bits=8, strategy="channel", learn_amax=True)
    w = torch.from_numpy((rng.standard_normal((4, 16)) * 2).astype(F32))
    amax = torch.tensor([1.0, 1.5, 0.5, 3.0])
    wq.set_amax(amax)
    g = torch.from_numpy(rng.standard_normal((4, 16)).astype(F32))
    (wq(w) * g).sum().backward()
    clipped = (w.abs() > amax[:, None]).float()
    want = (g * clipped * w.sign()).sum(dim=1)  # d(+-amax)/d amax on the clipped elements
    assert torch.allclose(wq.amax.grad, want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# The weight quantizer: the compressed-tensors rule, recomputed in NumPy (docs/cli.md "The numbers")

def np_weight_fq(w32, amax, bits, g, sdt):
    n, k = w32.shape
    qmax = F32(7 if bits == 4 else 127)
    wg = w32.reshape(-1, g)
    a = amax.reshape(-1).astype(F32)
    s = (a / qmax).astype(F32)
    s = np.where(a == 0, F32(1), np.where(s < np.finfo(F32).tiny, np.finfo(F32).tiny, s)).astype(F32)
    s = torch.from_numpy(s).to(sdt)
    if sdt == torch.float16:
        s = torch.where(s == 0, torch.tensor(2.0 ** -24, dtype=sdt), s)
    s = s.float().numpy()
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        v = (wg / s[:, None]).astype(F32) if bits == 8 else (wg * (F32(1) / s)[:, None]).astype(F32)
    q = np.clip(np.rint(v), -8 if bits == 4 else -128, 7 if bits == 4 else 127)
    q = np.where(np.isnan(v), 0, q).astype(np.int32).astype(F32)  # integers: no -0 (the loader's q * s')
    return torch.from_numpy((q * s[:, None]).astype(F32).reshape(n, k)).to(sdt), q.reshape(n, k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bits,strategy", [(4, "group"), (4, "channel"), (8, "group"), (8, "channel"), (8, "tensor")])
def test_weight_quantizer_is_the_compressed_tensors_rule(rng, dtype, bits, strategy):
    w = torch.from_numpy((rng.standard_normal((6, 64)) * 0.05).astype(F32)).to(dtype)
    w[1] = 0  # an all-zero row: scale 1
    w[2, :8] = 1e-30 if dtype != torch.float16 else 0  # tiny values
    wq = xqat.WeightQuantizer(num_bits=bits, strategy=strategy, group_size=16)
    wq.calibrate_from(w)
    g = wq.group_of(w)
    a = w.float().reshape(-1, g).abs().amax(dim=1)
    assert torch.equal(wq.amax.reshape(-1), a)
    with torch.no_grad():  # a smaller amax (values saturate), not representable in float16: the scale is
        wq.amax.view(-1)[0] = 0.060002  # float16(0.060002 / qmax), not float16(float16(0.060002) / qmax)
    want, q = np_weight_fq(w.float().numpy(), wq.amax.numpy(), bits, g, dtype)
    got = wq(w)
    bits_of = lambda t: t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)  # noqa: E731
    assert got.dtype == dtype and torch.equal(bits_of(got), bits_of(want))  # bit for bit (+0, never -0)
    assert torch.equal(wq.integers(w).float(), torch.from_numpy(q))


def test_weight_quantizer_refuses_overflowing_scales():
    wq = xqat.WeightQuantizer(num_bits=4, strategy="channel")
    wq.qname = "fc.weight_quantizer"
    w = torch.ones(2, 8, dtype=torch.float16)
    wq.set_amax(torch.tensor([1.0, 70000.0 * 7]))  # scale 70000 > 65504
    with pytest.raises(ValueError, match=r"fc\.weight_quantizer: amax up to 490000.0 gives a scale that overflows torch.float16"):
        wq(w)
    with pytest.raises(ValueError, match="amax has 1 value"):
        wq.set_amax(torch.tensor([1.0, float("nan")]))


def test_dynamic_quantizer_is_per_token_int8(rng):
    x = (rng.standard_normal((3, 5, 32)) * 2).astype(F32)
    x[0, 1] = 0  # an all-zero token: scale 0, output 0
    q = xqat.DynamicQuantizer()
    xt = torch.from_numpy(x).requires_grad_()
    y = q(xt)
    s = (np.abs(x).max(axis=-1, keepdims=True) / F32(127)).astype(F32)
    with np.errstate(invalid="ignore", divide="ignore"):
        v = np.where(s == 0, 0, np.clip(np.rint((x / s).astype(F32)), -128, 127))
    assert torch.equal(y.detach(), torch.from_numpy((v.astype(F32) * s).astype(F32)))
    y.sum().backward()
    assert torch.equal(xt.grad, torch.ones_like(xt))  # straight through
    q.disable()
    assert q(xt) is xt


def test_per_axis_tensor_quantizer(rng):
    x = torch.from_numpy(rng.standard_normal((4, 6, 5)).astype(F32))
    q = xqat.TensorQuantizer(num_bits=6, axis=1, unsigned=True, narrow_range=False)
    q.enable_calib()
    q(x)
    q.load_calib_amax()
    q.enable_quant()
    from xquant.npu import npu_fake_tensor_quant_with_axis
    assert torch.equal(q(x), npu_fake_tensor_quant_with_axis(x, x.abs().amax(dim=(0, 2)), 1, 6, True, False))
    assert "axis=1" in repr(q) and "x (6,)" in repr(q)


def test_quant_modules_built_directly(rng):
    lin = xqat.QuantLinear(16, 8)  # W8A8: int8 per output channel, per-token activations
    assert lin.weight_quantizer.strategy == "channel" and isinstance(lin.input_quantizer, xqat.DynamicQuantizer)
    assert torch.equal(lin.weight_quantizer.amax, lin.weight.detach().abs().amax(dim=1))  # from the initial weight
    x = torch.randn(4, 16)
    assert torch.equal(lin(x), torch.nn.functional.linear(lin.input_quantizer(x), lin.quantized_weight(), lin.bias))
    conv = xqat.QuantConv2d(3, 4, 3, padding=1)
    assert conv.weight_quantizer.strategy == "channel" and isinstance(conv.input_quantizer, xqat.TensorQuantizer)
    with pytest.warns(UserWarning, match="dynamic per-token activations apply to Linear inputs"):
        m = xqat.prepare(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(16, 8)),
                         "W8A8")
    assert [n for n, _ in xqat.quant_modules(m)] == ["2"]


def test_summary_and_set_quantizer_mode():
    m = xqat.prepare(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)), "W8A8",
                     targets=["Linear"])
    text = xqat.summary(m)
    assert "0.weight_quantizer: WeightQuantizer(strategy=channel" in text and "2 quant modules, 4 quantizers" in text
    assert xqat.set_quantizer_mode(m, "disabled", "re:.*input_quantizer") == 2
    assert [q.mode for _, q in xqat.quantizers(m)] == ["disabled", "quantize", "disabled", "quantize"]
    with pytest.raises(ValueError, match="pattern 'nothing' matches no quantizer"):
        xqat.set_quantizer_mode(m, "quantize", "nothing")


# ---------------------------------------------------------------------------------------------------------
# ActsULQ and quant_loss

def test_actsulq_quantizer_and_quant_loss(rng):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    xqat.prepare(m, {"weights": {"num_bits": 8, "strategy": "channel"},
                     "input_activations": {"type": "actsulq", "num_bits": 4}})
    x = torch.randn(64, 8)
    with pytest.raises(RuntimeError, match=r"0\.input_quantizer has no clamp range"):
        m(x)
    xqat.calibrate(m, lambda mm: mm(x))
    q = m[0].input_quantizer
    assert float(q.clamp_min.detach()) == float(x.min()) and float(q.clamp_max.detach()) == float(x.max())
    y = m(x)
    from xquant.npu import acts_ulq
    want = acts_ulq(x, q.clamp_min.detach(), q.clamp_max.detach(), False, 4)[0]
    assert torch.equal(m[0].input_quantizer(x), want)
    ql = xqat.quant_loss(m)
    assert ql.requires_grad and float(ql.detach()) > 0 and q.clamped_loss is not None
    (y.square().mean() + ql).backward()
    assert q.clamp_min.grad is not None and q.clamp_max.grad is not None
    assert float(xqat.quant_loss(torch.nn.Linear(2, 2))) == 0.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", [{"num_bits": 8, "learn_amax": True}, {"dynamic": "token"}, {"type": "actsulq"}],
                         ids=["static", "dynamic", "actsulq"])
def test_half_precision_models_train(dtype, act):
    # regression: ActsULQ passed float32 clamps with bfloat16 / float16 activations (a TypeError)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 8)).to(dtype)
    xqat.prepare(m, {"weights": {"num_bits": 4, "strategy": "channel", "learn_amax": True}, "input_activations": act})
    x = torch.randn(4, 16, dtype=dtype)
    xqat.calibrate(m, lambda mm: mm(x))
    y = m(x)
    y.float().sum().backward()
    assert y.dtype == dtype and m[0].weight.grad.dtype == dtype and m[0].weight_quantizer.amax.grad is not None
    if act.get("type") == "actsulq":
        q = m[0].input_quantizer
        from xquant.npu import acts_ulq
        want = acts_ulq(x, q.clamp_min.detach().to(dtype), q.clamp_max.detach().to(dtype), False, 8)[0]
        assert torch.equal(q(x), want) and q.clamp_max.grad is not None


# ---------------------------------------------------------------------------------------------------------
# Targets, prepare, configs

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(16, 16)
        self.up_proj = torch.nn.Linear(16, 32)
        self.conv = torch.nn.Conv1d(4, 8, 3)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([Block(), Block()])
        self.lm_head = torch.nn.Linear(16, 10)


def test_match_modules_compressed_tensors_semantics():
    n = Net()
    names = lambda t, i=(): [k for k, _ in tg.match_modules(n, t, i)]  # noqa: E731
    assert names(["Linear"]) == ["layers.0.q_proj", "layers.0.up_proj", "layers.1.q_proj", "layers.1.up_proj", "lm_head"]
    assert names(["re:.*proj$"], ["re:layers\\.1\\."]) == ["layers.0.q_proj", "layers.0.up_proj"]
    assert names(["lm_head", "Conv1d"]) == ["layers.0.conv", "layers.1.conv", "lm_head"]
    with pytest.raises(ValueError, match=r"targets pattern 're:proj' matches no module"):
        names(["re:proj"])  # re.match anchors at the start of the name
    assert list(tg.match_modules(n, ["re:proj"], require_all=False)) == []
    with pytest.raises(ValueError, match=r"targets pattern 'Linaer' matches no module of Net"):
        names(["Linaer"])
    with pytest.raises(ValueError, match=r"ignore pattern 'head' matches no module"):
        names(["Linear"], ["head"])
    with pytest.raises(ValueError, match="is not a valid regular expression"):
        names(["re:("])
    with pytest.raises(TypeError, match="pattern 3 is a int but expected a str"):
        names([3])


def test_prepare_defaults_targets_ignore_and_misfits():
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        n = xqat.prepare(Net(), xqat.preset("W8A16", group_size=0))
    assert not rec
    qn = [k for k, _ in xqat.quant_modules(n)]
    assert qn == ["layers.0.q_proj", "layers.0.up_proj", "layers.0.conv", "layers.1.q_proj", "layers.1.up_proj",
                  "layers.1.conv"]  # lm_head dense by default, convolutions per channel
    assert type(n.layers[0].conv).__name__ == "QuantConv1d"
    with pytest.warns(UserWarning, match=r"'layers.0.q_proj' \(Linear, weight \[16, 16\]\) stays dense: input dimension 16 "
                                          r"is not divisible by the group size 128"):
        with pytest.raises(ValueError, match="no module of Net was quantized"):
            xqat.prepare(Net(), "W4A16", targets=["re:.*q_proj"], ignore=["layers.1.q_proj"])
    with pytest.raises(ValueError, match="stays dense"):
        xqat.prepare(Net(), "W4A16", targets=["Linear"], strict=True)
    n = xqat.prepare(Net(), xqat.preset("w4a16", group_size=16), targets=["Linear"], ignore=["re:layers\\.1"])
    assert [k for k, _ in xqat.quant_modules(n)] == ["layers.0.q_proj", "layers.0.up_proj", "lm_head"]
    with pytest.raises(ValueError, match="already a QuantLinear"):
        xqat.prepare(n, "W8A8", targets=["lm_head"])
    with pytest.raises(ValueError, match="match only modules that are not Linear"):
        xqat.prepare(Net(), "W8A8", targets=["re:layers\\.0$"])


def test_config_errors():
    with pytest.raises(ValueError, match=r"preset is 'W2A2' but expected one of \['W4A16', 'W8A16', 'W8A8'\]"):
        xqat.prepare(Net(), "W2A2")
    with pytest.raises(ValueError, match=r"config 'weights' has unknown keys \['bits'\]"):
        xqat.normalize_config({"weights": {"bits": 4}})
    with pytest.raises(ValueError, match="num_bits is 3 but expected 4 or 8"):
        xqat.normalize_config({"weights": {"num_bits": 3}})
    with pytest.raises(ValueError, match="group_size is 12 but expected a positive multiple of 8"):
        xqat.normalize_config({"weights": {"num_bits": 4, "strategy": "group", "group_size": 12}})
    with pytest.raises(ValueError, match=r"keys \['calibrator'\] do not apply"):
        xqat.normalize_config({"weights": {}, "input_activations": {"dynamic": "token", "calibrator": "mse"}})
    with pytest.raises(ValueError, match="group_size is 64 but W8A8 has one scale per output channel"):
        xqat.preset("W8A8", group_size=64)
    cfg = xqat.normalize_config("w8a8")
    assert cfg["weights"]["strategy"] == "channel" and cfg["input_activations"]["dynamic"] == "token"


# ---------------------------------------------------------------------------------------------------------
# torch.compile (no graph breaks) and torch.export

def _small_model():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 36, 8))
    xqat.prepare(m, {"weights": {"num_bits": 4, "strategy": "channel", "learn_amax": True},
                     "input_activations": {"num_bits": 8, "learn_amax": True}})
    x = torch.randn(16, 1, 8, 8)
    xqat.calibrate(m, lambda mm: mm(x))
    return m, x


@pytest.mark.parametrize("act", ["static", "dynamic", "actsulq"])
def test_compile_fullgraph_forward_and_backward(act):
    m, x = _small_model()
    if act != "static":
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
        a = {"dynamic": {"dynamic": "token"}, "actsulq": {"type": "actsulq"}}[act]
        xqat.prepare(m, {"weights": {"num_bits": 8, "strategy": "channel", "learn_amax": True}, "input_activations": a})
        x = torch.randn(8, 16)
        xqat.calibrate(m, lambda mm: mm(x))
    torch._dynamo.reset()
    cm = torch.compile(m, fullgraph=True, backend="aot_eager")
    y1 = cm(x)
    l1 = xqat.quant_loss(m)  # ActsULQ: the loss kept by the compiled forward, differentiable
    (y1.square().sum() + l1).backward()
    g1 = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    y0 = m(x)
    l0 = xqat.quant_loss(m)
    (y0.square().sum() + l0).backward()
    g0 = [p.grad.clone() for p in m.parameters()]
    assert torch.equal(y0, y1) and torch.equal(l0, l1) and (act != "actsulq" or float(l0.detach()) > 0)
    assert all(torch.equal(a, b) for a, b in zip(g0, g1))


def test_torch_export_of_a_prepared_model():
    m, x = _small_model()
    m.eval()
    ep = torch.export.export(m, (x,))
    assert torch.equal(ep.module()(x), m(x))
    assert "xquant" in str(ep.graph)
