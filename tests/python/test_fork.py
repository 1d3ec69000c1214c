"""Fork safety (issue #17): after a parallel operator in the parent, a child made by fork() runs operators.

libgomp's thread pool does not survive fork(); before the fix every such child hung in its first parallel
operator (Python multiprocessing's 'fork' start method included). Now a forked child runs every operator on
its calling thread, with the parent's results bit for bit. Each child runs under a timeout so that a hang
fails the test instead of blocking the run.
"""

import multiprocessing
import os
import sys

import numpy as np
import pytest

import xquant

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork() start method: Linux only here")

TIMEOUT_S = 120  # a child finishes in well under a second; only a hang reaches this


def _numpy_results():
    # 2^20 float32 elements (4 MiB) per input: above the 2 MiB at which a call is split across threads.
    x = (np.arange(1 << 20, dtype=np.float32).reshape(1024, 1024) % 2001 - 1000) / np.float32(97)
    amax = np.array([8.0], np.float32)
    cols = (1 + np.arange(1024) % 13).astype(np.float32)
    out = [xquant.npu_fake_tensor_quant(x, amax)]
    out += list(xquant.fake_tensor_quant_backward(x, x, cols, axis=1))
    out += list(xquant.npu_dynamic_quant_asymmetric(x))
    out.append(xquant.npu_quantize(x, cols, None, "qint8", axis=1))
    y, min_mask, max_mask, loss = xquant.acts_ulq(x, np.array([-4.0], np.float32), np.array([5.0], np.float32))
    out += [y, *xquant.acts_ulq_backward(x, x.shape, np.array([-4.0], np.float32), np.array([5.0], np.float32),
                                         min_mask, max_mask, loss)]
    return [np.asarray(a).tobytes() for a in out]


def _torch_inputs():
    # Made in the parent: torch's own parallel operators (arange, %, the bfloat16 conversion on 2^20
    # elements) hang in a forked child just the same (torch's DataLoader workers call
    # torch.set_num_threads(1) for that); the child runs only xquant's operators on them.
    import torch

    x = (torch.arange(1 << 20, dtype=torch.float32).reshape(1024, 1024) % 2001 - 1000) / 97
    return x, x.to(torch.bfloat16), torch.tensor([8.0]), torch.ones(1024), torch.full((1024,), 0.5)


def _torch_results(inputs):
    import torch

    x, xb, amax, ones, half = inputs
    out = [xquant.npu_fake_tensor_quant(x, amax)]
    out += list(xquant.npu_dynamic_quant(xb))
    q = xquant.npu_quantize(x, ones, None, torch.qint8, axis=1)
    out += [q, xquant.npu_anti_quant(q, half)]
    return [t.view(torch.uint8).numpy().tobytes() for t in out]  # all of them contiguous


def _child(kind, expected, inputs):
    # In the forked child: exit status 0 = same bits as the parent, 2 = different, 3 = not single-threaded.
    got = _numpy_results() if kind == "numpy" else _torch_results(inputs)
    os._exit(2 if got != expected else 3 if xquant.get_num_threads() != 1 else 0)


def _run_forked(kind, expected, inputs=None):
    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=_child, args=(kind, expected, inputs))
    p.start()
    p.join(TIMEOUT_S)
    if p.is_alive():
        p.kill()
        p.join()
        pytest.fail(f"the forked child ({kind}) did not finish its operators within {TIMEOUT_S} s: hung in the "
                    "OpenMP runtime")
    assert p.exitcode == 0, {2: "a result differs from the parent's", 3: "get_num_threads() != 1 in the child"}.get(
        p.exitcode, f"exit status {p.exitcode}")


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_forked_child_runs_operators_after_parallel_ones(kind):
    if kind == "torch":
        pytest.importorskip("torch", reason="torch is not installed (scripts/setup-python installs it)")
    xquant.set_num_threads(2)  # two threads even on a one-core machine: the parent starts an OpenMP team
    try:
        inputs = _torch_inputs() if kind == "torch" else None
        run = (lambda: _numpy_results()) if kind == "numpy" else (lambda: _torch_results(inputs))
        expected = run()
        _run_forked(kind, expected, inputs)
        _run_forked(kind, expected, inputs)  # a second child of the same parent
        # the parent keeps its threads and its results
        assert xquant.get_num_threads() == 2
        assert run() == expected
    finally:
        xquant.set_num_threads(0)


def test_forked_pool_maps_operators():
    """multiprocessing.Pool with the 'fork' context, the usual way this is met."""
    xquant.set_num_threads(2)
    try:
        x = np.linspace(-3, 3, 1 << 22, dtype=np.float32)  # chunks of 4 MiB: parallel calls in the children
        want = xquant.npu_fake_tensor_quant(x, np.array([2.0], np.float32))  # parallel in the parent
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(2) as pool:
            res = pool.map_async(_pool_job, [x[i::4].copy() for i in range(4)])
            parts = res.get(TIMEOUT_S)  # multiprocessing.TimeoutError on a hang
        for i, part in enumerate(parts):
            np.testing.assert_array_equal(part, want[i::4])
    finally:
        xquant.set_num_threads(0)


def _pool_job(chunk):
    return xquant.npu_fake_tensor_quant(chunk, np.array([2.0], np.float32))
