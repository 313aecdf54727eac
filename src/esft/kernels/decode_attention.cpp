// The hand-written parts of one decode step on CPU: rotary + KV-cache append + grouped-query attention for a
// batch of rows (decode_attention), the per-layer RMSNorm / residual / SwiGLU glue (rms_norm, add_rms_norm,
// silu_mul; see their comment below), and the lean prefill's rotary embedding of a prompt's q and k (rotary_qkv).
//
// Why by hand: for a one-token query, torch's CPU scaled_dot_product_attention issues small GEMMs per
// (row, kv head) pair, and at 32-128 rows x 30 layers that per-call cost is several times the time needed to
// stream the KV cache once. This loop reads each cached key and value once per (row, kv head), serves all G query
// heads of the group from it, and folds in the rotary embedding and the cache append that would otherwise be ~15
// small torch ops per layer.
//
// Layout: keys are cached transposed within tiles of 64 keys, [R, KV, C/64, D, 64] (dimension-major per tile),
// so q.K^T is a sum of D axpys over contiguous keys, vectorised over keys with no horizontal sums, and each tile
// is one contiguous read; values stay [R, KV, C, D].
//
// Numerics: plain fp32. Each score accumulates its D products in order d = 0..D-1 with fused multiply-adds (the
// weighted sum of values too); the softmax and those sums run in another order than SDPA's, so outputs match
// SDPA to ~1e-6 relative, not bit for bit. The rotary part is bit-identical to `q * cos + rotate_half(q) * sin`
// (compiled with -ffp-contract=off: only the explicit std::fma calls fuse). With a bf16 cache (bf16 rollouts) the
// new key and value are rounded to bf16 (nearest even, as torch rounds) when appended and widened back to fp32
// when read; everything else is the fp32 arithmetic above.
#include <torch/extension.h>

#include <limits>
#include <mutex>
#include <vector>

#include "kernel_common.h"

