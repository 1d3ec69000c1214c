"""xquant.set_backend / set_num_threads from Python: the SIMD + OpenMP kernels and the scalar reference
give identical bits, for 1 and 2 threads, through the Python layer."""

import pytest

pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (scripts/setup-python installs it)")

import numpy as np

import golden
import xquant
from golden import assert_same
from tutil import with_edges


@pytest.fixture
def restore_runtime():
    backend, threads = xquant.get_backend(), xquant.get_num_threads()
    yield
    xquant.set_backend(backend)
    xquant.set_num_threads(threads)


def _run_all(x, x16):
    outs = [xquant.npu_fake_tensor_quant(x, 2.0),
            xquant.npu_fake_tensor_quant_with_axis(x, np.full(64, 1.5, np.float32), 1)]
    outs += list(xquant.fake_tensor_quant_backward(x, x, np.float32([1.0])))
    outs.append(xquant.npu_quantize(x16, np.float32([0.3]), None, "qint8"))
    outs.append(xquant.npu_quantize(x, np.full(64, 2.0, np.float32), None, "quint4x2", -1, False))
    outs += list(xquant.npu_dynamic_quant_asymmetric(x))
    outs += list(xquant.npu_dynamic_quant_asymmetric(x16, dst_type="quint4x2", quant_mode="pertensor"))
    y, m0, m1, loss = xquant.acts_ulq(x, np.full((1, 64), -1.0, np.float32), np.float32(1.5))
    outs += [y, m0, m1, loss]
    outs += list(xquant.acts_ulq_backward(x, x.shape, np.full((1, 64), -1.0, np.float32),
                                          np.asarray(np.float32(1.5)), m0, m1, loss))
    tile = np.zeros(x.shape, np.int8)
    xquant.quant(tile, x, np.full((x.shape[0], 1), 3.0, np.float32))
    outs.append(tile)
    return outs


def test_backends_and_thread_counts_agree(rng, restore_runtime):
    x = with_edges(rng, 3000 * 64, np.float32).reshape(3000, 64)
    with np.errstate(over="ignore"):
        x16 = x.astype(np.float16)
    results = {}
    for backend, threads in (("reference", 1), ("cpu", 1), ("cpu", 2)):
        xquant.set_backend(backend)
        xquant.set_num_threads(threads)
        assert xquant.get_backend() == backend and xquant.get_num_threads() == threads
        results[(backend, threads)] = _run_all(x, x16)
    ref = results[("reference", 1)]
    for key, outs in results.items():
        for i, (a, b) in enumerate(zip(ref, outs)):
            assert_same(b, a, f"{key} output {i}")
    # and the reference equals the independent golden on one of them
    assert_same(ref[0], golden.fake_quant(x, np.float32(2.0)))


def test_runtime_arguments(restore_runtime):
    assert isinstance(xquant.simd_target(), str) and xquant.simd_target()
    with pytest.raises(ValueError, match=r"xquant::set_backend: backend is 'gpu' but expected 'cpu' or 'reference'"):
        xquant.set_backend("gpu")
    with pytest.raises(ValueError, match=r"xquant::set_num_threads: n is -1 but expected a thread count >= 1"):
        xquant.set_num_threads(-1)
    with pytest.raises(TypeError):
        xquant.set_num_threads(1.5)
