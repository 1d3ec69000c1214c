"""Calibrators: statistics of the tensors a quantizer sees while calibrating, reduced to an ``amax``.

* ``max``: the largest ``|x|`` (per tensor, or per channel along the quantizer's axis).
* ``percentile``, ``mse``, ``entropy``: a histogram of ``|x|`` (per tensor only), then
  - percentile: the upper edge of the first bin where the cumulative share reaches ``percentile`` %;
  - mse: the candidate bin edge whose fake quantization (xquant's operator, the quantizer's own
    num_bits / unsigned / narrow_range) of the bin centres, weighted by the counts, has the least squared error;
  - entropy: the candidate edge minimizing KL(P || Q) of the clipped histogram P and its num-levels
    re-binned version Q (TensorRT's method, see :func:`entropy_amax`).

The histogram (deterministic, additive, identical in one process and across ranks):
``width`` is fixed by the first batch holding a non-zero value (``max|x| / num_bins``, float32);
``bin = min(floor(|x| / width), nbins - 1)`` (float32 division); a later batch whose max exceeds
``nbins * width`` appends ``ceil(max / width) - nbins`` empty bins; only when that would make more than
``max_bins`` (default 64 * num_bins) bins, the width is doubled (bins merged in pairs) until it does not.
Zeros seen before the width exists are added to bin 0.

Data rules: NaN or +-Inf in the calibration data is a ``ValueError`` naming the quantizer and the count
(a non-finite activation means a broken model; the weight quantizer instead leaves non-finite values out,
as the CLI's writer does). Data that is all zero gives ``amax = 0`` (the quantizer then outputs 0).

Distributed (``torch.distributed`` initialized, more than one rank): the max calibrator all-reduces its
amax with MAX when it is computed; the histogram calibrators all-reduce each batch's max (so every rank
bins with the same width) and sum the histograms when the amax is computed. Every rank must calibrate the
same number of batches (as DDP training requires anyway); then every rank holds the same amax, equal to a
single process's on the concatenated batches.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

__all__ = ["MaxCalibrator", "HistogramCalibrator", "make_calibrator", "CALIBRATORS", "entropy_amax",
           "mse_amax", "percentile_amax"]

CALIBRATORS = ("max", "percentile", "mse", "entropy")


def _dist_world() -> int:
    d = torch.distributed
    return d.get_world_size() if d.is_available() and d.is_initialized() else 1


def _check_finite(x: torch.Tensor, who: str, method: str) -> None:
    bad = int((~torch.isfinite(x)).sum())
    if bad:
        raise ValueError(f"xquant.qat: quantizer {who}: the calibration data has {bad} NaN / Inf value(s) of "
                         f"{x.numel()} (calibrator {method!r} expects finite values)")


def _reduce_axes(ndim: int, axis: Optional[int]) -> list[int]:
    return [d for d in range(ndim) if d != axis]


class MaxCalibrator:
    """Running max of ``|x|``, per tensor (``axis=None``) or per channel along ``axis``."""

    method = "max"

    def __init__(self, axis: Optional[int] = None, skip_nonfinite: bool = False, who: str = "?"):
        self.axis, self.skip_nonfinite, self.who = axis, skip_nonfinite, who
        self.amax: Optional[torch.Tensor] = None
        self.batches = 0

    def reset(self) -> None:
        self.amax, self.batches = None, 0

    @torch.no_grad()
    def collect(self, x: torch.Tensor) -> None:
        a = x.detach().float().abs()
        if self.skip_nonfinite:
            a = torch.where(torch.isfinite(a), a, torch.zeros((), dtype=a.dtype, device=a.device))
        else:
            _check_finite(a, self.who, self.method)
        if self.axis is None:
            m = a.amax() if a.numel() else torch.zeros((), device=a.device)
            m = m.reshape(1)
        else:
            ax = self.axis % a.ndim
            m = a.amax(dim=_reduce_axes(a.ndim, ax)) if a.numel() else torch.zeros(a.shape[ax], device=a.device)
        if self.amax is not None and self.amax.shape != m.shape:
            raise ValueError(f"xquant.qat: quantizer {self.who}: calibration batch has {m.numel()} channels on axis "
                             f"{self.axis} but earlier batches had {self.amax.numel()}")
        self.amax = m if self.amax is None else torch.maximum(self.amax, m)
        self.batches += 1

    @torch.no_grad()
    def compute_amax(self, sync: bool = True) -> Optional[torch.Tensor]:
        if self.amax is None:
            return None
        amax = self.amax.clone()
        if sync and _dist_world() > 1:
            torch.distributed.all_reduce(amax, op=torch.distributed.ReduceOp.MAX)
        return amax


class HistogramCalibrator:
    """Histogram of ``|x|`` (per tensor) for the percentile, mse and entropy methods (see the module doc)."""

    def __init__(self, method: str, num_bins: int = 2048, percentile: float = 99.99, start_bin: Optional[int] = None,
                 num_bits: int = 8, is_unsigned: bool = False, narrow_range: bool = True, who: str = "?",
                 max_bins: Optional[int] = None):
        if method not in ("percentile", "mse", "entropy"):
            raise ValueError(f"xquant.qat: quantizer {who}: histogram method {method!r} is not one of "
                             "'percentile', 'mse', 'entropy'")
        if not isinstance(num_bins, int) or num_bins < 2:
            raise ValueError(f"xquant.qat: quantizer {who}: num_bins is {num_bins!r} but expected an int >= 2")
        if not (isinstance(percentile, (int, float)) and 0 < percentile <= 100):
            raise ValueError(f"xquant.qat: quantizer {who}: percentile is {percentile!r} but expected a number in (0, 100]")
        if start_bin is None:
            start_bin = min(128, num_bins)
        if not isinstance(start_bin, int) or not 1 <= start_bin <= num_bins:
            raise ValueError(f"xquant.qat: quantizer {who}: start_bin is {start_bin!r} but expected an int in [1, num_bins={num_bins}]")
        if max_bins is None:
            max_bins = 64 * num_bins
        if not isinstance(max_bins, int) or max_bins < num_bins:
            raise ValueError(f"xquant.qat: quantizer {who}: max_bins is {max_bins!r} but expected an int >= "
                             f"num_bins={num_bins}")
        self.max_bins = max_bins
        self.method, self.num_bins, self.percentile, self.start_bin = method, num_bins, float(percentile), start_bin
        self.num_bits, self.is_unsigned, self.narrow_range, self.who = num_bits, is_unsigned, narrow_range, who
        self.reset()

    def reset(self) -> None:
        self.width: Optional[torch.Tensor] = None  # float32 scalar
        self.hist: Optional[torch.Tensor] = None   # int64 counts
        self.zeros = 0                              # zeros seen before the width existed
        self.batches = 0

    @torch.no_grad()
    def collect(self, x: torch.Tensor) -> None:
        a = x.detach().float().abs().reshape(-1)
        _check_finite(a, self.who, self.method)
        m = a.max() if a.numel() else torch.zeros((), device=a.device)
        if _dist_world() > 1:  # same width and growth on every rank
            torch.distributed.all_reduce(m, op=torch.distributed.ReduceOp.MAX)
        self.batches += 1
        if self.width is None:
            if float(m) == 0.0:
                self.zeros += a.numel()
                return
            self.width = (m / self.num_bins).reshape(())
            self.hist = torch.zeros(self.num_bins, dtype=torch.int64, device=a.device)
            if self.zeros:
                self.hist[0] += self.zeros
                self.zeros = 0
        nb = self.hist.numel()
        if float(m) > float(self.width) * nb:
            while math.ceil(float(m) / float(self.width)) > self.max_bins:  # a far larger batch: coarser bins
                h = self.hist
                if h.numel() % 2:
                    h = torch.cat([h, h.new_zeros(1)])
                self.hist = h.reshape(-1, 2).sum(dim=1)
                self.width = self.width * 2
            nb = self.hist.numel()
            grow = math.ceil(float(m) / float(self.width)) - nb
            if grow > 0:
                self.hist = torch.cat([self.hist, torch.zeros(grow, dtype=torch.int64, device=a.device)])
                nb += grow
        idx = torch.floor(a / self.width).long().clamp_(0, nb - 1)
        self.hist += torch.bincount(idx, minlength=nb)

    @torch.no_grad()
    def compute_amax(self, sync: bool = True) -> Optional[torch.Tensor]:
        if self.batches == 0:
            return None
        dev = self.hist.device if self.hist is not None else torch.device("cpu")
        if self.width is None:  # only zeros (every rank: the batch max is all-reduced in collect)
            return torch.zeros(1, device=dev)
        hist = self.hist.clone()
        if sync and _dist_world() > 1:
            torch.distributed.all_reduce(hist, op=torch.distributed.ReduceOp.SUM)
        counts = hist.cpu().numpy().astype(np.float64)
        width = float(self.width)
        if self.method == "percentile":
            a = percentile_amax(counts, width, self.percentile)
        elif self.method == "mse":
            a = mse_amax(counts, width, self.start_bin, self.num_bits, self.is_unsigned, self.narrow_range)
        else:
            a = entropy_amax(counts, width, self.start_bin, self.num_bits, self.is_unsigned)
        return torch.tensor([a], dtype=torch.float32, device=dev)


def _edge(i: int, width: float) -> float:
    """The upper edge of bin i - 1 (i bins kept), rounded to float32."""
    return float(np.float32(np.float64(i) * np.float64(np.float32(width))))


def percentile_amax(counts: np.ndarray, width: float, percentile: float) -> float:
    total = counts.sum()
    cdf = np.cumsum(counts) / total
    idx = int(np.searchsorted(cdf, percentile / 100.0, side="left"))
    idx = min(idx, counts.size - 1)
    return _edge(idx + 1, width)


def mse_amax(counts: np.ndarray, width: float, start_bin: int, num_bits: int, is_unsigned: bool,
             narrow_range: bool) -> float:
    """The edge i * width (i in [start_bin, nbins]) whose fake quantization of the bin centres, weighted
    by the counts, has the least squared error (the first such i on ties)."""
    from ..npu import npu_fake_tensor_quant_with_axis

    nb = counts.size
    w = np.float32(width)
    centres = ((np.arange(nb, dtype=np.float64) + 0.5) * np.float64(w)).astype(np.float32)
    cand = np.arange(start_bin, nb + 1)
    amaxes = np.array([_edge(int(i), width) for i in cand], dtype=np.float32)
    best, best_err = None, None
    for s in range(0, cand.size, 256):  # [candidates, bins] blocks through xquant's per-axis fake quant
        am = torch.from_numpy(amaxes[s:s + 256].copy())
        xs = torch.from_numpy(centres).expand(am.numel(), nb).contiguous()
        fq = npu_fake_tensor_quant_with_axis(xs, am, 0, num_bits, is_unsigned, narrow_range).numpy().astype(np.float64)
        err = ((fq - centres.astype(np.float64)) ** 2 * counts).sum(axis=1)
        j = int(np.argmin(err))
        if best_err is None or err[j] < best_err:
            best, best_err = float(amaxes[s + j]), float(err[j])
    return best


def entropy_amax(counts: np.ndarray, width: float, start_bin: int, num_bits: int, is_unsigned: bool) -> float:
    """TensorRT's KL-divergence calibration on the histogram. For each i in [max(start_bin, levels), nbins]:
    P = counts[:i] with the counts beyond added to bin i - 1; Q = counts[:i] merged into ``levels`` groups
    (bin j in group floor(j * levels / i)), each group's total spread evenly over its non-empty bins;
    KL(P || Q) over P > 0 after normalizing both (a candidate with Q = 0 where P > 0 is skipped). Returns
    the edge i * width with the least KL (the first on ties). ``levels`` = 2^(num_bits - 1 + is_unsigned) - 1."""
    levels = (1 << (num_bits - 1 + int(is_unsigned))) - 1
    levels = max(levels, 1)
    nb = counts.size
    best_i, best_kl = nb, None
    for i in range(max(start_bin, levels), nb + 1):
        p = counts[:i].copy()
        p[i - 1] += counts[i:].sum()
        if p.sum() == 0:
            continue
        ref = counts[:i]
        grp = (np.arange(i) * levels) // i
        tot = np.bincount(grp, weights=ref, minlength=levels)
        nz = np.bincount(grp, weights=(ref > 0).astype(np.float64), minlength=levels)
        per = np.divide(tot, nz, out=np.zeros_like(tot), where=nz > 0)
        q = np.where(ref > 0, per[grp], 0.0)
        if q.sum() == 0:
            continue
        pn, qn = p / p.sum(), q / q.sum()
        m = pn > 0
        if np.any(qn[m] == 0):
            continue
        kl = float(np.sum(pn[m] * np.log(pn[m] / qn[m])))
        if best_kl is None or kl < best_kl:
            best_i, best_kl = i, kl
    return _edge(best_i, width)


def make_calibrator(method: str, axis: Optional[int], num_bits: int, is_unsigned: bool, narrow_range: bool,
                    who: str, skip_nonfinite: bool = False, **kw):
    if method == "max":
        if kw:
            raise ValueError(f"xquant.qat: quantizer {who}: calibrator 'max' takes no options, got {sorted(kw)}")
        return MaxCalibrator(axis, skip_nonfinite=skip_nonfinite, who=who)
    if method in ("percentile", "mse", "entropy"):
        if axis is not None:
            raise ValueError(f"xquant.qat: quantizer {who}: calibrator {method!r} computes one amax per tensor, but "
                             f"the quantizer has axis={axis} (use calibrator 'max' for per-channel amax)")
        return HistogramCalibrator(method, num_bits=num_bits, is_unsigned=is_unsigned, narrow_range=narrow_range,
                                   who=who, **kw)
    raise ValueError(f"xquant.qat: quantizer {who}: calibrator is {method!r} but expected one of {CALIBRATORS}")
