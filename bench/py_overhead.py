#!/usr/bin/env python3
"""Per-call cost of every xquant.npu function from Python on small torch tensors (1 Ki elements), against
the closest native PyTorch operator, measured side by side in one run.

Each round times a batch of --calls calls of the xquant function, then a batch of the native operator
(interleaved, so that machine noise hits both alike); the per-call time of a batch is its time divided by
--calls, and the table reports the median over --rounds rounds, in microseconds of this thread's CPU time
(time.thread_time_ns: on a shared, loaded machine the wall clock also counts the slices other processes
get; --wall uses it anyway). torch and xquant run on
one thread (torch.set_num_threads(1), xquant.set_num_threads(1)). Prints a Markdown table. A third batch
per round times the same xquant call with the eager fast path turned off, i.e. through torch.ops.xquant.*
and the dispatcher (what every call that is not plain eager takes), for the column "via torch.ops".

    PYTHONPATH=.pyinstall python3 bench/py_overhead.py [--rounds 31] [--calls 200] [--only fake]
"""
from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import time


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=31, help="interleaved rounds (median over rounds)")
    ap.add_argument("--calls", type=int, default=200, help="calls per timed batch")
    ap.add_argument("--only", default=None, help="substring filter on case names")
    ap.add_argument("--no-dispatcher-column", action="store_true",
                    help="do not also time the xquant calls with the fast path off (through torch.ops.xquant.*)")
    ap.add_argument("--wall", action="store_true",
                    help="time with the wall clock (default: this thread's CPU time, which time slices given to "
                         "other processes on a loaded machine do not inflate)")
    return ap.parse_args()


ARGS = parse_args()

import torch  # noqa: E402

import xquant  # noqa: E402
from xquant import _torch_ops, npu  # noqa: E402

torch.set_num_threads(1)
xquant.set_num_threads(1)
torch.manual_seed(0)


def cases():
    """(name, xquant call, native name, native call): every xquant.npu function on 1 Ki elements."""
    x = torch.randn(8, 128)  # 1 Ki float32 elements
    amax = x.abs().max().reshape(1)
    scale_t = (amax / 127).reshape(1)
    zp_t = torch.zeros(1, dtype=torch.int32)
    amax_c = x.abs().amax(0) + 0.1  # per channel on the last axis (128)
    scale_c = amax_c / 127
    zp_c = torch.zeros(128, dtype=torch.int32)
    s_c = 1.0 / scale_c
    xb = x.bfloat16()
    buf = x.clone()
    src = x.clone()
    tile_out = torch.empty(8, 128, dtype=torch.int8)
    row_scale = torch.full((8, 1), 20.0)
    row_inv, row_zp = 1.0 / row_scale.view(8), torch.zeros(8, dtype=torch.int32)
    zp_c8 = zp_c.to(torch.int8)
    lo, hi = torch.tensor([-1.0]), torch.tensor([1.5])
    ulq_scale, ulq_zp = torch.tensor([2.5 / 255]), torch.tensor([102.0])
    xg = x.clone().requires_grad_()
    amax_g = amax.clone().requires_grad_()
    torch_qint8 = torch.qint8
    w8 = torch.randint(-128, 128, (8, 128), dtype=torch.int8)  # 1 Ki int8 weights
    w4 = torch.randint(-2**31, 2**31 - 1, (8, 16), dtype=torch.int32)  # 1 Ki packed int4
    q4 = torch.quantize_per_tensor(x, 0.05, 8, torch.quint4x2)
    yield ("npu_fake_tensor_quant", lambda: npu.npu_fake_tensor_quant(x, amax),
           "fake_quantize_per_tensor_affine (tensor qparams)",
           lambda: torch.fake_quantize_per_tensor_affine(x, scale_t, zp_t, -128, 127))
    yield ("npu_fake_tensor_quant bfloat16", lambda: npu.npu_fake_tensor_quant(xb, amax),
           "fake_quantize_per_tensor_affine bfloat16",
           lambda: torch.fake_quantize_per_tensor_affine(xb, scale_t, zp_t, -128, 127))
    yield ("npu_fake_tensor_quant_with_axis", lambda: npu.npu_fake_tensor_quant_with_axis(x, amax_c, 1),
           "fake_quantize_per_channel_affine",
           lambda: torch.fake_quantize_per_channel_affine(x, scale_c, zp_c, 1, -128, 127))
    yield ("npu_fake_tensor_quant_inplace", lambda: npu.npu_fake_tensor_quant_inplace(buf, amax),
           "fake_quantize_per_tensor_affine (tensor qparams)",
           lambda: torch.fake_quantize_per_tensor_affine(x, scale_t, zp_t, -128, 127))
    yield ("npu_quantize per-tensor qint8", lambda: npu.npu_quantize(x, scale_t, None, torch_qint8, 1, True),
           "quantize_per_tensor (tensor qparams)",
           lambda: torch.quantize_per_tensor(x, scale_t, zp_t, torch_qint8))
    yield ("npu_quantize per-channel qint8", lambda: npu.npu_quantize(x, scale_c, zp_c8, torch_qint8, -1),
           "quantize_per_channel",
           lambda: torch.quantize_per_channel(x, scale_c, zp_c, 1, torch_qint8))
    yield ("npu_quantize quint4x2 (div_mode=False)",
           lambda: npu.npu_quantize(x, s_c, None, torch.quint4x2, -1, False),
           "quantize_per_tensor quint4x2", lambda: torch.quantize_per_tensor(x, 0.05, 8, torch.quint4x2))
    yield ("npu_quantize quint4x2 (div_mode=False), one scale",
           lambda: npu.npu_quantize(x, scale_t, None, torch.quint4x2, -1, False),
           "quantize_per_tensor quint4x2", lambda: torch.quantize_per_tensor(x, 0.05, 8, torch.quint4x2))
    yield ("npu_dynamic_quant_asymmetric", lambda: npu.npu_dynamic_quant_asymmetric(x),
           "quantize_per_tensor_dynamic", lambda: torch.quantize_per_tensor_dynamic(x, torch_qint8, False))
    yield ("npu_dynamic_quant", lambda: npu.npu_dynamic_quant(x),
           "quantize_per_tensor_dynamic", lambda: torch.quantize_per_tensor_dynamic(x, torch_qint8, False))
    yield ("npu_anti_quant int8 -> float16", lambda: npu.npu_anti_quant(w8, scale_c),
           "int8 * scale -> float16", lambda: (w8.float() * scale_c).half())
    yield ("npu_anti_quant int8 -> float16, one scale", lambda: npu.npu_anti_quant(w8, scale_t),
           "int8 * scale -> float16", lambda: (w8.float() * scale_t).half())
    yield ("npu_anti_quant quint4x2 -> bfloat16",
           lambda: npu.npu_anti_quant(w4, scale_c, dst_dtype=torch.bfloat16, src_dtype=torch.quint4x2),
           "dequantize (quint4x2)", lambda: torch.dequantize(q4))
    yield ("quant (tile, SYM)", lambda: npu.quant(tile_out, src, row_scale),
           "quantize_per_channel (axis 0)",
           lambda: torch.quantize_per_channel(src, row_inv, row_zp, 0, torch_qint8))
    yield ("acts_ulq", lambda: npu.acts_ulq(x, lo, hi),
           "_fake_quantize_learnable_per_tensor_affine",
           lambda: torch._fake_quantize_learnable_per_tensor_affine(x, ulq_scale, ulq_zp, 0, 255, 1.0))
    # Autograd recording (requires_grad inputs): the custom operator path.
    yield ("npu_fake_tensor_quant, x and amax require grad", lambda: npu.npu_fake_tensor_quant(xg, amax_g),
           "fake_quantize_per_tensor_affine, x requires grad",
           lambda: torch.fake_quantize_per_tensor_affine(xg, scale_t, zp_t, -128, 127))


