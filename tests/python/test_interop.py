"""Arrays in, same kind out: NumPy and torch give identical bits, zero-copy for dense inputs, non-contiguous
inputs made contiguous, in-place really in place, bfloat16 through ml_dtypes, the GIL released."""

import pytest

pytest.importorskip("torch", reason="torch is not installed (scripts/setup-python installs it)")
pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (scripts/setup-python installs it)")

import sys
import threading
import time
import tracemalloc

import numpy as np
import torch

import golden
import xquant
from xquant import _core
from golden import BF16, assert_same
from tutil import NP_DTYPES, TORCH_OF, to_numpy, to_torch, with_edges

DT_IDS = ["f32", "f16", "bf16"]


def _all_ops(x_np_or_t, lib):
    """Every operator on one input; returns a flat list of outputs."""
    is_t = isinstance(x_np_or_t, torch.Tensor)
    arr = (lambda a: to_torch(np.asarray(a))) if is_t else (lambda a: np.asarray(a))
    x = x_np_or_t  # [8, 16]
    outs = [lib.npu_fake_tensor_quant(x, arr(np.array([2.0], np.float32)), 6),
            lib.npu_fake_tensor_quant_with_axis(x, arr(np.linspace(0.5, 3, 16, dtype=np.float32).astype(np.float16)
                                                    .astype(np.float32)), 1, 8, True)]  # float16-exact amax
    outs.append(lib.npu_quantize(x, arr(np.float32([0.25])), None, "qint8"))
    outs.append(lib.npu_quantize(x, arr(np.full(16, 1.5, np.float32)), arr(np.zeros(16, np.float32)), "quint4x2", -1,
                                 False))
    outs += list(lib.npu_dynamic_quant_asymmetric(x))
    outs += list(lib.npu_dynamic_quant_asymmetric(x, dst_type="quint4x2", quant_mode="pertensor"))
    outs += list(lib.acts_ulq(x, -1.0, 1.5))
    src = arr(np.linspace(-40, 40, 128, dtype=np.float32).reshape(8, 16))
    tile = arr(np.zeros((8, 16), np.int8))
    lib.quant(tile, src, arr(np.full((8, 1), 1.25, np.float32)))
    outs.append(tile)
    return outs


@pytest.mark.parametrize("dtype", NP_DTYPES, ids=DT_IDS)
def test_numpy_and_torch_identical_bits(rng, dtype):
    x = with_edges(rng, 128, dtype).reshape(8, 16)
    np_outs = _all_ops(x, xquant)
    t_outs = _all_ops(to_torch(x), xquant)
    assert len(np_outs) == len(t_outs)
    for i, (a, b) in enumerate(zip(np_outs, t_outs)):
        assert isinstance(a, np.ndarray) and isinstance(b, torch.Tensor)
        assert_same(a, to_numpy(b), f"output {i}")


@pytest.mark.parametrize("dtype", NP_DTYPES, ids=DT_IDS)
def test_output_dtypes_follow_the_input(dtype):
    x = np.ones((2, 8), dtype=dtype)
    assert xquant.npu_fake_tensor_quant(x, 1.0).dtype == dtype
    assert all(o.dtype == dtype for o in xquant.acts_ulq(x, 0.0, 1.0))
    t = to_torch(x)
    assert xquant.npu_fake_tensor_quant(t, 1.0).dtype == TORCH_OF[dtype]
    assert xquant.npu_quantize(t, torch.tensor([1.0]), None, torch.quint8).dtype == torch.uint8
    assert xquant.npu_quantize(t, torch.tensor([1.0]), None, torch.qint32).dtype == torch.int32
    assert xquant.npu_quantize(x, np.float32([1.0]), None, np.int32).dtype == np.int32


def test_zero_copy_for_dense_numpy_inputs():
    """tracemalloc sees NumPy's allocations: a dense input costs only the output, a strided one a copy too."""
    x = np.ones((2048, 1024), np.float32)  # 8 MiB
    nbytes = x.nbytes
    amax = np.float32([1.0])
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        out = xquant.npu_fake_tensor_quant(x, amax)
        _, peak_dense = tracemalloc.get_traced_memory()
        del out
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        out = xquant.npu_fake_tensor_quant(x.T, amax)  # non-contiguous: copied once
        _, peak_strided = tracemalloc.get_traced_memory()
        del out
    finally:
        tracemalloc.stop()
    assert peak_dense < 1.25 * nbytes
    assert peak_strided - base > 1.75 * nbytes


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_non_contiguous_inputs_are_made_contiguous(rng, kind):
    base = with_edges(rng, 24 * 32, np.float32).reshape(24, 32)
    views = [base.T, base[::2, 1::3], base[:, ::-1]]
    for v in views:
        dense = np.ascontiguousarray(v)
        if kind == "numpy":
            assert_same(xquant.npu_fake_tensor_quant(v, 2.0), xquant.npu_fake_tensor_quant(dense, 2.0))
            got = xquant.acts_ulq(v, -1.0, 1.0)
            for a, b in zip(got, xquant.acts_ulq(dense, -1.0, 1.0)):
                assert_same(a, b)
        else:
            tb = torch.from_numpy(base.copy())
            tv = {0: tb.t(), 1: tb[::2, 1::3], 2: tb.flip(1)}[[id(u) for u in views].index(id(v))]
            assert not tv.is_contiguous() or tv.data_ptr() != tb.data_ptr()
            assert_same(to_numpy(xquant.npu_fake_tensor_quant(tv, 2.0)), xquant.npu_fake_tensor_quant(dense, 2.0))
    # per-axis on a transposed tensor: the axis refers to the view's dimensions
    wt = torch.from_numpy(base.copy()).t()  # [32, 24]
    amax = torch.linspace(0.5, 4, 32)
    assert_same(to_numpy(xquant.npu_fake_tensor_quant_with_axis(wt, amax, 0)),
                to_numpy(xquant.npu_fake_tensor_quant_with_axis(wt.contiguous(), amax, 0)))


