# torch_npu.npu_quantize (seed 02). The seed document's own examples were lost when it was scraped
# ("[object Object]"); this script follows its documented signature, written the way Ascend code is.
import torch
import torch_npu

# div_mode=True: y = round(input / scales + zero_points), per channel on axis 1, qint8
x = torch.tensor([[-1.0, 0.25, 3.0], [100.0, -0.75, 0.5]], dtype=torch.float32).npu()
scales = torch.tensor([0.5, 0.25, 2.0], dtype=torch.float32).npu()
zero_points = torch.tensor([1, -2, 0], dtype=torch.int8).npu()
y = torch_npu.npu_quantize(x, scales, zero_points, torch.qint8, axis=1, div_mode=True)
print(y.tolist())

# div_mode=False, quint4x2: y = round(input * scales + zero_points), eight int4 packed into each int32
x4 = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0],
                   [-1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0]], device='npu')
s4 = torch.tensor([1.0] * 8, device='npu')
o4 = torch.tensor([0.0] * 8, device='npu')
y4 = torch_npu.npu_quantize(x4, s4, o4, torch.quint4x2, axis=-1, div_mode=False)
print(y4.dtype, y4.tolist())