namespace {

// Software prefetch into L2 of the next (row, kv head) pair's keys or values, a few 64-byte lines per step of the
// current pair's loop. Each pair reads two runs of a few tens of KB, then skips the unused rest of its cache
// capacity: the hardware prefetchers restart on every run (and every 4 KB page), and a lane waited on memory for
// most of the attention time (2-core Xeon with AMX, one thread: 5.1 GB/s of bf16 cache read against 14.7
// streamed; with this, 6.9-7.4; docs/results/bench/amx-xeon-2026-12-07b). Prefetches change no result.
struct Prefetch {
  const char* next = nullptr;
  const char* end = nullptr;
  int64_t per_step = 0;
  void start(const void* from, int64_t bytes, int64_t steps) {
    next = static_cast<const char*>(from);
    end = next + bytes;
    per_step = (bytes / 64 + steps - 1) / steps;
  }
  inline void step() {
    for (int64_t i = 0; i < per_step && next < end; ++i, next += 64) __builtin_prefetch(next, 0, 2);
  }
};

// Register blocks: B keys (scores) or B value dimensions (weighted sum) per pass, times G query heads of
// accumulators: 64 x G <= 4 fills at most 16 AVX-512 registers; larger groups use blocks of 16.

// The float with these bits (memcpy: the portable spelling, which gcc turns into a register move)
inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// e^x, Cephes' expf on x clamped to [-87, 88] (~1 ulp; branch-free so loops vectorise)
inline float exp_clamped(float x) {
  // (two separate clamps and std::floor: the shape gcc vectorises, with -fno-trapping-math)
  float xc = x < -87.f ? -87.f : x;
  xc = xc > 88.f ? 88.f : xc;
  const float n = std::floor(xc * 1.44269504088896341f + 0.5f);
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  const float z = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * z + r + 1.0f;
  return p * bits_to_float(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
}

// exp for x <= 0 (softmax after subtracting the max), -inf included: below -87 it returns 0
inline float exp_nonpositive(float x) { return x < -87.f ? 0.f : exp_clamped(x); }

// Cache elements: fp32, or bf16 (bf16 rollouts: half the bytes to stream per step) held as raw uint16 bits so
// that the loops below vectorise (a bf16 load is a zero-extend and a shift). Arithmetic stays fp32 either way.
inline float bf16_to_float(uint16_t b) { return bits_to_float(static_cast<uint32_t>(b) << 16); }
inline float load(float x) { return x; }
inline float load(uint16_t x) { return bf16_to_float(x); }
inline void store(float* p, float x) { *p = x; }
// round to nearest even, NaN kept quiet: what torch's fp32 -> bf16 conversion does
inline void store(uint16_t* p, float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  *p = std::isnan(x) ? static_cast<uint16_t>(0x7FC0)
                     : static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

template <typename T>
inline void rotate(const T* x, const float* c, const float* s, float* out, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) out[i] = load(x[i]) * c[i] + (-load(x[i + half])) * s[i];
  for (int64_t i = half; i < d; ++i) out[i] = load(x[i]) * c[i] + load(x[i - half]) * s[i];
}

// Keys are cached in tiles of KEY_TILE keys, each tile dimension-major ([D][KEY_TILE]): a block of scores reads
// one contiguous 16 KB tile (D = 64) instead of D short runs KV-capacity apart, which the hardware prefetchers
// follow poorly (the untiled [D][C] layout streamed at ~15 GB/s, the tiled one at ~25).
constexpr int64_t KEY_TILE = 64;

// scores[g][l] = sum_d q[g][d] * key_l[d] for l in [0, used), keys tiled as above; LB divides KEY_TILE
template <int G, int64_t LB, typename T>
void scores_block(const float* q, const T* kt, int64_t D, int64_t used, float* scores, Prefetch& pf) {
  static_assert(KEY_TILE % LB == 0, "register block must divide the key tile");
  for (int64_t l0 = 0; l0 < used; l0 += LB) {
    const int64_t w = std::min(LB, used - l0);
    const T* tile = kt + (l0 / KEY_TILE) * D * KEY_TILE + l0 % KEY_TILE;
    float acc[G][LB] = {};
    if (w == LB) {
      for (int64_t d = 0; d < D; ++d) {
        pf.step();
        const T* row = tile + d * KEY_TILE;
        float k[LB];
#pragma omp simd
        for (int64_t j = 0; j < LB; ++j) k[j] = load(row[j]);
        for (int g = 0; g < G; ++g) {
          const float qd = q[g * D + d];
#pragma omp simd
          for (int64_t j = 0; j < LB; ++j) acc[g][j] = std::fma(qd, k[j], acc[g][j]);
        }
      }
    } else {
      for (int64_t d = 0; d < D; ++d) {
        const T* row = tile + d * KEY_TILE;
        for (int g = 0; g < G; ++g) {
          const float qd = q[g * D + d];
          for (int64_t j = 0; j < w; ++j) acc[g][j] = std::fma(qd, load(row[j]), acc[g][j]);
        }
      }
    }
    for (int g = 0; g < G; ++g)
      for (int64_t j = 0; j < w; ++j) scores[g * used + l0 + j] = acc[g][j];
  }
}

// acc[g][:W] += sum over the attended columns l of p[g][l] * v[l][d0 : d0 + W]. W is a compile-time width and
// the loop has no branch, so the G x W accumulators stay in registers (a masked-column `continue` inside this
// loop made gcc keep them in memory: one load and store per multiply-add, ~4x slower).
template <int G, int64_t W, typename T>
inline void values_block(const float* p, const T* v, int64_t D, int64_t d0, int64_t used, const int64_t* cols,
                         int64_t ncols, float (&acc)[G][W], Prefetch& pf) {
  for (int64_t t = 0; t < ncols; ++t) {
    pf.step();
    const int64_t l = cols ? cols[t] : t;
    const T* row = v + l * D + d0;
    float x[W];
#pragma omp simd
    for (int64_t j = 0; j < W; ++j) x[j] = load(row[j]);
    for (int g = 0; g < G; ++g) {
      const float pl = p[g * used + l];
#pragma omp simd
      for (int64_t j = 0; j < W; ++j) acc[g][j] = std::fma(pl, x[j], acc[g][j]);
    }
  }
}

// out[g][:] = sum_l p[g][l] * v[l][:] / total[g], over columns `cols` (all `used` columns when cols is null:
// masked columns are skipped, never multiplied by their zero weight, so whatever they hold cannot leak)
template <int G, int64_t LB, typename T>
void weighted_values(const float* p, const T* v, int64_t D, int64_t used, const int64_t* cols, int64_t ncols,
                     const float* total, T* out, int64_t out_stride, Prefetch& pf) {
  for (int64_t d0 = 0; d0 < D; d0 += LB) {
    const int64_t w = std::min(LB, D - d0);
    float acc[G][LB] = {};
    if (w == LB) {
      values_block<G, LB, T>(p, v, D, d0, used, cols, ncols, acc, pf);
    } else {
      for (int64_t t = 0; t < ncols; ++t) {
        const int64_t l = cols ? cols[t] : t;
        const T* row = v + l * D + d0;
        for (int g = 0; g < G; ++g)
          for (int64_t j = 0; j < w; ++j) acc[g][j] = std::fma(p[g * used + l], load(row[j]), acc[g][j]);
      }
    }
    for (int g = 0; g < G; ++g) {
      const float inv = 1.f / total[g];
      for (int64_t j = 0; j < w; ++j) store(out + g * out_stride + d0 + j, acc[g][j] * inv);
    }
  }
}

template <int G, typename T>
void attend_pairs(int64_t begin, int64_t end, const T* qp, const T* kp, const T* vp, const float* cp,
                  const float* sp, T* kt_cache, T* v_cache, const bool* mp, T* op, int64_t H,
                  int64_t KV, int64_t D, int64_t C, int64_t col, float scale, bool use_mask, int64_t q_row,
                  int64_t k_row, int64_t v_row) {
  const int64_t used = col + 1;
  std::vector<float> qr(G * D), knew(D), scores(G * used);
  std::vector<int64_t> attended(use_mask ? used : 0);
  float total[G];
  for (int64_t idx = begin; idx < end; ++idx) {
    const int64_t r = idx / KV, h = idx % KV;
    Prefetch next_keys, next_values;  // of pair idx + 1, whose caches follow this pair's
    if (idx + 1 < end) {
      const int64_t tiles = (used + KEY_TILE - 1) / KEY_TILE;
      next_keys.start(kt_cache + (idx + 1) * D * C, tiles * D * KEY_TILE * sizeof(T), tiles * D);
      next_values.start(v_cache + (idx + 1) * C * D, used * D * sizeof(T), used);
    }
    const float* c = cp + r * D;
    const float* s = sp + r * D;
    T* kt = kt_cache + (r * KV + h) * D * C;
    T* values = v_cache + (r * KV + h) * C * D;
    rotate(kp + r * k_row + h * D, c, s, knew.data(), D);
    T* slot = kt + (col / KEY_TILE) * D * KEY_TILE + col % KEY_TILE;
    for (int64_t d = 0; d < D; ++d) store(slot + d * KEY_TILE, knew[d]);
    const T* vnew = vp + r * v_row + h * D;
    std::memcpy(values + col * D, vnew, D * sizeof(T));
    for (int g = 0; g < G; ++g) rotate(qp + r * q_row + (h * G + g) * D, c, s, qr.data() + g * D, D);
    constexpr int64_t B = G <= 4 ? 64 : 16;
    scores_block<G, B, T>(qr.data(), kt, D, used, scores.data(), next_keys);
    const bool* m = mp + r * C;
    constexpr float neg_inf = -std::numeric_limits<float>::infinity();
    for (int g = 0; g < G; ++g) {
      float* sg = scores.data() + g * used;
      // (separate simple loops: gcc vectorises each; the fused masked max loop stayed scalar)
      if (use_mask) {
#pragma omp simd
        for (int64_t l = 0; l < used; ++l) sg[l] = m[l] ? sg[l] * scale : neg_inf;
      } else {
#pragma omp simd
        for (int64_t l = 0; l < used; ++l) sg[l] = sg[l] * scale;
      }
      float best = neg_inf;
#pragma omp simd reduction(max : best)
      for (int64_t l = 0; l < used; ++l) best = std::max(best, sg[l]);
      float t = 0.f;
#pragma omp simd
      for (int64_t l = 0; l < used; ++l) sg[l] = exp_nonpositive(sg[l] - best);
#pragma omp simd reduction(+ : t)
      for (int64_t l = 0; l < used; ++l) t += sg[l];
      total[g] = t;
    }
    int64_t ncols = used;
    if (use_mask) {
      ncols = 0;
      for (int64_t l = 0; l < used; ++l)
        if (m[l]) attended[ncols++] = l;
    }
    weighted_values<G, B, T>(scores.data(), values, D, used, use_mask ? attended.data() : nullptr, ncols, total,
                          op + (r * H + h * G) * D, D, next_values);
  }
}

}  // namespace

// q [n, H, D], k and v [n, KV, D] (projections of the new token, before rotary), cos and sin [n, D];
// kt_cache [R >= n, KV, C / KEY_TILE, D, KEY_TILE] (keys in tiles, see KEY_TILE) and v_cache [R, KV, C, D],
// contiguous; mask [R, C] bool (true = attend), read only when use_mask. Writes the rotated key and the value at
// column `col`, attends over columns 0..col and returns the attention output [n, H, D]. All of q, k, v, the caches
// and the output are fp32, or all bf16 (bf16 rollouts: the projections' bf16 outputs are read as they are, the
// rotated key and the output are rounded once; the arithmetic is fp32 either way).
// q, k and v may be row-strided views (e.g. column slices of one fused q|k|v projection): only each row's
// [heads, D] block must be dense.
torch::Tensor row_dense(torch::Tensor t) {
  return (t.stride(2) == 1 && t.stride(1) == t.size(2)) ? t : t.contiguous();
}

torch::Tensor decode_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor cos,
                               torch::Tensor sin, torch::Tensor kt_cache, torch::Tensor v_cache,
                               torch::Tensor mask, int64_t col, double scale, bool use_mask) {
  const bool bf16_cache = kt_cache.scalar_type() == torch::kBFloat16;
  TORCH_CHECK((bf16_cache || kt_cache.scalar_type() == torch::kFloat32) && v_cache.scalar_type() == kt_cache.scalar_type(),
              "decode_attention: the caches must both be fp32 or both bf16");
  TORCH_CHECK(q.scalar_type() == kt_cache.scalar_type() && k.scalar_type() == q.scalar_type() &&
                  v.scalar_type() == q.scalar_type(),
              "decode_attention: q, k and v must have the caches' dtype (fp32, or bf16 with a bf16 cache)");
  TORCH_CHECK(kt_cache.is_contiguous() && v_cache.is_contiguous() && mask.is_contiguous(),
              "decode_attention: caches and mask must be contiguous");
  q = row_dense(q);
  k = row_dense(k);
  v = row_dense(v);
  cos = cos.contiguous();
  sin = sin.contiguous();
  TORCH_CHECK(kt_cache.dim() == 5 && kt_cache.size(4) == KEY_TILE, "decode_attention: keys must be tiled by ",
              KEY_TILE);
  const int64_t n = q.size(0), H = q.size(1), D = q.size(2), KV = k.size(1), C = kt_cache.size(2) * KEY_TILE;
  TORCH_CHECK(H % KV == 0 && col >= 0 && col < C && kt_cache.size(0) >= n && kt_cache.size(1) == KV &&
                  kt_cache.size(3) == D && v_cache.dim() == 4 && v_cache.size(0) >= n && v_cache.size(1) == KV &&
                  v_cache.size(2) == C && v_cache.size(3) == D && mask.dim() == 2 && mask.size(0) >= n &&
                  mask.size(1) == C && k.dim() == 3 && v.dim() == 3 && k.size(0) == n && v.size(0) == n &&
                  k.size(2) == D && v.size(1) == KV && v.size(2) == D && cos.dim() == 2 && sin.dim() == 2 &&
                  cos.size(0) >= n && sin.size(0) >= n && cos.size(1) == D && sin.size(1) == D,
              "decode_attention: bad shapes");
  const int64_t G = H / KV;
  auto out = torch::empty({n, H, D}, q.options());
  const void* qp = q.data_ptr();
  const void* kp = k.data_ptr();
  const void* vp = v.data_ptr();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  void* kt = kt_cache.data_ptr();
  void* vc = v_cache.data_ptr();
  const bool* mp = mask.data_ptr<bool>();
  void* op = out.data_ptr();
  const float sc = static_cast<float>(scale);
  const int64_t q_row = q.stride(0), k_row = k.stride(0), v_row = v.stride(0);
  esft_kernels::parallel_range(n * KV, 1, [&](int64_t begin, int64_t end) {
    switch (G) {
#define ESFT_CASE(g)                                                                                          \
  case g:                                                                                                     \
    if (bf16_cache)                                                                                           \
      attend_pairs<g, uint16_t>(begin, end, static_cast<const uint16_t*>(qp), static_cast<const uint16_t*>(kp), \
                                static_cast<const uint16_t*>(vp), cp, sp, static_cast<uint16_t*>(kt),          \
                                static_cast<uint16_t*>(vc), mp, static_cast<uint16_t*>(op), H, KV, D, C, col,  \
                                sc, use_mask, q_row, k_row, v_row);                                            \
    else                                                                                                      \
      attend_pairs<g, float>(begin, end, static_cast<const float*>(qp), static_cast<const float*>(kp),         \
                             static_cast<const float*>(vp), cp, sp, static_cast<float*>(kt),                   \
                             static_cast<float*>(vc), mp, static_cast<float*>(op), H, KV, D, C, col, sc,       \
                             use_mask, q_row, k_row, v_row);                                                   \
    break;
      ESFT_CASE(1) ESFT_CASE(2) ESFT_CASE(3) ESFT_CASE(4) ESFT_CASE(5) ESFT_CASE(6) ESFT_CASE(7) ESFT_CASE(8)
#undef ESFT_CASE
      default:
        TORCH_CHECK(false, "decode_attention: more than 8 query heads per kv head");
    }
  });
  return out;
}

