"""Errors: the C++ library's xquant::Error arrives as TypeError (dtype_mismatch) or ValueError (every other
code) with the library's message, the same for NumPy and torch inputs; wrong Python argument types are a
clear TypeError; nothing crashes and nothing is written on error."""

import pytest

pytest.importorskip("torch", reason="torch is not installed (scripts/setup-python installs it)")
pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (scripts/setup-python installs it)")

import re

import numpy as np
import torch

import xquant
from tutil import to_torch

f32 = np.float32


def both(fn, *args, **kw):
    """Calls fn with NumPy arguments and with the same arguments as torch tensors; returns both
    exceptions (they must be of the same type with the same message)."""
    conv = lambda a: to_torch(a) if isinstance(a, np.ndarray) else a  # noqa: E731
    errs = []
    for variant in (lambda a: a, conv):
        with pytest.raises((TypeError, ValueError)) as info:
            fn(*(variant(a) for a in args), **{k: variant(v) for k, v in kw.items()})
        errs.append(info.value)
    assert type(errs[0]) is type(errs[1]) and str(errs[0]) == str(errs[1]), (errs[0], errs[1])
    return errs[0]


def expect(exc, kind, message):
    assert type(exc) is kind, f"{type(exc).__name__}: {exc}"
    assert str(exc) == message, str(exc)


X = np.linspace(-2, 2, 24, dtype=f32).reshape(2, 3, 4)


# ---- C++ errors, same message ---------------------------------------------------------------------------------

def test_fake_quant_errors():
    expect(both(xquant.npu_fake_tensor_quant, X.astype(np.int8), np.array([1.0], f32)), TypeError,
           "xquant::fake_tensor_quant: inputs has dtype int8 but expected float32, float16 or bfloat16")
    expect(both(xquant.npu_fake_tensor_quant, X, np.array([1.0, 2.0], f32)), ValueError,
           "xquant::fake_tensor_quant: amax has shape [2] (2 elements) but expected exactly one element for "
           "per-tensor quantization")
    expect(both(xquant.npu_fake_tensor_quant, X, np.array([np.nan], f32)), ValueError,
           "xquant::fake_tensor_quant: amax[0] is nan but expected a finite value >= 0")
    expect(both(xquant.npu_fake_tensor_quant, X, np.array([1.0], f32), num_bits=33), ValueError,
           "xquant::fake_tensor_quant: num_bits is 33 but expected a value in [1, 32]")
    expect(both(xquant.npu_fake_tensor_quant_with_axis, X, np.ones(4, f32), 1), ValueError,
           "xquant::fake_tensor_quant_with_axis: amax has shape [4] but inputs has 3 channels on axis 1 "
           "(expected a 1-D amax of that length)")
    expect(both(xquant.npu_fake_tensor_quant_with_axis, X, np.ones(4, f32), 3), ValueError,
           "xquant::fake_tensor_quant_with_axis: axis is 3 but expected a value in [-3, 2] for a tensor of rank 3")
    expect(both(xquant.npu_fake_tensor_quant_with_axis, X, np.array([1.0, -1.0, 1.0], f32), 1), ValueError,
           "xquant::fake_tensor_quant_with_axis: amax[1] is -1 but expected a finite value >= 0")


def test_unsupported_array_dtypes():
    expect(both(xquant.npu_fake_tensor_quant, X.astype(np.float64), np.array([1.0], f32)), TypeError,
           "xquant::fake_tensor_quant: inputs has dtype float64 which xquant does not support "
           "(float32, float16, bfloat16, int8, uint8, int32, int64)")
    with pytest.raises(TypeError, match=r"inputs has dtype uint16 which xquant does not support"):
        xquant.npu_fake_tensor_quant(X.astype(np.uint16), 1.0)
    with pytest.raises(TypeError, match=r"inputs has dtype torch.uint16 which xquant does not support"):
        xquant.npu_fake_tensor_quant(torch.zeros(3, dtype=torch.uint16), 1.0)
    with pytest.raises(TypeError, match=r"xquant::acts_ulq: x has dtype bool"):
        xquant.acts_ulq(np.zeros(3, bool), 0.0, 1.0)


