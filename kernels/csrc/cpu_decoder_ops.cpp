// The CPU forward's fused element-wise kernels and its decode attention, fp32 only
// (kernels/cpu_ops.py routes other dtypes, and 8-bit KV caches, to the torch ops).
//
// Each replaces a chain of small torch ops with one call: inside a forward the weights
// streaming through the caches evict the small ops' data and code, so a chain of ten ops
// over a 576-wide row costs far more there than its arithmetic. The math is the
// references' (kernels/rmsnorm.py, rotary.py, kv_write.py, activation.py, attention.py),
// built with -ffp-contract=off so that a * b - c * d rounds as torch rounds it (sums are
// vectorized, so their order is not torch's: the results differ from the references by
// rounding, as any two kernels' sums do):
//
//   rms_norm(x, residual?, w, eps)   x += residual (in place: the new residual stream),
//                                    returns (x * rsqrt(mean(x^2) + eps)) * w
//   rope_write_kv(qkv, table, positions, H, Hkv, D, k_cache, v_cache, slots)
//       rotates q and k in place in the fused qkv rows ([T, (H + 2 Hkv) D]; x1' = x1 cos -
//       x2 sin, x2' = x2 cos + x1 sin, cos|sin rows of table [max_pos, D] at positions) and
//       writes k and v into the caches' slots (a negative slot writes nothing)
//   silu_mul(gu)                     [T, 2I] -> silu(gate) * up  [T, I]
//   decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, window)
//       one query per sequence ([B, H, D]) over its paged context, read in place through
//       the block table (no gather); grouped heads share each key read; a sliding window
//       (> 0) keeps keys pos - W + 1 .. pos; seq_len 0 (padding) gives zeros.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <vector>

namespace {

bool has_avx512f() {
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
}

// exp on 16 lanes: n = round(x log2 e), r = x - n ln 2 (two-part ln 2), exp(r) by its
// degree-7 Taylor polynomial (|r| <= ln2 / 2: relative error < 2e-7, about 1 ulp), scaled
// by 2^n; inputs below -87 give 0 (softmax's masked and far-below-max scores)
__attribute__((target("avx512f,fma")))
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.f / 5040.f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// silu(g) * u over one row of I values (I a multiple of 16 on the AVX-512 path)
__attribute__((target("avx512f,fma")))
void silu_mul_row16(const float* g, const float* u, float* o, int64_t I) {
  const __m512 one = _mm512_set1_ps(1.f);
  for (int64_t i = 0; i < I; i += 16) {
    const __m512 gv = _mm512_loadu_ps(g + i);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
    _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, e)), _mm512_loadu_ps(u + i)));
  }
}

// p[j] = exp(s[j] - mx) in place over n scores; returns their sum
__attribute__((target("avx512f,fma")))
float exp_sum16(float* s, int64_t n, float mx) {
  const __m512 m = _mm512_set1_ps(mx);
  __m512 acc = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), m));
    _mm512_storeu_ps(s + j, e);
    acc = _mm512_add_ps(acc, e);
  }
  float sum = _mm512_reduce_add_ps(acc);
  for (; j < n; ++j) { s[j] = std::exp(s[j] - mx); sum += s[j]; }
  return sum;
}

void check_f32(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat32, what, " must be an fp32 CPU tensor");
}

}  // namespace

