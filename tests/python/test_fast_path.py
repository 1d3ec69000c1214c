"""The eager fast path of xquant.npu on torch tensors (xquant._torch_ext.f_<op>: the operators' C++
implementation called without the dispatcher): it gives bit for bit the results of the operators, it is
taken only in plain eager mode, and everything else (autograd recording, tracing, modes, unusual tensors and
arguments) takes the full path (torch.ops.xquant.*)."""

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
from xquant import _torch_ops, npu

xquant.register_torch_ops()
_torch_ext = importlib.import_module("xquant._torch_ext")

# The module whose lenient f_* functions the fast path calls.
LENIENT = [_torch_ext]
LENIENT_IDS = ["_torch_ext"]

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
    assert _torch_ops.FAST is _torch_ext and npu._fast is _torch_ext


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
         lambda: m.f_fake_tensor_quant(x, amax, None, 5, True, False)),
        (lambda: xquant.npu_fake_tensor_quant(x, 1.75),
         lambda: ops.fake_tensor_quant(x, torch.tensor(1.75), 8, False, True),
         lambda: m.f_fake_tensor_quant(x, 1.75, None, 8, False, True)),
        (lambda: xquant.npu_fake_tensor_quant_with_axis(x, amax_c, 1),
         lambda: ops.fake_tensor_quant_with_axis(x, amax_c, 1),
         lambda: m.f_fake_tensor_quant(x, amax_c, 1, 8, False, True)),
        (lambda: xquant.npu_quantize(x, s16, s16, torch.quint4x2, -1, False),
         lambda: ops.quantize(x, s16, s16, torch.quint4x2, -1, False),
         lambda: m.f_quantize(x, s16, s16, torch.quint4x2, -1, False)),
        (lambda: xquant.npu_quantize(x, amax_c, torch.arange(6, dtype=torch.int8), torch.quint8, 1),
         lambda: ops.quantize(x, amax_c, torch.arange(6, dtype=torch.int8), torch.quint8, 1),
         lambda: m.f_quantize(x, amax_c, torch.arange(6, dtype=torch.int8), torch.quint8, 1, True)),
        (lambda: xquant.npu_dynamic_quant_asymmetric(x, smooth_scales=s16, dst_type=torch.quint4x2),
         lambda: ops.dynamic_quant_asymmetric(x, s16, None, torch.quint4x2),
         lambda: m.f_dynamic_quant_asymmetric(x, s16, None, torch.quint4x2, "pertoken")),
        (lambda: xquant.npu_dynamic_quant_asymmetric(x, quant_mode="pertensor"),
         lambda: ops.dynamic_quant_asymmetric(x, quant_mode="pertensor"),
         lambda: m.f_dynamic_quant_asymmetric(x, None, None, None, "pertensor")),
        (lambda: xquant.npu_dynamic_quant(x, smooth_scales=s16, dst_type=torch.quint4x2),
         lambda: ops.dynamic_quant(x, s16, None, torch.quint4x2),
         lambda: m.f_dynamic_quant(x, s16, None, torch.quint4x2, "pertoken")),
        (lambda: xquant.npu_dynamic_quant(x, smooth_scales=moe, group_index=ends),
         lambda: ops.dynamic_quant(x, moe, ends),
         lambda: m.f_dynamic_quant(x, moe, ends, None, "pertoken")),
        (lambda: xquant.npu_anti_quant(q8, s16.float(), offset=s16.float(), dst_dtype=dtype),
         lambda: ops.anti_quant(q8, s16.float(), s16.float(), dtype),
         lambda: m.f_anti_quant(q8, s16.float(), s16.float(), dtype, None)),
        (lambda: xquant.npu_anti_quant(q4, s16.bfloat16()[:1], src_dtype=torch.quint4x2),
         lambda: ops.anti_quant(q4, s16.bfloat16()[:1], None, None, torch.quint4x2),
         lambda: m.f_anti_quant(q4, s16.bfloat16()[:1], None, None, torch.quint4x2)),
        (lambda: xquant.acts_ulq(x, torch.full((6, 1), -1.0, dtype=dtype), s16, True, 4),
         lambda: ops.acts_ulq(x, torch.full((6, 1), -1.0, dtype=dtype), s16, True, 4),
         lambda: m.f_acts_ulq(x, torch.full((6, 1), -1.0, dtype=dtype), s16, True, 4)),
    ]
    if dtype == torch.float32:  # Python-number clamps take the fast path for float32 x
        cases.append((lambda: xquant.acts_ulq(x, -0.7, 1.3),
                      lambda: ops.acts_ulq(x, torch.tensor(-0.7), torch.tensor(1.3)),
                      lambda: m.f_acts_ulq(x, -0.7, 1.3, False, 8)))
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
    lenient = m.f_fake_tensor_quant
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
    # autograd recording: the operators with autograd record through their C++ autograd kernel, called directly
    assert lenient(x.clone().requires_grad_(), a, None, 8, False, True).grad_fn is not None
    assert lenient(x, a.clone().requires_grad_(), None, 8, False, True).grad_fn is not None
    assert m.f_acts_ulq(x.clone().requires_grad_(), -1.0, 1.0, False, 8)[0].grad_fn is not None
    assert m.f_quantize(x.clone().requires_grad_(), a, None, torch.qint8, 1, True) is None
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
        assert m.f_fake_tensor_quant(x, a, None, 8, False, True) is None
        y = xquant.npu_fake_tensor_quant(x, a)
    assert "xquant.fake_tensor_quant.default" in seen  # the custom operator ran under the mode
    assert torch.equal(y, xquant.npu_fake_tensor_quant(x, a))
    with Function():
        assert m.f_fake_tensor_quant(x, a, None, 8, False, True) is None
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
    """With autograd recording, xquant.npu calls go through the operators and their registered autograd
    formulas: values and gradients equal those of the operators called directly."""
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
            assert all(y.grad_fn is not None for y in ys)
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
    assert ya.grad_fn is not None and _same((ya.detach(), xa.grad), (yb.detach(), xb.grad))
    xa, xb = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    ya = xquant.acts_ulq(xa, -0.5, 2.0)[0]
    yb = ops.acts_ulq(xb, torch.tensor(-0.5), torch.tensor(2.0), False, 8)[0]
    (ya * g).sum().backward()
    (yb * g).sum().backward()
    assert ya.grad_fn is not None and _same((ya.detach(), xa.grad), (yb.detach(), xb.grad))


