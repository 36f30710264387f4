// LoRA deltas of a step that mixes adapters, on the CPU, in one call per projection:
//
//   lora_add(y [T, N], x [T, K], a [S, CA, K], b_blocks, block_starts, ranks, R, order, segs)
//
// The layout is engine/lora/slots.py's CPU one: the projection's output rows are cut into
// blocks (q | k | v of a fused qkv; gate | up; one block otherwise), block j owns A's columns
// [j R, j R + R) and its B is b_blocks[j] [S, R, rows of block j]; ranks [blocks, S] int32
// holds each slot's rank in each block (0: not adapted). `order` [M] lists the token rows
// that use an adapter, grouped by slot; segs [G, 3] int64 is (slot, first, end) of each group
// in `order`. For each group's token t and each block j with rank r > 0:
//
//   y[t, block j rows] += (x[t] . a[slot, jR + c] for c < r) @ b_blocks[j][slot, :r]
//
// Two passes, each split over torch's intra-op threads: the shrink (each group's rows
// against its slot's used A rows, 4 A rows x up to 4 tokens a tile, as f32_linear's tiles),
// then the expand in 16-wide column chunks of y (each chunk owned by one thread: no two
// threads write one element), the broadcast-multiply-add of the shrunk values onto B's rows.
// Every adapter's weights are read once a step whatever the number of its tokens, and the
// Python side makes one call per projection (the torch ops took ~20 calls per projection
// and their small-matrix overheads: benchmarks/lora.py). Needs AVX-512, K and every block's
// rows multiples of 16 (kernels/lora.py checks, and uses its torch path otherwise).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <vector>

namespace {

bool has_avx512f() {
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
}

// xa[i][c] = x_i . a_c for up to 4 token rows (pointers) and NB (1 or 4) A rows
template <int MB, int NB>
__attribute__((target("avx512f,fma")))
void shrink_tile(const float* const* xr, const float* a, int64_t K, float* const* out) {
  __m512 acc[MB][NB];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    __m512 av[NB];
    for (int j = 0; j < NB; ++j) av[j] = _mm512_loadu_ps(a + j * K + k);
    for (int i = 0; i < MB; ++i) {
      const __m512 xv = _mm512_loadu_ps(xr[i] + k);
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_fmadd_ps(av[j], xv, acc[i][j]);
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) out[i][j] = _mm512_reduce_add_ps(acc[i][j]);
}

template <int NB>
void shrink_rows(const float* const* xr, int64_t m, const float* a, int64_t K, float* const* out) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) shrink_tile<4, NB>(xr + i, a, K, out + i);
  switch (m - i) {
    case 1: shrink_tile<1, NB>(xr + i, a, K, out + i); break;
    case 2: shrink_tile<2, NB>(xr + i, a, K, out + i); break;
    case 3: shrink_tile<3, NB>(xr + i, a, K, out + i); break;
    default: break;
  }
}

// y rows (pointers, at this chunk's first column) += sum_c xa_i[c] * b[c * ldb .. + 16]
template <int MB>
__attribute__((target("avx512f,fma")))
void expand_tile(float* const* yr, const float* const* xa, const float* b, int64_t ldb, int r) {
  __m512 acc[MB];
  for (int i = 0; i < MB; ++i) acc[i] = _mm512_loadu_ps(yr[i]);
  for (int c = 0; c < r; ++c) {
    _mm_prefetch((const char*)(b + c * ldb) + 256, _MM_HINT_T0);  // 4 chunks ahead on this row
    const __m512 bv = _mm512_loadu_ps(b + c * ldb);
    for (int i = 0; i < MB; ++i) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(xa[i][c]), bv, acc[i]);
  }
  for (int i = 0; i < MB; ++i) _mm512_storeu_ps(yr[i], acc[i]);
}

}  // namespace

