#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <cstdint>
#include <cstring>
namespace {
inline uint16_t to_bf16(float x) {
  uint32_t bits; std::memcpy(&bits, &x, 4);
  return std::isnan(x) ? uint16_t(0x7FC0) : uint16_t((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}
}
void add_scaled(torch::Tensor master, torch::Tensor eps, double step, torch::Tensor out) {
  const float* m = master.data_ptr<float>(); const float* e = eps.data_ptr<float>();
  const float s = static_cast<float>(step); const int64_t n = master.numel();
  if (out.scalar_type() == torch::kBFloat16) {
    uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
    at::parallel_for(0, n, 1 << 16, [&](int64_t b, int64_t en) {
#pragma omp simd
      for (int64_t i = b; i < en; ++i) o[i] = to_bf16(std::fma(e[i], s, m[i]));
    });
  } else {
    float* o = out.data_ptr<float>();
    at::parallel_for(0, n, 1 << 16, [&](int64_t b, int64_t en) {
#pragma omp simd
      for (int64_t i = b; i < en; ++i) o[i] = std::fma(e[i], s, m[i]);
    });
  }
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("add_scaled", &add_scaled, py::call_guard<py::gil_scoped_release>()); }