def test_quantize_errors():
    s = np.array([0.5], f32)
    expect(both(xquant.npu_quantize, X, s, None, "quint4x2", -1, True), ValueError,
           "xquant::quantize: dtype is quint4x2 but div_mode=true expects qint8, quint8 or qint32")
    expect(both(xquant.npu_quantize, X, np.ones(5, f32), None, "qint8", 1, True), ValueError,
           "xquant::quantize: scales has shape [5] but input has 3 channels on axis 1 (expected 1 or 3 elements)")
    expect(both(xquant.npu_quantize, X, s, None, "qint8", -3, False), ValueError,
           "xquant::quantize: axis is -3 but div_mode=false expects axis >= -2 (-2: the second-to-last dimension, "
           "> -2: the last one)")
    expect(both(xquant.npu_quantize, X[..., :3], s, None, "quint4x2", -1, False), ValueError,
           "xquant::quantize: input has shape [2, 3, 3] but dtype quint4x2 expects a last dimension divisible by 8 "
           "(eight int4 per int32)")
    expect(both(xquant.npu_quantize, X, s, np.array([1.0], np.float16), "qint8", -1, False), TypeError,
           "xquant::quantize: zero_points has dtype float16 but expected float32 (the dtype of scales)")


def test_quantize_dtype_argument():
    for bad in (torch.float32, "float32", np.float64):
        with pytest.raises(ValueError, match=r"^xquant::quantize: dtype is .* but expected one of torch.qint8"):
            xquant.npu_quantize(X, np.array([1.0], f32), None, bad)
    with pytest.raises(TypeError, match=r"^xquant::quantize: dtype is 8 but expected a torch dtype"):
        xquant.npu_quantize(X, np.array([1.0], f32), None, 8)
    # float8 is a QuantDType of dynamic quantization, not an output of npu_quantize (Ascend 950 only)
    for f8 in ("float8_e4m3fn", torch.float8_e5m2):
        with pytest.raises(ValueError, match=r"^xquant::quantize: dtype is float8_e.* but expected qint8, quint8, "
                                             r"qint32 or quint4x2 \(npu_quantize's float8"):
            xquant.npu_quantize(to_torch(X), torch.tensor([1.0]), None, f8, -1, False)
    # every accepted spelling
    want = xquant.npu_quantize(X, np.array([0.1], f32), None, "qint8")
    for d in (torch.qint8, torch.int8, np.int8, np.dtype(np.int8), "qint8", "int8", "torch.qint8"):
        assert np.array_equal(xquant.npu_quantize(X, np.array([0.1], f32), None, d), want)
        assert np.array_equal(xquant.npu_quantize(to_torch(X), torch.tensor([0.1]), None, d).numpy(), want)


def test_tile_quant_errors():
    src = np.ones((4, 8), f32)
    scale = np.ones((4, 1), f32)
    expect(both(xquant.quant, np.zeros((4, 8), np.int8), src, scale, "SYM", np.ones((4, 1), f32)), ValueError,
           "xquant::tile_quant: offset is given but mode SYM takes no offset")
    expect(both(xquant.quant, np.zeros((4, 8), np.uint8), src, scale, "ASYM"), ValueError,
           "xquant::tile_quant: offset is missing but mode ASYM requires it")
    expect(both(xquant.quant, np.zeros((4, 8), np.uint8), src, scale, "SYM"), TypeError,
           "xquant::tile_quant: out has dtype uint8 but expected int8")
    expect(both(xquant.quant, np.zeros((4, 8), np.int8), src, np.ones((3, 1), f32)), ValueError,
           "xquant::tile_quant: scale has valid shape [3, 1] but expected [4, 1] (one value per row of src)")
    expect(both(xquant.quant, np.zeros((4, 8), np.int8), src, np.ones(4, f32)), ValueError,
           "xquant::tile_quant: scale has shape [4] but expected a 2-D tile")
    with pytest.raises(ValueError, match=r"^xquant::tile_quant: mode is 'BOTH' but expected 'SYM' or 'ASYM'$"):
        xquant.quant(np.zeros((4, 8), np.int8), src, scale, "BOTH")
    with pytest.raises(ValueError, match="overlaps"):  # the library detects aliasing
        buf = np.zeros(64, f32)
        xquant.quant(buf.view(np.int8)[:32].reshape(4, 8), buf[:32].reshape(4, 8), scale)


