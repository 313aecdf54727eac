// Helpers shared by esft's compiled kernels (included by the .cpp files of this folder).
#pragma once

#include <ATen/Parallel.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace esft_kernels {

// at::parallel_for without its first-call reset of the thread's team size. Each extension holds its own copy of
// ATen's inline lazy_init_num_threads, whose thread-local flag starts false in every thread: the first
// at::parallel_for a thread ran here would set that thread's OpenMP team to torch's global thread count, undoing
// the share an ES lane set for itself (LocalExecutor: torch.set_num_threads(share) on each lane's thread).
// at::get_num_threads() is libtorch's own, so it returns the calling thread's setting. The chunks are
// at::parallel_for's: min(threads, ceil(n / grain)) of equal size.
template <class F>
void parallel_range(int64_t n, int64_t grain, const F& body) {
  const int64_t most = std::max<int64_t>(1, (n + grain - 1) / grain);
  const int threads = static_cast<int>(std::min<int64_t>(at::get_num_threads(), most));
  if (threads <= 1 || at::in_parallel_region()) {
    body(0, n);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t k = omp_get_num_threads();
    const int64_t chunk = (n + k - 1) / k;
    const int64_t begin = std::min<int64_t>(n, omp_get_thread_num() * chunk);
    const int64_t end = std::min<int64_t>(n, begin + chunk);
    if (begin < end) body(begin, end);
  }
}

// fp32 -> bf16 as torch's vectorised conversion rounds: to nearest even, subnormals kept, every NaN as 0xFFFF.
inline uint16_t to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return std::isnan(x) ? uint16_t(0xFFFF) : uint16_t((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

#if defined(__AVX512F__)
// 16 floats -> 16 bf16 (as 32-bit lanes holding the 16-bit results), to_bf16's rule.
inline __m512i bf16_bits(__m512 x) {
  const __m512i b = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  return _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0xFFFF));
}

// 32 floats (lo: the first 16, hi: the next 16) -> 32 bf16 in order, 64 bytes, to_bf16's rule.
inline __m512i bf16x32(__m512 lo, __m512 hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(bf16_bits(lo))),
                            _mm512_cvtepi32_epi16(bf16_bits(hi)), 1);
}
#endif

}  // namespace esft_kernels
