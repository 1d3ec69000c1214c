import torch
import torch_npu
from mx_driving import npu_fake_tensor_quant

# 创建输入张量
inputs = torch.randn(4, 64, 32, 32, dtype=torch.float32, device='npu')

# 计算 amax（整个张量的最大绝对值）
amax = inputs.abs().max()

# 标量量化（8bit 有符号窄范围）
quantized = npu_fake_tensor_quant(inputs, amax, num_bits=8, is_unsigned=False, narrow_range=True)
