#!/usr/bin/env python3
"""Quantization-aware training on the CPU with the seeds' operators (xquant.npu), a few seconds.

A two-layer MLP learns a small regression task while
  * its weights are fake-quantized per output channel to int8 (npu_fake_tensor_quant_with_axis, seed 01),
    the per-channel amax taken from the weights each step (straight-through gradient to the weights), and
  * its hidden activations go through ActsULQ (seed 05) with learnable clamp_min / clamp_max, trained by
    the ActsULQ gradients (computed by xquant's C++ backward kernels).
The loss goes down and is printed; the script exits non-zero if it does not.

    python3 examples/qat_example.py
"""

from __future__ import annotations

import sys
import time

import torch

from xquant.npu import acts_ulq, npu_fake_tensor_quant_with_axis


class QuantLinear(torch.nn.Linear):
    """nn.Linear whose weight is fake-quantized per output channel (axis 0) in every forward pass."""

    def __init__(self, in_features: int, out_features: int, num_bits: int = 8):
        super().__init__(in_features, out_features)
        self.num_bits = num_bits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        amax = self.weight.detach().abs().amax(dim=1)  # Shape: [out_features]
        w_q = npu_fake_tensor_quant_with_axis(self.weight, amax, axis=0, num_bits=self.num_bits)
        return torch.nn.functional.linear(x, w_q, self.bias)


class ActsULQ(torch.nn.Module):
    """ActsULQ activation quantizer with a learnable clip range [clamp_min, clamp_max]."""

    def __init__(self, clamp_min: float = -1.0, clamp_max: float = 1.0, num_bits: int = 8):
        super().__init__()
        self.clamp_min = torch.nn.Parameter(torch.tensor([clamp_min]))
        self.clamp_max = torch.nn.Parameter(torch.tensor([clamp_max]))
        self.num_bits = num_bits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _clamp_min_mask, _clamp_max_mask, _x_clamped_loss = acts_ulq(x, self.clamp_min, self.clamp_max,
                                                                      fixed_min=False, num_bits=self.num_bits)
        return y


def main() -> int:
    torch.manual_seed(0)
    torch.set_num_threads(2)
    t0 = time.perf_counter()

    # Task: y = sin(x @ A) @ B + noise, 16 -> 4.
    a, b = torch.randn(16, 8), torch.randn(8, 4) / 3
    x_train = torch.randn(512, 16)
    y_train = torch.sin(x_train @ a) @ b + 0.01 * torch.randn(512, 4)

    model = torch.nn.Sequential(QuantLinear(16, 64), ActsULQ(-0.5, 0.5), QuantLinear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = torch.nn.MSELoss()

    losses = []
    for step in range(300):
        idx = torch.randint(0, 512, (64,))
        opt.zero_grad()
        loss = loss_fn(model(x_train[idx]), y_train[idx])
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == 299:
            ulq = model[1]
            print(f"step {step:3d}  loss {loss.item():.4f}  clamp_min {ulq.clamp_min.item():+.3f}  "
                  f"clamp_max {ulq.clamp_max.item():+.3f}")

    with torch.no_grad():
        final = loss_fn(model(x_train), y_train).item()
        initial = losses[0]
    print(f"full-batch loss {final:.4f} (first step {initial:.4f}), {time.perf_counter() - t0:.1f} s")
    moved = model[1].clamp_max.item() != 0.5 or model[1].clamp_min.item() != -0.5
    if not (final < 0.5 * initial and moved):
        print("error: the loss did not go down (or the ActsULQ clamps did not learn)", file=sys.stderr)
        return 1
    print("loss went down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
