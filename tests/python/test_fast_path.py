"""The eager fast path of xquant.npu on torch tensors (the compiled core reading tensors directly, without
the torch.library dispatch): it gives bit for bit the results of the custom operators, it is taken only in
plain eager mode, and everything else (autograd recording, tracing, modes, unusual tensors and arguments)
takes the full path."""

import importlib
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch", reason="torch is not installed (scripts/setup-python installs it)")
pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (scripts/setup-python installs it)")

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import xquant
from xquant import _core, _torch_ops, npu

try:
    from xquant._torch_fast_info import TORCH_VERSION as _TORCH_FAST_BUILT_FOR
except ImportError:  # built without torch at build time: only _core's path exists
    _TORCH_FAST_BUILT_FOR = None
# Built for this torch: it must import (an unresolved symbol or a bad capsule fails here, not silently).
_torch_fast = importlib.import_module("xquant._torch_fast") if _TORCH_FAST_BUILT_FOR == torch.__version__ else None

# The modules whose lenient t_* functions the fast path may call: _core always, _torch_fast when built.
LENIENT = [_core] + ([_torch_fast] if _torch_fast is not None else [])
LENIENT_IDS = [m.__name__.rsplit(".", 1)[1] for m in LENIENT]

ops = torch.ops.xquant
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _same(a, b) -> bool:
    la, lb = torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)
    return len(la) == len(lb) and all(
        x.dtype == y.dtype and x.shape == y.shape and x.is_contiguous() and
        torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)) for x, y in zip(la, lb))


def _data(dtype, *shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * 3
    x.view(-1)[:6] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.5, -2.5, 0.0])
    return x.to(dtype)


def test_fast_path_is_available():
    assert _torch_ops.FAST_PATH  # the probes exist in this PyTorch: the tests below exercise the fast path