void lora_add(torch::Tensor y, torch::Tensor x, torch::Tensor a, std::vector<torch::Tensor> b_blocks,
              torch::Tensor block_starts, torch::Tensor ranks, int64_t R, torch::Tensor order, torch::Tensor segs) {
  TORCH_CHECK(has_avx512f(), "lora_add: needs AVX-512 (callers check f32_linear_supported)");
  TORCH_CHECK(y.scalar_type() == torch::kFloat32 && x.scalar_type() == torch::kFloat32 &&
              a.scalar_type() == torch::kFloat32, "lora_add: fp32 y, x, a");
  TORCH_CHECK(y.dim() == 2 && x.dim() == 2 && a.dim() == 3 && y.stride(1) == 1 && x.stride(1) == 1 &&
              a.is_contiguous(), "lora_add: y [T, N] and x [T, K] with unit column stride, a [S, CA, K] contiguous");
  TORCH_CHECK(y.device().is_cpu() && x.device().is_cpu() && a.device().is_cpu() && y.size(0) == x.size(0),
              "lora_add: y and x on the CPU with one row per token");
  const int64_t K = x.size(1), S = a.size(0), CA = a.size(1), N = y.size(1);
  const int64_t nb = static_cast<int64_t>(b_blocks.size());
  TORCH_CHECK(a.size(2) == K && K % 16 == 0, "lora_add: a [S, CA, K] with K % 16 == 0");
  TORCH_CHECK(CA == nb * R, "lora_add: a's columns are blocks x R");
  TORCH_CHECK(block_starts.scalar_type() == torch::kInt64 && block_starts.numel() == nb + 1,
              "lora_add: block_starts int64 [blocks + 1]");
  TORCH_CHECK(ranks.scalar_type() == torch::kInt32 && ranks.is_contiguous() && ranks.size(0) == nb &&
              ranks.size(1) == S, "lora_add: ranks int32 [blocks, S]");
  TORCH_CHECK(order.scalar_type() == torch::kInt64 && segs.scalar_type() == torch::kInt64 &&
              segs.dim() == 2 && segs.size(1) == 3 && order.is_contiguous() && segs.is_contiguous(),
              "lora_add: order int64 [M], segs int64 [G, 3]");
  const int64_t* bs = block_starts.data_ptr<int64_t>();
  TORCH_CHECK(bs[0] == 0 && bs[nb] == N, "lora_add: blocks cover y's columns");
  std::vector<const float*> bp(nb);
  for (int64_t j = 0; j < nb; ++j) {
    const auto& b = b_blocks[j];
    TORCH_CHECK(b.scalar_type() == torch::kFloat32 && b.is_contiguous() && b.dim() == 3 && b.size(0) == S &&
                b.size(1) == R && b.size(2) == bs[j + 1] - bs[j] && b.size(2) % 16 == 0,
                "lora_add: b_blocks[j] fp32 [S, R, rows of block j], rows % 16 == 0");
    bp[j] = b.data_ptr<float>();
  }
  const int32_t* rk = ranks.data_ptr<int32_t>();
  for (int64_t i = 0; i < nb * S; ++i) TORCH_CHECK(0 <= rk[i] && rk[i] <= R, "lora_add: a rank outside 0..R");
  const int64_t* ord = order.data_ptr<int64_t>();
  const int64_t* sg = segs.data_ptr<int64_t>();
  const int64_t G = segs.size(0), M = order.numel();
  for (int64_t g = 0; g < G; ++g)
    TORCH_CHECK(sg[3 * g] >= 0 && sg[3 * g] < S && 0 <= sg[3 * g + 1] && sg[3 * g + 1] <= sg[3 * g + 2] &&
                sg[3 * g + 2] <= M, "lora_add: a segment out of range");
  for (int64_t i = 0; i < M; ++i) TORCH_CHECK(ord[i] >= 0 && ord[i] < x.size(0), "lora_add: a row out of range");
  if (M == 0 || nb == 0) return;

  const float* xp = x.data_ptr<float>();
  const float* ap = a.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t ldx = x.stride(0), ldy = y.stride(0);
  std::vector<float> xa(M * CA, 0.0f);

  // pass 1, the shrink: tasks of (group, 4 A rows) that some block's rank reaches
  const int64_t ct = (CA + 3) / 4;
  at::parallel_for(0, G * ct, 1, [&](int64_t t0, int64_t t1) {
    std::vector<const float*> xr;
    std::vector<float*> out;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t g = t / ct, c0 = (t % ct) * 4, s = sg[3 * g], i0 = sg[3 * g + 1], i1 = sg[3 * g + 2];
      const int64_t m = i1 - i0;
      if (m == 0) continue;
      xr.resize(m);
      out.resize(m);
      for (int64_t i = 0; i < m; ++i) xr[i] = xp + ord[i0 + i] * ldx;
      const int64_t c1 = std::min(c0 + 4, CA);
      bool needed = false;  // columns past a block's rank are never read (A is zero there)
      for (int64_t c = c0; c < c1; ++c) needed |= c % R < rk[(c / R) * S + s];
      if (!needed) continue;
      if (c1 - c0 == 4) {
        for (int64_t i = 0; i < m; ++i) out[i] = xa.data() + (i0 + i) * CA + c0;
        shrink_rows<4>(xr.data(), m, ap + (s * CA + c0) * K, K, out.data());
        continue;
      }
      for (int64_t c = c0; c < c1; ++c) {
        for (int64_t i = 0; i < m; ++i) out[i] = xa.data() + (i0 + i) * CA + c;
        shrink_rows<1>(xr.data(), m, ap + (s * CA + c) * K, K, out.data());
      }
    }
  });

  // pass 2, the expand: 16-column chunks of y, each within one block
  const int64_t chunks = N / 16;
  const int64_t grain = std::max<int64_t>(1, chunks / (4 * at::get_num_threads()));
  at::parallel_for(0, chunks, grain, [&](int64_t q0, int64_t q1) {
    float* yr[4];
    const float* xr[4];
    // slot by slot, then along the chunks: one slot's B rows are read as r streams moving
    // forward together (the hardware prefetcher follows them; the chunks-outer order made
    // r x slots streams and ran at half the bandwidth)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t s = sg[3 * g], i0 = sg[3 * g + 1], i1 = sg[3 * g + 2];
      int64_t j = 0;
      for (int64_t q = q0; q < q1; ++q) {
        const int64_t n = q * 16;
        while (n >= bs[j + 1]) ++j;
        const int64_t rows = bs[j + 1] - bs[j];
        const int r = rk[j * S + s];
        if (r == 0) continue;
        const float* b = bp[j] + s * R * rows + (n - bs[j]);
        for (int64_t i = i0; i < i1; i += 4) {
          const int mb = static_cast<int>(std::min<int64_t>(4, i1 - i));
          for (int u = 0; u < mb; ++u) {
            yr[u] = yp + ord[i + u] * ldy + n;
            xr[u] = xa.data() + (i + u) * CA + j * R;
          }
          switch (mb) {
            case 4: expand_tile<4>(yr, xr, b, rows, r); break;
            case 3: expand_tile<3>(yr, xr, b, rows, r); break;
            case 2: expand_tile<2>(yr, xr, b, rows, r); break;
            default: expand_tile<1>(yr, xr, b, rows, r); break;
          }
        }
      }
    }
  });
}