namespace {

// LlamaRMSNorm on one fp32 row, op for op: mean of squares, 1 / sqrt(mean + eps), x * that, then weight *
// (out fp32, or rounded to bf16 for the next bf16 matmul)
template <typename T>
inline void rms_row(const float* x, const float* w, T* out, int64_t D, float eps) {
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int64_t d = 0; d < D; ++d) ss += x[d] * x[d];
  const float inv = 1.f / std::sqrt(ss / static_cast<float>(D) + eps);
  for (int64_t d = 0; d < D; ++d) store(out + d, w[d] * (x[d] * inv));
}

void check_rows(const torch::Tensor& t, const char* what, bool bf16_ok = false) {
  TORCH_CHECK((t.scalar_type() == torch::kFloat32 || (bf16_ok && t.scalar_type() == torch::kBFloat16)) &&
                  t.dim() == 2 && t.is_contiguous(),
              what, bf16_ok ? ": a contiguous 2-D fp32 or bf16 tensor is required"
                            : ": a contiguous 2-D fp32 tensor is required");
}

// RMSNorm(x) * weight of every row of x [n, D] (fp32, or bf16 where `low`), after x += delta where delta is
// given (fp32 or bf16, widened exactly): each row's add and norm in one visit, rows split between threads in
// blocks of 64 (a decode step's few rows stay on one thread; each row's arithmetic is the same either way).
torch::Tensor normed_rows(const torch::Tensor& x, const torch::Tensor* delta, const torch::Tensor& weight, double eps,
                          bool low) {
  const int64_t n = x.size(0), D = x.size(1);
  TORCH_CHECK(weight.numel() == D, "rms_norm: weight size");
  auto out = torch::empty_like(x, low ? torch::kBFloat16 : torch::kFloat32);
  float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  const bool bf16_delta = delta != nullptr && delta->scalar_type() == torch::kBFloat16;
  const uint16_t* d16 = bf16_delta ? reinterpret_cast<const uint16_t*>(delta->data_ptr<at::BFloat16>()) : nullptr;
  const float* d32 = delta != nullptr && !bf16_delta ? delta->data_ptr<float>() : nullptr;
  uint16_t* o16 = low ? reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()) : nullptr;
  float* o32 = low ? nullptr : out.data_ptr<float>();
  const float e = static_cast<float>(eps);
  esft_kernels::parallel_range(n, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* xr = xp + r * D;
      if (d16 != nullptr) {
#pragma omp simd
        for (int64_t i = 0; i < D; ++i) xr[i] = xr[i] + bf16_to_float(d16[r * D + i]);
      } else if (d32 != nullptr) {
#pragma omp simd
        for (int64_t i = 0; i < D; ++i) xr[i] = xr[i] + d32[r * D + i];
      }
      if (low)
        rms_row(xr, wp, o16 + r * D, D, e);
      else
        rms_row(xr, wp, o32 + r * D, D, e);
    }
  });
  return out;
}

}  // namespace

