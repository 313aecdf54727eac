// The ES passes over the fp32 masters (esft.es.param_writes): a member's weights written from the masters and
// one noise window (add_rounded), and the table-noise update applied to a block of the masters (add_update).
//
// Why by hand: both are memory-bound elementwise passes, and torch runs them as several ops, each a pass of its
// own: the perturbation as an fp32 add into a cached block then a conversion to bf16, the update as a zero, one
// add per member, a multiply and an add over the block. Here each element is read once, computed in registers and
// written once; a large output is written with streaming stores, which skip the read-for-ownership of lines the
// pass overwrites whole. On a 2-core Xeon with AMX a SmolLM2-135M perturbation took ~52 ms instead of ~75 and an
// update with four members ~130 ms instead of ~190 (docs/performance.md, "The masters' passes in one loop").
//
// Numerics: the arithmetic of the torch ops they replace, element by element, so the bits are the same (the
// tests compare both on the CPU at hand). torch.add(m, e, alpha=s) computes fma(e, s, m) in fp32; the bf16 copy
// rounds to nearest even, every NaN becoming 0xFFFF (the rule of torch's vectorised fp32 -> bf16 conversion,
// written out below rather than the CPU's bf16 conversion instruction, which flushes subnormals to zero). The
// update: acc = 0, acc = fma(e_k, c_k, acc) for k in order, acc *= scale, master += acc.
#include <torch/extension.h>

#include <vector>

#include "kernel_common.h"

namespace {

using esft_kernels::parallel_range;
using esft_kernels::to_bf16;
#if defined(__AVX512F__)
using esft_kernels::bf16x32;
#endif

// Elements per thread task: large enough that the OpenMP fork costs nothing, small enough to split one layer
// between two threads.
constexpr int64_t GRAIN = 1 << 15;
// Outputs of at least this many bytes are written with streaming stores: beyond the caches anyway.
constexpr int64_t STREAM_BYTES = 1 << 20;

void rounded_bf16(const float* m, const float* e, float s, uint16_t* o, int64_t begin, int64_t end, bool stream) {
  int64_t i = begin;
#if defined(__AVX512F__)
  if (stream) {  // streaming stores need 64-byte aligned addresses
    for (; i < end && (reinterpret_cast<uintptr_t>(o + i) & 63) != 0; ++i) o[i] = to_bf16(std::fma(e[i], s, m[i]));
  }
  const __m512 sv = _mm512_set1_ps(s);
  for (; i + 32 <= end; i += 32) {
    const __m512i both = bf16x32(_mm512_fmadd_ps(_mm512_loadu_ps(e + i), sv, _mm512_loadu_ps(m + i)),
                                 _mm512_fmadd_ps(_mm512_loadu_ps(e + i + 16), sv, _mm512_loadu_ps(m + i + 16)));
    if (stream) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(o + i), both);
    } else {
      _mm512_storeu_si512(reinterpret_cast<void*>(o + i), both);
    }
  }
#else
  (void)stream;
#endif
  for (; i < end; ++i) o[i] = to_bf16(std::fma(e[i], s, m[i]));
}

void rounded_fp32(const float* m, const float* e, float s, float* o, int64_t begin, int64_t end, bool stream) {
  int64_t i = begin;
#if defined(__AVX512F__)
  if (stream) {
    for (; i < end && (reinterpret_cast<uintptr_t>(o + i) & 63) != 0; ++i) o[i] = std::fma(e[i], s, m[i]);
    const __m512 sv = _mm512_set1_ps(s);
    for (; i + 16 <= end; i += 16) {
      _mm512_stream_ps(o + i, _mm512_fmadd_ps(_mm512_loadu_ps(e + i), sv, _mm512_loadu_ps(m + i)));
    }
  }
#else
  (void)stream;
#endif
#pragma omp simd
  for (int64_t j = i; j < end; ++j) o[j] = std::fma(e[j], s, m[j]);
}

void check_flat(const torch::Tensor& t, torch::ScalarType dtype, int64_t n, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == dtype && t.is_contiguous() && t.numel() == n, what,
              " must be a contiguous CPU tensor of ", n, " ", c10::toString(dtype), " elements");
}

}  // namespace

