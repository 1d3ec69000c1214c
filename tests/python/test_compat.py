"""xquant.compat: Ascend code (import torch_npu / mx_driving, device='npu', torch.ops.npu.*) runs unchanged.

Global state (the stand-in modules, the device mode, torch.compile) is exercised in subprocesses; the
operator numerics run in this process under a module-scoped install() / uninstall(). The symmetric
dynamic quantization (SPEC section 6) and the dequantization (SPEC section 7) are checked bit for bit
against the NumPy references below, written from SPEC.md alone.
"""

import pytest

pytest.importorskip("torch", reason="torch is not installed (scripts/setup-python installs it)")
pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (scripts/setup-python installs it)")

import inspect
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import torch

import golden
import xquant
import xquant.npu
from golden import BF16, F32, assert_same
from tutil import to_numpy, to_torch, with_edges

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLES = os.path.join(ROOT, "examples", "ascend")
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(xquant.__file__)))  # where `import xquant` works


# ---- NumPy references of SPEC sections 6 and 7 ----------------------------------------------------------------

def ref_dynamic_quant(x, smooth_scales=None, group_index=None, int4=False):
    """SPEC 6: per row, scale = rowMax(|x'|) / DST_MAX (float32 division), y = sat(rint(x' / scale))."""
    x32 = np.asarray(x).astype(np.float32)
    h = x32.shape[-1]
    rows = x32.reshape(-1, h)
    if smooth_scales is not None:
        sm = np.asarray(smooth_scales).astype(np.float32).reshape(-1, h)
        ends = [int(e) for e in (group_index if group_index is not None else [rows.shape[0]])]
        for r in range(rows.shape[0]):
            e = next(i for i, end in enumerate(ends) if end > r)  # the first group whose end lies past row r
            rows[r] = rows[r] * sm[e]
    dst_max = F32(7) if int4 else F32(127)
    scale = np.empty(rows.shape[0], F32)
    y = np.empty(rows.shape, np.int64)
    for r in range(rows.shape[0]):
        row = rows[r]
        amax = F32(np.max(np.abs(row))) if row.size else F32(0)  # NaN anywhere -> NaN
        with np.errstate(all="ignore"):
            scale[r] = F32(amax / dst_max)
            q = np.rint((row / scale[r]).astype(F32))
        y[r] = golden.sat_int(q, -8 if int4 else -128, 7 if int4 else 127, np.int64)
    y = y.reshape(x32.shape)
    y = golden.pack_int4(y) if int4 else y.astype(np.int8)
    return y, scale.reshape(x32.shape[:-1])


def ref_anti_quant(x, scale, offset=None, dst=np.float16):
    """SPEC 7: out = narrow((float(x) + offset) * scale); int32 x holds eight int4 per word."""
    x = np.asarray(x)
    v = (golden.unpack_int4(x) if x.dtype == np.int32 else x).astype(np.float32)
    if offset is not None:
        v = (v + np.asarray(offset).astype(np.float32)).astype(F32)
    v = (v * np.asarray(scale).astype(np.float32)).astype(F32)
    with np.errstate(over="ignore"):  # float32 beyond float16's range narrows to +-Inf on purpose
        return v.astype(dst)


# ---- helpers --------------------------------------------------------------------------------------------------

def _env(extra_path=None):
    env = dict(os.environ)
    parts = ([extra_path] if extra_path else []) + [PKG_PARENT, env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in parts if p)
    env.setdefault("OMP_NUM_THREADS", "2")
    return env


def _run(args, cwd=None, extra_path=None, timeout=240):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd or ROOT,
                          env=_env(extra_path), timeout=timeout)


@pytest.fixture(scope="module")
def torch_npu():
    import xquant.compat as compat

    assert not compat.is_installed()
    compat.install()
    try:
        yield sys.modules["torch_npu"]
    finally:
        compat.uninstall()
    assert "torch_npu" not in sys.modules and not hasattr(torch, "npu")


# ---- schemas and signatures -----------------------------------------------------------------------------------

# torch_npu's published schemas (op-plugin op_plugin_functions.yaml; the dynamic quantizations as op-plugin 26.x:
# integer dtype codes, quant_mode, dst_type_max).
ASCEND_SCHEMAS = {
    "npu_quantize": "npu::npu_quantize(Tensor self, Tensor scales, Tensor? zero_points, int dtype, "
                    "int axis=1, bool div_mode=True) -> Tensor",
    "npu_dynamic_quant": "npu::npu_dynamic_quant(Tensor input, *, Tensor? smooth_scales=None, "
                         "Tensor? group_index=None, int? dst_type=None, str quant_mode=\"pertoken\", "
                         "float dst_type_max=0.) -> (Tensor, Tensor)",
    "npu_dynamic_quant_asymmetric": "npu::npu_dynamic_quant_asymmetric(Tensor input, *, Tensor? smooth_scales=None, "
                                    "Tensor? group_index=None, int? dst_type=None, "
                                    "str quant_mode=\"pertoken\", float dst_type_max=0.) -> (Tensor, Tensor, Tensor)",
    "npu_anti_quant": "npu::npu_anti_quant(Tensor x, Tensor scale, *, Tensor? offset=None, "
                      "int? dst_dtype=None, int? src_dtype=None) -> Tensor",
}


