"""xquant on torch CUDA tensors: the CUDA backend behind xquant.npu and torch.ops.xquant.*.

Two groups:
- tests that run on every machine: xquant.cuda_built / cuda_available / cuda_unavailable_reason, the CUDA
  kernel registered for every custom operator and its refusal (with the reason) where xquant cannot run
  on CUDA, and the fake implementations on fake CUDA tensors (FakeTensorMode needs no GPU): outputs on the
  inputs' device with the shapes and dtypes of the real CPU call, the same-device check, torch.export of a
  CUDA program;
- tests that need a GPU (the `dev` fixture): every case of CASES on CUDA tensors equal bit for bit to the
  same call on CPU tensors, autograd, torch.compile(fullgraph=True), mixed devices, torch's current stream
  and caching allocator. Without a usable GPU they are skipped with the reason printed (pytest -rs);
  XQUANT_REQUIRE_CUDA=1 (scripts/device-check) turns that skip into a failure.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/setup-python installs it)")

import numpy as np  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils import _pytree  # noqa: E402

import xquant  # noqa: E402
from xquant import _torch_ops  # noqa: E402

from tutil import with_edges  # noqa: E402


def _gpu_skip_reason():
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build: no CUDA tensors"
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False: no GPU on this machine"
    if not xquant.cuda_available():
        return f"torch sees a GPU but xquant cannot run on it: {xquant.cuda_unavailable_reason()}"
    return None


GPU_SKIP_REASON = _gpu_skip_reason()


@pytest.fixture
def dev():
    """cuda:0, or a skip naming why (a failure under XQUANT_REQUIRE_CUDA=1)."""
    if GPU_SKIP_REASON is not None:
        if os.environ.get("XQUANT_REQUIRE_CUDA") == "1":
            pytest.fail(f"XQUANT_REQUIRE_CUDA=1 but {GPU_SKIP_REASON}")
        pytest.skip(GPU_SKIP_REASON)
    return torch.device("cuda", 0)


OPS = ("fake_tensor_quant", "fake_tensor_quant_with_axis", "fake_tensor_quant_inplace", "fake_tensor_quant_backward",
       "quantize", "tile_quant", "dynamic_quant_asymmetric", "dynamic_quant", "anti_quant", "acts_ulq",
       "acts_ulq_backward")
FLOATS = (torch.float32, torch.float16, torch.bfloat16)


# ---- the case table: (id, inputs on the CPU, function of those inputs) --------------------------------------
#
# Each function takes its inputs (tensors, moved to the device under test, and plain values) and returns
# tensors; in-place operators write into clones of their CPU-created targets, which are returned.

def _floats(rng, shape, dt, scale=3.0):
    """Random values with SPEC's edge values mixed in, rounded to dt by torch (round to nearest even,
    overflow to +-Inf: what NumPy / ml_dtypes do). (No ml_dtypes needed: the GPU machine may lack it.)"""
    n = int(np.prod(shape)) if len(shape) else 1
    return torch.from_numpy(with_edges(rng, n, np.dtype(np.float32), scale).reshape(shape)).to(dt)


def _inplace_fq(x, a, *opts):
    y = x.clone()
    r = xquant.npu_fake_tensor_quant_inplace(y, a, *opts)
    assert r is y
    return y


def _tile(base, cols, src, scale, mode, offset=None):
    b = base.clone()
    assert xquant.quant(b[:, :cols], src, scale, mode, offset) is None
    return b  # padding columns included: they must stay as they were


def _build_cases():
    rng = np.random.default_rng(2024)
    cases = []

    def add(name, inputs, fn):
        cases.append(pytest.param(inputs, fn, id=name))

    for dt in FLOATS:
        d = str(dt)[6:]
        # lengths around block boundaries, empty included
        for n in (0, 1, 255, 256, 257, 4097, 65539):
            x = _floats(rng, (n,), dt)
            add(f"fq-{d}-n{n}", (x, torch.tensor([2.5])), lambda x, a: xquant.npu_fake_tensor_quant(x, a))
        x = _floats(rng, (3, 37, 65), dt)
        for nb, uns, nr in ((8, False, True), (4, True, False), (16, False, False), (2, False, True)):
            add(f"fq-{d}-{nb}{uns}{nr}", (x, torch.tensor(3.0, dtype=dt), nb, uns, nr), xquant.npu_fake_tensor_quant)
            # a float32 amax holding values of x's dtype (float16 inputs need a float16-exact amax, SPEC 1)
            add(f"fq-axis1-{d}-{nb}{uns}{nr}", (x, (torch.rand(37) * 4).to(dt).float(), 1, nb, uns, nr),
                xquant.npu_fake_tensor_quant_with_axis)
        add(f"fq-axis-1-{d}", (x, (torch.rand(65) * 4).to(dt), -1), xquant.npu_fake_tensor_quant_with_axis)
        add(f"fq-zero-amax-{d}", (x, torch.tensor([0.0])), xquant.npu_fake_tensor_quant)
        add(f"fq-number-amax-{d}", (x, 1.75), xquant.npu_fake_tensor_quant)
        add(f"fq-inplace-{d}", (x, torch.tensor([2.0]), 8, False, False), _inplace_fq)
        g = _floats(rng, (3, 37, 65), dt)
        add(f"fq-backward-axis-{d}", (g, x, (torch.rand(37) * 3 + 0.1).to(dt).float(), 1),
            lambda g, x, a, ax: xquant.fake_tensor_quant_backward(g, x, a, ax, 8, False, True, True))
        add(f"fq-backward-tensor-{d}", (g, x, torch.tensor([1.5])),
            lambda g, x, a: xquant.fake_tensor_quant_backward(g, x, a, None, 4, True, False, True))

        # npu_quantize
        xq = _floats(rng, (4, 33, 17), dt, 40.0)
        sc = (torch.rand(33) + 0.05).to(dt)
        for qd in (torch.qint8, torch.quint8, torch.qint32):
            add(f"quantize-div-{d}-{qd}", (xq, sc, torch.arange(33, dtype=torch.int8) - 16, qd),
                lambda x, s, z, q: xquant.npu_quantize(x, s, z, q, axis=1))
            add(f"quantize-div-pertensor-{d}-{qd}", (xq, torch.tensor([0.37], dtype=dt), None, qd),
                lambda x, s, z, q: xquant.npu_quantize(x, s, z, q))
        add(f"quantize-div-floatzp-{d}", (xq, sc, (torch.rand(33) * 8).to(dt)),
            lambda x, s, z: xquant.npu_quantize(x, s, z, torch.qint8, axis=1))
        s17 = (torch.rand(17) * 3).to(dt)
        add(f"quantize-mul-{d}", (xq, s17, (torch.rand(17) * 4).to(dt)),
            lambda x, s, z: xquant.npu_quantize(x, s, z, torch.qint8, axis=-1, div_mode=False))
        x4 = _floats(rng, (6, 64), dt, 6.0)
        add(f"quantize-int4-{d}", (x4, (torch.rand(64) + 0.2).to(dt), (torch.rand(64) * 2).to(dt)),
            lambda x, s, z: xquant.npu_quantize(x, s, z, torch.quint4x2, axis=-1, div_mode=False))

        # npu_dynamic_quant_asymmetric / npu_dynamic_quant
        xd = _floats(rng, (5, 7, 64), dt)
        sm = (torch.rand(64) + 0.5).to(dt)
        sm_e = (torch.rand(3, 64) + 0.5).to(dt)
        for gi_dt in (torch.int32, torch.int64):
            gi = torch.tensor([10, 10, 35], dtype=gi_dt)
            add(f"dyn-asym-moe-{d}-{gi_dt}", (xd, sm_e, gi),
                lambda x, s, g: xquant.npu_dynamic_quant_asymmetric(x, smooth_scales=s, group_index=g))
            add(f"dyn-sym-moe-{d}-{gi_dt}", (xd, sm_e, gi),
                lambda x, s, g: xquant.npu_dynamic_quant(x, smooth_scales=s, group_index=g))
        add(f"dyn-asym-{d}", (xd,), lambda x: xquant.npu_dynamic_quant_asymmetric(x))
        add(f"dyn-asym-pertensor-{d}", (xd,), lambda x: xquant.npu_dynamic_quant_asymmetric(x, quant_mode="pertensor"))
        add(f"dyn-asym-smooth-int4-{d}", (xd, sm),
            lambda x, s: xquant.npu_dynamic_quant_asymmetric(x, smooth_scales=s, dst_type=torch.quint4x2))
        add(f"dyn-sym-{d}", (xd,), lambda x: xquant.npu_dynamic_quant(x))
        add(f"dyn-sym-int4-{d}", (xd, sm), lambda x, s: xquant.npu_dynamic_quant(x, smooth_scales=s,
                                                                                  dst_type=torch.quint4x2))
        big = _floats(rng, (3, 70001), dt)  # long rows: the reductions' blocking
        add(f"dyn-asym-longrows-{d}", (big,), lambda x: xquant.npu_dynamic_quant_asymmetric(x))
        add(f"dyn-sym-longrows-{d}", (big,), lambda x: xquant.npu_dynamic_quant(x))

        # ActsULQ and its backward
        xa = _floats(rng, (4, 5, 6), dt, 2.0)
        lo, hi = (-torch.rand(5, 1) * 2).to(dt), (torch.rand(5, 1) * 3).to(dt)
        for fixed, nb in ((False, 8), (True, 4), (False, 16)):
            add(f"ulq-{d}-{fixed}-{nb}", (xa, lo, hi, fixed, nb), xquant.acts_ulq)
        add(f"ulq-numbers-{d}", (xa, -1.25, 2.5), xquant.acts_ulq)
        add(f"ulq-scalar-{d}", (xa, torch.tensor(-0.5, dtype=dt), torch.tensor(1.0, dtype=dt)), xquant.acts_ulq)
        dy = _floats(rng, (4, 5, 6), dt)

        def ulq_bwd(dy, x, lo, hi):
            _, m0, m1, loss = xquant.acts_ulq(x, lo, hi)
            return xquant.acts_ulq_backward(dy, tuple(x.shape), lo, hi, m0, m1, loss)

        add(f"ulq-backward-{d}", (dy, xa, lo, hi), ulq_bwd)

    # pypto tile quant: float32 only; out may be a row slice of a wider tensor
    src = _floats(rng, (24, 40), torch.float32, 50.0)
    scale = torch.rand(24, 1) * 3
    add("tile-sym", (torch.zeros(24, 40, dtype=torch.int8), 40, src, scale, "SYM"), _tile)
    add("tile-sym-padded", (torch.full((24, 47), 7, dtype=torch.int8), 40, src, scale, "SYM"), _tile)
    add("tile-asym-padded", (torch.full((24, 45), 3, dtype=torch.uint8), 40, src, scale, "ASYM",
                             torch.rand(24, 1) * 200), _tile)

    # npu_anti_quant
    xi8 = torch.randint(-128, 128, (6, 48), dtype=torch.int8)
    xi4 = torch.randint(-2**31, 2**31 - 1, (6, 6), dtype=torch.int32)
    for sdt in (torch.float32, torch.bfloat16):
        s = (torch.rand(48) * 0.1).to(sdt)
        o = (torch.rand(48) * 10 - 5).to(sdt)
        for dst in (None, torch.float16, torch.bfloat16, torch.float32):
            add(f"anti-int8-{sdt}-{dst}", (xi8, s, o, dst),
                lambda x, s, o, dst: xquant.npu_anti_quant(x, s, offset=o, dst_dtype=dst))
        add(f"anti-int4-{sdt}", (xi4, s, o),
            lambda x, s, o: xquant.npu_anti_quant(x, s, offset=o, src_dtype=torch.quint4x2, dst_dtype=torch.float32))
        add(f"anti-pertensor-{sdt}", (xi8, s[:1]), lambda x, s: xquant.npu_anti_quant(x, s))
    return cases


CASES = _build_cases()


def _to(v, device):
    return v.to(device) if isinstance(v, torch.Tensor) else v


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    if t.is_floating_point():
        return t.view({4: torch.int32, 2: torch.int16}[t.element_size()])
    return t


def assert_bits_equal(expected, got, device):
    le, lg = _pytree.tree_leaves(expected), _pytree.tree_leaves(got)
    assert len(le) == len(lg)
    for i, (e, g) in enumerate(zip(le, lg)):
        if e is None:
            assert g is None
            continue
        assert g.device == device, f"output {i} is on {g.device}, expected {device}"
        assert (e.dtype, tuple(e.shape)) == (g.dtype, tuple(g.shape)), f"output {i}"
        eb, gb = _bits(e), _bits(g)
        if not torch.equal(eb, gb):
            bad = (eb != gb).nonzero()
            pytest.fail(f"output {i}: {bad.shape[0]} of {eb.numel()} elements differ, first at {bad[0].tolist()}: "
                        f"cpu {e.reshape(-1)[0] if e.numel() else None!r} ...")


# ---- every machine -------------------------------------------------------------------------------------------

def test_cuda_queries():
    built, available, reason = xquant.cuda_built(), xquant.cuda_available(), xquant.cuda_unavailable_reason()
    print(f"xquant.cuda_built()={built} cuda_available()={available} reason={reason!r}")
    assert isinstance(built, bool) and isinstance(available, bool) and isinstance(reason, str)
    assert available == (reason == "")
    if not built:
        assert not available and "built without CUDA" in reason
    if torch.version.cuda is not None and not torch.cuda.is_available():
        # the same driver answers both: no device for torch, none for xquant
        assert not available and reason
    assert {"cuda_built", "cuda_available", "cuda_unavailable_reason"} <= set(xquant.__all__)


def test_every_custom_op_has_a_cuda_kernel():
    for name in OPS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"xquant::{name}", "CUDA"), name
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"xquant::{name}", "Meta"), name


@pytest.mark.skipif(xquant.cuda_available(), reason="xquant can run on CUDA here: its refusal cannot be provoked")
def test_cuda_kernel_refuses_with_the_reason():
    # The CUDA kernel itself, reached through the dispatcher's CUDA key (no GPU needed to call it).
    ks = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
    with pytest.raises(TypeError, match="xquant cannot run on CUDA tensors: " + _re(xquant.cuda_unavailable_reason())):
        torch.ops.xquant.fake_tensor_quant.default.redispatch(ks, torch.randn(4), torch.tensor(1.0), 8, False, True)
    # ... and its message names the operator's main argument
    x = torch.randn(4)
    with pytest.raises(TypeError, match=r"^xquant::quantize: input is on cpu but xquant cannot run on CUDA "
                                        r"tensors: .+ \(move the tensors with \.cpu\(\)"):
        torch.ops.xquant.quantize.default.redispatch(ks, x, x[:1], None, torch.qint8, 1, True)


def _re(s: str) -> str:
    import re

    return re.escape(s)


def _fake_inputs(fm, inputs, device):
    return tuple(fm.from_tensor(v).to(device) if isinstance(v, torch.Tensor) else v for v in inputs)


@pytest.mark.parametrize("inputs, fn", CASES)
def test_fake_cuda_outputs_match_the_cpu_call(inputs, fn):
    """The fake implementations on fake CUDA tensors: every output on the inputs' device, with the shape
    and dtype of the real call on CPU tensors."""
    expected = _pytree.tree_leaves(fn(*inputs))
    for device in ("cuda:0", "cuda:1"):
        with FakeTensorMode() as fm:
            got = _pytree.tree_leaves(fn(*_fake_inputs(fm, inputs, device)))
        assert len(got) == len(expected)
        for e, g in zip(expected, got):
            assert g.device == torch.device(device)
            assert (g.dtype, tuple(g.shape)) == (e.dtype, tuple(e.shape))


# (function, main input, other tensor arguments by name) for the mixed-device checks.
def _mixed_cases():
    x = torch.randn(4, 8)
    return [
        ("fake_tensor_quant", lambda x, a: xquant.npu_fake_tensor_quant(x, a), "inputs", {"amax": torch.tensor([1.0])}),
        ("fake_tensor_quant_with_axis", lambda x, a: xquant.npu_fake_tensor_quant_with_axis(x, a, 1), "inputs",
         {"amax": torch.ones(8)}),
        ("fake_tensor_quant_inplace", lambda x, a: xquant.npu_fake_tensor_quant_inplace(x, a), "inputs",
         {"amax": torch.tensor(1.0)}),
        ("fake_tensor_quant_backward", lambda g, x: xquant.fake_tensor_quant_backward(g, x, torch.tensor(1.0)
                                                                                      .to(g.device)),
         "grad_out", {"inputs": torch.ones(4, 8)}),
        ("quantize", lambda x, s: xquant.npu_quantize(x, s, None, torch.qint8), "input", {"scales": torch.ones(8)}),
        ("dynamic_quant", lambda x, s: xquant.npu_dynamic_quant(x, smooth_scales=s), "x",
         {"smooth_scales": torch.ones(8)}),
        ("dynamic_quant_asymmetric", lambda x, s: xquant.npu_dynamic_quant_asymmetric(x, smooth_scales=s), "x",
         {"smooth_scales": torch.ones(8)}),
        ("anti_quant", lambda x, s: xquant.npu_anti_quant(x.to(torch.int8), s), "x", {"scale": torch.ones(8)}),
        ("acts_ulq", lambda x, lo: xquant.acts_ulq(x, lo, 1.0), "x", {"clamp_min": torch.tensor(-1.0)}),
    ], x


def test_fake_cuda_mixed_devices_raise_naming_the_argument():
    cases, x = _mixed_cases()
    for op, fn, main, others in cases:
        (other_name, other), = others.items()
        for main_dev, other_dev in (("cuda:0", "cpu"), ("cuda:0", "cuda:1"), ("cpu", "cuda:0")):
            with FakeTensorMode() as fm:
                xm = fm.from_tensor(x).to(main_dev)
                om = fm.from_tensor(other).to(other_dev)
                want = (rf"^xquant::{op}: {other_name} is on {other_dev} but {main} is on {main_dev} "
                        r"\(expected every tensor of the call on one device\)$")
                with pytest.raises(ValueError, match=want):
                    fn(xm, om)
    with FakeTensorMode() as fm:  # pypto tile quant: out, src, scale and offset on one device
        out = fm.from_tensor(torch.zeros(2, 4, dtype=torch.uint8)).to("cuda:0")
        src = fm.from_tensor(torch.randn(2, 4)).to("cuda:0")
        sc = fm.from_tensor(torch.ones(2, 1)).to("cuda:0")
        off = fm.from_tensor(torch.ones(2, 1))
        with pytest.raises(ValueError, match=r"^xquant::tile_quant: offset is on cpu but out is on cuda:0 "):
            xquant.quant(out, src, sc, "ASYM", off)
        with pytest.raises(ValueError, match=r"^xquant::tile_quant: src is on cuda:0 but out is on cpu "):
            xquant.quant(fm.from_tensor(torch.zeros(2, 4, dtype=torch.int8)), src, sc.cpu(), "SYM")


def test_mixed_cpu_and_meta_raise_before_computing():
    # Real CPU tensors mixed with meta ones: the same check on a machine without GPU.
    with pytest.raises(ValueError, match=r"^xquant::quantize: scales is on meta but input is on cpu "):
        xquant.npu_quantize(torch.randn(2, 3), torch.ones(3, device="meta"), None, torch.qint8)


def test_export_of_a_cuda_program_without_gpu():
    class M(torch.nn.Module):
        def forward(self, x, amax, lo, hi):
            y = xquant.npu_fake_tensor_quant(x, amax)
            q, s = xquant.npu_dynamic_quant(y)
            u = xquant.acts_ulq(y, lo, hi)
            return q, s, u[0]

    # (Python-number parameters would become constant CUDA tensors of the program: a GPU is needed then.)
    with FakeTensorMode():
        args = (torch.empty(4, 8, device="cuda"), torch.empty(1, device="cuda"), torch.empty((), device="cuda"),
                torch.empty((), device="cuda"))
        ep = torch.export.export(M(), args)
    out = next(n for n in ep.graph.nodes if n.op == "output")
    assert [v.meta["val"].device for v in out.args[0]] == [torch.device("cuda", 0)] * 3
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert {"xquant.fake_tensor_quant.default", "xquant.dynamic_quant.default", "xquant.acts_ulq.default"} <= targets


# ---- on a GPU -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("inputs, fn", CASES)
def test_cuda_equals_cpu_bit_for_bit(dev, inputs, fn):
    expected = fn(*inputs)
    got = fn(*(_to(v, dev) for v in inputs))
    torch.cuda.synchronize(dev)
    assert_bits_equal(expected, got, dev)


def test_custom_ops_directly_on_cuda(dev):
    x = torch.randn(64, 33)
    a = torch.tensor([2.0])
    for f in (lambda x, a: torch.ops.xquant.fake_tensor_quant(x, a),
              lambda x, a: torch.ops.xquant.quantize(x, a, None, torch.qint8, 1, True),
              lambda x, a: torch.ops.xquant.dynamic_quant(x),
              lambda x, a: torch.ops.xquant.acts_ulq(x, -a, a)):
        assert_bits_equal(f(x, a), f(x.to(dev), a.to(dev)), dev)


def test_fast_path_hands_cuda_tensors_over(dev):
    x, a = torch.randn(8, device=dev), torch.tensor(1.0, device=dev)
    assert _torch_ops.FAST.f_fake_tensor_quant(x, a, None, 8, False, True) is None


def test_autograd_on_cuda(dev):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 10, 12, generator=g) * 3
    w = torch.randn(6, 10, 12, generator=g)
    for dt in FLOATS:
        res = []
        for device in (torch.device("cpu"), dev):
            xx = x.to(dt).to(device).detach().clone().requires_grad_()
            amax = torch.full((10,), 2.5, device=device).requires_grad_()
            lo = torch.tensor(-1.5, dtype=dt, device=device).requires_grad_()
            hi = torch.full((12,), 2.0, dtype=dt, device=device).requires_grad_()
            y = xquant.npu_fake_tensor_quant_with_axis(xx, amax, 1)
            z = xquant.acts_ulq(y, lo, hi)[0]
            assert z.grad_fn is not None and z.device == device
            (z * w.to(dt).to(device)).sum().backward()
            res.append((z, xx.grad, amax.grad, lo.grad, hi.grad))
        assert_bits_equal(res[0], res[1], dev)


def test_compile_fullgraph_on_cuda(dev):
    def f(x, amax, lo, hi):
        y = xquant.npu_fake_tensor_quant(x, amax)
        q, s = xquant.npu_dynamic_quant(y)
        u = xquant.acts_ulq(y, lo, hi)
        return q, s, u[0]

    g = torch.Generator().manual_seed(5)
    x, amax = torch.randn(16, 64, generator=g) * 2, torch.tensor([2.0])
    lo, hi = torch.tensor(-1.0), torch.tensor(1.5)
    expected = f(x, amax, lo, hi)
    torch._dynamo.reset()
    for backend in ("aot_eager", "inductor"):
        cf = torch.compile(f, fullgraph=True, backend=backend)
        got = cf(x.to(dev), amax.to(dev), lo.to(dev), hi.to(dev))
        assert_bits_equal(expected, got, dev)

    def train_step(x, amax):
        y = xquant.npu_fake_tensor_quant(x, amax)
        return (y * y).sum()

    grads = []
    for device, fn in ((torch.device("cpu"), train_step), (dev, torch.compile(train_step, fullgraph=True,
                                                                               backend="aot_eager"))):
        xx = x.to(device).detach().clone().requires_grad_()
        aa = amax.to(device).detach().clone().requires_grad_()
        fn(xx, aa).backward()
        grads.append((xx.grad, aa.grad))
    assert_bits_equal(grads[0], grads[1], dev)


def test_mixed_devices_raise_and_write_nothing(dev):
    cases, x = _mixed_cases()
    for op, fn, main, others in cases:
        (other_name, other), = others.items()
        with pytest.raises(ValueError, match=rf"^xquant::{op}: {other_name} is on cpu but {main} is on cuda:0 "):
            fn(x.to(dev), other)
    out = torch.full((2, 4), 9, dtype=torch.int8, device=dev)
    with pytest.raises(ValueError, match=r"^xquant::tile_quant: scale is on cpu but out is on cuda:0 "):
        xquant.quant(out, torch.randn(2, 4, device=dev), torch.ones(2, 1), "SYM")
    assert (out == 9).all()
    xi = torch.randn(16, device=dev)
    before = xi.clone()
    with pytest.raises(ValueError, match="amax is on cpu but inputs is on cuda:0"):
        xquant.npu_fake_tensor_quant_inplace(xi, torch.tensor(1.0))
    assert torch.equal(xi, before)


def test_another_gpu(dev):
    if torch.cuda.device_count() < 2:
        pytest.skip(f"{torch.cuda.device_count()} GPU: the two-GPU checks need two")
    d1 = torch.device("cuda", 1)
    x = torch.randn(32, 17)
    with pytest.raises(ValueError, match=r"amax is on cuda:1 but inputs is on cuda:0"):
        xquant.npu_fake_tensor_quant(x.to(dev), torch.tensor([1.0], device=d1))
    a = torch.tensor([1.0])
    with torch.cuda.device(0):  # calls on cuda:1 tensors while cuda:0 is current
        got = xquant.npu_dynamic_quant(x.to(d1))
        grads = xquant.fake_tensor_quant_backward(x.to(d1), x.to(d1), a.to(d1))  # (tensors through DLPack)
        assert torch.cuda.current_device() == 0  # the calls' device switch is undone
    assert_bits_equal(xquant.npu_dynamic_quant(x), got, d1)
    assert_bits_equal(xquant.fake_tensor_quant_backward(x, x, a), grads, d1)


def test_runs_on_the_current_stream(dev):
    """The call is queued on torch's current stream (a non-default one here): ordered after the work
    queued there before it (a copy delayed behind a long sleep kernel), and asynchronous to the host."""
    src = torch.randn(1024, 4096, device=dev)
    s = torch.cuda.Stream(device=dev)
    x = torch.zeros(1024, 4096, device=dev)
    torch.cuda.synchronize(dev)
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time on this stream
        x.copy_(src)
        q, scale = xquant.npu_dynamic_quant(x)  # reads nothing on the host
        assert not s.query()  # still queued behind the sleep: the call did not wait for the stream
    s.synchronize()
    assert_bits_equal(xquant.npu_dynamic_quant(src.cpu()), (q, scale), dev)
    # Operators that read small parameters on the host (amax, scales, zero_points, group_index, anti
    # quant's scale / offset) copy them on the same stream, after the work queued before the call.
    with torch.cuda.stream(s):
        torch.cuda._sleep(100_000_000)
        amax = torch.full((1,), 3.0, device=dev)
        y = xquant.npu_fake_tensor_quant(x, amax)
    s.synchronize()
    assert_bits_equal(xquant.npu_fake_tensor_quant(src.cpu(), torch.tensor([3.0])), y, dev)


def test_outputs_come_from_torchs_caching_allocator(dev):
    x = torch.randn(1 << 20, device=dev)
    torch.cuda.synchronize(dev)
    before = torch.cuda.memory_allocated(dev)
    y = xquant.npu_fake_tensor_quant(x, 1.5)
    q, s = xquant.npu_dynamic_quant(x.view(1024, 1024))
    grown = torch.cuda.memory_allocated(dev) - before
    assert grown >= y.nbytes + q.nbytes + s.nbytes
    assert y.device == q.device == s.device == dev
    del y, q, s
    assert torch.cuda.memory_allocated(dev) <= before + 4096  # (amax's 0-d tensor is freed too)


def test_compat_stand_ins_compute_on_the_gpu(dev):
    # xquant.compat's operators (install(device="cuda")) compute where the tensors are, without copies.
    from xquant.compat import _modules, _ops

    g = torch.Generator().manual_seed(9)
    x, s = torch.randn(8, 64, generator=g) * 4, torch.rand(64, generator=g) + 0.1
    amax = torch.tensor([3.0])
    for f in (lambda x, s, a: _modules.npu_fake_tensor_quant(x, a),
              lambda x, s, a: _modules.npu_fake_tensor_quant_with_axis(x, s, 1),
              lambda x, s, a: _ops._quantize(x, s, None, torch.qint8, -1),
              lambda x, s, a: _ops._dynamic_quant(x, smooth_scales=s),
              lambda x, s, a: _ops._dynamic_quant_asymmetric(x, smooth_scales=s),
              lambda x, s, a: _ops._anti_quant(x.to(torch.int8), s)):
        assert_bits_equal(f(x, s, amax), f(x.to(dev), s.to(dev), amax.to(dev)), dev)
    y = x.to(dev)
    assert _modules.npu_fake_tensor_quant_inplace(y, amax.to(dev)) is y
    assert_bits_equal(xquant.npu_fake_tensor_quant(x, amax), y, dev)
