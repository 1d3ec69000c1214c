"""``torch_npu.testing.testcase`` of the xquant.compat stand-in: ``TestCase`` with torch_npu's assertion
helpers, and ``run_tests``.

``assertRtolEqual`` keeps torch_npu's acceptance rule, so a peer test passes here exactly when its
outputs would pass the same check on the NPU: host and 'npu' results of the same shape and dtype agree when
at most ``prec * size`` elements (``prec16`` for float16) differ by more than ``prec`` both absolutely and
relatively to the larger magnitude. Differences are computed in float64 (no integer wrap-around); equal
values, same-signed infinities and NaN against NaN agree; bool results must be equal everywhere.
"""

from __future__ import annotations

import math
import os
import random
import sys
import unittest
from collections.abc import Mapping, Sequence
from numbers import Number

import numpy as np
import torch

from . import common_utils

_RTOL_DTYPES = (np.bool_, np.uint16, np.int16, np.int32, np.float16, np.float32, np.int8, np.uint8, np.int64,
                np.float64)
_CHUNK = 1 << 22  # elements compared at a time: float64 temporaries stay at tens of MB for any size


def run_tests(argv=None) -> None:
    """Runs the tests of ``__main__`` with unittest (what torch_npu's run_tests does outside its CI)."""
    unittest.main(module="__main__", argv=sys.argv if argv is None else argv)


def _numpy(t) -> np.ndarray:
    return t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


def _as_tensor(a) -> torch.Tensor:
    return a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))