// These run once per layer on [rows, hidden] tensors, where torch's ~6 separate ops per RMSNorm (each a
// dispatch, an allocation and a thread-pool wake-up) cost more than the arithmetic: microseconds per decode step.
// `low` (bf16 rollouts): the result is rounded to bf16, the input of the next bf16 matmul, instead of being
// returned in fp32 and converted by torch (the same bits, one pass fewer).

// RMSNorm(x) * weight, row-wise; x [n, D] fp32.
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps, bool low) {
  check_rows(x, "rms_norm");
  check_rows(weight.view({1, -1}), "rms_norm weight");
  return normed_rows(x, nullptr, weight, eps, low);
}

// The residual step of a decoder layer: x += delta in place (the new residual stream, fp32; delta fp32 or the
// bf16 output of a bf16 matmul, widened exactly), returns RMSNorm(x) * weight.
torch::Tensor add_rms_norm(torch::Tensor x, torch::Tensor delta, torch::Tensor weight, double eps, bool low) {
  check_rows(x, "add_rms_norm");
  check_rows(delta, "add_rms_norm delta", true);
  check_rows(weight.view({1, -1}), "add_rms_norm weight");
  TORCH_CHECK(delta.sizes() == x.sizes(), "add_rms_norm: delta shape");
  return normed_rows(x, &delta, weight, eps, low);
}

