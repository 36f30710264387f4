// fp32 x fp32 linear for decode rows: f32_linear(x [M, K], w [N, K], bias?) -> [M, N];
// w may be bf16 too (bf16_linear): widened to fp32 in registers, exactly, so a bf16-stored
// weight (a quantized folder's LM head) is read at half the bytes for the same products.
//
// A decode step's matmuls read each weight once, so they run at the speed the weights
// stream from memory. MKL's sgemv reaches ~13 GB/s on one core here; these tiles (4 weight
// rows x up to 4 activation rows, each weight row's next lines prefetched) match it for one
// row and beat MKL / oneDNN for 2-64 rows, each tile of weight rows read once and reused
// from L1 for every 4 activation rows (numbers in docs/benchmarks.md). The weights stay in
// their row-major layout (the one MKL's GEMM takes for prefill). Sums are vectorized (16
// lanes, then reduced): rounding differs from MKL's as any two kernels' do.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

namespace {

// bytes ahead along each weight row: into L1, and further into L2 (as the int8 kernels)
constexpr int64_t PREFETCH_L1 = 1024, PREFETCH_L2 = 4096;

bool has_avx512f() {
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
}

__attribute__((target("avx512f")))
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

__attribute__((target("avx512f")))
inline __m512 load16(const at::BFloat16* p) {  // bf16 -> fp32: the 16 bits on top, exact
  const __m256i h = _mm256_loadu_si256((const __m256i*)p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <int MB, int NB, typename W>
__attribute__((target("avx512f,fma")))
void f32_tile(const float* x, const W* w, float* y, int64_t N, int64_t K) {
  __m512 acc[MB][NB];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    __m512 wv[NB];
    for (int j = 0; j < NB; ++j) {
      _mm_prefetch((const char*)(w + j * K + k) + PREFETCH_L1, _MM_HINT_T0);
      _mm_prefetch((const char*)(w + j * K + k) + PREFETCH_L2, _MM_HINT_T1);
      wv[j] = load16(w + j * K + k);
    }
    for (int i = 0; i < MB; ++i) {
      const __m512 xv = _mm512_loadu_ps(x + i * K + k);
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_fmadd_ps(wv[j], xv, acc[i][j]);
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) y[i * N + j] = _mm512_reduce_add_ps(acc[i][j]);
}

// every activation row against weight rows n0..n1: each tile of 4 weight rows is read once
// (from memory) and kept in L1 for every tile of up to 4 activation rows
template <typename W>
void f32_all_rows(const float* x, const W* w, float* y, int64_t M, int64_t N, int64_t K, int64_t n0, int64_t n1) {
  auto rows = [&](auto nb, int64_t n) {
    constexpr int NB = decltype(nb)::value;
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) f32_tile<4, NB>(x + m * K, w + n * K, y + m * N + n, N, K);
    switch (M - m) {
      case 1: f32_tile<1, NB>(x + m * K, w + n * K, y + m * N + n, N, K); break;
      case 2: f32_tile<2, NB>(x + m * K, w + n * K, y + m * N + n, N, K); break;
      case 3: f32_tile<3, NB>(x + m * K, w + n * K, y + m * N + n, N, K); break;
      default: break;
    }
  };
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) rows(std::integral_constant<int, 4>(), n);
  for (; n < n1; ++n) rows(std::integral_constant<int, 1>(), n);
}

template <typename W>
torch::Tensor linear_rows(const torch::Tensor& x, const torch::Tensor& w, const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(has_avx512f(), "f32_linear: needs AVX-512 (callers check f32_linear_supported)");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.dim() == 2 && x.is_contiguous() && w.is_contiguous()
              && x.device().is_cpu() && w.device().is_cpu(), "f32_linear: contiguous fp32 CPU x, contiguous w");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(w.size(1) == K && K % 16 == 0, "f32_linear: w [N, K], K % 16 == 0");
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const W* wp = w.data_ptr<W>();
  float* yp = y.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(16, N / (4 * at::get_num_threads()));
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) { f32_all_rows(xp, wp, yp, M, N, K, n0, n1); });
  return bias.has_value() ? y.add_(*bias) : y;
}

}  // namespace

torch::Tensor f32_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(w.scalar_type() == torch::kFloat32, "f32_linear: fp32 weights");
  return linear_rows<float>(x, w, bias);
}

torch::Tensor bf16_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(w.scalar_type() == torch::kBFloat16, "bf16_linear: bf16 weights");
  return linear_rows<at::BFloat16>(x, w, bias);
}

bool f32_linear_supported() { return has_avx512f(); }