class TestCase(unittest.TestCase):
    _precision = 1e-5
    maxDiff = None
    exact_dtype = False

    @property
    def precision(self) -> float:
        return self._precision

    @precision.setter
    def precision(self, prec: float) -> None:
        self._precision = prec

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.npu_device = common_utils.set_npu_device()

    def setUp(self) -> None:
        # Every test starts from the same random state ($SEED, default 666): torch, random and (unlike
        # torch_npu, whose tests draw most inputs from it) NumPy, so a failure here is reproducible.
        super().setUp()
        seed = int(os.environ.get("SEED", "666"))
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)

    # ---- assertRtolEqual -----------------------------------------------------------------------------

    def assertRtolEqual(self, x, y, prec=1.e-4, prec16=1.e-3, auto_trans_dtype=False, message=None):
        """x and y agree elementwise within prec (float16: prec16), up to a fraction prec of the elements."""
        if isinstance(x, Sequence) and isinstance(y, Sequence):
            for a, b in zip(x, y):
                self.assertRtolEqual(a, b, prec, prec16, auto_trans_dtype, message)
            return
        if isinstance(x, torch.Tensor) and isinstance(y, Sequence):
            y = torch.as_tensor(y, dtype=x.dtype, device=x.device)
        elif isinstance(y, torch.Tensor) and isinstance(x, Sequence):
            x = torch.as_tensor(x, dtype=y.dtype, device=y.device)
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and auto_trans_dtype:
            x = x.to(y.dtype)
        for name, t in (("x", x), ("y", y)):
            if isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16:
                self.fail(self._msg(message, f"assertRtolEqual: {name} is bfloat16, which NumPy cannot hold; "
                                             "expected one of bool, uint16, int16, int32, int64, int8, uint8, "
                                             "float16, float32, float64 (convert it first)"))
        a, b = _numpy(x), _numpy(y)
        if a.shape != b.shape:
            self.fail(self._msg(message, f"shape error: {a.shape} vs {b.shape}"))
        if a.dtype != b.dtype:
            self.fail(self._msg(message, f"dtype error: {a.dtype} vs {b.dtype}"))
        if a.dtype.type not in _RTOL_DTYPES:
            self.fail(self._msg(message, f"assertRtolEqual: dtype {a.dtype} is not one of bool, uint16, int16, "
                                         "int32, int64, int8, uint8, float16, float32, float64"))
        if a.dtype == np.bool_:
            if not np.array_equal(a, b):
                bad = int(np.count_nonzero(a != b))
                self.fail(self._msg(message, f"result error: {bad} of {a.size} bool elements differ"))
            return
        tol, tiny = (prec16, 6e-8) if a.dtype == np.float16 else (prec, 1e-9)
        a, b = a.reshape(-1), b.reshape(-1)
        abs_bad = rel_bad = 0
        worst, worst_at = 0.0, None
        for start in range(0, a.size, _CHUNK):
            u = a[start:start + _CHUNK].astype(np.float64)
            v = b[start:start + _CHUNK].astype(np.float64)
            with np.errstate(invalid="ignore", over="ignore"):
                same = (u == v) | (np.isnan(u) & np.isnan(v))
                diff = np.abs(u - v)
                rel = diff / (np.maximum(np.abs(u), np.abs(v)) + tiny)
            abs_bad += int(np.count_nonzero(~same & ~(diff <= tol)))  # NaN against a number: a mismatch
            rel_bad += int(np.count_nonzero(~same & ~(rel <= tol)))
            d = np.where(same, 0.0, np.nan_to_num(diff, nan=np.inf))
            if d.size and d.max() > worst:
                worst, worst_at = float(d.max()), start + int(d.argmax())
        allowed = a.size * tol
        if abs_bad > allowed and rel_bad > allowed:
            at = np.unravel_index(worst_at, _numpy(x).shape) if worst_at is not None else None
            self.fail(self._msg(message, f"result error: {abs_bad} of {a.size} elements differ by more than {tol} "
                                         f"absolutely and {rel_bad} relatively (at most {allowed:g} may); "
                                         f"largest |x - y| = {worst:g} at index {at}: "
                                         f"x = {_numpy(x)[at] if at is not None else None}, "
                                         f"y = {_numpy(y)[at] if at is not None else None}"))

    @staticmethod
    def _msg(message, text: str) -> str:
        return f"{message}: {text}" if message else text

    # ---- precision-aware assertEqual / assertNotEqual / assertAlmostEqual -------------------------------

    def assertEqual(self, x, y, prec=None, message="", allow_inf=False, exact_dtype=None):
        """Numbers and tensors agree within prec (default self.precision); containers elementwise."""
        if isinstance(prec, str) and not message:
            message, prec = prec, None
        prec = self.precision if prec is None else prec
        exact_dtype = self.exact_dtype if exact_dtype is None else exact_dtype
        self._equal(x, y, prec, message, allow_inf, exact_dtype)

    def _equal(self, x, y, prec, message, allow_inf, exact_dtype):
        if isinstance(x, np.ndarray) and isinstance(y, (np.ndarray, torch.Tensor)) or \
                isinstance(y, np.ndarray) and isinstance(x, torch.Tensor):
            x, y = _as_tensor(x), _as_tensor(y)
        if isinstance(x, (np.bool_, bool)) or isinstance(y, (np.bool_, bool)):
            xv = x.item() if isinstance(x, (torch.Tensor, np.generic)) else x
            yv = y.item() if isinstance(y, (torch.Tensor, np.generic)) else y
            super().assertEqual(xv, yv, message or None)
        elif isinstance(x, Number) or isinstance(y, Number):
            self._number_equal(x, y, prec, message, allow_inf)
        elif isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            self._tensor_equal(x, y, prec, message, allow_inf, exact_dtype)
        elif isinstance(x, (str, bytes)) and isinstance(y, (str, bytes)):
            super().assertEqual(x, y, message or None)
        elif isinstance(x, (set, frozenset)) and isinstance(y, (set, frozenset)):
            super().assertEqual(x, y, message or None)
        elif isinstance(x, Mapping) and isinstance(y, Mapping):
            super().assertEqual(set(x.keys()), set(y.keys()), message or None)
            for k in x:
                self._equal(x[k], y[k], prec, message, allow_inf, exact_dtype)
        elif common_utils.is_iterable(x) and common_utils.is_iterable(y):
            x, y = list(x), list(y)
            super().assertEqual(len(x), len(y), message or None)
            for a, b in zip(x, y):
                self._equal(a, b, prec, message, allow_inf, exact_dtype)
        else:
            super().assertEqual(x, y, message or None)

    def _number_equal(self, x, y, prec, message, allow_inf):
        if isinstance(x, torch.Tensor):
            x = x.item()
        if isinstance(y, torch.Tensor):
            y = y.item()
        if isinstance(x, np.generic):
            x = x.item()
        if isinstance(y, np.generic):
            y = y.item()
        if isinstance(x, complex) or isinstance(y, complex):
            super().assertLessEqual(abs(x - y), prec, message or None)
            return
        if math.isinf(x) or math.isinf(y):
            if not allow_inf:
                self.fail(self._msg(message, f"expected finite numbers, got x = {x}, y = {y} (allow_inf=True "
                                             "compares infinities)"))
            super().assertEqual(x, y, message or None)
            return
        if math.isnan(x) and math.isnan(y):
            return
        super().assertLessEqual(abs(x - y), prec, self._msg(message, f"x = {x}, y = {y}"))

    def _tensor_equal(self, x, y, prec, message, allow_inf, exact_dtype):
        super().assertEqual(x.size(), y.size(), message or None)
        if exact_dtype:
            super().assertEqual(x.dtype, y.dtype, message or None)
        if x.numel() == 0:
            return
        a, b = x.detach().cpu(), y.detach().cpu()
        if a.is_complex() or b.is_complex():
            a, b = a.to(torch.complex128), b.to(torch.complex128)
        elif a.is_floating_point() or b.is_floating_point():
            a, b = a.to(torch.float64), b.to(torch.float64)
        else:  # integers and bool: exact in int64
            a, b = a.to(torch.int64), b.to(torch.int64)
        if a.is_floating_point() or a.is_complex():
            nan_a, nan_b = torch.isnan(a), torch.isnan(b)
            if not torch.equal(nan_a, nan_b):
                self.fail(self._msg(message, "NaN at different positions"))
            skip = nan_a
            if allow_inf:
                inf_a, inf_b = torch.isinf(a), torch.isinf(b)
                if not torch.equal(inf_a, inf_b) or not torch.equal(a[inf_a], b[inf_b]):
                    self.fail(self._msg(message, "infinities at different positions or with different signs"))
                skip = skip | inf_a
            diff = (a - b).abs()
            diff[skip] = 0
        else:
            diff = (a - b).abs()
        worst = diff.max().item()
        super().assertLessEqual(worst, prec, self._msg(message, f"largest |x - y| = {worst} > prec = {prec}"))

    def assertNotEqual(self, x, y, prec=None, message=""):
        """Tensors / numbers differ by at least prec somewhere (default self.precision)."""
        if isinstance(prec, str) and not message:
            message, prec = prec, None
        prec = self.precision if prec is None else prec
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.size() != y.size():
                return
            self.assertGreater(x.numel(), 0, message or None)
            a, b = x.detach().cpu().to(torch.float64), y.detach().cpu().to(torch.float64)
            if not torch.equal(torch.isnan(a), torch.isnan(b)):
                return
            diff = (a - b).abs()
            diff[torch.isnan(a)] = 0
            super().assertGreaterEqual(diff.max().item(), prec, message or None)
        elif isinstance(x, Number) and isinstance(y, Number) and not isinstance(x, bool):
            super().assertGreaterEqual(abs(x - y), prec, message or None)
        else:
            super().assertNotEqual(x, y, message or None)

    def assertAlmostEqual(self, x, y, places=None, msg=None, delta=None, allow_inf=False):
        prec = delta if delta is not None else (10 ** (-places) if places else None)
        self.assertEqual(x, y, prec, msg or "", allow_inf)
