"""Every operator's meta / FakeTensor error equals its eager error, for bad inputs generated from ONE table.

The operators (torch.ops.xquant.*, defined in C++) plan every call with the library's planning entry
(xquant/plan.hpp) in both their CPU kernel and their Meta kernel. This test does not list bad calls per
operator: it takes one valid call per operator (VALID) and applies every mutation of one table (MUTATIONS:
another dtype, one more / one fewer dimension, a different last dimension, an empty tensor, out-of-range
integers) to every argument the mutation fits, then compares the eager call on CPU tensors with the same call
on meta tensors and under FakeTensorMode: the same exception type and message, or, where eager succeeds,
outputs of the same shapes and dtypes. Errors that need values (amax finite, group_index row ends) exist
only for real data and are left out.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/setup-python installs it)")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import xquant  # noqa: E402

xquant.register_torch_ops()
ops = torch.ops.xquant
f32, f16, i8, i32 = torch.float32, torch.float16, torch.int8, torch.int32


def T(*shape, dtype=f32, fill=1.0):
    return torch.full(shape, fill, dtype=dtype)


# One valid call per operator: (operator, positional arguments). Tensor values are chosen so that the value
# checks pass for every shape the mutations produce (amax 1, group_index ends covering every row).
VALID = {
    "fake_tensor_quant": (ops.fake_tensor_quant, [T(4, 8), T(1), 8, False, True]),
    "fake_tensor_quant_with_axis": (ops.fake_tensor_quant_with_axis, [T(4, 8), T(8), 1, 8, False, True]),
    "fake_tensor_quant_inplace": (ops.fake_tensor_quant_inplace, [T(4, 8), T(1), 8, False, True]),
    "fake_tensor_quant_backward": (ops.fake_tensor_quant_backward,
                                   [T(4, 8), T(4, 8), T(8), 1, 8, False, True, True]),
    "quantize": (ops.quantize, [T(4, 8), T(8), T(8, dtype=i32, fill=0), torch.qint8, 1, True]),
    "quantize_mul": (ops.quantize, [T(4, 16), T(16), T(16), torch.quint4x2, -1, False]),
    "tile_quant": (ops.tile_quant, [T(4, 8, dtype=i8), T(4, 8), T(4, 1), "SYM", None]),
    "tile_quant_asym": (ops.tile_quant, [T(4, 8, dtype=torch.uint8), T(4, 8), T(4, 1), "ASYM", T(4, 1)]),
    "dynamic_quant_asymmetric": (ops.dynamic_quant_asymmetric,
                                 [T(4, 16), T(16), None, torch.quint4x2, "pertoken", 0.0]),
    "dynamic_quant_asymmetric_moe": (ops.dynamic_quant_asymmetric,
                                     [T(4, 16), T(1, 16), T(1, dtype=i32, fill=4), None, "pertoken"]),
    "dynamic_quant": (ops.dynamic_quant, [T(4, 16), T(16), None, torch.qint8, "pertoken", 0.0]),
    "dynamic_quant_perchannel": (ops.dynamic_quant_asymmetric,
                                 [T(2, 4, 16), T(4), None, torch.float8_e5m2, "perchannel", 0.0]),
    "anti_quant": (ops.anti_quant, [T(4, 8, dtype=i8), T(8), T(8), f32, None]),
    "anti_quant_int4": (ops.anti_quant, [T(4, 2, dtype=i32), T(16), None, None, torch.quint4x2]),
    "acts_ulq": (ops.acts_ulq, [T(4, 8), T(1, 8, fill=-1.0), T(1), False, 8]),
    "acts_ulq_backward": (ops.acts_ulq_backward,
                          [T(4, 8), [4, 8], T(1, 8, fill=-1.0), T(1), T(4, 8), T(4, 8), T(4, 8), False, 8]),
    "quant_matmul": (ops.quant_matmul, [T(4, 16, dtype=i8), T(16, 8, dtype=i8), T(8), None, T(4),
                                        T(8, dtype=i32), f16]),
    "quant_matmul_int4": (ops.quant_matmul, [T(4, 2, dtype=i32), T(16, 1, dtype=i32), T(1), T(1), None, None, None]),
    "weight_quant_batchmatmul": (ops.weight_quant_batchmatmul, [T(4, 64, dtype=f16), T(64, 8, dtype=i8),
                                                                T(2, 8, dtype=f16), T(2, 8, dtype=f16),
                                                                T(8, dtype=f16), 32]),
    "trans_quant_param": (ops.trans_quant_param, [T(8), T(8), 1]),
    "convert_weight_to_int4pack": (ops.convert_weight_to_int4pack, [T(4, 16, dtype=i32)]),
}

# The one table of bad inputs: (name, applies to the argument?, mutate the argument).
MUTATIONS = [
    ("dtype float16", lambda a: isinstance(a, torch.Tensor) and a.dtype != f16, lambda a: a.to(f16)),
    ("dtype int8", lambda a: isinstance(a, torch.Tensor) and a.dtype != i8, lambda a: a.to(i8)),
    ("dtype int64", lambda a: isinstance(a, torch.Tensor), lambda a: a.to(torch.int64)),
    ("dtype float64", lambda a: isinstance(a, torch.Tensor), lambda a: a.to(torch.float64)),
    ("dtype bool", lambda a: isinstance(a, torch.Tensor), lambda a: a.to(torch.bool)),
    ("one more dimension", lambda a: isinstance(a, torch.Tensor), lambda a: a.unsqueeze(0).expand(3, *a.shape).clone()),
    ("one fewer dimension", lambda a: isinstance(a, torch.Tensor) and a.dim() > 0, lambda a: a.reshape(-1)[:1].reshape(()) if a.dim() == 1 else a.flatten(0, 1)),
    ("last dimension + 1", lambda a: isinstance(a, torch.Tensor) and a.dim() > 0,
     lambda a: torch.cat([a, a[..., :1]], dim=-1)),
    ("last dimension 3", lambda a: isinstance(a, torch.Tensor) and a.dim() > 0, lambda a: a[..., :1].expand(*a.shape[:-1], 3).clone()),
    ("empty", lambda a: isinstance(a, torch.Tensor) and a.dim() > 0, lambda a: a[:0]),
    ("rank 9", lambda a: isinstance(a, torch.Tensor), lambda a: a.reshape(*([1] * 9), -1)[..., :1].clone()),
    ("absent", lambda a: isinstance(a, torch.Tensor), lambda a: None),
    ("int 0", lambda a: type(a) is int, lambda a: 0),
    ("int 33", lambda a: type(a) is int, lambda a: 33),
    ("int -3", lambda a: type(a) is int, lambda a: -3),
    ("int 2**40", lambda a: type(a) is int, lambda a: 2**40),
    ("shape list longer", lambda a: type(a) is list, lambda a: [2, *a]),
    ("shape list negative", lambda a: type(a) is list, lambda a: [-1, *a[1:]]),
    ("str other", lambda a: type(a) is str, lambda a: "OTHER"),
    ("dtype qint32", lambda a: isinstance(a, torch.dtype), lambda a: torch.qint32),
    ("dtype float32", lambda a: isinstance(a, torch.dtype), lambda a: torch.float32),
    ("None -> tensor", lambda a: a is None, lambda a: T(4, 1)),
]

VALUE_CHECKS = ("amax[", "group_index[")  # errors that need data: eager only


def _cases():
    for op_name, (op, args) in VALID.items():
        types = [str(a.type) for a in op.default._schema.arguments]
        for i, a in enumerate(args):
            for m_name, fits, _m in MUTATIONS:
                if m_name == "None -> tensor" and types[i] != "Optional[Tensor]":
                    continue  # (a tensor for an optional dtype: torch's own argument parsing, which prints it)
                if m_name == "absent" and sum(isinstance(b, torch.Tensor) for b in args) == 1:
                    continue  # (no tensor left: the dispatcher has no device to choose a kernel by; torch's error)
                if fits(a):
                    yield pytest.param(op_name, i, m_name, id=f"{op_name}-arg{i}-{m_name}")


def _call(op, args, convert):
    return op(*[convert(a) if isinstance(a, torch.Tensor) else a for a in args])


def _outcome(op, args, convert):
    try:
        out = _call(op, args, convert)
    except Exception as e:  # noqa: BLE001 - the outcome is compared as it is
        return type(e), str(e)
    leaves = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    return None, [(tuple(t.shape), t.dtype) for t in leaves]


@pytest.mark.parametrize("op_name,index,mutation", list(_cases()))
def test_meta_and_fake_outcomes_equal_eager(op_name, index, mutation):
    op, args = VALID[op_name]
    mutate = next(m for n, _f, m in MUTATIONS if n == mutation)
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    args[index] = mutate(args[index])
    eager = _outcome(op, args, lambda t: t.clone())
    if eager[0] is not None and any(v in eager[1] for v in VALUE_CHECKS):
        pytest.skip(f"the eager error needs data (a value check): {eager[1]}")
    meta = _outcome(op, args, lambda t: t.to("meta"))
    mode = FakeTensorMode()
    with mode:
        fake = _outcome(op, args, lambda t: mode.from_tensor(t))
    assert meta == eager, (eager, meta)
    assert fake == eager, (eager, fake)
    if eager[0] is not None and eager[1].startswith("xquant::"):  # (else torch's own schema check)
        assert eager[0] in (TypeError, ValueError), eager


def test_every_operator_has_a_valid_call():
    names = {n for n in dir(ops) if not n.startswith("_") and isinstance(getattr(ops, n), torch._ops.OpOverloadPacket)}
    assert names == {op._qualified_op_name.split("::")[1] for op, _ in VALID.values()}
    for op, args in VALID.values():  # and the valid calls are valid
        _call(op, args, lambda t: t.clone())
