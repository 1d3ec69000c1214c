# torch_npu.npu_anti_quant: out = (x + offset) * scale in the requested floating dtype. The values are
# those of torch_npu's own single-operator example, whose documented output is
# tensor([ 6.,  8., 10., 12.], device='npu:0', dtype=torch.float16).
import torch
import torch_npu

x = torch.tensor([1, 2, 3, 4], dtype=torch.int8).npu()
scale = torch.tensor([2.0], dtype=torch.float).npu()
offset = torch.tensor([2.0], dtype=torch.float).npu()
out = torch_npu.npu_anti_quant(x, scale, offset=offset, dst_dtype=torch.float16)
print(out.dtype, out.tolist())
