# An Ascend-style quantized inference step: a linear layer with int8 weights (static, per output channel,
# torch_npu.npu_quantize) and int8 activations (dynamic, per token, torch_npu.npu_dynamic_quant), an int8
# matmul with int32 accumulation, then the float rescale; and the weight-only paths that dequantize int8
# and packed-int4 weights with torch_npu.npu_anti_quant. Written for the NPU; runs unchanged under
# `python -m xquant.compat`.
import torch
import torch_npu

torch.manual_seed(0)
device = torch.device("npu:0")
torch.npu.set_device(device)


class W8A8Linear(torch.nn.Module):
    def __init__(self, weight: torch.Tensor):
        super().__init__()
        out_features = weight.shape[0]
        w_scale = weight.abs().amax(dim=1).clamp(min=1e-8) / 127           # [out]
        self.register_buffer("w_scale", w_scale.float())
        self.register_buffer("w_int8", torch_npu.npu_quantize(weight, self.w_scale, None, torch.qint8, axis=0,
                                                              div_mode=True))  # [out, in] int8
        self.out_features = out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x_int8, x_scale = torch_npu.npu_dynamic_quant(x.reshape(-1, shape[-1]))  # per token
        acc = torch._int_mm(x_int8, self.w_int8.t())                           # int32 [tokens, out]
        y = acc.float() * x_scale.unsqueeze(1) * self.w_scale.unsqueeze(0)
        return y.to(x.dtype).reshape(*shape[:-1], self.out_features)


hidden, out_features, tokens = 256, 128, 64
weight = torch.randn(out_features, hidden, device=device) / hidden ** 0.5
x = torch.randn(2, tokens // 2, hidden, device=device).half()

layer = W8A8Linear(weight).npu().eval()
with torch.no_grad():
    y_w8a8 = layer(x)
    y_ref = (x.float() @ weight.t()).half()
rel_w8a8 = ((y_w8a8.float() - y_ref.float()).norm() / y_ref.float().norm()).item()
print(f"w8a8 linear: out {tuple(y_w8a8.shape)} {y_w8a8.dtype}, relative error vs float {rel_w8a8:.4f}")

# Weight-only int8 (W8A16): weights stored [in, out] with an asymmetric per-output-channel offset,
# dequantized to float16 before a float16-accumulating matmul (in float32 here).
w_t = weight.t().contiguous()                                                # [in, out]
w_min, w_max = w_t.amin(dim=0), w_t.amax(dim=0)
a_scale = ((w_max - w_min) / 255).float()
a_offset = torch.round(-128 - w_min / a_scale).float()                       # zero point as a float
w_q = torch_npu.npu_quantize(w_t, 1 / a_scale, a_offset, torch.qint8, axis=-1, div_mode=False)
w_deq = torch_npu.npu_anti_quant(w_q, a_scale, offset=-a_offset, dst_dtype=torch.float16)
y_w8a16 = (x.float() @ w_deq.float()).half()
rel_w8a16 = ((y_w8a16.float() - y_ref.float()).norm() / y_ref.float().norm()).item()
print(f"w8a16 linear: relative error vs float {rel_w8a16:.4f}")

# Weight-only int4 (W4A16): symmetric per output channel, eight int4 packed per int32.
s4 = (w_t.abs().amax(dim=0) / 7).float()
w_q4 = torch_npu.npu_quantize(w_t, 1 / s4, torch.zeros_like(s4), torch.quint4x2, axis=-1, div_mode=False)
w_deq4 = torch_npu.npu_anti_quant(w_q4, s4, dst_dtype=torch.bfloat16)         # src int32 -> quint4x2
y_w4a16 = (x.float() @ w_deq4.float()).half()
rel_w4a16 = ((y_w4a16.float() - y_ref.float()).norm() / y_ref.float().norm()).item()
print(f"w4a16 linear: packed {tuple(w_q4.shape)} {w_q4.dtype}, relative error vs float {rel_w4a16:.4f}")
torch.npu.synchronize()