# ---- the torch extension: built for this torch, or a clear error saying how to rebuild -------------------------

def test_extension_is_built_for_this_torch():
    from xquant._build_info import TORCH_VERSION

    assert TORCH_VERSION == torch.__version__ == _torch_ext.TORCH_VERSION


@pytest.mark.parametrize("built_for", ["", "0.0.0+another.build"])
def test_another_torch_raises_saying_how_to_rebuild(built_for):
    """xquant built without torch, or against another torch: `import xquant` works (NumPy), the first call with
    a torch tensor raises ImportError saying how to rebuild, and the extension binary is never loaded."""
    code = textwrap.dedent(f"""
        import sys, types, torch
        info = types.ModuleType("xquant._build_info")  # what the install wrote, as another build would have
        info.TORCH_VERSION = {built_for!r}
        sys.modules["xquant._build_info"] = info
        import numpy as np, xquant
        assert xquant.npu_fake_tensor_quant(np.ones(4, np.float32), np.float32(1)).shape == (4,)
        for call in (lambda: xquant.npu_fake_tensor_quant(torch.ones(4), 1.0), xquant.register_torch_ops):
            try:
                call()
            except ImportError as e:
                print(e)
            else:
                raise AssertionError("no ImportError")
        assert "xquant._torch_ext" not in sys.modules
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 2 and lines[0] == lines[1]
    assert "rebuild xquant against the torch in use: python -m pip install --no-build-isolation" in lines[0]
    assert (f"built against torch {built_for} but torch {torch.__version__} is running" in lines[0] if built_for
            else "installed without its PyTorch operators" in lines[0])


def test_extension_large_outputs_and_released_gil():
    """Outputs of 2 MiB and more come from xquant's allocator (at::from_blob with a deleter), and calls on
    32 Ki elements and more release the GIL: same values as the custom operators, memory that outlives
    the call."""
    x = _data(torch.float32, 1024, 1024)  # 4 MiB
    amax = torch.tensor([2.5])
    y = _torch_ext.f_fake_tensor_quant(x, amax, None, 8, False, True)
    ref = ops.fake_tensor_quant(x, amax, 8, False, True)
    assert _same(y, ref)
    ys = [_torch_ext.f_acts_ulq(x, -1.0, 1.5, False, 8) for _ in range(3)]
    del ys[1]  # freed through the deleter, back to xquant's cache
    again = _torch_ext.f_acts_ulq(x, -1.0, 1.5, False, 8)
    assert _same(ys[0], ops.acts_ulq(x, torch.tensor(-1.0), torch.tensor(1.5), False, 8))
    assert _same(ys[1], again) and _same(ys[0], again)
    y8 = _torch_ext.f_quantize(x.view(-1, 8), torch.tensor([0.05]), None, torch.qint8, 1, True)
    assert y8.dtype == torch.int8 and _same(y8, ops.quantize(x.view(-1, 8), torch.tensor([0.05]), None,
                                                            torch.qint8, 1, True))


def test_extension_shares_the_library_state_of_core():
    """One xquant library per process (_torch_ext calls the one in _core through its capsule): a block freed
    by a fast-path result is reused by the next allocation of that size, through the dispatcher too, from the
    cache whose limit xquant.set_memory_cache_limit (in _core) sets."""
    x, amax = _data(torch.float32, 1024, 1024), torch.tensor([2.5])  # 4 MiB outputs: the library's allocator
    limit = xquant.get_memory_cache_limit()
    try:
        xquant.set_memory_cache_limit(0)  # empty the cache
        xquant.set_memory_cache_limit(limit)
        y = _torch_ext.f_fake_tensor_quant(x, amax, None, 8, False, True)
        p = y.data_ptr()
        del y
        z = ops.fake_tensor_quant(x, amax, 8, False, True)  # the dispatcher's kernel: the same cache
        assert z.data_ptr() == p
        del z
        assert _torch_ext.f_fake_tensor_quant(x, amax, None, 8, False, True).data_ptr() == p
    finally:
        xquant.set_memory_cache_limit(limit)


def test_extension_declines_what_the_core_declines():
    """Every f_* function returns None (full path) under a mode, for a tensor it cannot read, or
    where an in-place write needs torch's checks; the in-place forms refuse inference tensors and views
    under grad mode."""
    F = _torch_ext
    x, s = torch.randn(4, 8), torch.tensor([0.05])
    w8 = torch.randint(-128, 128, (4, 8), dtype=torch.int8)
    out = torch.empty(4, 8, dtype=torch.int8)
    calls = [
        lambda t: F.f_fake_tensor_quant(t, s, None, 8, False, True),
        lambda t: F.f_fake_tensor_quant_inplace(t.clone(), s, 8, False, True),
        lambda t: F.f_quantize(t, s, None, torch.qint8, 1, True),
        lambda t: F.f_tile_quant(out, t, torch.full((4, 1), 2.0), "SYM", None),
        lambda t: F.f_dynamic_quant_asymmetric(t, None, None, None, "pertoken"),
        lambda t: F.f_dynamic_quant(t, None, None, None, "pertoken"),
        lambda t: F.f_anti_quant(w8, s, None, torch.float32, None) if t is x else F.f_anti_quant(t, s, None, None,
                                                                                                   None),
        lambda t: F.f_acts_ulq(t, -1.0, 1.0, False, 8),
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
        assert lenient.f_fake_tensor_quant_inplace(xi, s, 8, False, True) is None
    with torch.inference_mode():
        assert F.f_fake_tensor_quant_inplace(xi, s, 8, False, True) is None
        assert xquant.npu_fake_tensor_quant_inplace(xi, s) is xi
    view = torch.randn(8, 8)[2:6]
    assert F.f_fake_tensor_quant_inplace(view, s, 8, False, True) is None  # a view under grad mode
    with torch.no_grad():
        assert F.f_fake_tensor_quant_inplace(view, s, 8, False, True) is view
    with pytest.raises(TypeError, match="takes 6 arguments"):
        F.f_fake_tensor_quant(x, s)


# ---- torch.vmap: batching rules, or a clear refusal (never torch's slow per-example fallback) ----------------

def test_vmap_batching_rules_equal_per_example_calls_without_fallback_warning():
    """fake_tensor_quant (shared and per-example amax), fake_tensor_quant_with_axis and acts_ulq batch; no
    call falls back to torch's per-example loop, whose warning asked users to file an issue."""
    import warnings

    g = torch.Generator().manual_seed(7)
    xs = torch.randn(3, 4, 8, generator=g) * 3
    a, am, ac = torch.tensor([2.0]), torch.tensor([1.0, 2.0, 3.0]), torch.rand(8, generator=g) + 0.5
    lo, hi = -torch.rand(3, 1, 8, generator=g), torch.rand(8, generator=g) + 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the fallback's UserWarning would fail the test
        assert _same(torch.vmap(lambda t: xquant.npu_fake_tensor_quant(t, a))(xs),
                     torch.stack([xquant.npu_fake_tensor_quant(t, a) for t in xs]))
        assert _same(torch.vmap(lambda t: xquant.npu_fake_tensor_quant(t, a), in_dims=1)(xs.transpose(0, 1))
                     .contiguous(), torch.stack([xquant.npu_fake_tensor_quant(t, a) for t in xs]))
        assert _same(torch.vmap(xquant.npu_fake_tensor_quant)(xs, am),
                     torch.stack([xquant.npu_fake_tensor_quant(t, b) for t, b in zip(xs, am)]))
        assert _same(torch.vmap(lambda t: xquant.npu_fake_tensor_quant_with_axis(t, ac, -1))(xs),
                     torch.stack([xquant.npu_fake_tensor_quant_with_axis(t, ac, -1) for t in xs]))
        ys = torch.vmap(lambda t, m: xquant.acts_ulq(t, m, hi))(xs, lo)
        ref = [xquant.acts_ulq(t, m, hi) for t, m in zip(xs, lo)]
        assert _same(ys, tuple(torch.stack([r[k] for r in ref]) for k in range(4)))


def test_vmap_declines_with_a_clear_error():
    xs = torch.randn(3, 4, 16)
    s = torch.tensor([0.1])
    calls = {
        "quantize": lambda t: xquant.npu_quantize(t, s, None, torch.qint8),
        "dynamic_quant": lambda t: xquant.npu_dynamic_quant(t)[0],
        "dynamic_quant_asymmetric": lambda t: xquant.npu_dynamic_quant_asymmetric(t)[0],
        "anti_quant": lambda t: xquant.npu_anti_quant(t.to(torch.int8), s),
        "fake_tensor_quant_backward": lambda t: xquant.fake_tensor_quant_backward(t, t, s)[0],
    }
    for name, call in calls.items():
        with pytest.raises(NotImplementedError, match=rf"^xquant::{name}: torch.vmap is not supported by this "
                                                      r"operator \(it has no batching rule\)"):
            torch.vmap(call)(xs)
    with pytest.raises(NotImplementedError, match="vmap over amax"):
        torch.vmap(lambda t, m: xquant.npu_fake_tensor_quant_with_axis(t, m, 0))(xs, torch.ones(3, 4))