// The rotary embedding of a prompt's queries and keys (the lean prefill): qkv [N, (H + 2 KV) * D], one fused
// q|k|v projection's output (fp32, or bf16 from a bf16 matmul), and row r's cos and sin [N, D] -> q [N, H * D],
// k [N, KV * D] and v [N, KV * D] in fp32, q and k rotated as `rotate` does (torch's `x * cos + rotate_half(x) *
// sin`, bit for bit), v widened exactly. One pass over the rows instead of ~8 torch ops over strided views.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> rotary_qkv(torch::Tensor qkv, torch::Tensor cos,
                                                                   torch::Tensor sin, int64_t H, int64_t KV) {
  check_rows(qkv, "rotary_qkv", true);
  cos = cos.contiguous();
  sin = sin.contiguous();
  check_rows(cos, "rotary_qkv cos");
  check_rows(sin, "rotary_qkv sin");
  const int64_t N = qkv.size(0), W = qkv.size(1);
  TORCH_CHECK(H > 0 && KV > 0 && W % (H + 2 * KV) == 0, "rotary_qkv: width not (H + 2 KV) heads");
  const int64_t D = W / (H + 2 * KV);
  TORCH_CHECK(D % 2 == 0 && cos.size(0) == N && sin.size(0) == N && cos.size(1) == D && sin.size(1) == D,
              "rotary_qkv: cos and sin must be [rows, head_dim] with an even head_dim");
  const auto f32 = qkv.options().dtype(torch::kFloat32);
  auto q = torch::empty({N, H * D}, f32), k = torch::empty({N, KV * D}, f32), v = torch::empty({N, KV * D}, f32);
  float* qp = q.data_ptr<float>();
  float* kp = k.data_ptr<float>();
  float* vp = v.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  const bool bf16 = qkv.scalar_type() == torch::kBFloat16;
  const void* src = qkv.data_ptr();
  auto rows = [&](auto* x, int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const auto* xr = x + r * W;
      for (int64_t h = 0; h < H; ++h) rotate(xr + h * D, cp + r * D, sp + r * D, qp + (r * H + h) * D, D);
      for (int64_t h = 0; h < KV; ++h) rotate(xr + (H + h) * D, cp + r * D, sp + r * D, kp + (r * KV + h) * D, D);
      const auto* xv = xr + (H + KV) * D;
#pragma omp simd
      for (int64_t i = 0; i < KV * D; ++i) vp[r * KV * D + i] = load(xv[i]);
    }
  };
  esft_kernels::parallel_range(N, 64, [&](int64_t begin, int64_t end) {
    if (bf16)
      rows(static_cast<const uint16_t*>(src), begin, end);
    else
      rows(static_cast<const float*>(src), begin, end);
  });
  return {q, k, v};
}