@pytest.mark.parametrize("name", sorted(ASCEND_SCHEMAS))
def test_torch_ops_npu_schema_is_ascends(torch_npu, name):
    schema = getattr(torch.ops.npu, name).default._schema
    assert str(schema) == ASCEND_SCHEMAS[name]
    # and structurally: names, keyword-only markers, defaults
    args = [(a.name, a.kwarg_only, a.default_value) for a in schema.arguments]
    if name == "npu_quantize":
        assert args == [("self", False, None), ("scales", False, None), ("zero_points", False, None),
                        ("dtype", False, None), ("axis", False, 1), ("div_mode", False, True)]
    elif name == "npu_anti_quant":
        assert args == [("x", False, None), ("scale", False, None), ("offset", True, None),
                        ("dst_dtype", True, None), ("src_dtype", True, None)]
    else:
        assert args[0] == ("input", False, None)
        assert all(kw for _, kw, _ in args[1:]) and [a[0] for a in args[1:4]] == ["smooth_scales", "group_index",
                                                                                 "dst_type"]


def _sig(f):
    return [(p.name, p.kind.name, None if p.default is inspect.Parameter.empty else p.default)
            for p in inspect.signature(f).parameters.values()]


def test_python_signatures_are_the_documented_ones(torch_npu):
    P, K = "POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY"
    assert _sig(torch_npu.npu_quantize) == [("input", P, None), ("scales", P, None), ("zero_points", P, None),
                                            ("dtype", P, None), ("axis", P, 1), ("div_mode", P, True)]
    assert _sig(torch_npu.npu_dynamic_quant) == [("x", P, None), ("smooth_scales", K, None),
                                                 ("group_index", K, None), ("dst_type", K, None),
                                                 ("quant_mode", K, "pertoken"), ("dst_type_max", K, 0.0)]
    assert _sig(torch_npu.npu_dynamic_quant_asymmetric) == [
        ("x", P, None), ("smooth_scales", K, None), ("group_index", K, None), ("dst_type", K, None),
        ("quant_mode", K, "pertoken"), ("dst_type_max", K, 0.0)]
    assert _sig(torch_npu.npu_anti_quant) == [("x", P, None), ("scale", P, None), ("offset", K, None),
                                              ("dst_dtype", K, None), ("src_dtype", K, None)]
    import mx_driving

    fq = [("inputs", P, None), ("amax", P, None), ("num_bits", P, 8), ("is_unsigned", P, False),
          ("narrow_range", P, True)]
    assert _sig(mx_driving.npu_fake_tensor_quant) == fq
    assert _sig(mx_driving.npu_fake_tensor_quant_inplace) == fq
    assert _sig(mx_driving.npu_fake_tensor_quant_with_axis) == fq[:2] + [("axis", P, None)] + fq[2:]
    assert torch_npu.npu is torch.npu and sys.modules["torch_npu.npu"] is torch.npu
    # as on torch_npu, whose functions are torch.ops.npu packets, each carries its operator's schemas (amct
    # reads torch_npu.npu_quant_matmul._schemas to tell op-plugin versions apart)
    for name in ("npu_quantize", "npu_dynamic_quant", "npu_quant_matmul", "npu_weight_quant_batchmatmul"):
        schemas = getattr(torch_npu, name)._schemas
        assert {k: str(v) for k, v in schemas.items()} == \
               {k: str(v) for k, v in getattr(torch.ops.npu, name)._schemas.items()}
    names = [a.name for a in next(iter(torch_npu.npu_quant_matmul._schemas.values())).arguments]
    assert "x1_dtype" in names and "group_sizes" in names


# ---- numerics -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16], ids=["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("int4", [False, True], ids=["int8", "int4"])
def test_dynamic_quant_is_spec_section_6(torch_npu, rng, dtype, int4):
    x = with_edges(rng, 6 * 5 * 16, dtype).reshape(6, 5, 16)
    x[0, 1] = 0                                   # a zero row: scale 0, y 0
    x[1, 2] = np.array(np.arange(16) - 7.5, dtype=np.float32).astype(dtype)  # ties after the division
    x[2, 0, 3] = np.nan                           # a NaN row: scale NaN, y 0
    y, scale = torch_npu.npu_dynamic_quant(to_torch(x), dst_type=torch.quint4x2 if int4 else None)
    want_y, want_scale = ref_dynamic_quant(x, int4=int4)
    assert_same(to_numpy(y), want_y, "y")
    assert_same(to_numpy(scale), want_scale, "scale")
    assert to_numpy(scale)[0, 1] == 0 and np.isnan(to_numpy(scale)[2, 0])
    # torch.ops.npu and the torch_npu function are the same operator; int8 is the default dst_type
    y2, s2 = torch.ops.npu.npu_dynamic_quant(to_torch(x), dst_type=torch.quint4x2 if int4 else torch.int8)
    assert torch.equal(y2, y) and torch.equal(s2.view(torch.int32), scale.view(torch.int32))


