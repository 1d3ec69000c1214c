import torch
import torch_npu
from mx_driving import npu_fake_tensor_quant_with_axis

# 创建 4D 权重张量 (N, C, H, W)
weight = torch.randn(64, 128, 3, 3, dtype=torch.float32, device='npu')

# 沿通道轴（axis=0）计算每通道的 amax
amax = weight.abs().amax(dim=[1, 2, 3])  # Shape: [64]

# 按通道量化（8bit 有符号窄范围）
quantized_weight = npu_fake_tensor_quant_with_axis(
    weight, amax, axis=0, num_bits=8, is_unsigned=False, narrow_range=True
)
