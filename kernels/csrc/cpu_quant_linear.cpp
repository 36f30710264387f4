// Weight-only int8 / int4 linear layers on the CPU with fp32 activations, exact math:
// the weights are widened to fp32 in registers (no dequantized copy in memory), so a
// decode step reads 1 (w8) or ~0.6 (w4) bytes per weight instead of fp32's 4.
//
//   w8_linear(x [M, K] f32, q [N, K] int8, s [N] f32, bias?)   y = s[n] * sum_k x[m, k] q[n, k]
//   w4_linear(x [M, K] f32, q4 [N, K/2] uint8 (split layout below), s [N, G] fp16,
//             z [N, G] uint8 (the stored scales and zeros), group, bias?)
//       y = sum_g s[n, g] * sum_{k in g} x[m, k] (q[n, k] - z[n, g])
//         = sum_k x[m, k] (q[n, k] - z[n, g]) s[n, g]      (kernels/quant.py's W, reassociated)
//
// int4 split layout (made by kernels/cpu_quant.py from the stored one): each run of 32
// values along K is 16 bytes, byte i holding k = 32c + i in its low nibble and 32c + 16 + i
// in its high one, so one 16-byte load widens into two vectors of 16 consecutive k.
// K must be a multiple of 32 and the group size a multiple of 32 (the last group may be
// shorter). Output rows are split over torch's intra-op threads (at::parallel_for: it
// honours torch.set_num_threads). The AVX-512 kernels are chosen at run time; elsewhere
// the scalar loops compute the same sums.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

namespace {

constexpr int NB = 4;                // weight rows per tile, interleaved in memory (below)
// Prefetch distances in the weight stream, bytes: into L1 a few lines ahead, into L2 a
// few pages ahead. NOTE: with the hardware prefetcher alone a lone row's int8 GEMV read
// its weights at ~6 GB/s where a plain read of the same stream runs at ~13 (one core);
// these distances gave ~11 (docs/benchmarks.md).
constexpr int64_t PREFETCH_L1 = 512, PREFETCH_L2 = 4096;

bool has_avx512() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return ok;
}

// One tile: MB activation rows x NB weight rows, MB * NB independent accumulators (a lone
// row's GEMV keeps NB chains of FMAs in flight instead of one).
template <int MB>
__attribute__((target("avx512f,avx512bw,fma")))
void w8_tile(const float* x, const int8_t* q, const float* s, float* y, int64_t N, int64_t K) {
  __m512 acc[MB][NB];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    __m512 w[NB];
    const int8_t* qk = q + k * NB;  // NB rows x 16 values: one cache line
    _mm_prefetch((const char*)(qk + PREFETCH_L1), _MM_HINT_T0);
    _mm_prefetch((const char*)(qk + PREFETCH_L2), _MM_HINT_T1);
    for (int j = 0; j < NB; ++j)
      w[j] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(qk + j * 16))));
    for (int i = 0; i < MB; ++i) {
      const __m512 xv = _mm512_loadu_ps(x + i * K + k);
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_fmadd_ps(w[j], xv, acc[i][j]);
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) y[i * N + j] = _mm512_reduce_add_ps(acc[i][j]) * s[j];
}