def test_dynamic_quant_errors():
    x = np.ones((4, 16), f32)
    expect(both(xquant.npu_dynamic_quant_asymmetric, np.ones(16, f32)), ValueError,
           "xquant::dynamic_quant_asymmetric: x has shape [16] (rank 1) but expected rank >= 2")
    expect(both(xquant.npu_dynamic_quant_asymmetric, x, smooth_scales=np.ones(16, f32), quant_mode="pertensor"),
           ValueError, "xquant::dynamic_quant_asymmetric: quant_mode is pertensor with smooth_scales but expected "
           "pertoken (smooth_scales supports only pertoken)")
    expect(both(xquant.npu_dynamic_quant_asymmetric, x, smooth_scales=np.ones((2, 16), f32),
                group_index=np.array([1, 3], np.int32)), ValueError,
           "xquant::dynamic_quant_asymmetric: group_index[1] is 3 but expected 4 (S, the number of rows of x: the "
           "last row end covers every row)")
    expect(both(xquant.npu_dynamic_quant_asymmetric, x, smooth_scales=np.ones((2, 16), f32),
                group_index=np.array([1, 4], np.float32)), TypeError,
           "xquant::dynamic_quant_asymmetric: group_index has dtype float32 but expected int32 or int64")
    expect(both(xquant.npu_dynamic_quant_asymmetric, x, dst_type="quint8"), ValueError,
           "xquant::dynamic_quant_asymmetric: dst_type is quint8 but expected qint8, quint4x2, float8_e4m3fn or "
           "float8_e5m2")
    with pytest.raises(ValueError, match=r"quant_mode is 'pertoken2' but expected 'pertoken', 'pertensor' or "
                                         r"'perchannel'"):
        xquant.npu_dynamic_quant_asymmetric(x, quant_mode="pertoken2")
    with pytest.raises(TypeError):  # keyword-only, as in torch_npu
        xquant.npu_dynamic_quant_asymmetric(x, np.ones(16, f32))


def test_acts_ulq_errors():
    expect(both(xquant.acts_ulq, np.ones((2, 3), f32), np.ones((4,), f32), np.ones((1,), f32)), ValueError,
           "xquant::acts_ulq: clamp_min has shape [4] which does not broadcast with x's shape [2, 3]")
    expect(both(xquant.acts_ulq, np.ones((2, 3), f32), np.ones((1,), np.float16), np.ones((1,), f32)), TypeError,
           "xquant::acts_ulq: clamp_min has dtype float16 but expected float32")
    expect(both(xquant.acts_ulq, np.ones((2, 3), f32), np.zeros(1, f32), np.ones(1, f32), num_bits=1), ValueError,
           "xquant::acts_ulq: num_bits is 1 but expected a value in [2, 16]")
    expect(both(xquant.acts_ulq, np.ones((1,) * 9, f32), np.zeros(1, f32), np.ones(1, f32)), ValueError,
           "xquant::acts_ulq: x has shape [1, 1, 1, 1, 1, 1, 1, 1, 1] of rank 9 but expected a rank of at most 8")


# ---- Python argument types -------------------------------------------------------------------------------------

@pytest.mark.parametrize("call,message", [
    (lambda: xquant.npu_fake_tensor_quant([1.0, 2.0], 1.0),
     "xquant::fake_tensor_quant: inputs is [1.0, 2.0] (builtins.list) but expected a numpy.ndarray or a torch.Tensor"),
    (lambda: xquant.npu_fake_tensor_quant(X, 1.0, num_bits="8"),
     "xquant::fake_tensor_quant: num_bits is '8' but expected an int"),
    (lambda: xquant.npu_fake_tensor_quant(X, 1.0, num_bits=8.0),
     "xquant::fake_tensor_quant: num_bits is 8.0 but expected an int"),
    (lambda: xquant.npu_fake_tensor_quant(X, 1.0, 8, 1),
     "xquant::fake_tensor_quant: is_unsigned is 1 but expected a bool"),
    (lambda: xquant.npu_fake_tensor_quant(X, "1.0"),
     "xquant::fake_tensor_quant: amax is '1.0' but expected a numpy.ndarray (the kind of the main input)"),
    (lambda: xquant.npu_fake_tensor_quant(X, torch.tensor([1.0])),
     "xquant::fake_tensor_quant: amax is tensor([1.]) (torch.Tensor) but expected a numpy.ndarray (the kind of the "
     "main input)"),
    (lambda: xquant.npu_fake_tensor_quant(torch.ones(3), np.ones(1, f32)),
     "xquant::fake_tensor_quant: amax is array([1.], dtype=float32) (numpy.ndarray) but expected a torch.Tensor "
     "(the kind of the main input)"),
    (lambda: xquant.npu_fake_tensor_quant_with_axis(X, np.ones(3, f32), None),
     "xquant::fake_tensor_quant_with_axis: axis is None but expected an int"),
    (lambda: xquant.quant(np.zeros((4, 8), np.int8), np.ones((4, 8), f32), np.ones((4, 1), f32), 0),
     "xquant::tile_quant: mode is 0 but expected 'SYM', 'ASYM' or xquant.QuantMode"),
    (lambda: xquant.npu_dynamic_quant_asymmetric(np.ones((2, 8), f32), quant_mode=None),
     "xquant::dynamic_quant_asymmetric: quant_mode is None but expected 'pertoken', 'pertensor' or 'perchannel'"),
    (lambda: xquant.acts_ulq(np.ones(3, f32), 0.0, 1.0, fixed_min="yes"),
     "xquant::acts_ulq: fixed_min is 'yes' but expected a bool"),
    (lambda: xquant.acts_ulq_backward(np.ones(3, f32), 3, np.zeros(1, f32), np.ones(1, f32), np.ones(3, f32),
                                      np.ones(3, f32), np.zeros(3, f32)),
     "xquant::acts_ulq_backward: x_shape is 3 but expected a sequence of ints"),
])
def test_python_argument_types(call, message):
    with pytest.raises(TypeError) as info:
        call()
    assert str(info.value) == message