torch::Tensor rms_norm(torch::Tensor x, c10::optional<torch::Tensor> residual, torch::Tensor w, double eps) {
  check_f32(x, "rms_norm: x");
  check_f32(w, "rms_norm: weight");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && w.is_contiguous(), "rms_norm: x [T, D] rows, contiguous weight");
  const int64_t T = x.size(0), D = x.size(1), ld = x.stride(0);
  float* xp = x.data_ptr<float>();
  const float* rp = nullptr;
  int64_t ldr = 0;
  if (residual.has_value()) {
    check_f32(*residual, "rms_norm: residual");
    TORCH_CHECK(residual->dim() == 2 && residual->stride(1) == 1 && residual->size(0) == T, "rms_norm: residual [T, D]");
    rp = residual->data_ptr<float>();
    ldr = residual->stride(0);
  }
  const float* wp = w.data_ptr<float>();
  auto out = torch::empty({T, D}, x.options());
  float* op = out.data_ptr<float>();
  const float fe = float(eps);
  at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* xr = xp + t * ld;
      if (rp)
        for (int64_t i = 0; i < D; ++i) xr[i] += rp[t * ldr + i];
      float ss = 0.f;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < D; ++i) ss += xr[i] * xr[i];
      const float r = 1.f / std::sqrt(ss / float(D) + fe);
      float* orow = op + t * D;
      for (int64_t i = 0; i < D; ++i) orow[i] = (xr[i] * r) * wp[i];
    }
  });
  return out;
}

void rope_write_kv(torch::Tensor qkv, torch::Tensor table, torch::Tensor positions, int64_t H, int64_t Hkv,
                   int64_t D, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor slots) {
  check_f32(qkv, "rope_write_kv: qkv");
  check_f32(table, "rope_write_kv: cos/sin table");
  check_f32(k_cache, "rope_write_kv: k_cache");
  check_f32(v_cache, "rope_write_kv: v_cache");
  TORCH_CHECK(qkv.dim() == 2 && qkv.stride(1) == 1 && qkv.size(1) == (H + 2 * Hkv) * D, "rope_write_kv: qkv [T, (H + 2 Hkv) D]");
  TORCH_CHECK(table.is_contiguous() && table.size(1) == D && k_cache.is_contiguous() && v_cache.is_contiguous()
              && k_cache.size(2) == Hkv && k_cache.size(3) == D, "rope_write_kv: table [P, D], caches [NB, bs, Hkv, D]");
  TORCH_CHECK(positions.scalar_type() == torch::kInt64 && slots.scalar_type() == torch::kInt64
              && positions.is_contiguous() && slots.is_contiguous(), "rope_write_kv: int64 positions and slots");
  const int64_t T = qkv.size(0), ld = qkv.stride(0), half = D / 2, P = table.size(0);
  const int64_t cache_rows = k_cache.size(0) * k_cache.size(1);
  float* xp = qkv.data_ptr<float>();
  const float* tp = table.data_ptr<float>();
  const int64_t* pp = positions.data_ptr<int64_t>();
  const int64_t* sp = slots.data_ptr<int64_t>();
  float* kc = k_cache.data_ptr<float>();
  float* vc = v_cache.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(pp[t] >= 0 && pp[t] < P && sp[t] < cache_rows, "rope_write_kv: position or slot out of range");
  at::parallel_for(0, T, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* row = xp + t * ld;
      const float* cs = tp + pp[t] * D;
      for (int64_t h = 0; h < H + Hkv; ++h) {
        float* x = row + h * D;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = x[i], x2 = x[i + half], c = cs[i], s = cs[i + half];
          x[i] = x1 * c - x2 * s;
          x[i + half] = x2 * c + x1 * s;
        }
      }
      if (sp[t] >= 0) {
        std::memcpy(kc + sp[t] * Hkv * D, row + H * D, sizeof(float) * Hkv * D);
        std::memcpy(vc + sp[t] * Hkv * D, row + (H + Hkv) * D, sizeof(float) * Hkv * D);
      }
    }
  });
}

torch::Tensor silu_mul(torch::Tensor gu) {
  check_f32(gu, "silu_mul: x");
  TORCH_CHECK(gu.dim() == 2 && gu.stride(1) == 1 && gu.size(1) % 2 == 0, "silu_mul: x [T, 2I]");
  const int64_t T = gu.size(0), I = gu.size(1) / 2, ld = gu.stride(0);
  auto out = torch::empty({T, I}, gu.options());
  const float* xp = gu.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const bool v = has_avx512f() && I % 16 == 0;
  at::parallel_for(0, T, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      if (v) {
        silu_mul_row16(xp + t * ld, xp + t * ld + I, op + t * I, I);
        continue;
      }
      for (int64_t i = 0; i < I; ++i) {
        const float g = xp[t * ld + i];
        op[t * I + i] = (g / (1.f + std::exp(-g))) * xp[t * ld + I + i];
      }
    }
  });
  return out;
}

