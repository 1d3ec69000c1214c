"""Meta tensors and FakeTensors (torch.compile, torch.export) get the errors real tensors get (issue #11):
every fake implementation validates shapes, dtypes and arguments like the eager call, with the same
exception type and message. Each case runs once on CPU tensors and once on the same tensors on the meta
device; checks that need values (amax finite, group_index row ends) exist only for real data."""

import pytest

pytest.importorskip("torch", reason="torch is not installed (scripts/setup-python installs it)")
pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (scripts/setup-python installs it)")

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import xquant

ops = torch.ops.xquant
f32, f16, bf16, i8, i32 = torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int32


def t(*shape, dtype=f32):
    return torch.ones(shape, dtype=dtype)


# (name, callable taking a converter `d` that puts a tensor on the device under test)
CASES = [
    # fake quant
    ("fq amax elements", lambda d: xquant.npu_fake_tensor_quant(d(t(2, 3)), d(t(2)))),
    ("fq inputs dtype", lambda d: xquant.npu_fake_tensor_quant(d(t(2, 3, dtype=i8)), d(t(1)))),
    ("fq amax dtype", lambda d: xquant.npu_fake_tensor_quant(d(t(2, 3)), d(t(1, dtype=i32)))),
    ("fq num_bits", lambda d: xquant.npu_fake_tensor_quant(d(t(2, 3)), d(t(1)), num_bits=33)),
    ("fq num_bits 32 bits", lambda d: ops.fake_tensor_quant(d(t(2, 3)), d(t(1)), 2**40)),
    ("fq float64", lambda d: xquant.npu_fake_tensor_quant(d(t(2, 3, dtype=torch.float64)), d(t(1)))),
    ("fq axis range", lambda d: xquant.npu_fake_tensor_quant_with_axis(d(t(2, 3)), d(t(3)), 2)),
    ("fq axis channels", lambda d: xquant.npu_fake_tensor_quant_with_axis(d(t(2, 3)), d(t(4)), 1)),
    ("fq axis amax 2-D", lambda d: xquant.npu_fake_tensor_quant_with_axis(d(t(2, 3)), d(t(1, 3)), -1)),
    ("fq inplace amax", lambda d: xquant.npu_fake_tensor_quant_inplace(d(t(2, 3)), d(t(3)))),
    ("fq inplace non-contiguous", lambda d: ops.fake_tensor_quant_inplace(d(t(3, 4)).t(), d(t(1)))),
    ("fq backward grad dtype", lambda d: ops.fake_tensor_quant_backward(d(t(2, 3, dtype=f16)), d(t(2, 3)), d(t(1)),
                                                                         None, 8, False, True, True)),
    ("fq backward grad shape", lambda d: ops.fake_tensor_quant_backward(d(t(3, 2)), d(t(2, 3)), d(t(3)), 1, 8, False,
                                                                         True, True)),
    # npu_quantize
    ("quantize mode dtype", lambda d: xquant.npu_quantize(d(t(2, 8)), d(t(1)), None, torch.quint4x2, -1, True)),
    ("quantize int4 last dim", lambda d: xquant.npu_quantize(d(t(3, 5)), d(t(5)), None, torch.quint4x2, -1, False)),
    ("quantize scales channels", lambda d: xquant.npu_quantize(d(t(2, 3, 4)), d(t(5)), None, torch.qint8, 1)),
    ("quantize scales 2-D div", lambda d: xquant.npu_quantize(d(t(2, 3)), d(t(1, 3)), None, torch.qint8, 1)),
    ("quantize axis range", lambda d: xquant.npu_quantize(d(t(2, 3)), d(t(3)), None, torch.qint8, 5)),
    ("quantize mul axis < -2", lambda d: xquant.npu_quantize(d(t(2, 8)), d(t(1)), None, torch.qint8, -3, False)),
    ("quantize mul axis >= rank", lambda d: xquant.npu_quantize(d(t(2, 8)), d(t(1)), None, torch.qint8, 2, False)),
    ("quantize mul axis -2 rank 1", lambda d: xquant.npu_quantize(d(t(8)), d(t(1)), None, torch.qint8, -2, False)),
    ("quantize mul scales shape", lambda d: xquant.npu_quantize(d(t(2, 8)), d(t(2, 8)), None, torch.qint8, -1, False)),
    ("quantize zp dtype div", lambda d: xquant.npu_quantize(d(t(2, 8)), d(t(1)), d(t(1, dtype=torch.int64)),
                                                            torch.qint8)),
    ("quantize zp dtype mul", lambda d: xquant.npu_quantize(d(t(2, 8)), d(t(1)), d(t(1, dtype=f16)), torch.qint8, -1,
                                                            False)),
    ("quantize zp shape", lambda d: xquant.npu_quantize(d(t(2, 8)), d(t(8)), d(t(1)), torch.qint8, -1)),
    ("quantize input dtype", lambda d: xquant.npu_quantize(d(t(2, 8, dtype=i32)), d(t(1)), None, torch.qint8)),
    ("quantize scales dtype", lambda d: xquant.npu_quantize(d(t(2, 8)), d(t(1, dtype=i8)), None, torch.qint8)),
    # tile quant
    ("tile offset for SYM", lambda d: xquant.quant(d(t(4, 8, dtype=i8)), d(t(4, 8)), d(t(4, 1)), "SYM", d(t(4, 1)))),
    ("tile offset missing", lambda d: xquant.quant(d(t(4, 8, dtype=torch.uint8)), d(t(4, 8)), d(t(4, 1)), "ASYM")),
    ("tile out dtype", lambda d: xquant.quant(d(t(4, 8, dtype=torch.uint8)), d(t(4, 8)), d(t(4, 1)))),
    ("tile scale rows", lambda d: xquant.quant(d(t(4, 8, dtype=i8)), d(t(4, 8)), d(t(3, 1)))),
    ("tile scale 1-D", lambda d: xquant.quant(d(t(4, 8, dtype=i8)), d(t(4, 8)), d(t(4)))),
    ("tile src dtype", lambda d: xquant.quant(d(t(4, 8, dtype=i8)), d(t(4, 8, dtype=f16)), d(t(4, 1)))),
    ("tile out shape", lambda d: xquant.quant(d(t(4, 7, dtype=i8)), d(t(4, 8)), d(t(4, 1)))),
    ("tile offset shape", lambda d: xquant.quant(d(t(4, 8, dtype=torch.uint8)), d(t(4, 8)), d(t(4, 1)), "ASYM",
                                                 d(t(2, 1)))),
    # dynamic quant
    ("dynamic rank", lambda d: xquant.npu_dynamic_quant_asymmetric(d(t(16)))),
    ("dynamic x dtype", lambda d: xquant.npu_dynamic_quant_asymmetric(d(t(2, 16, dtype=i8)))),
    ("dynamic dst_type", lambda d: xquant.npu_dynamic_quant_asymmetric(d(t(2, 16)), dst_type=torch.quint8)),
    ("dynamic int4 H", lambda d: xquant.npu_dynamic_quant_asymmetric(d(t(2, 12)), dst_type=torch.quint4x2)),
    ("dynamic group without smooth", lambda d: ops.dynamic_quant_asymmetric(d(t(4, 16)), None,
                                                                            d(t(2, dtype=i32)))),
    ("dynamic smooth pertensor", lambda d: xquant.npu_dynamic_quant_asymmetric(d(t(4, 16)), smooth_scales=d(t(16)),
                                                                               quant_mode="pertensor")),
    ("dynamic smooth 1-D shape", lambda d: xquant.npu_dynamic_quant_asymmetric(d(t(4, 16)), smooth_scales=d(t(8)))),
    ("dynamic smooth 2-D no group", lambda d: xquant.npu_dynamic_quant_asymmetric(d(t(4, 16)),
                                                                                  smooth_scales=d(t(2, 16)))),
    ("dynamic smooth rank with group", lambda d: xquant.npu_dynamic_quant_asymmetric(
        d(t(4, 16)), smooth_scales=d(t(16)), group_index=d(t(1, dtype=i32)))),
    ("dynamic smooth H with group", lambda d: xquant.npu_dynamic_quant_asymmetric(
        d(t(4, 16)), smooth_scales=d(t(2, 8)), group_index=d(t(2, dtype=i32)))),
    ("dynamic smooth dtype", lambda d: xquant.npu_dynamic_quant_asymmetric(d(t(4, 16)),
                                                                           smooth_scales=d(t(16, dtype=i32)))),
    ("dynamic group dtype", lambda d: xquant.npu_dynamic_quant_asymmetric(
        d(t(4, 16)), smooth_scales=d(t(2, 16)), group_index=d(t(2)))),
    ("dynamic group shape", lambda d: xquant.npu_dynamic_quant_asymmetric(
        d(t(4, 16)), smooth_scales=d(t(2, 16)), group_index=d(t(3, dtype=i32)))),
    ("dynamic zero experts", lambda d: xquant.npu_dynamic_quant_asymmetric(
        d(t(4, 16)), smooth_scales=d(t(0, 16)), group_index=d(t(0, dtype=i32)))),
    # ActsULQ
    ("ulq broadcast", lambda d: xquant.acts_ulq(d(t(2, 3)), d(t(4)), d(t(1)))),
    ("ulq broadcast max", lambda d: xquant.acts_ulq(d(t(2, 3)), d(t(1)), d(t(2, 1, 1, 4)))),
    ("ulq clamp dtype", lambda d: xquant.acts_ulq(d(t(2, 3)), d(t(1, dtype=f16)), d(t(1)))),
    ("ulq x dtype", lambda d: xquant.acts_ulq(d(t(2, 3, dtype=i8)), d(t(1, dtype=i8)), d(t(1, dtype=i8)))),
    ("ulq num_bits", lambda d: xquant.acts_ulq(d(t(2, 3)), d(t(1)), d(t(1)), num_bits=1)),
    ("ulq rank", lambda d: xquant.acts_ulq(d(t(*(1,) * 9)), d(t(1)), d(t(1)))),
    ("ulq backward dtype", lambda d: ops.acts_ulq_backward(d(t(2, 3)), [2, 3], d(t(1, dtype=f16)), d(t(1)), d(t(2, 3)),
                                                           d(t(2, 3)), d(t(2, 3)), False, 8)),
    ("ulq backward mask shape", lambda d: ops.acts_ulq_backward(d(t(2, 3)), [2, 3], d(t(1)), d(t(1)), d(t(3, 2)),
                                                                d(t(2, 3)), d(t(2, 3)), False, 8)),
    ("ulq backward x_shape", lambda d: ops.acts_ulq_backward(d(t(2, 3)), [5, 4], d(t(3)), d(t(1)), d(t(2, 3)),
                                                             d(t(2, 3)), d(t(2, 3)), False, 8)),
    ("ulq backward negative x_shape", lambda d: ops.acts_ulq_backward(d(t(2, 3)), [-1, 3], d(t(1)), d(t(1)),
                                                                      d(t(2, 3)), d(t(2, 3)), d(t(2, 3)), False, 8)),
    ("ulq backward num_bits", lambda d: ops.acts_ulq_backward(d(t(2, 3)), [2, 3], d(t(1)), d(t(1)), d(t(2, 3)),
                                                              d(t(2, 3)), d(t(2, 3)), False, 17)),
]