// The w4 tile: per group, the zero point is subtracted from the nibbles in integers (exact),
// the products summed, and the group's sum scaled into the totals: sum_g s_g sum_k x (q - z).
template <int MB>
__attribute__((target("avx512f,avx512bw,fma,f16c")))
void w4_tile(const float* x, const uint8_t* q, const at::Half* s, const uint8_t* z, float* y,
             int64_t N, int64_t K, int64_t G, int64_t group) {
  const __m128i low = _mm_set1_epi8(0x0F);
  __m512 tot[MB][NB];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) tot[i][j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const int64_t k0 = g * group, k1 = std::min(K, k0 + group);
    __m512i zv[NB];
    for (int j = 0; j < NB; ++j) zv[j] = _mm512_set1_epi32(z[j * G + g]);
    __m512 acc[MB][NB];
    for (int i = 0; i < MB; ++i)
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
    for (int64_t k = k0; k < k1; k += 32) {
      __m512 wl[NB], wh[NB];
      const uint8_t* qk = q + (k / 2) * NB;  // NB rows x 32 values: one cache line
      _mm_prefetch((const char*)(qk + PREFETCH_L1), _MM_HINT_T0);
      _mm_prefetch((const char*)(qk + PREFETCH_L2), _MM_HINT_T1);
      for (int j = 0; j < NB; ++j) {
        const __m128i b = _mm_loadu_si128((const __m128i*)(qk + j * 16));
        const __m512i lo = _mm512_cvtepu8_epi32(_mm_and_si128(b, low));
        const __m512i hi = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), low));
        wl[j] = _mm512_cvtepi32_ps(_mm512_sub_epi32(lo, zv[j]));
        wh[j] = _mm512_cvtepi32_ps(_mm512_sub_epi32(hi, zv[j]));
      }
      for (int i = 0; i < MB; ++i) {
        const __m512 xl = _mm512_loadu_ps(x + i * K + k), xh = _mm512_loadu_ps(x + i * K + k + 16);
        for (int j = 0; j < NB; ++j) {
          acc[i][j] = _mm512_fmadd_ps(wl[j], xl, acc[i][j]);
          acc[i][j] = _mm512_fmadd_ps(wh[j], xh, acc[i][j]);
        }
      }
    }
    for (int j = 0; j < NB; ++j) {
      const __m512 sg = _mm512_set1_ps(_cvtsh_ss(s[j * G + g].x));
      for (int i = 0; i < MB; ++i) tot[i][j] = _mm512_fmadd_ps(acc[i][j], sg, tot[i][j]);
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) y[i * N + j] = _mm512_reduce_add_ps(tot[i][j]);
}

// Rows n0..n1 (multiples of NB) of the output for every activation row: each tile of NB
// weight rows is read once (from memory) and reused from L1 by tiles of MB activation rows,
// MB = 4 while that many are left, then 2, then 1.
template <typename Tile>
void sweep(int64_t M, int64_t n0, int64_t n1, Tile tile) {
  for (int64_t n = n0; n < n1; n += NB) {
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) tile(std::integral_constant<int, 4>(), m, n);
    for (; m + 2 <= M; m += 2) tile(std::integral_constant<int, 2>(), m, n);
    for (; m < M; ++m) tile(std::integral_constant<int, 1>(), m, n);
  }
}

void w8_rows_scalar(const float* x, const int8_t* q, const float* s, float* y, int64_t M, int64_t N,
                    int64_t K, int64_t n0, int64_t n1) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      float acc = 0.f;
      for (int64_t k = 0; k < K; ++k) acc += x[m * K + k] * float(q[(n / NB) * NB * K + (k / 16) * NB * 16 + (n % NB) * 16 + k % 16]);
      y[m * N + n] = acc * s[n];
    }
}

void w4_rows_scalar(const float* x, const uint8_t* q, const at::Half* s, const uint8_t* z, float* y,
                    int64_t M, int64_t N, int64_t K, int64_t G, int64_t group, int64_t n0, int64_t n1) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* qr = q + (n / NB) * NB * (K / 2) + (n % NB) * 16;
      float tot = 0.f;
      for (int64_t g = 0; g < G; ++g) {
        const int64_t k0 = g * group, k1 = std::min(K, k0 + group);
        float acc = 0.f;
        for (int64_t k = k0; k < k1; ++k) {
          const int64_t c = k / 32, i = k % 32;
          const uint8_t b = qr[c * NB * 16 + (i % 16)];
          acc += x[m * K + k] * float(int(i < 16 ? (b & 0x0F) : (b >> 4)) - int(z[n * G + g]));
        }
        tot += acc * float(s[n * G + g]);
      }
      y[m * N + n] = tot;
    }
}

