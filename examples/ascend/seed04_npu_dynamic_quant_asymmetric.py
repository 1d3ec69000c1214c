# torch_npu.npu_dynamic_quant_asymmetric (seed 04). The seed document's examples were lost when it was
# scraped ("[object Object]"); these calls follow its documented signature and its four listed cases.
import torch
import torch_npu

torch.manual_seed(4)
x = torch.randn(4, 3, 32, dtype=torch.float16, device='npu')

# only x, int8, per token
y, scale, offset = torch_npu.npu_dynamic_quant_asymmetric(x)
print("int8", y.dtype, tuple(y.shape), tuple(scale.shape), tuple(offset.shape))

# only x, int4 (quint4x2: eight int4 per int32)
y4, scale4, offset4 = torch_npu.npu_dynamic_quant_asymmetric(x, dst_type=torch.quint4x2)
print("int4", y4.dtype, tuple(y4.shape))

# smooth_scales, no MoE
smooth_scales = torch.rand(32, dtype=torch.float16, device='npu') + 0.5
ys, scales_s, offsets_s = torch_npu.npu_dynamic_quant_asymmetric(x, smooth_scales=smooth_scales)
print("smooth", ys.dtype, tuple(ys.shape))

# MoE: one smooth row per expert, group_index = cumulative row ends (12 rows in all)
moe_smooth = torch.rand(3, 32, dtype=torch.float16, device='npu') + 0.5
group_index = torch.tensor([5, 5, 12], dtype=torch.int32, device='npu')
ym, scales_m, offsets_m = torch_npu.npu_dynamic_quant_asymmetric(x, smooth_scales=moe_smooth,
                                                                 group_index=group_index)
print("moe", ym.dtype, tuple(ym.shape))

# per tensor
yt, scale_t, offset_t = torch_npu.npu_dynamic_quant_asymmetric(x, quant_mode="pertensor")
print("pertensor", tuple(scale_t.shape))
