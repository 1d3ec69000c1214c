#!/usr/bin/env python3
"""One QAT training step's cost with xquant.qat against the float step and against torch.ao's eager QAT
(prepare_qat, the default x86 qconfig: per-channel int8 weights, per-tensor activations with moving-average
observers) on the same model, measured side by side in one run.

The model: an MLP 1024 -> 1024 -> 1024 -> 1024 -> 16 (ReLU), batch 64, float32. A step is forward +
cross-entropy + backward + SGD update. Each round runs --steps steps of every variant in turn (interleaved,
so that machine noise hits all alike); the table reports the median over --rounds rounds of the per-step
time in milliseconds of this thread's CPU time (time.thread_time_ns; --wall for the wall clock). torch and
xquant run on one thread. Prints a Markdown table (docs/qat.md).

    python3 bench/qat_overhead.py [--rounds 15] [--steps 5]
"""
from __future__ import annotations

import argparse
import copy
import platform
import statistics
import time
import warnings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--wall", action="store_true", help="wall-clock time instead of thread CPU time")
    args = ap.parse_args()

    import torch
    import xquant
    import xquant.qat as xqat

    torch.set_num_threads(1)
    xquant.set_num_threads(1)
    torch.manual_seed(0)
    clock = time.perf_counter_ns if args.wall else time.thread_time_ns
    d, batch = 1024, 64
    x = torch.randn(batch, d)
    y = torch.randint(0, 16, (batch,))

    def mlp():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.ReLU(), torch.nn.Linear(d, d), torch.nn.ReLU(),
                                   torch.nn.Linear(d, d), torch.nn.ReLU(), torch.nn.Linear(d, 16))

    variants = {}
    variants["float"] = mlp()

    def xq(cfg):
        m = xqat.prepare(mlp(), cfg, targets=["Linear"])
        xqat.calibrate(m, lambda mm: mm(x))
        return m

    a8 = {"num_bits": 8, "calibrator": "max"}
    variants["xquant.qat int8 weights per channel + int8 activations per tensor"] = xq(
        {"weights": {"num_bits": 8, "strategy": "channel"}, "input_activations": a8})
    variants["the same, learnable amax (weights and activations)"] = xq(
        {"weights": {"num_bits": 8, "strategy": "channel", "learn_amax": True},
         "input_activations": dict(a8, learn_amax=True)})
    variants["xquant.qat W4A16 (int4 weights, group 128)"] = xq("W4A16")
    variants["xquant.qat W8A8 (int8 weights per channel, dynamic per-token int8 activations)"] = xq("W8A8")
    variants["xquant.qat int8 weights + ActsULQ int8 activations"] = xq(
        {"weights": {"num_bits": 8, "strategy": "channel"}, "input_activations": {"type": "actsulq", "num_bits": 8}})

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
        from torch.ao.quantization import DeQuantStub, QuantStub, get_default_qat_qconfig, prepare_qat

        ao = torch.nn.Sequential(QuantStub(), *mlp(), DeQuantStub())
        ao.qconfig = get_default_qat_qconfig("x86")
        ao.train()
        prepare_qat(ao, inplace=True)
    variants["torch.ao prepare_qat (x86 default qconfig: int8 per-channel weights, per-tensor activations)"] = ao

    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, m in variants.items()}

    def step(m, opt):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(m(x), y) + (xqat.quant_loss(m) if m is not ao else 0)
        loss.backward()
        opt.step()

    for k, m in variants.items():  # warm up
        for _ in range(3):
            step(m, opts[k])
    times = {k: [] for k in variants}
    for _ in range(args.rounds):
        for k, m in variants.items():
            t0 = clock()
            for _ in range(args.steps):
                step(m, opts[k])
            times[k].append((clock() - t0) / args.steps / 1e6)
    med = {k: statistics.median(v) for k, v in times.items()}
    ao_key = [k for k in variants if k.startswith("torch.ao")][0]
    print(f"<!-- {platform.processor() or platform.machine()}, torch {torch.__version__}, xquant {xquant.__version__}, "
          f"SIMD {xquant.simd_target()}, 1 thread, {'wall' if args.wall else 'thread CPU'} time, median of "
          f"{args.rounds} rounds x {args.steps} steps -->")
    print("| variant | ms / step | vs float | vs torch.ao QAT |")
    print("|---|---:|---:|---:|")
    for k in variants:
        print(f"| {k} | {med[k]:.2f} | {med[k] / med['float']:.2f}x | {med[k] / med[ao_key]:.2f}x |")


if __name__ == "__main__":
    main()