torch::Tensor decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                               torch::Tensor block_tables, torch::Tensor seq_lens, double scale, int64_t window) {
  check_f32(q, "decode_attention: q");
  check_f32(k_cache, "decode_attention: k_cache");
  check_f32(v_cache, "decode_attention: v_cache");
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "decode_attention: q [B, H, D] rows");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "decode_attention: contiguous caches");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 && seq_lens.scalar_type() == torch::kInt32
              && seq_lens.is_contiguous() && block_tables.stride(1) == 1, "decode_attention: int32 tables and lengths");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t bs = k_cache.size(1), Hkv = k_cache.size(2), NB = k_cache.size(0);
  TORCH_CHECK(H % Hkv == 0 && k_cache.size(3) == D, "decode_attention: heads / head dim mismatch");
  const int64_t G = H / Hkv, ldb = block_tables.stride(0), M = block_tables.size(1);
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  const int32_t* bt = block_tables.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(lens[b] >= 0 && (lens[b] + bs - 1) / bs <= M, "decode_attention: seq_len beyond the block table");
  auto out = torch::empty({B, H, D}, q.options());
  float* op = out.data_ptr<float>();
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1);
  const float sc = float(scale);
  const bool v = has_avx512f();
  at::parallel_for(0, B * Hkv, 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> scores;
    std::vector<float> acc(G * D);
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / Hkv, g = w % Hkv;
      const int64_t L = lens[b];
      float* o = op + b * H * D + g * G * D;
      if (L == 0) {
        std::fill(o, o + G * D, 0.f);
        continue;
      }
      const int64_t lo = window > 0 ? std::max<int64_t>(0, L - window) : 0, n = L - lo;
      scores.resize(G * n);
      const float* qb = qp + b * qs0 + g * G * qs1;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t pos = lo + j, blk = bt[b * ldb + pos / bs];
        TORCH_CHECK(blk >= 0 && blk < NB, "decode_attention: block id out of range");
        const float* kr = kp + ((blk * bs + pos % bs) * Hkv + g) * D;
        for (int64_t h = 0; h < G; ++h) {
          const float* qh = qb + h * qs1;
          float s = 0.f;
#pragma omp simd reduction(+ : s)
          for (int64_t d = 0; d < D; ++d) s += qh[d] * kr[d];
          scores[h * n + j] = s * sc;
        }
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t h = 0; h < G; ++h) {
        float* sh = scores.data() + h * n;
        float mx = sh[0];
        for (int64_t j = 1; j < n; ++j) mx = std::max(mx, sh[j]);
        float sum = 0.f;
        if (v)
          sum = exp_sum16(sh, n, mx);
        else
          for (int64_t j = 0; j < n; ++j) { sh[j] = std::exp(sh[j] - mx); sum += sh[j]; }
        const float inv = 1.f / sum;
        for (int64_t j = 0; j < n; ++j) sh[j] *= inv;
      }
      for (int64_t j = 0; j < n; ++j) {
        const int64_t pos = lo + j, blk = bt[b * ldb + pos / bs];
        const float* vr = vp + ((blk * bs + pos % bs) * Hkv + g) * D;
        for (int64_t h = 0; h < G; ++h) {
          const float p = scores[h * n + j];
          float* ah = acc.data() + h * D;
          for (int64_t d = 0; d < D; ++d) ah[d] += p * vr[d];
        }
      }
      std::copy(acc.begin(), acc.end(), o);
    }
  });
  return out;
}
