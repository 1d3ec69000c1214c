"""torch.library integration: torch.library.opcheck on every custom operator (schema, fake/meta
implementation, autograd registration, AOT dispatch), torch.compile(fullgraph=True) equal to eager
(forward and backward), torch.export."""

import pytest

pytest.importorskip("torch", reason="torch is not installed (scripts/setup-python installs it)")
pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (scripts/setup-python installs it)")

import numpy as np
import torch
from torch.utils import _pytree

import xquant

ops = torch.ops.xquant


def _leaves(t):
    return _pytree.tree_leaves(t)


def _equal(a, b) -> bool:
    la, lb = _leaves(a), _leaves(b)
    return len(la) == len(lb) and all(
        x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.view(-1).view(torch.uint8) if x.numel() else x,
                                                                  y.view(-1).view(torch.uint8) if y.numel() else y)
        for x, y in zip(la, lb))


def _samples():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, 16, generator=g) * 2
    amax = x.abs().max().reshape(1)
    amax_c = x.abs().amax(dim=(0, 2)) + 0.1
    return g, x, amax, amax_c


OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def test_opcheck_fake_quant_family():
    g, x, amax, amax_c = _samples()
    for xx in (x, x.half(), x.bfloat16()):
        a, ac = amax.to(xx.dtype), amax_c.to(xx.dtype)
        xg = xx.clone().requires_grad_()
        torch.library.opcheck(ops.fake_tensor_quant, (xg, a.clone().requires_grad_(), 8, False, True),
                              test_utils=OPCHECK_TESTS)
        torch.library.opcheck(ops.fake_tensor_quant_with_axis, (xg, ac.clone().requires_grad_(), 1, 4, True, True),
                              test_utils=OPCHECK_TESTS)
        torch.library.opcheck(ops.fake_tensor_quant_inplace, (xx.clone(), a, 8, False, False),
                              test_utils=OPCHECK_TESTS)
        torch.library.opcheck(ops.fake_tensor_quant_backward, (torch.ones_like(xx), xx, ac, 1, 8, False, True, True),
                              test_utils=OPCHECK_TESTS)


def test_opcheck_quantize_tile_dynamic():
    g, x, amax, amax_c = _samples()
    s = torch.rand(16, generator=g) + 0.5
    torch.library.opcheck(ops.quantize, (x, torch.rand(6, generator=g) + 0.1, torch.arange(6, dtype=torch.int8),
                                         torch.qint8, 1, True), test_utils=OPCHECK_TESTS)
    torch.library.opcheck(ops.quantize, (x.bfloat16(), s.bfloat16(), s.bfloat16(), torch.quint4x2, -1, False),
                          test_utils=OPCHECK_TESTS)
    torch.library.opcheck(ops.quantize, (x, s[:1], None, torch.int32, 1, True), test_utils=OPCHECK_TESTS)
    out = torch.zeros(24, 16, dtype=torch.int8)
    torch.library.opcheck(ops.tile_quant, (out, x.view(24, 16), torch.full((24, 1), 3.0), "SYM", None),
                          test_utils=OPCHECK_TESTS)
    torch.library.opcheck(ops.tile_quant, (out.to(torch.uint8), x.view(24, 16), torch.full((24, 1), 3.0), "ASYM",
                                           torch.full((24, 1), 100.0)), test_utils=OPCHECK_TESTS)
    torch.library.opcheck(ops.dynamic_quant_asymmetric, (x,), test_utils=OPCHECK_TESTS)
    torch.library.opcheck(ops.dynamic_quant_asymmetric, (x.half(), s.half(), None, torch.quint4x2, "pertoken"),
                          test_utils=OPCHECK_TESTS)
    torch.library.opcheck(ops.dynamic_quant_asymmetric, (x, None, None, None, "pertensor"), test_utils=OPCHECK_TESTS)
    torch.library.opcheck(ops.dynamic_quant_asymmetric,
                          (x, torch.rand(3, 16, generator=g), torch.tensor([4, 4, 24]), torch.qint8, "pertoken"),
                          test_utils=OPCHECK_TESTS)


def test_opcheck_acts_ulq():
    g, x, _, _ = _samples()
    for dt in (torch.float32, torch.float16):
        xx = x.to(dt).requires_grad_()
        lo = (torch.randn(6, 1, generator=g) - 1).to(dt).requires_grad_()
        hi = (torch.rand(16, generator=g) + 0.5).to(dt).requires_grad_()
        torch.library.opcheck(ops.acts_ulq, (xx, lo, hi, False, 8), test_utils=OPCHECK_TESTS)
        y, m0, m1, loss = ops.acts_ulq(xx.detach(), lo.detach(), hi.detach())
        torch.library.opcheck(ops.acts_ulq_backward, (torch.ones_like(y), [4, 6, 16], lo.detach(), hi.detach(), m0, m1,
                                                      loss, False, 8), test_utils=OPCHECK_TESTS)