def test_companions_empty_noncontiguous_and_errors(torch_npu):
    for shape in ((0, 16), (3, 0), (2, 0, 8)):  # empty inputs give empty outputs (SPEC rule 6)
        for dst, last in ((None, shape[-1]), (torch.quint4x2, shape[-1] // 8)):
            y, s = torch_npu.npu_dynamic_quant(torch.randn(*shape), dst_type=dst)
            assert tuple(y.shape) == shape[:-1] + (last,) and tuple(s.shape) == shape[:-1]
    assert torch_npu.npu_anti_quant(torch.zeros(3, 0, dtype=torch.int32), torch.ones(1)).shape == (3, 0)
    xt = torch.randn(16, 4).t()  # non-contiguous
    for a, b in zip(torch_npu.npu_dynamic_quant(xt), torch_npu.npu_dynamic_quant(xt.contiguous())):
        assert torch.equal(a, b)
    w = torch.randint(-128, 128, (8, 4), dtype=torch.int8).t()
    assert torch.equal(torch_npu.npu_anti_quant(w, torch.ones(8)),
                       torch_npu.npu_anti_quant(w.contiguous(), torch.ones(8)))
    with pytest.raises(ValueError, match=r"\bx\b"):
        torch_npu.npu_dynamic_quant(torch.randn(8))  # rank 1
    with pytest.raises(ValueError, match="8"):
        torch_npu.npu_dynamic_quant(torch.randn(2, 12), dst_type=torch.quint4x2)
    with pytest.raises(TypeError, match=r"\bx\b"):
        torch_npu.npu_dynamic_quant(torch.randn(2, 4, dtype=torch.float64))
    with pytest.raises((TypeError, ValueError), match="offset"):
        torch_npu.npu_anti_quant(torch.zeros(2, 4, dtype=torch.int8), torch.ones(4),
                                 offset=torch.ones(4, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=r"\bx\b"):
        torch_npu.npu_anti_quant(torch.zeros(2, 4, dtype=torch.int16), torch.ones(4))


def test_dynamic_quant_smooth_scales_and_moe_groups(torch_npu, rng):
    x = (rng.standard_normal((7, 24)) * 3).astype(np.float16)
    smooth = (rng.random(24) + 0.5).astype(np.float16)
    y, s = torch_npu.npu_dynamic_quant(to_torch(x), smooth_scales=to_torch(smooth))
    wy, ws = ref_dynamic_quant(x, smooth)
    assert_same(to_numpy(y), wy, "smooth y")
    assert_same(to_numpy(s), ws, "smooth scale")
    moe = (rng.random((3, 24)) + 0.5).astype(np.float16)
    ends = np.array([2, 2, 7], dtype=np.int32)  # an empty middle group
    y, s = torch_npu.npu_dynamic_quant(to_torch(x), smooth_scales=to_torch(moe), group_index=to_torch(ends))
    wy, ws = ref_dynamic_quant(x, moe, ends)
    assert_same(to_numpy(y), wy, "moe y")
    assert_same(to_numpy(s), ws, "moe scale")
    with pytest.raises(ValueError, match="group_index"):
        torch_npu.npu_dynamic_quant(to_torch(x), smooth_scales=to_torch(moe),
                                    group_index=torch.tensor([2, 1, 7], dtype=torch.int32))


def test_anti_quant_is_spec_section_7(torch_npu, rng):
    xi8 = rng.integers(-128, 128, size=(3, 16)).astype(np.int8)
    xi4 = golden.pack_int4(rng.integers(-8, 8, size=(3, 16)))  # int32 [3, 2], logical [3, 16]
    dsts = [(torch.float16, np.float16), (torch.bfloat16, BF16), (torch.float32, np.float32)]
    checked = 0
    for x in (xi8, xi4):
        for n in (1, 16):
            for sdt in (np.float32, BF16):
                scale = (rng.standard_normal(n) * 1e-2).astype(np.float32).astype(sdt)
                scale[0] = np.float32(65504.0 / 100).astype(sdt)  # some products overflow float16 -> Inf
                offset = rng.integers(-3, 4, size=n).astype(np.float32).astype(sdt)
                for off in (None, offset):
                    for tdst, ndst in dsts:
                        got = torch_npu.npu_anti_quant(to_torch(x), to_torch(scale),
                                                       offset=None if off is None else to_torch(off),
                                                       dst_dtype=tdst)
                        assert_same(to_numpy(got), ref_anti_quant(x, scale, off, ndst),
                                    f"x {x.dtype} n={n} scale {np.dtype(sdt)} offset {off is not None} {tdst}")
                        checked += 1
    assert checked == 2 * 2 * 2 * 2 * 3
    # double rounding: these float32 products land on a float16 (element 0) / bfloat16 (element 1) midpoint
    # that the exact product misses, so narrowing once from float32 differs from narrowing the exact value
    x2 = np.array([[11, -90]], np.int8)
    s2 = np.array([1.8373578786849976, 2.3722221851348877], np.float32)
    exact = x2.astype(np.float64) * s2.astype(np.float64)
    for k, (tdst, ndst) in enumerate(dsts[:2]):
        want = ref_anti_quant(x2, s2, None, ndst)
        assert want[0, k].astype(np.float32) != exact.astype(ndst)[0, k].astype(np.float32)
        assert_same(to_numpy(torch_npu.npu_anti_quant(to_torch(x2), to_torch(s2), dst_dtype=tdst)), want, "ties")
    # defaults: dst float16; src from x's dtype (int32 = packed int4), an explicit src_dtype must agree
    d = torch_npu.npu_anti_quant(to_torch(xi4), torch.tensor([0.5]))
    assert d.dtype == torch.float16 and d.shape == (3, 16)
    assert torch.equal(d, torch_npu.npu_anti_quant(to_torch(xi4), torch.tensor([0.5]), src_dtype=torch.quint4x2))
    with pytest.raises(ValueError, match="src_dtype"):
        torch_npu.npu_anti_quant(to_torch(xi8), torch.tensor([0.5]), src_dtype=torch.quint4x2)
    with pytest.raises(ValueError, match="scale"):
        torch_npu.npu_anti_quant(to_torch(xi8), torch.ones(5))


def test_quantize_and_asymmetric_are_xquants(torch_npu, rng):
    x = torch.from_numpy((rng.standard_normal((4, 3, 16)) * 4).astype(np.float32))
    sc, zp = torch.tensor([0.5, 0.25, 2.0]), torch.tensor([1, -2, 0], dtype=torch.int8)
    for args in ((x, sc, zp, torch.qint8, 1, True), (x, sc, None, torch.quint8, -2, True),
                 (x, torch.full((16,), 3.0), torch.zeros(16), torch.quint4x2, -1, False)):
        assert torch.equal(torch_npu.npu_quantize(*args), xquant.npu.npu_quantize(*args))
    assert torch.equal(torch_npu.npu_quantize(x, sc, zp, torch.qint8),
                       torch.ops.npu.npu_quantize(x, sc, zp, torch.qint8))
    for kw in ({}, {"dst_type": torch.quint4x2}, {"quant_mode": "pertensor"},
               {"smooth_scales": torch.rand(16) + 0.5}):
        got = torch_npu.npu_dynamic_quant_asymmetric(x, **kw)
        want = xquant.npu.npu_dynamic_quant_asymmetric(x, **kw)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and torch.equal(g, w)
    with pytest.raises(ValueError, match="dst_type_max"):
        torch_npu.npu_dynamic_quant_asymmetric(x, dst_type_max=7.0)
    with pytest.raises(ValueError, match="dst_type"):
        torch_npu.npu_dynamic_quant(x, dst_type=torch.float32)


def test_mx_driving_is_xquant_fake_quant(torch_npu, rng):
    import mx_driving

    x = torch.from_numpy(rng.standard_normal((8, 32)).astype(np.float32))
    amax = x.abs().max()
    assert torch.equal(mx_driving.npu_fake_tensor_quant(x, amax, 4), xquant.npu.npu_fake_tensor_quant(x, amax, 4))
    axis_amax = x.abs().amax(dim=0)
    assert torch.equal(mx_driving.npu_fake_tensor_quant_with_axis(x, axis_amax, axis=1),
                       xquant.npu.npu_fake_tensor_quant_with_axis(x, axis_amax, 1))
    # autograd passes through (QAT)
    w = x.clone().requires_grad_(True)
    mx_driving.npu_fake_tensor_quant(w, amax).sum().backward()
    assert w.grad is not None and w.grad.shape == w.shape


def test_fake_implementations_give_shapes_and_dtypes(torch_npu):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(5, 3, 64, dtype=torch.float16)
        y, s = torch.ops.npu.npu_dynamic_quant(x, dst_type=torch.quint4x2)
        assert (y.shape, y.dtype, s.shape, s.dtype) == ((5, 3, 8), torch.int32, (5, 3), torch.float32)
        y, s, o = torch.ops.npu.npu_dynamic_quant_asymmetric(x, quant_mode="pertensor")
        assert (y.shape, y.dtype, s.shape, o.shape) == ((5, 3, 64), torch.int8, (1,), (1,))
        q = torch.ops.npu.npu_quantize(x, torch.empty(64), torch.empty(64), torch.quint4x2, -1, False)
        assert (q.shape, q.dtype) == ((5, 3, 8), torch.int32)
        d = torch.ops.npu.npu_anti_quant(torch.empty(4, 2, dtype=torch.int32), torch.empty(16),
                                         dst_dtype=torch.bfloat16)
        assert (d.shape, d.dtype) == ((4, 16), torch.bfloat16)


def test_torch_export_keeps_the_npu_operators(torch_npu):
    class Step(torch.nn.Module):
        def forward(self, x, s):
            y, scale = torch_npu.npu_dynamic_quant(x)
            return torch_npu.npu_anti_quant(y, s, dst_dtype=torch.float32) * scale.unsqueeze(-1)

    x, s = torch.randn(4, 16), torch.rand(16)
    ep = torch.export.export(Step(), (x, s))
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert "npu.npu_dynamic_quant.default" in targets and "npu.npu_anti_quant.default" in targets
    assert torch.equal(ep.module()(x, s), Step()(x, s))


def test_companions_call_xquant_npu_when_it_has_them(torch_npu, monkeypatch):
    """The hand-over contract: the stand-in calls xquant.npu.npu_dynamic_quant / npu_anti_quant (looked up at
    call time): dst_type as torch_npu's integer code (None: int8), quant_mode / dst_type_max passed on; a float16
    default and src_dtype from x's dtype for npu_anti_quant."""
    calls = []

    def dq(input, smooth_scales=None, group_index=None, dst_type=None, quant_mode="pertoken", dst_type_max=0.0):
        calls.append(("dq", dst_type, smooth_scales is not None, quant_mode))
        return torch.zeros(input.shape, dtype=torch.int8), torch.full(input.shape[:-1], 7.0)

    def aq(x, scale, offset=None, dst_dtype=torch.float16, src_dtype=torch.int8):
        calls.append(("aq", dst_dtype, src_dtype, offset is not None))
        return torch.full((2, 16), 3.0, dtype=dst_dtype)

    monkeypatch.setattr(xquant.npu, "npu_dynamic_quant", dq, raising=False)
    monkeypatch.setattr(xquant.npu, "npu_anti_quant", aq, raising=False)
    y, s = torch_npu.npu_dynamic_quant(torch.ones(2, 8), smooth_scales=torch.ones(8))
    assert torch.equal(s, torch.full((2,), 7.0))
    d = torch_npu.npu_anti_quant(torch.zeros(2, 2, dtype=torch.int32), torch.ones(1), offset=torch.ones(1))
    assert torch.equal(d, torch.full((2, 16), 3.0, dtype=torch.float16))
    torch_npu.npu_dynamic_quant(torch.ones(2, 8), dst_type=torch.qint8)
    torch_npu.npu_anti_quant(torch.zeros(2, 16, dtype=torch.int8), torch.ones(1), dst_dtype=torch.bfloat16)
    assert calls == [("dq", None, True, "pertoken"), ("aq", torch.float16, torch.quint4x2, True),
                     ("dq", 12, False, "pertoken"), ("aq", torch.bfloat16, torch.int8, False)]


def test_device_mapping_in_process(torch_npu):
    import torch.npu as tnpu  # importable while installed
    import torch_npu.npu as tnpu2
    from torch_npu.npu import is_available

    assert tnpu is torch.npu and tnpu2 is torch.npu and is_available()
    for spec in ("npu", "npu:0", torch.device("npu"), torch.device("npu:0")):
        t = torch.randn(2, 3, device=spec)
        assert t.device.type == "cpu" and t.is_npu
    assert torch.device("npu").type == "cpu" and torch.device("npu", 0).type == "cpu"
    assert torch.zeros(2).npu().device.type == "cpu" and torch.ones(2).to("npu:0").is_npu
    assert torch.zeros_like(torch.ones(3), device="npu").is_npu
    assert torch.ones(3).new_zeros(2, device="npu").is_npu
    assert torch.tensor([1, 2], device="npu").tolist() == [1, 2]
    m = torch.nn.Linear(4, 2).npu()
    assert all(p.is_npu for p in m.parameters()) and torch.nn.Linear(4, 2).to("npu").weight.is_npu
    torch.set_default_device("npu")
    try:
        assert torch.randn(2).device.type == "cpu"
    finally:
        torch.set_default_device(None)
    assert torch.npu.is_available() and torch.npu.device_count() == 1 and torch.npu.current_device() == 0
    torch.npu.set_device(0)
    torch.npu.set_device("npu:0")
    torch.npu.synchronize()
    with pytest.raises(ValueError, match="one device"):
        torch.npu.set_device(1)
    for bad in (lambda: torch.randn(2, device="npu:1"), lambda: torch.device("npu", 1),
                lambda: torch.device("npu:2"), lambda: torch.ones(2).to("npu:1"), lambda: torch.ones(2).npu(1)):
        with pytest.raises(RuntimeError, match="one device, npu:0"):
            bad()
    assert torch.device("cpu").type == "cpu" and torch.randn(2, device="cpu").device.type == "cpu"


# ---- subprocesses: the example scripts, the command line, install refusal, uninstall, torch.compile ------------

HARNESS = textwrap.dedent('''
    import contextlib, io, json, os, runpy, sys
    import torch
    out_dir, examples = sys.argv[1], sys.argv[2:]
    for path in examples:
        name = os.path.splitext(os.path.basename(path))[0]
        torch.manual_seed(1234)
        sys.path.insert(0, os.path.dirname(os.path.abspath(path)))  # as `python path` would
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            g = runpy.run_path(path, run_name="__main__")
        tensors = {k: v for k, v in g.items() if isinstance(v, torch.Tensor)}
        same = [[a, b] for a in tensors for b in tensors if a < b and tensors[a] is tensors[b]]
        for k, m in g.items():  # buffers of modules the script built
            if isinstance(m, torch.nn.Module):
                tensors.update({f"{k}.{n}": b for n, b in m.named_buffers()})
        torch.save(tensors, os.path.join(out_dir, name + ".pt"))
        with open(os.path.join(out_dir, name + ".json"), "w") as f:
            json.dump({"stdout": buf.getvalue(), "same": same, "argv0": sys.argv[0]}, f)
    print("harness done", len(examples))
''')

ALL_EXAMPLES = ["seed01_example1_per_tensor", "seed01_example2_inplace", "seed01_example3_per_axis",
                "seed02_npu_quantize", "seed03_pypto_quant_run", "seed04_npu_dynamic_quant_asymmetric", "anti_quant",
                "w8a8_inference"]


@pytest.fixture(scope="module")
def example_results(tmp_path_factory):
    d = tmp_path_factory.mktemp("ascend_examples")
    (d / "harness.py").write_text(HARNESS)
    r = _run(["-m", "xquant.compat", str(d / "harness.py"), str(d)]
             + [os.path.join(EXAMPLES, n + ".py") for n in ALL_EXAMPLES])
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"harness done {len(ALL_EXAMPLES)}" in r.stdout

    def load(name):
        with open(d / (name + ".json")) as f:
            meta = json.load(f)
        return torch.load(d / (name + ".pt")), meta

    return load


def _regen(*shape):
    torch.manual_seed(1234)
    return torch.randn(*shape, dtype=torch.float32)


def test_seed01_examples_unchanged(example_results):
    t, _ = example_results("seed01_example1_per_tensor")
    assert torch.equal(t["inputs"], _regen(4, 64, 32, 32))  # device='npu' drew from the CPU generator
    assert torch.equal(t["quantized"], xquant.npu.npu_fake_tensor_quant(t["inputs"], t["amax"], num_bits=8))
    assert_same(to_numpy(t["quantized"]), golden.fake_quant(to_numpy(t["inputs"]), to_numpy(t["amax"])), "ex1")

    t, meta = example_results("seed01_example2_inplace")
    before = _regen(1000, 256)
    want = xquant.npu.npu_fake_tensor_quant(before, before.abs().max(), num_bits=8)
    assert ["inputs", "quantized"] in meta["same"]  # the in-place call returned its input
    assert torch.equal(t["inputs"], want) and not torch.equal(want, before)

    t, _ = example_results("seed01_example3_per_axis")
    assert torch.equal(t["amax"], t["weight"].abs().amax(dim=[1, 2, 3]))
    want = xquant.npu.npu_fake_tensor_quant_with_axis(t["weight"], t["amax"], axis=0)
    assert torch.equal(t["quantized_weight"], want)


def test_reconstructed_seed02_and_seed04_examples(example_results):
    _, meta = example_results("seed02_npu_quantize")
    # hand-derived: col 0: -1/0.5+1 = -1, 100/0.5+1 = 201 -> 127; col 1: 0.25/0.25-2 = -1, -0.75/0.25-2 = -5;
    # col 2: 3/2 = 1.5 -> 2 (half to even), 0.5/2 = 0.25 -> 0. int4: nibbles 0..7 -> 0x76543210; -1 x 8 -> -1
    assert meta["stdout"].splitlines() == ["[[-1, -1, 2], [127, -5, 0]]", "torch.int32 [[1985229328], [-1]]"]

    t, meta = example_results("seed04_npu_dynamic_quant_asymmetric")
    x = t["x"]
    cases = [("y", "scale", "offset", {}), ("y4", "scale4", "offset4", {"dst_type": torch.quint4x2}),
             ("ys", "scales_s", "offsets_s", {"smooth_scales": t["smooth_scales"]}),
             ("ym", "scales_m", "offsets_m", {"smooth_scales": t["moe_smooth"], "group_index": t["group_index"]}),
             ("yt", "scale_t", "offset_t", {"quant_mode": "pertensor"})]
    for names, kw in ((c[:3], c[3]) for c in cases):
        want = xquant.npu.npu_dynamic_quant_asymmetric(x, **kw)
        for n, w in zip(names, want):
            assert torch.equal(t[n], w), n
    assert len(meta["stdout"].splitlines()) == 5


# seed 03's "measured result" (实测结果示例), as the document prints it
SEED03_PRINTS = [
    "输入数据src：[[-16 -15.75 -15.5 -15.25 -15 -14.75 -14.5 -14.25 ...], "
    "[16 16.25 16.5 16.75 17 17.25 17.5 17.75 ...], "
    "[48 48.25 48.5 48.75 49 49.25 49.5 49.75 ...], [80 80.25 80.5 80.75 81 81.25 81.5 81.75 ...], ...]",
    "输入数据scale：[[4], [4], [4], [4], ...]",
    "输出数据out：[[-64 -63 -62 -61 -60 -59 -58 -57 ...], [64 65 66 67 68 69 70 71 ...], "
    "[127 127 127 127 127 127 127 127 ...], [127 127 127 127 127 127 127 127 ...], ...]",
]


def test_seed03_pypto_kernel_prints_the_documented_result(example_results):
    t, meta = example_results("seed03_pypto_quant_run")
    assert meta["stdout"].splitlines() == SEED03_PRINTS
    assert_same(to_numpy(t["out"]), golden.tile_quant(to_numpy(t["src"]), to_numpy(t["scale"])), "seed 03 out")


def test_pypto_language_stand_in(torch_npu):
    import pypto_pro.language as pl

    assert _sig(pl.quant) == [("out", "POSITIONAL_OR_KEYWORD", None), ("src", "POSITIONAL_OR_KEYWORD", None),
                              ("scale", "POSITIONAL_OR_KEYWORD", None), ("mode", "KEYWORD_ONLY", pl.QuantMode.SYM),
                              ("offset", "KEYWORD_ONLY", None)]

    @pl.jit
    def asym(src: pl.Tensor[[2, 8], pl.DT_FP32], scale: pl.Tensor[[2, 1], pl.DT_FP32],
             offset: pl.Tensor[[2, 1], pl.DT_FP32], out: pl.Tensor[[2, 8], pl.DT_UINT8]):
        tiles = [pl.make_tile_group(type=pl.TileType(shape=t.shape, dtype=t.dtype)).current()
                 for t in (src, scale, offset, out)]
        for tile, t in zip(tiles[:3], (src, scale, offset)):
            pl.load(tile, t, [0, 0])
        pl.quant(tiles[3], tiles[0], tiles[1], mode=pl.QuantMode.ASYM, offset=tiles[2])
        pl.store(out, tiles[3], [0, 0])

    src = torch.linspace(-3, 3, 16).reshape(2, 8)
    scale, offset = torch.tensor([[10.0], [20.0]]), torch.tensor([[128.0], [100.5]])
    out = torch.zeros(2, 8, dtype=torch.uint8, device="npu")
    asym(src, scale, offset, out)
    assert_same(to_numpy(out), golden.tile_quant(to_numpy(src), to_numpy(scale), "ASYM", to_numpy(offset)), "asym")
    with pytest.raises(ValueError, match="src has shape"):
        asym(torch.zeros(3, 8), scale, offset, out)


def test_anti_quant_example_prints_documented_values(example_results):
    _, meta = example_results("anti_quant")
    # torch_npu's documentation: tensor([ 6.,  8., 10., 12.], device='npu:0', dtype=torch.float16)
    assert meta["stdout"] == "torch.float16 [6.0, 8.0, 10.0, 12.0]\n"


def test_w8a8_inference_snippet_unchanged(example_results):
    t, meta = example_results("w8a8_inference")
    x, weight = t["x"], t["weight"]
    w_scale = weight.abs().amax(dim=1).clamp(min=1e-8) / 127
    w_int8 = xquant.npu.npu_quantize(weight, w_scale, None, torch.qint8, axis=0, div_mode=True)
    assert torch.equal(t["layer.w_int8"], w_int8)
    xq, xs = ref_dynamic_quant(to_numpy(x.reshape(-1, x.shape[-1])))
    acc = torch.from_numpy(xq).int() @ w_int8.int().t()  # exact int32 accumulation
    y = (acc.float() * torch.from_numpy(xs).unsqueeze(1) * w_scale.unsqueeze(0)).half().reshape(2, 32, 128)
    assert torch.equal(t["y_w8a8"], y)
    assert_same(to_numpy(t["w_deq"]), ref_anti_quant(to_numpy(t["w_q"]), to_numpy(t["a_scale"]),
                                                     -to_numpy(t["a_offset"]), np.float16), "w8a16 dequant")
    assert_same(to_numpy(t["w_deq4"]), ref_anti_quant(to_numpy(t["w_q4"]), to_numpy(t["s4"]), None, BF16),
                "w4a16 dequant")
    lines = meta["stdout"].splitlines()
    errors = [float(line.rsplit(" ", 1)[1]) for line in lines]
    assert errors[0] < 0.02 and errors[1] < 0.02 and errors[2] < 0.2, lines  # quantization error only


PROBE = textwrap.dedent('''
    import json, sys
    import torch, torch_npu
    from mx_driving import npu_fake_tensor_quant
    x = torch.ones(2, device="npu")
    print(json.dumps({"argv": sys.argv, "name": __name__, "path0": sys.path[0], "device": str(x.device),
                      "standin": getattr(torch_npu, "__xquant_compat__", False)}))
    sys.exit(int(sys.argv[-1]))
''')


def test_command_line_runs_scripts_and_modules(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    r = _run(["-m", "xquant.compat", str(tmp_path / "probe.py"), "--flag", "3"])
    assert r.returncode == 3, r.stderr  # the script's exit status
    got = json.loads(r.stdout)
    assert got == {"argv": [str(tmp_path / "probe.py"), "--flag", "3"], "name": "__main__",
                   "path0": str(tmp_path), "device": "cpu", "standin": True}
    r = _run(["-m", "xquant.compat", "--device", "cpu", "-m", "probe", "0"], cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["name"] == "__main__" and got["argv"][1:] == ["0"] and got["argv"][0].endswith("probe.py")
    r = _run(["-m", "xquant.compat"])
    assert r.returncode == 2 and "usage" in r.stderr


def test_install_refuses_when_real_torch_npu_is_importable(tmp_path):
    pkg = tmp_path / "torch_npu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('the dummy torch_npu must not be imported')\n")
    code = textwrap.dedent('''
        import sys, xquant.compat as c
        try:
            c.install()
        except RuntimeError as e:
            print("refused:", e)
        # refused before torch is even imported: nothing registered, nothing patched, no module replaced
        print("state", c.is_installed(), "torch_npu" in sys.modules, "torch" in sys.modules)
    ''')
    r = _run(["-c", code], extra_path=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "refused: xquant.compat.install: a real torch_npu is importable" in r.stdout
    assert str(pkg) in r.stdout and "state False False False" in r.stdout
    r = _run(["-m", "xquant.compat", os.path.join(EXAMPLES, "anti_quant.py")], extra_path=str(tmp_path))
    assert r.returncode == 1 and "xquant.compat: xquant.compat.install: a real torch_npu is importable" in r.stderr
    assert "Traceback" not in r.stderr


UNINSTALL = textwrap.dedent('''
    import sys, torch
    from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

    def npu_error():
        try:
            torch.randn(2, device="npu")
        except Exception as e:
            return type(e).__name__ + ": " + str(e)
        return "no error"

    def snapshot():
        return (npu_error(), hasattr(torch, "npu"), "npu" in torch.Tensor.__dict__, "is_npu" in torch.Tensor.__dict__,
                "npu" in torch.nn.Module.__dict__, len(_get_current_function_mode_stack()),
                sorted(m for m in sys.modules if m.split(".")[0] in ("torch_npu", "mx_driving", "pypto_pro")
                      or m == "torch.npu"),
                hasattr(torch.ops.npu, "npu_quantize"), hasattr(torch.ops.npu, "npu_anti_quant"))

    before = snapshot()
    assert before[0].startswith("RuntimeError") and "npu" in before[0], before
    import xquant.compat as c
    for round in range(2):
        c.install()
        c.install()  # same device: nothing happens
        import torch_npu
        assert snapshot() != before and torch.randn(2, device="npu").is_npu
        y, s = torch_npu.npu_dynamic_quant(torch.randn(4, 8, device="npu"))
        try:
            c.install("cpu:0")
            raise AssertionError("install with another device must raise")
        except RuntimeError as e:
            assert "already installed" in str(e)
        class Other(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))
        with Other():
            try:
                c.uninstall()
                raise AssertionError("uninstall under another mode must raise")
            except RuntimeError as e:
                assert "another TorchFunctionMode" in str(e)
            assert c.is_installed() and torch.randn(1, device="npu").is_npu
        c.uninstall()
        c.uninstall()  # not installed: nothing happens
        after = snapshot()
        assert after == before, (before, after)
        try:
            import torch_npu
            raise AssertionError("torch_npu still importable")
        except ModuleNotFoundError:
            pass
    try:
        torch.device("npu")
        raise AssertionError("torch.device('npu') must fail again")
    except RuntimeError:
        pass
    print("torch works:", float((torch.ones(2, 2) @ torch.ones(2, 2)).sum()))
    # an operator of the same name defined by someone else: install refuses and leaves nothing behind
    other = torch.library.Library("npu", "FRAGMENT")
    other.define("npu_anti_quant(Tensor x) -> Tensor")
    try:
        c.install()
        raise AssertionError("install over a foreign npu::npu_anti_quant must raise")
    except RuntimeError as e:
        assert "could not define the torch.ops.npu" in str(e), e
    assert not c.is_installed() and snapshot()[:-1] == before[:-1], snapshot()  # (the foreign op stays)
    print("UNINSTALL OK")
''')


def test_uninstall_restores_everything():
    r = _run(["-c", UNINSTALL])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "torch works: 8.0" in r.stdout and "UNINSTALL OK" in r.stdout


BLOCKER = textwrap.dedent('''
    import sys
    import xquant.compat as c
    # a user's explicit "no torch_npu" (and no mx_driving): import blockers, as Python documents them
    sys.modules["torch_npu"] = None
    sys.modules["mx_driving"] = None
    for round in range(2):
        c.install()
        import torch_npu, mx_driving  # the stand-in while installed
        from torch_npu.testing.testcase import TestCase
        assert torch_npu.__xquant_compat__ and mx_driving.__xquant_compat__
        c.uninstall()
        assert "torch_npu" in sys.modules and sys.modules["torch_npu"] is None, sys.modules.get("torch_npu", "absent")
        assert "mx_driving" in sys.modules and sys.modules["mx_driving"] is None
        assert "torch_npu.testing" not in sys.modules and "torch_npu.npu" not in sys.modules  # absent stays absent
        try:
            import torch_npu
            raise AssertionError("the blocker is gone")
        except ImportError as e:
            assert "import of torch_npu halted; None in sys.modules" in str(e), e
    print("BLOCKER OK")
''')


def test_install_and_uninstall_keep_an_import_blocker():
    # Regression (issue #17): uninstall() removed a sys.modules['torch_npu'] = None blocker.
    r = _run(["-c", BLOCKER])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "BLOCKER OK" in r.stdout


THREADS = textwrap.dedent('''
    import sys, threading, torch
    from torch.overrides import _get_current_function_mode_stack
    import xquant.compat as c

    def on_thread(fn):
        errors = []
        def run():
            try:
                fn()
            except BaseException as e:
                errors.append(e)
        t = threading.Thread(target=run)
        t.start()
        t.join()
        if errors:
            raise errors[0]

    def plain():
        return (not c.is_installed() and "torch_npu" not in sys.modules and not hasattr(torch, "npu")
                and not hasattr(torch.ops.npu, "npu_quantize") and "npu" not in torch.Tensor.__dict__)

    # installed from a worker thread, undone from the main thread (it raised "not the thread that called
    # install()" before, and the stand-in could never be removed once that thread had ended)
    on_thread(c.install)
    assert c.is_installed()
    import torch_npu
    y, s = torch_npu.npu_dynamic_quant(torch.randn(4, 8))  # the operators are process-wide
    c.uninstall()
    assert plain()

    # installed on the main thread, undone from a worker: the main thread's mode is switched off
    c.install()
    assert torch.randn(2, device="npu").is_npu and len(_get_current_function_mode_stack()) == 1
    on_thread(c.uninstall)
    assert plain()
    try:
        torch.randn(2, device="npu")
        raise AssertionError("'npu' must fail again after uninstall")
    except RuntimeError as e:
        assert "npu" in str(e)
    c.install()  # drops the switched-off mode of this thread before pushing its own
    assert len(_get_current_function_mode_stack()) == 1 and torch.randn(2, device="npu").is_npu
    c.uninstall()
    assert plain() and len(_get_current_function_mode_stack()) == 0

    # eight threads install at once: one install, the others see it (same device: nothing to do)
    barrier = threading.Barrier(8)
    def racer():
        barrier.wait()
        c.install()
        assert c.is_installed()
    threads = [threading.Thread(target=racer) for _ in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert c.is_installed()
    c.uninstall()  # from the main thread, whichever thread won
    assert plain()
    print("THREADS OK")
''')


def test_install_and_uninstall_from_different_threads():
    # Regression (issue #17): an install from a worker thread could not be undone from another thread.
    r = _run(["-c", THREADS])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "THREADS OK" in r.stdout


COMPILE = textwrap.dedent('''
    import torch, torch_npu
    torch.set_num_threads(2)

    def step(x, w_int8, w_scale, kv_int8, kv_scale):
        x_int8, x_scale = torch_npu.npu_dynamic_quant(x)
        acc = torch._int_mm(x_int8, w_int8.t())
        y = acc.float() * x_scale.unsqueeze(1) * w_scale
        kv = torch_npu.npu_anti_quant(kv_int8, kv_scale, dst_dtype=torch.float32)
        q = torch.ops.npu.npu_quantize(y, torch.tensor([0.05], device="npu"), None, torch.qint8)
        ya, sa, oa = torch_npu.npu_dynamic_quant_asymmetric(y, dst_type=torch.quint4x2)
        return y + kv.sum(), q, ya, sa

    x = torch.randn(32, 64, device="npu")
    w_int8 = torch.randint(-127, 128, (48, 64), dtype=torch.int8).npu()
    w_scale = torch.rand(48, device="npu") / 100
    kv_int8 = torch.randint(-128, 128, (4, 48), dtype=torch.int8, device="npu")
    kv_scale = torch.rand(48, device="npu")
    eager = step(x, w_int8, w_scale, kv_int8, kv_scale)
    compiled = torch.compile(step, fullgraph=True, backend=BACKEND)(x, w_int8, w_scale, kv_int8, kv_scale)
    for e, g in zip(eager, compiled):
        assert e.dtype == g.dtype and e.shape == g.shape, (e.dtype, g.dtype, e.shape, g.shape)
        assert torch.equal(e, g) if e.dtype != torch.float32 else torch.allclose(e, g, rtol=1e-6, atol=1e-6)
    print("COMPILE OK")
''')


def test_torch_compile_fullgraph(tmp_path):
    # aot_eager: dynamo's full-graph capture, the fake implementations and AOT autograd, without inductor's
    # C++ code generation (the slow part; inductor works too, see docs/python.md).
    script = tmp_path / "compile_step.py"
    script.write_text("BACKEND = 'aot_eager'\n" + COMPILE)
    r = _run(["-m", "xquant.compat", str(script)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "COMPILE OK" in r.stdout