namespace {

// silu(g) * u on one row: g / (1 + e^-g) as torch computes it, times u, in fp32 (inputs widened, output rounded
// for bf16). Two passes over blocks of 256: gcc vectorises the fused loop with masked divisions and blends, ~3x
// slower.
template <typename T>
void silu_row(const T* gr, const T* ur, T* orow, int64_t I) {
  float g[256], e[256];
  for (int64_t i0 = 0; i0 < I; i0 += 256) {
    const int64_t w = std::min<int64_t>(256, I - i0);
#pragma omp simd
    for (int64_t i = 0; i < w; ++i) g[i] = load(gr[i0 + i]);
#pragma omp simd
    for (int64_t i = 0; i < w; ++i) e[i] = exp_clamped(-g[i]);
    for (int64_t i = 0; i < w; ++i) store(orow + i0 + i, (g[i] / (1.f + e[i])) * load(ur[i0 + i]));
  }
}

}  // namespace

// The SwiGLU gate on one fused gate|up projection: gu [n, 2I] -> silu(gu[:, :I]) * gu[:, I:], in gu's dtype (fp32,
// or bf16: the bf16 matmul's output in, the next bf16 matmul's input out).
torch::Tensor silu_mul(torch::Tensor gu) {
  check_rows(gu, "silu_mul", true);
  const int64_t n = gu.size(0), I = gu.size(1) / 2;
  TORCH_CHECK(gu.size(1) == 2 * I, "silu_mul: odd width");
  auto out = torch::empty({n, I}, gu.options());
  const bool low = gu.scalar_type() == torch::kBFloat16;
  esft_kernels::parallel_range(n, 4, [&](int64_t begin, int64_t end) {  // the exp makes this one worth two threads
    for (int64_t r = begin; r < end; ++r) {
      if (low) {
        const uint16_t* g = reinterpret_cast<const uint16_t*>(gu.data_ptr<at::BFloat16>()) + r * 2 * I;
        silu_row(g, g + I, reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()) + r * I, I);
      } else {
        const float* g = gu.data_ptr<float>() + r * 2 * I;
        silu_row(g, g + I, out.data_ptr<float>() + r * I, I);
      }
    }
  });
  return out;
}