def test_out_of_range_integers_do_not_crash():
    with pytest.raises(ValueError, match=r"num_bits is 1099511627776 which does not fit in 32 bits"):
        xquant.npu_fake_tensor_quant(X, 1.0, num_bits=2**40)
    with pytest.raises(ValueError, match=r"axis is 1180591620717411303424 which does not fit in 64 bits"):
        xquant.npu_fake_tensor_quant_with_axis(X, np.ones(3, f32), 2**70)
    with pytest.raises(ValueError, match=re.escape("axis is -9223372036854775808 but expected a value in [-3, 2]")):
        xquant.npu_fake_tensor_quant_with_axis(X, np.ones(3, f32), -2**63)


def test_nothing_is_written_on_error():
    x = X.copy()
    with pytest.raises(ValueError):
        xquant.npu_fake_tensor_quant_inplace(x, np.array([-1.0], f32))
    assert np.array_equal(x, X)
    t = to_torch(X)
    with pytest.raises(ValueError):
        xquant.npu_fake_tensor_quant_inplace(t, torch.tensor([1.0]), num_bits=0)
    assert np.array_equal(t.numpy(), X)
    out = np.full((4, 8), 7, np.int8)
    with pytest.raises(ValueError):
        xquant.quant(out, np.ones((4, 8), f32), np.ones((3, 1), f32))
    assert np.all(out == 7)


def test_inplace_refuses_tensors_that_require_grad():
    p = torch.randn(4, requires_grad=True)
    for t in (p, p * 2):
        with pytest.raises(ValueError, match="inputs requires grad but the in-place fake quantization has no autograd"):
            xquant.npu_fake_tensor_quant_inplace(t, 1.0)
    with torch.no_grad():
        before = p.clone()
        assert xquant.npu_fake_tensor_quant_inplace(p, 1.0) is p
        assert torch.equal(p, xquant.npu_fake_tensor_quant(before, 1.0))


def test_meta_tensors_infer_shapes():
    """Meta tensors run the fake implementations: shapes and dtypes without data."""
    x = torch.empty(4, 6, 16, device="meta")
    assert xquant.npu_quantize(x, torch.empty(16, device="meta"), None, torch.quint4x2, -1, False).shape == (4, 6, 2)
    y, s, o = xquant.npu_dynamic_quant_asymmetric(x)
    assert (y.dtype, y.shape, s.shape, o.device.type) == (torch.int8, (4, 6, 16), (4, 6), "meta")
    assert xquant.acts_ulq(x, torch.empty(6, 1, device="meta"), torch.empty(16, device="meta"))[3].shape == (4, 6, 16)


def test_torch_ops_called_directly_validate_too():
    with pytest.raises(ValueError, match="amax has shape"):
        torch.ops.xquant.fake_tensor_quant(torch.ones(3), torch.ones(2))
    with pytest.raises(ValueError, match=r"xquant::quantize: dtype is torch.float32 but expected one of"):
        torch.ops.xquant.quantize(torch.ones(3), torch.ones(1), None, torch.float32)
    with pytest.raises(ValueError, match="not contiguous"):
        torch.ops.xquant.fake_tensor_quant_inplace(torch.ones(4, 4).t(), torch.ones(1))


# ---- inputs that are not plain arrays / tensors (issue #11): clean TypeError / ValueError naming the argument ----