@pytest.mark.parametrize("m", LENIENT, ids=LENIENT_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fast_path_equals_custom_operators(dtype, m, monkeypatch):
    monkeypatch.setattr(npu, "_fast", m)  # xquant.npu's fast path through this module
    x = _data(dtype, 4, 6, 16)
    amax = torch.tensor([2.5], dtype=dtype)
    amax_c = (torch.rand(6) * 3 + 0.1).to(dtype)
    s16 = (torch.rand(16) + 0.5).to(dtype)
    q8 = torch.randint(-128, 128, (4, 6, 16), dtype=torch.int8)
    q4 = torch.randint(-2**31, 2**31 - 1, (4, 6, 2), dtype=torch.int32)
    moe, ends = s16.repeat(3, 1) * torch.tensor([[1.0], [0.5], [2.0]], dtype=dtype), torch.tensor([2, 2, 24])
    # each: (fast-path call, the custom operator call, the core's lenient call that must compute)
    cases = [
        (lambda: xquant.npu_fake_tensor_quant(x, amax, 5, True, False),
         lambda: ops.fake_tensor_quant(x, amax, 5, True, False),
         lambda: m.t_fake_tensor_quant(x, amax, None, 5, True, False)),
        (lambda: xquant.npu_fake_tensor_quant(x, 1.75),
         lambda: ops.fake_tensor_quant(x, torch.tensor(1.75), 8, False, True),
         lambda: m.t_fake_tensor_quant(x, 1.75, None, 8, False, True)),
        (lambda: xquant.npu_fake_tensor_quant_with_axis(x, amax_c, 1),
         lambda: ops.fake_tensor_quant_with_axis(x, amax_c, 1),
         lambda: m.t_fake_tensor_quant(x, amax_c, 1, 8, False, True)),
        (lambda: xquant.npu_quantize(x, s16, s16, torch.quint4x2, -1, False),
         lambda: ops.quantize(x, s16, s16, torch.quint4x2, -1, False),
         lambda: m.t_quantize(x, s16, s16, torch.quint4x2, -1, False)),
        (lambda: xquant.npu_quantize(x, amax_c, torch.arange(6, dtype=torch.int8), torch.quint8, 1),
         lambda: ops.quantize(x, amax_c, torch.arange(6, dtype=torch.int8), torch.quint8, 1),
         lambda: m.t_quantize(x, amax_c, torch.arange(6, dtype=torch.int8), torch.quint8, 1, True)),
        (lambda: xquant.npu_dynamic_quant_asymmetric(x, smooth_scales=s16, dst_type=torch.quint4x2),
         lambda: ops.dynamic_quant_asymmetric(x, s16, None, torch.quint4x2),
         lambda: m.t_dynamic_quant_asymmetric(x, s16, None, torch.quint4x2, "pertoken")),
        (lambda: xquant.npu_dynamic_quant_asymmetric(x, quant_mode="pertensor"),
         lambda: ops.dynamic_quant_asymmetric(x, quant_mode="pertensor"),
         lambda: m.t_dynamic_quant_asymmetric(x, None, None, None, "pertensor")),
        (lambda: xquant.npu_dynamic_quant(x, smooth_scales=s16, dst_type=torch.quint4x2),
         lambda: ops.dynamic_quant(x, s16, None, torch.quint4x2),
         lambda: m.t_dynamic_quant(x, s16, None, torch.quint4x2)),
        (lambda: xquant.npu_dynamic_quant(x, smooth_scales=moe, group_index=ends),
         lambda: ops.dynamic_quant(x, moe, ends),
         lambda: m.t_dynamic_quant(x, moe, ends, None)),
        (lambda: xquant.npu_anti_quant(q8, s16.float(), offset=s16.float(), dst_dtype=dtype),
         lambda: ops.anti_quant(q8, s16.float(), s16.float(), dtype),
         lambda: m.t_anti_quant(q8, s16.float(), s16.float(), dtype, None)),
        (lambda: xquant.npu_anti_quant(q4, s16.bfloat16()[:1], src_dtype=torch.quint4x2),
         lambda: ops.anti_quant(q4, s16.bfloat16()[:1], None, None, torch.quint4x2),
         lambda: m.t_anti_quant(q4, s16.bfloat16()[:1], None, None, torch.quint4x2)),
        (lambda: xquant.acts_ulq(x, torch.full((6, 1), -1.0, dtype=dtype), s16, True, 4),
         lambda: ops.acts_ulq(x, torch.full((6, 1), -1.0, dtype=dtype), s16, True, 4),
         lambda: m.t_acts_ulq(x, torch.full((6, 1), -1.0, dtype=dtype), s16, True, 4)),
    ]
    if dtype == torch.float32:  # Python-number clamps take the fast path for float32 x
        cases.append((lambda: xquant.acts_ulq(x, -0.7, 1.3),
                      lambda: ops.acts_ulq(x, torch.tensor(-0.7), torch.tensor(1.3)),
                      lambda: m.t_acts_ulq(x, -0.7, 1.3, False, 8)))
    for fast, full, core in cases:
        assert core() is not None  # plain eager: the compiled core computes
        assert _same(fast(), full())


@pytest.mark.parametrize("m", LENIENT, ids=LENIENT_IDS)
def test_fast_path_in_place_forms(m, monkeypatch):
    monkeypatch.setattr(npu, "_fast", m)
    x = _data(torch.float32, 8, 16)
    a, b = x.clone(), x.clone()
    v = a._version
    assert xquant.npu_fake_tensor_quant_inplace(a, torch.tensor([2.0]), 6) is a
    ops.fake_tensor_quant_inplace(b, torch.tensor([2.0]), 6)
    assert _same(a, b) and a._version > v  # the version counter moves, as for torch's in-place operators
    src, scale, offset = x, torch.full((8, 1), 4.0), torch.full((8, 1), 100.0)
    o1, o2 = torch.zeros(8, 16, dtype=torch.uint8), torch.zeros(8, 16, dtype=torch.uint8)
    v = o1._version
    assert xquant.quant(o1, src, scale, xquant.QuantMode.ASYM, offset) is None
    ops.tile_quant(o2, src, scale, "ASYM", offset)
    assert torch.equal(o1, o2) and o1._version > v
    # a lazily copied (copy-on-write) tensor written in place: the write materializes its own storage
    if hasattr(torch, "_lazy_clone"):
        c = torch._lazy_clone(x)
        assert xquant.npu_fake_tensor_quant_inplace(c, torch.tensor([2.0]), 6) is c
        assert _same(c, b) and _same(x, _data(torch.float32, 8, 16))  # the original is untouched
        oc = torch._lazy_clone(torch.zeros(8, 16, dtype=torch.uint8))
        oc_base = torch._lazy_clone(oc)
        xquant.quant(oc, src, scale, xquant.QuantMode.ASYM, offset)
        assert torch.equal(oc, o2) and not oc_base.any()


@pytest.mark.parametrize("m", LENIENT, ids=LENIENT_IDS)
def test_in_place_fast_path_keeps_autograd_honest(m, monkeypatch):
    """A tensor saved for another operator's backward and then quantized in place: autograd notices."""
    monkeypatch.setattr(npu, "_fast", m)
    w = torch.randn(5, requires_grad=True)
    x = torch.randn(5)
    y = (w * x).sum()
    xquant.npu_fake_tensor_quant_inplace(x, 1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


@pytest.mark.parametrize("m", LENIENT, ids=LENIENT_IDS)
def test_lenient_core_declines_what_it_cannot_do_plainly(m):
    x = torch.randn(4, 8)
    a = torch.tensor([1.0])
    lenient = m.t_fake_tensor_quant
    assert lenient(x, a, None, 8, False, True) is not None
    declined = [
        (x.t(), a, None, 8, False, True),                              # not contiguous
        (x.to("meta"), a, None, 8, False, True),                       # meta
        (x.double(), a, None, 8, False, True),                         # unsupported dtype
        (torch._neg_view(x), a, None, 8, False, True),                 # neg bit
        (x, a, None, 8.0, False, True),                                # num_bits not an int
        (x, a, None, 2**40, False, True),                              # num_bits beyond 32 bits
        (x, a, None, 8, 1, True),                                      # is_unsigned not a bool
        (x, "1.0", None, 8, False, True),                              # amax neither tensor nor number
        (x, a, 1.0, 8, False, True),                                   # axis not an int
    ]
    for args in declined:
        assert lenient(*args) is None, args
    # autograd recording is the only obstacle: NotImplemented (the caller records through autograd.Function)
    assert lenient(x.clone().requires_grad_(), a, None, 8, False, True) is NotImplemented
    assert lenient(x, a.clone().requires_grad_(), None, 8, False, True) is NotImplemented
    assert m.t_acts_ulq(x.clone().requires_grad_(), -1.0, 1.0, False, 8) is NotImplemented
    assert m.t_quantize(x.clone().requires_grad_(), a, None, torch.qint8, 1, True) is None
    with torch.no_grad():  # requires_grad without grad mode: plain
        assert lenient(x.clone().requires_grad_(), a, None, 8, False, True) is not None

    class Sub(torch.Tensor):
        pass

    assert lenient(x.as_subclass(Sub), a, None, 8, False, True) is None


@pytest.mark.parametrize("m", LENIENT, ids=LENIENT_IDS)
def test_modes_and_transforms_take_the_full_path(m, monkeypatch):
    monkeypatch.setattr(npu, "_fast", m)
    x = torch.randn(4, 8)
    a = torch.tensor([1.0])
    seen = []

    class Dispatch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    class Function(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Dispatch():
        assert m.t_fake_tensor_quant(x, a, None, 8, False, True) is None
        y = xquant.npu_fake_tensor_quant(x, a)
    assert "xquant.fake_tensor_quant.default" in seen  # the custom operator ran under the mode
    assert torch.equal(y, xquant.npu_fake_tensor_quant(x, a))
    with Function():
        assert m.t_fake_tensor_quant(x, a, None, 8, False, True) is None
    with torch.profiler.profile() as prof:
        xquant.npu_fake_tensor_quant(x, a)
    assert any("xquant::fake_tensor_quant" in e.name for e in prof.events())  # visible to the profiler
    # functorch: vmap over the custom operator's batching fallback
    xs = torch.randn(3, 4, 8)
    ys = torch.vmap(lambda t: xquant.npu_fake_tensor_quant(t, a))(xs)
    assert torch.equal(ys, torch.stack([xquant.npu_fake_tensor_quant(t, a) for t in xs]))


def test_autograd_still_records_through_the_full_path():
    x = torch.randn(6, requires_grad=True)
    y = xquant.npu_fake_tensor_quant(x, 1.0)
    assert y.grad_fn is not None
    with torch.no_grad():
        assert xquant.npu_fake_tensor_quant(x, 1.0).grad_fn is None
    p = torch.nn.Parameter(torch.randn(6))
    with torch.inference_mode():  # parameters in inference: the fast path
        assert torch.equal(xquant.npu_fake_tensor_quant(p, 1.0), xquant.npu_fake_tensor_quant(p.detach(), 1.0))


@pytest.mark.parametrize("dtype", DTYPES)
def test_eager_autograd_path_equals_custom_operator_autograd(dtype):
    """With autograd recording, plain eager calls use an autograd.Function over the same kernels; its
    values and gradients equal those of the registered custom operators' autograd."""
    x0 = _data(dtype, 4, 6, 16)
    amax0 = torch.tensor([2.0], dtype=dtype)
    amax_c0 = (torch.rand(6) * 3 + 0.1).to(dtype)
    lo0, hi0 = torch.full((6, 1), -1.0, dtype=dtype), (torch.rand(16) + 0.5).to(dtype)
    g = torch.randn(4, 6, 16).to(dtype)

    def run(use_ops):
        x, amax, amax_c, lo, hi = (t.clone().requires_grad_() for t in (x0, amax0, amax_c0, lo0, hi0))
        if use_ops:
            ys = [ops.fake_tensor_quant(x, amax, 6, False, True), ops.fake_tensor_quant_with_axis(x, amax_c, 1),
                  ops.acts_ulq(x, lo, hi, False, 8)[0]]
        else:
            ys = [xquant.npu_fake_tensor_quant(x, amax, 6), xquant.npu_fake_tensor_quant_with_axis(x, amax_c, 1),
                  xquant.acts_ulq(x, lo, hi)[0]]
            assert [type(y.grad_fn).__name__ for y in ys] == ["_FakeQuantFnBackward", "_FakeQuantFnBackward",
                                                             "_ActsUlqFnBackward"]
        sum((y.float() * g.float()).sum() for y in ys).backward()
        return [y.detach() for y in ys] + [t.grad for t in (x, amax, amax_c, lo, hi)]

    assert _same(run(False), run(True))


def test_eager_autograd_with_python_number_parameters():
    x0 = _data(torch.float32, 5, 8)
    g = torch.randn(5, 8)
    xa, xb = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    ya = xquant.npu_fake_tensor_quant(xa, 1.5)
    yb = ops.fake_tensor_quant(xb, torch.tensor(1.5), 8, False, True)
    (ya * g).sum().backward()
    (yb * g).sum().backward()
    assert type(ya.grad_fn).__name__ == "_FakeQuantFnBackward" and _same((ya.detach(), xa.grad), (yb.detach(), xb.grad))
    xa, xb = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    ya = xquant.acts_ulq(xa, -0.5, 2.0)[0]
    yb = ops.acts_ulq(xb, torch.tensor(-0.5), torch.tensor(2.0), False, 8)[0]
    (ya * g).sum().backward()
    (yb * g).sum().backward()
    assert type(ya.grad_fn).__name__ == "_ActsUlqFnBackward" and _same((ya.detach(), xa.grad), (yb.detach(), xb.grad))


# ---- xquant._torch_fast (the fast path compiled against PyTorch's C++ API) and its fallback ------------------

needs_torch_fast = pytest.mark.skipif(
    _torch_fast is None, reason="xquant._torch_fast was not built (torch was not importable when installing)")


@needs_torch_fast
def test_torch_fast_is_chosen_when_built_for_this_torch():
    assert _torch_fast.TORCH_VERSION == torch.__version__
    assert _torch_ops.TORCH_FAST is _torch_fast and _torch_ops.FAST is _torch_fast and npu._fast is _torch_fast


def test_torch_fast_fallback_on_version_mismatch_missing_module_or_opt_out(monkeypatch):
    assert _torch_ops._load_torch_fast("0.0.0+another.build") is None  # built for another torch: not loaded
    monkeypatch.setitem(sys.modules, "xquant._torch_fast_info", None)  # not built: its version file is absent
    assert _torch_ops._load_torch_fast(torch.__version__) is None
    monkeypatch.delitem(sys.modules, "xquant._torch_fast_info")
    if _torch_fast is not None:
        assert _torch_ops._load_torch_fast(torch.__version__) is _torch_fast
        monkeypatch.setattr(_torch_fast, "TORCH_VERSION", "0.0.0+another.build")  # the binary disagrees
        assert _torch_ops._load_torch_fast(torch.__version__) is None
        monkeypatch.undo()
    monkeypatch.setenv("XQUANT_TORCH_FAST", "0")
    assert _torch_ops._load_torch_fast(torch.__version__) is None


def test_torch_fast_opt_out_takes_the_core_path_end_to_end():
    """A process where _torch_fast is not used (XQUANT_TORCH_FAST=0, as when it is missing or was built for
    another torch): xquant.npu runs through _core, with the same results."""
    code = textwrap.dedent("""
        import torch, xquant
        from xquant import _core, _torch_ops, npu
        x = torch.linspace(-3, 3, 96).reshape(4, 24)
        y = xquant.npu_quantize(x, torch.tensor([0.02]), None, torch.qint8)
        assert npu._fast is _core and _torch_ops.FAST is _core and _torch_ops.TORCH_FAST is None
        assert torch.equal(y, torch.ops.xquant.quantize(x, torch.tensor([0.02]), None, torch.qint8, 1, True))
        print("ok")
    """)
    env = dict(os.environ, XQUANT_TORCH_FAST="0")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


@needs_torch_fast
def test_torch_fast_large_outputs_and_released_gil():
    """Outputs of 2 MiB and more come from xquant's allocator (at::from_blob with a deleter), and calls on
    32 Ki elements and more release the GIL: same values as the custom operators, memory that outlives
    the call."""
    x = _data(torch.float32, 1024, 1024)  # 4 MiB
    amax = torch.tensor([2.5])
    y = _torch_fast.t_fake_tensor_quant(x, amax, None, 8, False, True)
    ref = ops.fake_tensor_quant(x, amax, 8, False, True)
    assert _same(y, ref)
    ys = [_torch_fast.t_acts_ulq(x, -1.0, 1.5, False, 8) for _ in range(3)]
    del ys[1]  # freed through the deleter, back to xquant's cache
    again = _torch_fast.t_acts_ulq(x, -1.0, 1.5, False, 8)
    assert _same(ys[0], ops.acts_ulq(x, torch.tensor(-1.0), torch.tensor(1.5), False, 8))
    assert _same(ys[1], again) and _same(ys[0], again)
    y8 = _torch_fast.t_quantize(x.view(-1, 8), torch.tensor([0.05]), None, torch.qint8, 1, True)
    assert y8.dtype == torch.int8 and _same(y8, ops.quantize(x.view(-1, 8), torch.tensor([0.05]), None,
                                                            torch.qint8, 1, True))


@needs_torch_fast
def test_torch_fast_shares_the_library_state_of_core():
    """One xquant library per process (_torch_fast calls it through _core's capsule): a block _torch_fast
    frees is reused by _core's next allocation of that size from the library's cache, and the other way
    round; a second, linked-in copy of the library would have a cache (and threads, backend) of its own."""
    x, amax = _data(torch.float32, 1024, 1024), torch.tensor([2.5])  # 4 MiB outputs: the library's allocator
    limit = xquant.get_memory_cache_limit()
    try:
        xquant.set_memory_cache_limit(0)  # empty the cache
        xquant.set_memory_cache_limit(limit)
        y = _torch_fast.t_fake_tensor_quant(x, amax, None, 8, False, True)
        p = y.data_ptr()
        del y
        z = _core.empty_torch([1024, 1024], "float32")
        assert z.data_ptr() == p
        del z
        assert _torch_fast.t_fake_tensor_quant(x, amax, None, 8, False, True).data_ptr() == p
    finally:
        xquant.set_memory_cache_limit(limit)


@needs_torch_fast
def test_torch_fast_declines_what_the_core_declines():
    """Every _torch_fast function returns None (full path) under a mode, for a tensor it cannot read, or
    where an in-place write needs torch's checks; the in-place forms refuse inference tensors and views
    under grad mode."""
    F = _torch_fast
    x, s = torch.randn(4, 8), torch.tensor([0.05])
    w8 = torch.randint(-128, 128, (4, 8), dtype=torch.int8)
    out = torch.empty(4, 8, dtype=torch.int8)
    calls = [
        lambda t: F.t_fake_tensor_quant(t, s, None, 8, False, True),
        lambda t: F.t_fake_tensor_quant_inplace(t.clone(), s, 8, False, True),
        lambda t: F.t_quantize(t, s, None, torch.qint8, 1, True),
        lambda t: F.t_tile_quant(out, t, torch.full((4, 1), 2.0), "SYM", None),
        lambda t: F.t_dynamic_quant_asymmetric(t, None, None, None, "pertoken"),
        lambda t: F.t_dynamic_quant(t, None, None, None),
        lambda t: F.t_anti_quant(w8, s, None, torch.float32, None) if t is x else F.t_anti_quant(t, s, None, None,
                                                                                                   None),
        lambda t: F.t_acts_ulq(t, -1.0, 1.0, False, 8),
    ]
    for call in calls:
        assert call(x) is not None
        assert call(x.t().contiguous().t()) is None  # not contiguous
        assert call(x.to("meta")) is None
        assert call(torch.nested.nested_tensor([x[0], x[1, :3]])) is None

    class Dispatch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class Function(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    for mode in (Dispatch(), Function(), torch.autograd.profiler.profile()):
        with mode:
            assert all(call(x) is None for call in calls), mode
    assert F.plain_modes()
    assert torch.vmap(lambda t: torch.tensor(F.plain_modes()))(x).logical_not().all()
    traced = []
    torch.jit.trace(lambda t: (traced.append(F.plain_modes()), t * 2)[1], x, check_trace=False)
    assert traced == [False]
    with torch.inference_mode():
        xi = torch.randn(4, 8)
    for lenient in LENIENT:  # inference tensors (writable only inside inference mode): the full path decides
        assert lenient.t_fake_tensor_quant_inplace(xi, s, 8, False, True) is None
    with torch.inference_mode():
        assert F.t_fake_tensor_quant_inplace(xi, s, 8, False, True) is None
        assert xquant.npu_fake_tensor_quant_inplace(xi, s) is xi
    view = torch.randn(8, 8)[2:6]
    assert F.t_fake_tensor_quant_inplace(view, s, 8, False, True) is None  # a view under grad mode
    with torch.no_grad():
        assert F.t_fake_tensor_quant_inplace(view, s, 8, False, True) is view
    with pytest.raises(TypeError, match="takes 6 arguments"):
        F.t_fake_tensor_quant(x, s)