// Greedy lm_head screening (esft.lean.LMHeadScreen): approx [n, V] bf16 logits (suppressed tokens already set to
// the lowest finite bf16), hnorm [n] and wnorm [V] fp32 norms, error bound e = c_prod * hnorm * wnorm +
// c_out * |approx| + 1e-30. Token v can be row r's argmax only if approx + e >= max over u of (approx_u - e_u).
// Returns the union of those tokens over rows (ascending) and keep [n, c]: whether each is a candidate of each
// row. A row with a non-finite value gets no candidates (the caller then computes full logits).

std::tuple<torch::Tensor, torch::Tensor> screen_candidates(torch::Tensor approx, torch::Tensor hnorm,
                                                           torch::Tensor wnorm, double c_prod, double c_out) {
  TORCH_CHECK(approx.scalar_type() == torch::kBFloat16 && approx.dim() == 2 && approx.is_contiguous(),
              "screen_candidates: approx must be contiguous 2-D bf16");
  TORCH_CHECK(hnorm.scalar_type() == torch::kFloat32 && wnorm.scalar_type() == torch::kFloat32 &&
                  hnorm.is_contiguous() && wnorm.is_contiguous(),
              "screen_candidates: norms must be contiguous fp32");
  const int64_t n = approx.size(0), V = approx.size(1);
  TORCH_CHECK(hnorm.numel() == n && wnorm.numel() == V, "screen_candidates: norm sizes");
  const uint16_t* a = reinterpret_cast<const uint16_t*>(approx.data_ptr<at::BFloat16>());
  const float* hn = hnorm.data_ptr<float>();
  const float* wn = wnorm.data_ptr<float>();
  const float cp = static_cast<float>(c_prod), co = static_cast<float>(c_out);
  std::vector<float> floor(n);
  std::vector<uint8_t> hit(V, 0);  // tokens some row cannot rule out, merged from each thread's marks
  std::mutex merge;
  esft_kernels::parallel_range(n, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> marks(V, 0.f);
    float* mark = marks.data();
    for (int64_t r = begin; r < end; ++r) {
      const uint16_t* ar = a + r * V;
      const float hr = hn[r] * cp;
      float best = -std::numeric_limits<float>::infinity();
      float check = 0.f;  // stays finite only if every value is
#pragma omp simd reduction(max : best) reduction(+ : check)
      for (int64_t v = 0; v < V; ++v) {
        const float x = bf16_to_float(ar[v]);
        const float e = hr * wn[v] + co * std::fabs(x) + 1e-30f;
        best = std::max(best, x - e);
        check += x - x;
      }
      if (!std::isfinite(check) || !std::isfinite(hr) || !std::isfinite(best)) {
        floor[r] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      floor[r] = best;
#pragma omp simd
      for (int64_t v = 0; v < V; ++v) {
        const float x = bf16_to_float(ar[v]);
        const float e = hr * wn[v] + co * std::fabs(x) + 1e-30f;
        mark[v] = x + e >= best ? 1.f : mark[v];
      }
    }
    const std::lock_guard<std::mutex> hold(merge);
    for (int64_t v = 0; v < V; ++v) hit[v] |= mark[v] != 0.f;
  });
  std::vector<int64_t> cols;
  for (int64_t v = 0; v < V; ++v) {
    if (hit[v]) cols.push_back(v);
  }
  const int64_t c = static_cast<int64_t>(cols.size());
  auto cols_t = torch::empty({c}, torch::kInt64);
  std::memcpy(cols_t.data_ptr<int64_t>(), cols.data(), c * sizeof(int64_t));
  auto keep = torch::zeros({n, c}, torch::kBool);
  bool* kp = keep.data_ptr<bool>();
  for (int64_t r = 0; r < n; ++r) {
    const float hr = hn[r] * cp;
    for (int64_t j = 0; j < c; ++j) {
      const float x = bf16_to_float(a[r * V + cols[j]]);
      const float e = hr * wn[cols[j]] + co * std::fabs(x) + 1e-30f;
      kp[r * c + j] = x + e >= floor[r];  // false for a NaN floor
    }
  }
  return {cols_t, keep};
}