// out <- fma(eps, step, master), rounded to out's dtype (fp32 or bf16): torch.add(master, eps, alpha=step)
// followed by .to(out.dtype).
void add_rounded(torch::Tensor master, torch::Tensor eps, double step, torch::Tensor out) {
  const int64_t n = master.numel();
  check_flat(master, torch::kFloat32, n, "master");
  check_flat(eps, torch::kFloat32, n, "eps");
  const bool bf16 = out.scalar_type() == torch::kBFloat16;
  check_flat(out, bf16 ? torch::kBFloat16 : torch::kFloat32, n, "out");
  const float* m = master.data_ptr<float>();
  const float* e = eps.data_ptr<float>();
  const float s = static_cast<float>(step);
  const bool stream = n * out.element_size() >= STREAM_BYTES;
  if (bf16) {
    uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
    parallel_range(n, GRAIN, [&](int64_t b, int64_t en) { rounded_bf16(m, e, s, o, b, en, stream); });
  } else {
    float* o = out.data_ptr<float>();
    parallel_range(n, GRAIN, [&](int64_t b, int64_t en) { rounded_fp32(m, e, s, o, b, en, stream); });
  }
#if defined(__AVX512F__)
  if (stream) _mm_sfence();  // streaming stores are weakly ordered: visible before the caller reads `out`
#endif
}

// acc <- scale * sum_k coefs[k] * eps[k] (summed from 0 in order k = 0, 1, ...), master += acc, and out <- master
// rounded to out's dtype where out is given (fp32 or bf16).
void add_update(torch::Tensor master, std::vector<torch::Tensor> eps, std::vector<double> coefs, double scale,
                torch::Tensor acc, c10::optional<torch::Tensor> out) {
  const int64_t n = master.numel();
  check_flat(master, torch::kFloat32, n, "master");
  check_flat(acc, torch::kFloat32, n, "acc");
  TORCH_CHECK(eps.size() == coefs.size(), "one coefficient per noise window");
  std::vector<const float*> e;
  std::vector<float> c;
  for (size_t k = 0; k < eps.size(); ++k) {
    check_flat(eps[k], torch::kFloat32, n, "each noise window");
    e.push_back(eps[k].data_ptr<float>());
    c.push_back(static_cast<float>(coefs[k]));
  }
  float* m = master.data_ptr<float>();
  float* a = acc.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  float* o32 = nullptr;
  uint16_t* o16 = nullptr;
  if (out.has_value()) {
    const bool bf16 = out->scalar_type() == torch::kBFloat16;
    check_flat(*out, bf16 ? torch::kBFloat16 : torch::kFloat32, n, "out");
    if (bf16) {
      o16 = reinterpret_cast<uint16_t*>(out->data_ptr<at::BFloat16>());
    } else {
      o32 = out->data_ptr<float>();
    }
  }
  const int terms = static_cast<int>(e.size());
  parallel_range(n, GRAIN, [&](int64_t b, int64_t en) {
    // tiles of 1024: the tile of `acc` stays in L1 across the member terms
    constexpr int64_t TILE = 1024;
    for (int64_t t = b; t < en; t += TILE) {
      const int64_t te = std::min(en, t + TILE);
#pragma omp simd
      for (int64_t i = t; i < te; ++i) a[i] = 0.0f;
      for (int k = 0; k < terms; ++k) {
        const float* ek = e[k];
        const float ck = c[k];
#pragma omp simd
        for (int64_t i = t; i < te; ++i) a[i] = std::fma(ek[i], ck, a[i]);
      }
#pragma omp simd
      for (int64_t i = t; i < te; ++i) {
        const float v = a[i] * sc;
        a[i] = v;
        m[i] = m[i] + v;
      }
      if (o32 != nullptr) std::memcpy(o32 + t, m + t, (te - t) * sizeof(float));
      if (o16 != nullptr) {
        for (int64_t i = t; i < te; ++i) o16[i] = to_bf16(m[i]);
      }
    }
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("add_rounded", &add_rounded, py::call_guard<py::gil_scoped_release>());
  module.def("add_update", &add_update, py::call_guard<py::gil_scoped_release>());
}