_UNSUPPORTED = "which xquant does not support (float32, float16, bfloat16, int8, uint8, int32, int64)"


def test_object_dtype_arrays():
    with pytest.raises(TypeError) as info:
        xquant.npu_fake_tensor_quant(np.array([1.0, 2.0], dtype=object), 1.0)
    assert str(info.value) == f"xquant::fake_tensor_quant: inputs has dtype object {_UNSUPPORTED}"
    with pytest.raises(TypeError) as info:
        xquant.npu_fake_tensor_quant(X, np.array([1.0], dtype=object))
    assert str(info.value) == f"xquant::fake_tensor_quant: amax has dtype object {_UNSUPPORTED}"
    with pytest.raises(TypeError, match=r"^xquant::quantize: scales has dtype object"):
        xquant.npu_quantize(X, np.array([0.5], dtype=object), None, "qint8")
    with pytest.raises(TypeError, match=r"^xquant::tile_quant: src has dtype object"):
        xquant.quant(np.zeros((2, 4), np.int8), np.ones((2, 4), dtype=object), np.ones((2, 1), f32))


def test_structured_and_big_endian_arrays():
    rec = np.zeros(3, dtype=[("a", np.float32)])
    with pytest.raises(TypeError, match=r"^xquant::fake_tensor_quant: inputs has dtype \[\('a', '<f4'\)\] which xquant"):
        xquant.npu_fake_tensor_quant(rec, 1.0)
    # big-endian float32 is supported (converted), big-endian float64 is not (named in native order)
    assert np.array_equal(xquant.npu_fake_tensor_quant(X.astype(">f4"), 1.0), xquant.npu_fake_tensor_quant(X, 1.0))
    with pytest.raises(TypeError, match=rf"^xquant::fake_tensor_quant: inputs has dtype float64 {re.escape(_UNSUPPORTED)}"):
        xquant.npu_fake_tensor_quant(X.astype(">f8"), 1.0)


@pytest.mark.parametrize("dtype", [np.float32, "bfloat16"])
def test_masked_arrays_are_refused_not_silently_unmasked(dtype):
    import ml_dtypes

    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    m = np.ma.masked_array(np.ones(4, dt), mask=[0, 1, 0, 0])
    msg = ("is a masked array (numpy.ma.MaskedArray) but expected a plain numpy.ndarray (xquant has no masked "
           "semantics: pass a.filled(value) or a.data explicitly)")
    with pytest.raises(TypeError) as info:
        xquant.npu_fake_tensor_quant(m, 1.0)
    assert str(info.value) == f"xquant::fake_tensor_quant: inputs {msg}"
    with pytest.raises(TypeError) as info:
        xquant.npu_fake_tensor_quant(np.ones(4, dt), np.ma.masked_array(np.ones(1, np.float32)))
    assert str(info.value) == f"xquant::fake_tensor_quant: amax {msg}"
    with pytest.raises(TypeError, match="x is a masked array"):
        xquant.npu_dynamic_quant_asymmetric(np.ma.masked_array(np.ones((2, 8), dt)))


def test_torch_quantized_tensors():
    with _no_warning_check():
        q = torch.quantize_per_tensor(torch.ones(4), 0.1, 0, torch.qint8)
    msg = ("is a quantized tensor (dtype torch.qint8) but expected a float or integer tensor (call .dequantize() or "
           ".int_repr() first)")
    with pytest.raises(TypeError) as info:
        xquant.npu_fake_tensor_quant(q, 1.0)
    assert str(info.value) == f"xquant::fake_tensor_quant: inputs {msg}"
    with pytest.raises(TypeError) as info:
        xquant.npu_quantize(torch.ones(4), q, None, torch.qint8)
    assert str(info.value) == f"xquant::quantize: scales {msg}"


class _no_warning_check:  # quantize_per_tensor warns about deprecation on recent PyTorch releases
    def __enter__(self):
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc):
        return self._w.__exit__(*exc)


