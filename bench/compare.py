#!/usr/bin/env python3
"""xquant against PyTorch on the seed documents' shapes, in one run, with the same thread count.

For every case: xquant (the Python package, allocating form as users call it), the PyTorch eager formula,
and the same formula compiled by torch.compile (Inductor), each timed as the median of --reps calls after
warm-up; plus a memcpy bandwidth probe (torch's parallel copy_ of the largest case, same threads) measured
in the same process. Prints a table (ms, GB/s, fraction of the memcpy probe, speedups) and whether the
PyTorch outputs are bit-identical to xquant's, and writes the numbers as JSON (--json).

    python3 bench/compare.py --threads 2 --json docs/perf/compare.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for xquant and torch")
    ap.add_argument("--reps", type=int, default=7, help="timed calls per measurement (median)")
    ap.add_argument("--json", default=None, help="write results here")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (it compiles each case)")
    ap.add_argument("--only", default=None, help="substring filter on case names")
    return ap.parse_args()


ARGS = parse_args()
# xquant's OpenMP threads follow OMP_NUM_THREADS unless set explicitly; set both before importing.
os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)

import torch  # noqa: E402

import xquant  # noqa: E402
from _timing import median_times  # noqa: E402  (bench/, the script's directory)
from xquant import npu  # noqa: E402

torch.set_num_threads(ARGS.threads)
if hasattr(xquant, "set_num_threads"):
    xquant.set_num_threads(ARGS.threads)


def median_time(fn, reps):
    return median_times([fn], reps)[0]


def nbytes(*ts):
    return sum(t.numel() * t.element_size() for t in ts)


def same_bits(a, b):
    if isinstance(a, (tuple, list)):
        return all(same_bits(x, y) for x, y in zip(a, b))
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        return bool(torch.equal(a.view(torch.int32 if a.element_size() == 4 else torch.int16),
                                b.view(torch.int32 if b.element_size() == 4 else torch.int16)))
    return bool(torch.equal(a, b))


# ---------------------------------------------------------------- PyTorch formulas (SPEC, eager)
def fq_formula(x, amax, bound=127.0):
    # torch.full_like(amax, bound) / amax, not bound / amax: PyTorch evaluates `scalar / tensor` as
    # tensor.reciprocal() * scalar, which is not the correctly rounded division SPEC (and xquant) use.
    scale = torch.full_like(amax, bound) / amax
    return torch.clamp(torch.round(x * scale), -bound, bound) / scale


def quantize_int8_formula(x, scales, axis0=True):
    s = scales[:, None] if axis0 else scales
    return torch.clamp(torch.round(x / s), -128, 127).to(torch.int8)


def pack_int4(q):
    """int32 values in [-8, 7] -> quint4x2 words: element 8k + j in bits [4j, 4j + 3] of word k."""
    q = (q & 0xF).reshape(*q.shape[:-1], q.shape[-1] // 8, 8) << (torch.arange(8, dtype=torch.int32) * 4)
    return _or_reduce(q)


def quantize_int4_formula(x, scales):
    return pack_int4(torch.clamp(torch.round(x * scales), -8, 7).to(torch.int32))


def _or_reduce(q):
    w = q[..., 0]
    for j in range(1, 8):
        w = w | q[..., j]
    return w


def dyn_formula(x, smooth=None, dst_max=127.0, dst_min=-128.0, int4=False):
    xs = x.float()
    if smooth is not None:
        xs = xs * smooth.float()
    mx = xs.amax(-1, keepdim=True)
    mn = xs.amin(-1, keepdim=True)
    scale = torch.clamp_min((mx - mn) / (dst_max - dst_min), 1e-12)
    offset = dst_max - mx / scale
    y = torch.clamp(torch.round(xs / scale + offset), dst_min, dst_max)
    if int4:
        y = pack_int4(y.to(torch.int32))
    else:
        y = y.to(torch.int8)
    return y, scale.squeeze(-1), offset.squeeze(-1)


LEVELS, EPS = 255.0, 1.192092896e-7


def ulq_formula(x, cmin, cmax):
    ori_min = torch.clamp_max(cmin, 0.0)
    ori_max = torch.clamp_min(cmax, LEVELS * EPS)
    s = (ori_max - ori_min) / LEVELS
    off = torch.round(ori_min / s)
    lo, hi = s * off, s * (off + LEVELS)
    xc = torch.minimum(torch.maximum(x, lo), hi)
    mn = (x >= lo).to(x.dtype)
    mx = (x <= hi).to(x.dtype)
    raw = xc / s
    rx = torch.round(raw)
    loss = (rx - raw) / LEVELS
    raw_m = ori_min / s
    loss_m = (torch.round(raw_m) - raw_m) / LEVELS
    xl = torch.where((mn * mx) > 0, loss, loss_m)
    return rx * s, mn, mx, xl


def ulq_bwd_formula(dy, mn, mx, loss):
    gx = dy * mn * mx
    gmin = (dy * ((1 - mn) - loss)).sum()
    gmax = (dy * (loss + (1 - mx))).sum()
    return gx, gmin, gmax


# ---------------------------------------------------------------- cases
def cases():
    g = torch.Generator().manual_seed(0)
    out = []

    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype)

    big = 100663296
    x = randn(big)
    amax = x.abs().max().reshape(1)
    out.append(dict(name="fake_quant global [100663296] f32", bytes=nbytes(x, x),
                    xq=lambda: npu.npu_fake_tensor_quant(x, amax), eager=lambda: fq_formula(x, amax),
                    fn=fq_formula, args=(x, amax)))
    for n in (1024, 65536):
        xs = randn(n)
        am = xs.abs().max().reshape(1)
        out.append(dict(name=f"fake_quant global [{n}] f32", bytes=nbytes(xs, xs),
                        xq=lambda xs=xs, am=am: npu.npu_fake_tensor_quant(xs, am),
                        eager=lambda xs=xs, am=am: fq_formula(xs, am), fn=fq_formula, args=(xs, am)))
    w = randn(32, 8, 512, 768)
    a1 = w.abs().amax(dim=(0, 2, 3))
    out.append(dict(name="fake_quant axis=1 [32,8,512,768] f32", bytes=nbytes(w, w),
                    xq=lambda: npu.npu_fake_tensor_quant_with_axis(w, a1, 1),
                    eager=lambda: fq_formula(w, a1.reshape(1, 8, 1, 1)),
                    fn=fq_formula, args=(w, a1.reshape(1, 8, 1, 1))))
    a3 = w.abs().amax(dim=(0, 1, 2))
    out.append(dict(name="fake_quant last axis [32,8,512,768] f32", bytes=nbytes(w, w),
                    xq=lambda: npu.npu_fake_tensor_quant_with_axis(w, a3, 3),
                    eager=lambda: fq_formula(w, a3), fn=fq_formula, args=(w, a3)))
    m = randn(4096, 4096)
    s8 = (m.abs().amax(dim=1) / 127).contiguous()
    out.append(dict(name="npu_quantize per-channel int8 [4096,4096] f32", bytes=m.numel() * 5,
                    xq=lambda: npu.npu_quantize(m, s8, None, torch.qint8, axis=0, div_mode=True),
                    eager=lambda: quantize_int8_formula(m, s8), fn=quantize_int8_formula, args=(m, s8)))
    s4 = (7 / m.abs().amax(dim=0)).contiguous()
    out.append(dict(name="npu_quantize per-channel quint4x2 [4096,4096] f32", bytes=m.numel() * 4 + m.numel() // 2,
                    xq=lambda: npu.npu_quantize(m, s4, None, torch.quint4x2, axis=-1, div_mode=False),
                    eager=lambda: quantize_int4_formula(m, s4), fn=quantize_int4_formula, args=(m, s4)))
    for dt, dname in ((torch.bfloat16, "bf16"), (torch.float32, "f32")):
        xd = randn(8192, 4096, dtype=dt)
        sm = (torch.rand(4096, generator=g) + 0.5).to(dt)
        for int4 in (False, True):
            for smooth in (False, True):
                dst = torch.quint4x2 if int4 else torch.int8
                ybytes = xd.numel() // 2 if int4 else xd.numel()
                kw = dict(dst_max=7.0, dst_min=-8.0, int4=True) if int4 else {}
                smv = sm if smooth else None
                out.append(dict(
                    name=f"dynamic pertoken [8192,4096] {dname}->{'int4' if int4 else 'int8'}{' smooth' if smooth else ''}",
                    bytes=nbytes(xd) + ybytes + 8 * 8192,
                    xq=lambda xd=xd, smv=smv, dst=dst: npu.npu_dynamic_quant_asymmetric(xd, smooth_scales=smv, dst_type=dst),
                    eager=lambda xd=xd, smv=smv, kw=kw: dyn_formula(xd, smv, **kw),
                    fn=lambda a, b, kw=kw: dyn_formula(a, b, **kw), args=(xd, smv)))
    cmin = torch.tensor([-1.5])
    cmax = torch.tensor([2.0])
    out.append(dict(name="acts_ulq forward [100663296] f32", bytes=nbytes(x) * 5,
                    xq=lambda: npu.acts_ulq(x, cmin, cmax), eager=lambda: ulq_formula(x, cmin, cmax),
                    fn=ulq_formula, args=(x, cmin, cmax)))
    f = npu.acts_ulq(x, cmin, cmax)
    dy = randn(big)
    out.append(dict(name="acts_ulq backward [100663296] f32", bytes=nbytes(x) * 5,
                    xq=lambda: xquant.acts_ulq_backward(dy, x.shape, cmin, cmax, f[1], f[2], f[3]),
                    eager=lambda: ulq_bwd_formula(dy, f[1], f[2], f[3]),
                    fn=ulq_bwd_formula, args=(dy, f[1], f[2], f[3])))
    return out


def main():
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, threads={ARGS.threads}, "
          f"torch {torch.__version__}, xquant {xquant.__version__}")
    probe_src = torch.randn(100663296)
    probe_dst = torch.empty_like(probe_src)
    t_copy = median_time(lambda: probe_dst.copy_(probe_src), ARGS.reps)
    bw = 2 * probe_src.numel() * 4 / t_copy
    print(f"memcpy probe (torch copy_, 402 MB, {ARGS.threads} threads): {t_copy * 1e3:.1f} ms = {bw / 1e9:.1f} GB/s (read + write)")
    rows = []
    hdr = f"{'case':52s} {'xquant ms':>10s} {'GB/s':>6s} {'%cpy':>5s} {'eager ms':>9s} {'x':>6s} {'compiled ms':>11s} {'x':>6s}  bit-exact eager/compiled"
    print(hdr)
    for c in cases():
        if ARGS.only and ARGS.only not in c["name"]:
            continue
        fns = [c["xq"], c["eager"]]
        if not ARGS.no_compile:
            comp = torch.compile(c["fn"])
            fns.append(lambda comp=comp: comp(*c["args"]))
        n_ops = len(fns)
        big = c["bytes"] >= (64 << 20)
        if big:  # the bandwidth line, measured in the same rounds as this case
            fns.append(lambda: probe_dst.copy_(probe_src))
        times = median_times(fns, ARGS.reps)
        t_xq, t_eager = times[0], times[1]
        t_comp = times[2] if n_ops > 2 else None
        case_bw = 2 * probe_src.numel() * 4 / times[-1] if big else bw
        ref = c["xq"]()
        exact_eager = _compare(ref, c["eager"]())
        exact_comp = _compare(ref, fns[2]()) if n_ops > 2 else None
        gbs = c["bytes"] / t_xq
        row = dict(case=c["name"], bytes=c["bytes"], xquant_s=t_xq, eager_s=t_eager, compiled_s=t_comp,
                   xquant_gbs=gbs / 1e9, memcpy_gbs=case_bw / 1e9, fraction_of_memcpy=gbs / case_bw, speedup_eager=t_eager / t_xq,
                   speedup_compiled=(t_comp / t_xq) if t_comp else None, bitexact_eager=exact_eager,
                   bitexact_compiled=exact_comp)
        rows.append(row)
        comp_s = f"{t_comp * 1e3:11.2f} {t_comp / t_xq:6.1f}" if t_comp else f"{'-':>11s} {'-':>6s}"
        print(f"{c['name']:52s} {t_xq * 1e3:10.3f} {gbs / 1e9:6.1f} {100 * gbs / case_bw:5.0f} {t_eager * 1e3:9.2f} "
              f"{t_eager / t_xq:6.1f} {comp_s}  {exact_eager}/{exact_comp}", flush=True)
    if ARGS.json:
        os.makedirs(os.path.dirname(os.path.abspath(ARGS.json)), exist_ok=True)
        with open(ARGS.json, "w") as fh:
            json.dump(dict(threads=ARGS.threads, torch=torch.__version__, memcpy_gbs=bw / 1e9,
                           machine=platform.processor() or platform.machine(), cpus=os.cpu_count(), rows=rows), fh, indent=1)


def _compare(a, b):
    """Bit-exact comparison of xquant's outputs with PyTorch's: True, or the indices of the outputs that
    differ. (Sums are expected to differ in the last bits: PyTorch adds in its own order, xquant in the
    canonical blocked order.)"""
    try:
        a = list(a) if isinstance(a, (tuple, list)) else [a]
        b = list(b) if isinstance(b, (tuple, list)) else [b]
        bad = [i for i, (x, y) in enumerate(zip(a, b))
               if not same_bits(x.reshape(y.shape) if x.numel() == y.numel() else x, y)]
        return True if not bad else "outputs " + ",".join(map(str, bad)) + " differ"
    except Exception as e:  # noqa: BLE001
        return f"n/a ({type(e).__name__})"


if __name__ == "__main__":
    sys.exit(main())
