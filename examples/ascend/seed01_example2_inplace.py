import torch
import torch_npu
from mx_driving import npu_fake_tensor_quant_inplace

inputs = torch.randn(1000, 256, dtype=torch.float32, device='npu')

amax = inputs.abs().max()

# 原地量化，输入张量会被修改
quantized = npu_fake_tensor_quant_inplace(inputs, amax, num_bits=8)