CLOCK = time.perf_counter_ns if ARGS.wall else time.thread_time_ns


def per_call_us(fn, calls: int) -> float:
    t0 = CLOCK()
    for _ in range(calls):
        fn()
    return (CLOCK() - t0) / calls / 1e3


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown"


class _NoFastPath:
    """Stands in for xquant._torch_ext in xquant.npu: every f_<op> declines, so calls take torch.ops.xquant."""

    def __getattr__(self, name):
        return lambda *args: None


def main():
    rows = []
    core_column = not ARGS.no_dispatcher_column
    for name, fx, native_name, fn in cases():
        if ARGS.only and ARGS.only not in name:
            continue
        for _ in range(max(ARGS.calls // 4, 20)):  # warm-up: registration, caches, allocator
            fx()
            fn()
        tx, tc, tn = [], [], []
        for _ in range(ARGS.rounds):
            tx.append(per_call_us(fx, ARGS.calls))
            tn.append(per_call_us(fn, ARGS.calls))
            if core_column:  # (the switch is outside the timed calls: one batch without the fast path)
                fast = npu._fast
                npu._fast = _NoFastPath()
                try:
                    tc.append(per_call_us(fx, ARGS.calls))
                finally:
                    npu._fast = fast
        rows.append((name, statistics.median(tx), statistics.median(tc) if tc else None, native_name,
                     statistics.median(tn)))

    fast = _torch_ops.FAST.__name__
    print(f"machine: {cpu_model()}; torch {torch.__version__}, xquant {xquant.__version__} "
          f"({xquant.simd_target()}); fast path through {fast}; 1 thread; median of {ARGS.rounds} rounds x "
          f"{ARGS.calls} calls, {'wall-clock' if ARGS.wall else 'thread CPU'} time\n")
    core_head = " via torch.ops us |" if core_column else ""
    print(f"| xquant.npu call (1 Ki elements, float32 unless noted) | us |{core_head} closest native PyTorch "
          "operator | us | xquant / native |")
    print("|---|---:|" + ("---:|" if core_column else "") + "---|---:|---:|")
    for name, mx, mc, native_name, mn in rows:
        core_cell = f" {mc:.2f} |" if core_column else ""
        print(f"| `{name}` | {mx:.2f} |{core_cell} `{native_name}` | {mn:.2f} | {mx / mn:.2f} |")


if __name__ == "__main__":
    main()