void check(const torch::Tensor& x, const torch::Tensor& q, int64_t K) {
  TORCH_CHECK(x.device().is_cpu() && q.device().is_cpu(), "cpu_quant_linear: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.dim() == 2 && x.is_contiguous(),
              "cpu_quant_linear: x must be contiguous fp32 [M, K]");
  TORCH_CHECK(K % 32 == 0, "cpu_quant_linear: K must be a multiple of 32, got ", K);
  TORCH_CHECK(q.size(0) % NB == 0, "cpu_quant_linear: N must be a multiple of ", NB, ", got ", q.size(0));
}

torch::Tensor finish(torch::Tensor y, const c10::optional<torch::Tensor>& bias) {
  return bias.has_value() ? y.add_(*bias) : y;
}

int64_t grain(int64_t N) {
  // output rows per task, enough to amortise the fork (at::parallel_for splits [0, N/NB))
  return std::max<int64_t>(4, N / NB / (4 * at::get_num_threads()));
}

}  // namespace

torch::Tensor w8_linear(torch::Tensor x, torch::Tensor q, torch::Tensor s, c10::optional<torch::Tensor> bias) {
  const int64_t M = x.size(0), K = x.size(1), N = q.size(0);
  check(x, q, K);
  TORCH_CHECK(q.scalar_type() == torch::kInt8 && q.is_contiguous() && q.size(1) == K, "w8_linear: q [N, K] int8");
  TORCH_CHECK(s.scalar_type() == torch::kFloat32 && s.numel() == N, "w8_linear: s [N] fp32");
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const int8_t* qp = q.data_ptr<int8_t>();
  const float* sp = s.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const bool v = has_avx512();
  at::parallel_for(0, N / NB, grain(N), [&](int64_t b0, int64_t b1) {
    const int64_t n0 = b0 * NB, n1 = b1 * NB;
    if (!v) return w8_rows_scalar(xp, qp, sp, yp, M, N, K, n0, n1);
    sweep(M, n0, n1, [&](auto mb, int64_t m, int64_t n) {
      w8_tile<decltype(mb)::value>(xp + m * K, qp + n * K, sp + n, yp + m * N + n, N, K);
    });
  });
  return finish(y, bias);
}

torch::Tensor w4_linear(torch::Tensor x, torch::Tensor q4, torch::Tensor s, torch::Tensor z, int64_t group,
                        c10::optional<torch::Tensor> bias) {
  const int64_t M = x.size(0), K = x.size(1), N = q4.size(0), G = s.size(1);
  check(x, q4, K);
  TORCH_CHECK(group % 32 == 0, "w4_linear: the group size must be a multiple of 32, got ", group);
  TORCH_CHECK(q4.scalar_type() == torch::kUInt8 && q4.is_contiguous() && q4.size(1) * 2 == K,
              "w4_linear: q4 [N, K/2] uint8");
  TORCH_CHECK(G == (K + group - 1) / group && s.size(0) == N && z.sizes() == s.sizes()
              && s.scalar_type() == torch::kFloat16 && z.scalar_type() == torch::kUInt8
              && s.is_contiguous() && z.is_contiguous(), "w4_linear: scales fp16 and zeros uint8 [N, G]");
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const uint8_t* qp = q4.data_ptr<uint8_t>();
  const at::Half* sp = s.data_ptr<at::Half>();
  const uint8_t* zp = z.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  const bool v = has_avx512() && __builtin_cpu_supports("f16c");
  at::parallel_for(0, N / NB, grain(N), [&](int64_t b0, int64_t b1) {
    const int64_t n0 = b0 * NB, n1 = b1 * NB;
    if (!v) return w4_rows_scalar(xp, qp, sp, zp, yp, M, N, K, G, group, n0, n1);
    sweep(M, n0, n1, [&](auto mb, int64_t m, int64_t n) {
      w4_tile<decltype(mb)::value>(xp + m * K, qp + n * (K / 2), sp + n * G, zp + n * G, yp + m * N + n,
                                   N, K, G, group);
    });
  });
  return finish(y, bias);
}
