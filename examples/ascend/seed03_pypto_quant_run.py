# Runs seed 03's kernel (seed03_pypto_quant.py, the seed's example verbatim) on the input the seed shows,
# src[i, j] = -16 + 32 i + 0.25 j and scale 4, and prints the three lines of its "measured result".
import torch

from seed03_pypto_quant import quant_kernel

rows = torch.arange(64, dtype=torch.float32, device='npu').unsqueeze(1)
cols = torch.arange(128, dtype=torch.float32, device='npu').unsqueeze(0)
src = -16 + 32 * rows + 0.25 * cols
scale = torch.full((64, 1), 4.0, device='npu')
out = torch.empty(64, 128, dtype=torch.int8, device='npu')
quant_kernel(src, scale, out)


def show(t):
    def row(r):
        vals = " ".join(f"{v:g}" for v in r[:8].tolist())
        return f"[{vals} ...]" if len(r) > 8 else f"[{vals}]"
    return "[" + ", ".join(row(r) for r in t[:4]) + ", ...]"


print("输入数据src：" + show(src))
print("输入数据scale：" + show(scale))
print("输出数据out：" + show(out))