@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr"])
def test_torch_sparse_tensors(layout):
    dense = torch.ones(2, 4)
    with _no_warning_check():  # CSR support is "beta"
        sp = dense.to_sparse() if layout == "sparse_coo" else dense.to_sparse_csr()
    tail = f"is a sparse tensor (layout torch.{layout}) but expected a dense strided tensor (call .to_dense() first)"
    with pytest.raises(TypeError) as info:
        xquant.npu_fake_tensor_quant(sp, 1.0)
    assert str(info.value) == f"xquant::fake_tensor_quant: inputs {tail}"
    with pytest.raises(TypeError) as info:
        torch.ops.xquant.fake_tensor_quant(sp, torch.ones(1))
    assert str(info.value) == f"xquant::fake_tensor_quant: inputs {tail}"
    with pytest.raises(TypeError) as info:
        xquant.acts_ulq(sp, -1.0, 1.0)
    assert str(info.value) == f"xquant::acts_ulq: x {tail}"
    with pytest.raises(TypeError) as info:
        xquant.npu_quantize(dense, torch.ones(4).to_sparse(), None, torch.qint8, -1)
    assert str(info.value) == "xquant::quantize: scales is a sparse tensor (layout torch.sparse_coo) but expected a " \
                              "dense strided tensor (call .to_dense() first)"


def test_torch_nested_tensors():
    with _no_warning_check():
        nt = torch.nested.nested_tensor([torch.ones(3), torch.ones(2)])
    with pytest.raises(TypeError) as info:
        xquant.npu_fake_tensor_quant(nt, 1.0)
    assert str(info.value) == "xquant::fake_tensor_quant: inputs is a nested tensor but expected a dense strided tensor"


def _neg_view(t: torch.Tensor) -> torch.Tensor:
    """A real tensor whose neg bit is set (the imaginary part of a conjugate view): its memory holds -t."""
    c = torch.complex(torch.zeros_like(t), -t).conj()
    v = c.imag
    assert v.is_neg() and torch.equal(v, t)
    return v


def test_negative_views_are_materialized():
    x = torch.linspace(-2, 2, 24).reshape(2, 3, 4)
    n = _neg_view(x)
    s = torch.tensor([0.05])
    assert torch.equal(xquant.npu_fake_tensor_quant(n, 1.5), xquant.npu_fake_tensor_quant(x, 1.5))
    assert torch.equal(xquant.npu_fake_tensor_quant_with_axis(n, torch.ones(3), 1),
                       xquant.npu_fake_tensor_quant_with_axis(x, torch.ones(3), 1))
    assert torch.equal(xquant.npu_quantize(n, s, None, torch.qint8), xquant.npu_quantize(x, s, None, torch.qint8))
    assert torch.equal(xquant.npu_quantize(x, _neg_view(s), None, torch.qint8), xquant.npu_quantize(x, s, None, torch.qint8))
    for a, b in zip(xquant.acts_ulq(n, -1.0, 1.0), xquant.acts_ulq(x, -1.0, 1.0)):
        assert torch.equal(a, b)
    for a, b in zip(xquant.npu_dynamic_quant_asymmetric(n), xquant.npu_dynamic_quant_asymmetric(x)):
        assert torch.equal(a, b)
    out_a, out_b = torch.zeros(6, 4, dtype=torch.int8), torch.zeros(6, 4, dtype=torch.int8)
    xquant.quant(out_a, n.reshape(6, 4), _neg_view(torch.full((6, 1), 3.0)))
    xquant.quant(out_b, x.reshape(6, 4), torch.full((6, 1), 3.0))
    assert torch.equal(out_a, out_b)


def test_inplace_refuses_negative_views():
    x = torch.linspace(-2, 2, 8)
    n = torch._neg_view(-x)  # contiguous, neg bit set: its memory holds -n
    assert n.is_neg() and n.is_contiguous() and torch.equal(n, x)
    with pytest.raises(ValueError) as info:
        xquant.npu_fake_tensor_quant_inplace(n, 1.0)
    assert str(info.value) == (
        "xquant::fake_tensor_quant_inplace: inputs is a negative view (its memory holds transformed values); an "
        "in-place call cannot write through it (call .resolve_neg() / .resolve_conj() first and use the result)")
    assert torch.equal(n, x)  # untouched


def test_set_num_threads_limit():
    before = xquant.get_num_threads()
    with pytest.raises(ValueError) as info:
        xquant.set_num_threads(2**31 - 1)
    assert str(info.value) == ("xquant::set_num_threads: n is 2147483647 but expected a thread count of at most 1024 "
                               "(xquant's limit), >= 1, or 0 for the default")
    with pytest.raises(ValueError, match="n is 1025 but expected a thread count of at most 1024"):
        xquant.set_num_threads(1025)
    assert xquant.get_num_threads() == before
    xquant.set_num_threads(1024)  # the limit itself is accepted
    assert xquant.get_num_threads() == 1024
    xquant.set_num_threads(0)