def test_inplace_is_in_place_torch():
    x = torch.randn(64, 33)
    want = xquant.npu_fake_tensor_quant(x, 1.5, 4)
    ptr = x.data_ptr()
    ret = xquant.npu_fake_tensor_quant_inplace(x, 1.5, 4)
    assert ret is x and x.data_ptr() == ptr
    assert torch.equal(x, want)
    # a contiguous view into a larger tensor: only that slice changes
    big = torch.randn(10, 33)
    before = big.clone()
    xquant.npu_fake_tensor_quant_inplace(big[2:5], 1.5, 4)
    assert torch.equal(big[2:5], xquant.npu_fake_tensor_quant(before[2:5], 1.5, 4))
    assert torch.equal(big[:2], before[:2]) and torch.equal(big[5:], before[5:])


@pytest.mark.parametrize("dtype", NP_DTYPES, ids=DT_IDS)
def test_inplace_is_in_place_numpy(dtype):
    x = np.linspace(-3, 3, 100, dtype=np.float32).astype(dtype)
    want = xquant.npu_fake_tensor_quant(x, 2.0)
    addr = x.__array_interface__["data"][0]
    ret = xquant.npu_fake_tensor_quant_inplace(x, 2.0)
    assert ret is x and x.__array_interface__["data"][0] == addr and x.dtype == dtype
    assert_same(x, want)


def test_inplace_non_contiguous_raises_and_leaves_input():
    t = torch.randn(8, 6)
    before = t.clone()
    with pytest.raises(ValueError, match="not contiguous"):
        xquant.npu_fake_tensor_quant_inplace(t.t(), 1.0)
    assert torch.equal(t, before)
    a = np.arange(48, dtype=np.float32).reshape(8, 6)
    with pytest.raises(ValueError, match="not a dense"):
        xquant.npu_fake_tensor_quant_inplace(a[:, ::2], 10.0)
    ro = a.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        xquant.npu_fake_tensor_quant_inplace(ro, 10.0)
    with pytest.raises(ValueError, match="column stride|unit column stride"):
        xquant.quant(np.zeros((6, 8), np.int8).T, a, np.ones((8, 1), np.float32))


def test_bfloat16_numpy_through_ml_dtypes():
    x = np.linspace(-2, 2, 64, dtype=np.float32).astype(BF16).reshape(4, 16)
    y = xquant.npu_fake_tensor_quant(x, np.array(1.5, dtype=BF16), 4)
    assert y.dtype == BF16
    assert_same(y, golden.fake_quant(x, np.array(1.5, dtype=BF16), None, 4))
    assert_same(y, to_numpy(xquant.npu_fake_tensor_quant(to_torch(x), to_torch(np.array(1.5, dtype=BF16)), 4)))
    q = xquant.npu_quantize(x, np.array([0.5], dtype=BF16), None, "quint4x2", -1, False)
    assert q.dtype == np.int32 and q.shape == (4, 2)


def test_parameters_as_numbers_and_parameters():
    x = torch.randn(5, 4)
    a = xquant.npu_fake_tensor_quant(x, 2.0)
    assert torch.equal(a, xquant.npu_fake_tensor_quant(x, torch.tensor([2.0])))
    assert torch.equal(a, xquant.npu_fake_tensor_quant(x, np.float32(2.0)))
    p = torch.nn.Parameter(torch.randn(5, 4))
    out = xquant.npu_fake_tensor_quant(p, 2.0)
    assert out.requires_grad and isinstance(out, torch.Tensor) and not isinstance(out, torch.nn.Parameter)
    y = xquant.acts_ulq(x.half(), -1, 1)[0]
    assert y.dtype == torch.float16


def test_inference_tensors_and_no_grad():
    with torch.inference_mode():
        x = torch.randn(4, 8)
        y = xquant.npu_fake_tensor_quant(x, 1.0)
        assert y.is_inference()
    with torch.no_grad():
        x = torch.randn(4, 8, requires_grad=True)
        assert not xquant.acts_ulq(x, -1.0, 1.0)[0].requires_grad


def test_gil_is_released_while_kernels_run():
    """With the interpreter's forced thread switches disabled (switch interval 100 s), a spinning Python
    thread can only run when the main thread releases the GIL. Around a bare C++ call it does run; around a
    pure-Python computation of similar length it does not (the control, showing the test can fail)."""
    x = np.random.default_rng(0).standard_normal(1 << 22).astype(np.float32)
    out = np.empty_like(x)
    amax = np.float32([1.0])
    counter = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            counter[0] += 1
            time.sleep(0)  # releases the GIL, so the main thread gets it back at once

    old = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    th = threading.Thread(target=spin)
    try:
        th.start()
        during_python = 0
        for _ in range(3):
            before = counter[0]
            sum(range(200_000))
            during_python += counter[0] - before
        during_cpp = 0
        for _ in range(50):
            before = counter[0]
            _core.fake_tensor_quant(out, x, amax, None, 8, False, True)
            during_cpp += counter[0] - before
            if during_cpp:
                break
    finally:
        stop.set()
        th.join()
        sys.setswitchinterval(old)
    assert during_python == 0, "control: the spinning thread ran while the main thread held the GIL"
    assert during_cpp > 0, "the spinning thread never ran during the C++ calls: the GIL is not released"