def _model_fn(x, amax, w, w_amax, lo, hi, s, smooth):
    """Every family in one function, as user code would call them (xquant.npu names)."""
    a = xquant.npu.npu_fake_tensor_quant(x, amax)
    wq = xquant.npu.npu_fake_tensor_quant_with_axis(w, w_amax, 0)
    y, m0, m1, loss = xquant.npu.acts_ulq(a, lo, hi)
    h = y @ wq.t()
    q8 = xquant.npu.npu_quantize(h, s, None, torch.qint8, -1, False)
    q4 = xquant.npu.npu_quantize(h, s, s, torch.quint4x2, -1, False)
    qd = xquant.npu.npu_quantize(h, s, None, torch.quint8, 1, True)
    dyn = xquant.npu.npu_dynamic_quant_asymmetric(h, smooth_scales=smooth, dst_type=torch.quint4x2)
    dyn_t = xquant.npu.npu_dynamic_quant_asymmetric(h, quant_mode="pertensor")
    tile = torch.zeros(h.shape, dtype=torch.int8)
    xquant.npu.quant(tile, h, torch.full((h.shape[0], 1), 2.0))
    inp = h.clone()
    xquant.npu.npu_fake_tensor_quant_inplace(inp, amax, num_bits=4)
    return h, q8, q4, qd, dyn, dyn_t, tile, inp, m0, m1, loss


def _model_inputs():
    g = torch.Generator().manual_seed(9)
    x = torch.randn(8, 32, generator=g)
    w = torch.randn(16, 32, generator=g)
    return (x, x.abs().max(), w, w.abs().amax(1), torch.tensor(-1.0), torch.tensor(1.5),
            torch.rand(16, generator=g) + 1.0, torch.rand(16, generator=g) + 0.5)


def test_compile_fullgraph_forward_equals_eager():
    args = _model_inputs()
    eager = _model_fn(*args)
    compiled = torch.compile(_model_fn, fullgraph=True)(*args)
    assert _equal(eager, compiled)


def test_compile_fullgraph_backward_equals_eager():
    def loss_fn(x, amax, w, w_amax, lo, hi):
        a = xquant.npu_fake_tensor_quant(x, amax)
        wq = xquant.npu_fake_tensor_quant_with_axis(w, w_amax, 0)
        y = xquant.acts_ulq(a @ wq.t(), lo, hi)[0]
        return (y * y).sum()

    args = _model_inputs()[:6]
    leaves_e = [a.clone().requires_grad_() for a in args]
    leaves_c = [a.clone().requires_grad_() for a in args]
    le = loss_fn(*leaves_e)
    le.backward()
    # aot_eager traces forward and backward through AOTAutograd (fake implementations, autograd formulas,
    # the backward custom operators) without Inductor's C++ code generation, which only adds compile time.
    lc = torch.compile(loss_fn, fullgraph=True, backend="aot_eager")(*leaves_c)
    lc.backward()
    assert torch.equal(le, lc)
    for a, b in zip(leaves_e, leaves_c):
        assert torch.equal(a.grad, b.grad)


def test_compile_dynamic_shapes():
    f = torch.compile(lambda x, a: xquant.npu_fake_tensor_quant_with_axis(x, a, -1) + 1, fullgraph=True,
                      dynamic=True, backend="aot_eager")
    for n in (3, 5, 9):
        x = torch.randn(n, 8)
        a = x.abs().amax(0)
        assert torch.equal(f(x, a), xquant.npu_fake_tensor_quant_with_axis(x, a, -1) + 1)


def test_export():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(16, 32))
            self.lo = torch.nn.Parameter(torch.tensor(-1.0))
            self.hi = torch.nn.Parameter(torch.tensor(2.0))

        def forward(self, x):
            wq = xquant.npu_fake_tensor_quant_with_axis(self.w, self.w.detach().abs().amax(1), 0)
            y = xquant.acts_ulq(x @ wq.t(), self.lo, self.hi)[0]
            return xquant.npu_dynamic_quant_asymmetric(y)

    m = M()
    x = torch.randn(4, 32)
    ep = torch.export.export(m, (x,))
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert {"xquant.fake_tensor_quant_with_axis.default", "xquant.acts_ulq.default",
            "xquant.dynamic_quant_asymmetric.default"} <= targets
    assert _equal(ep.module()(x), m(x))


def test_numpy_inputs_are_not_traced_by_torch():
    """The NumPy path never touches torch (works without torch.compile, returns NumPy)."""
    x = np.linspace(-2, 2, 11, dtype=np.float32)
    assert isinstance(xquant.npu_fake_tensor_quant(x, np.float32(1.0)), np.ndarray)