// The GIL is released while a kernel runs, so other Python threads of the process are not held up by it.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("KEY_TILE") = KEY_TILE;
  m.def("decode_attention", &decode_attention, py::call_guard<py::gil_scoped_release>(),
        "rotary + KV append + grouped-query attention for one decode step (CPU, fp32 arithmetic, fp32 or bf16 tiled key cache)");
  m.def("rms_norm", &rms_norm, py::call_guard<py::gil_scoped_release>(),
        "row-wise RMSNorm times weight ([n, D] fp32; low: the result rounded to bf16)", py::arg("x"),
        py::arg("weight"), py::arg("eps"), py::arg("low") = false);
  m.def("add_rms_norm", &add_rms_norm, py::call_guard<py::gil_scoped_release>(),
        "x += delta in place, then row-wise RMSNorm(x) times weight (low: rounded to bf16)", py::arg("x"),
        py::arg("delta"), py::arg("weight"), py::arg("eps"), py::arg("low") = false);
  m.def("rotary_qkv", &rotary_qkv, py::call_guard<py::gil_scoped_release>(),
        "q, k rotated and v widened to fp32 from one fused q|k|v projection (the lean prefill)", py::arg("qkv"),
        py::arg("cos"), py::arg("sin"), py::arg("heads"), py::arg("kv_heads"));
  m.def("screen_candidates", &screen_candidates, py::call_guard<py::gil_scoped_release>(), "greedy lm_head screening: candidate tokens from bf16 logits");
  m.def("silu_mul", &silu_mul, py::call_guard<py::gil_scoped_release>(), "silu(gu[:, :I]) * gu[:, I:] for a fused gate|up projection");
}
