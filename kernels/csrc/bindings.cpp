// The CPU kernels' Python module (kernels/cpu_native.py builds it): one extension for
// cpu_dense_linear.cpp (fp32 decode matmuls), cpu_lora.cpp (LoRA deltas), cpu_quant_linear.cpp (int8 / int4 weights x
// fp32) and cpu_decoder_ops.cpp (the fused element-wise ops and decode attention).
#include <torch/extension.h>

torch::Tensor f32_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias);
torch::Tensor bf16_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias);
bool f32_linear_supported();
torch::Tensor w8_linear(torch::Tensor x, torch::Tensor q, torch::Tensor s, c10::optional<torch::Tensor> bias);
torch::Tensor w4_linear(torch::Tensor x, torch::Tensor q4, torch::Tensor s, torch::Tensor z, int64_t group,
                        c10::optional<torch::Tensor> bias);
torch::Tensor rms_norm(torch::Tensor x, c10::optional<torch::Tensor> residual, torch::Tensor w, double eps);
void rope_write_kv(torch::Tensor qkv, torch::Tensor table, torch::Tensor positions, int64_t H, int64_t Hkv,
                   int64_t D, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor slots);
torch::Tensor silu_mul(torch::Tensor gu);
torch::Tensor decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                               torch::Tensor block_tables, torch::Tensor seq_lens, double scale, int64_t window);

void lora_add(torch::Tensor y, torch::Tensor x, torch::Tensor a, std::vector<torch::Tensor> b_blocks,
              torch::Tensor block_starts, torch::Tensor ranks, int64_t R, torch::Tensor order, torch::Tensor segs);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("f32_linear", &f32_linear, "fp32 linear for decode rows, row-major weights");
  m.def("bf16_linear", &bf16_linear, "fp32 x bf16-stored weights (widened exactly), decode rows");
  m.def("f32_linear_supported", &f32_linear_supported, "whether this CPU runs f32_linear (AVX-512)");
  m.def("w8_linear", &w8_linear, "int8 weights (interleaved) x fp32 activations, exact");
  m.def("w4_linear", &w4_linear, "int4 weights (split, interleaved) x fp32 activations, exact");
  m.def("rms_norm", &rms_norm, "x += residual in place; RMSNorm(x) * w");
  m.def("rope_write_kv", &rope_write_kv, "RoPE on q|k in place in the qkv rows, k and v into their slots");
  m.def("silu_mul", &silu_mul, "silu(gate) * up of the fused gate|up rows");
  m.def("lora_add", &lora_add, "LoRA deltas of a mixed-adapter step onto y, in place (CPU block layout)");
  m.def("decode_attention", &decode_attention, "one query per sequence over its paged context, in place");
}