def _error(fn, convert):
    with pytest.raises((TypeError, ValueError)) as info:
        fn(convert)
    return info.value


@pytest.mark.parametrize("name,fn", CASES, ids=[c[0] for c in CASES])
def test_meta_errors_equal_cpu_errors(name, fn):
    cpu = _error(fn, lambda x: x)
    meta = _error(fn, lambda x: x.to("meta"))
    assert type(meta) is type(cpu) and str(meta) == str(cpu), (cpu, meta)
    assert str(cpu).startswith("xquant::")


@pytest.mark.parametrize("name,fn", CASES[::4], ids=[c[0] for c in CASES[::4]])
def test_fake_tensor_errors_equal_cpu_errors(name, fn):
    """The same under FakeTensorMode (what torch.compile and torch.export trace with)."""
    cpu = _error(fn, lambda x: x)
    mode = FakeTensorMode()
    with mode:
        fake = _error(fn, lambda x: mode.from_tensor(x))
    assert type(fake) is type(cpu) and str(fake) == str(cpu), (cpu, fake)


def test_valid_meta_calls_give_the_eager_shapes():
    """Valid arguments: the fake implementations give the shapes and dtypes of the eager outputs."""
    x = torch.randn(4, 6, 16)
    calls = [
        lambda d: xquant.npu_fake_tensor_quant_with_axis(d(x), d(torch.ones(6)), 1),
        lambda d: xquant.npu_quantize(d(x), d(torch.ones(16)), d(torch.ones(16)), torch.quint4x2, -1, False),
        lambda d: xquant.npu_quantize(d(x), d(torch.ones(6)), d(torch.zeros(6, dtype=torch.int8)), torch.quint8, 1),
        lambda d: xquant.npu_dynamic_quant_asymmetric(d(x), smooth_scales=d(torch.ones(3, 16)),
                                                      group_index=d(torch.tensor([8, 16, 24]))),
        lambda d: xquant.npu_dynamic_quant_asymmetric(d(x), quant_mode="pertensor", dst_type=torch.quint4x2),
        lambda d: xquant.acts_ulq(d(x), d(torch.full((6, 1), -1.0)), d(torch.ones(16))),
        lambda d: ops.acts_ulq_backward(d(x), [4, 6, 16], d(torch.ones(6, 1)), d(torch.ones(1)), d(x), d(x), d(x),
                                        False, 8),
    ]
    for call in calls:
        real = torch.utils._pytree.tree_leaves(call(lambda v: v))
        meta = torch.utils._pytree.tree_leaves(call(lambda v: v.to("meta")))
        assert [(r.shape, r.dtype) for r in real] == [(m.shape, m.dtype) for m in meta]
        assert all(m.device.type == "meta" for m in meta)
