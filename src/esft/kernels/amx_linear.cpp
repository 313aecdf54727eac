// bf16 linears on Intel AMX tiles for the lean engine's packed weights (esft.generation.packed): out = x W^T with
// x [M, K] and out [M, N] in bf16, W packed once by `tile_layout` into [N/32][K/32][16][32][2] blocks.
//
// Why by hand: oneDNN's AMX matmul (torch.ops.mkldnn._linear_pointwise), which the engine used before, read a
// decode step's bf16 weights (212 MB for SmolLM2-135M, beyond the caches) at 7.1-8.6 GB/s on one core of a 2-core
// Sapphire Rapids VM, for 16-32 rows. This loop reads each 2 KB block of W once, with a software prefetch two
// blocks ahead, and multiplies it into both 16-row halves of a 32-row block of x: 8.5-10.6 GB/s on the same
// weights, and 1.2-1.9x oneDNN's rate at 32 rows on a weight that sits in the cache (docs/performance.md, "bf16
// linears on AMX tiles"). At prefill row counts (hundreds of rows) oneDNN's blocking is faster (a lever left); the
// engine keeps one packed copy, in this layout, for the prompt and the decode steps. An ES lane's members are
// written straight into this layout from the fp32 masters and the noise (`rounded_tiles`), never as plain weights.
//
// Layout: block (n, k) holds W[32n : 32n+32, 32k : 32k+32] as 16 rows of k pairs, each row 32 output columns of
// two bf16 each: AMX's B-tile (VNNI) order, two 16-column tiles side by side with a 128-byte row stride.
// Numerics: each output is one fp32 accumulator per tile element, k blocks added in order (tdpbf16ps), plus the
// bias in fp32, rounded to bf16 as torch rounds (to nearest even). A row's result depends on nothing but its own
// inputs: not on M, the thread count or how the work is split. On the CPUs tested this is what oneDNN's
// bf16 matmul gives for up to 32 rows (tests/test_amx_linear.py compares them on the CPU at hand).
#include <torch/extension.h>

#include <new>
#include <vector>

#include "kernel_common.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__)
#define ESFT_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#else
#define ESFT_AMX 0
#endif

namespace {

#if ESFT_AMX
// Rows of x per outer block: its bf16 rows stay in L2 while every column block of W passes over them (prefill).
constexpr int64_t ROW_BLOCK = 256;
// Prefetch distance in 2 KB weight blocks (one, four and eight were slower on the VM measured).
constexpr int PREFETCH_BLOCKS = 2;

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Tiles 0-3: the fp32 accumulators (rows 0-15 | 16-31) x (columns 0-15 | 16-31); 4-5: x's two row halves; 6-7:
// W's two column halves. `r1` = 0 leaves the second row half unconfigured (a block of at most 16 rows).
void configure(int r0, int r1) {
  TileConfig c;
  std::memset(&c, 0, sizeof c);
  c.palette_id = 1;
  const int rows[8] = {r0, r0, r1, r1, r0, r1, 16, 16};
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = static_cast<uint8_t>(rows[t]);
    c.colsb[t] = rows[t] ? 64 : 0;
  }
  _tile_loadconfig(&c);
}

// acc (32 x 32 fp32, row stride 32) + bias -> out rows [0, rows) (row stride N), rounded to bf16.
void store_rows(const float* acc, const float* bias, uint16_t* out, int64_t N, int rows) {
  const __m512 b0 = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  const __m512 b1 = bias ? _mm512_loadu_ps(bias + 16) : _mm512_setzero_ps();
  for (int r = 0; r < rows; ++r) {
    const __m512i both = esft_kernels::bf16x32(_mm512_add_ps(_mm512_load_ps(acc + 32 * r), b0),
                                               _mm512_add_ps(_mm512_load_ps(acc + 32 * r + 16), b1));
    _mm512_storeu_si512(reinterpret_cast<void*>(out + r * N), both);
  }
}

// Column blocks [nb0, nb1) of out for every row.
void column_blocks(const uint16_t* x, const uint16_t* w, const float* bias, uint16_t* out, int64_t M, int64_t N,
                   int64_t K, int64_t nb0, int64_t nb1) {
  const int64_t KB = K / 32;
  alignas(64) float acc[32 * 32];
  int cfg0 = -1, cfg1 = -1;
  for (int64_t mo = 0; mo < M; mo += ROW_BLOCK) {
    const int64_t me = std::min<int64_t>(M, mo + ROW_BLOCK);
    for (int64_t nb = nb0; nb < nb1; ++nb) {
      const uint16_t* wb = w + nb * KB * 1024;
      for (int64_t mb = mo; mb < me; mb += 32) {
        const int r0 = static_cast<int>(std::min<int64_t>(16, me - mb));
        const int r1 = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(16, me - mb - 16)));
        if (r0 != cfg0 || r1 != cfg1) {
          configure(r0, r1);
          cfg0 = r0;
          cfg1 = r1;
        }
        _tile_zero(0);
        _tile_zero(1);
        if (r1) {
          _tile_zero(2);
          _tile_zero(3);
        }
        const uint16_t* xa = x + mb * K;
        for (int64_t kb = 0; kb < KB; ++kb) {
          const uint16_t* b = wb + kb * 1024;
          if (mb == mo) {  // W's blocks come from memory once per row block, then from the cache
            const char* ahead = reinterpret_cast<const char*>(b) + PREFETCH_BLOCKS * 2048;
            for (int line = 0; line < 2048; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
          }
          _tile_loadd(6, b, 128);
          _tile_loadd(7, b + 32, 128);
          _tile_loadd(4, xa + kb * 32, K * 2);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          if (r1) {
            _tile_loadd(5, xa + 16 * K + kb * 32, K * 2);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
          }
        }
        _tile_stored(0, acc, 128);
        _tile_stored(1, acc + 16, 128);
        if (r1) {
          _tile_stored(2, acc + 16 * 32, 128);
          _tile_stored(3, acc + 16 * 32 + 16, 128);
        }
        store_rows(acc, bias ? bias + nb * 32 : nullptr, out + mb * N + nb * 32, N, r0 + r1);
      }
    }
  }
  _tile_release();
}
#endif

}  // namespace

// True where this build has the AMX loop and Linux lets this process use the tiles (it asks once: the tile data
// is an opt-in part of the thread state, ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA).
bool available() {
#if ESFT_AMX
  static const bool granted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return granted;
#else
  return false;
#endif
}

// w [N, K] bf16 (N, K multiples of 32) -> [N/32, K/32, 16, 32, 2]: esft.generation.packed.tile_layout, one pass.
// In 32-bit units (a pair of columns) each block is a 32 x 16 -> 16 x 32 transpose.
torch::Tensor pack(torch::Tensor w) {
  TORCH_CHECK(w.device().is_cpu() && w.dim() == 2 && w.scalar_type() == torch::kBFloat16 && w.is_contiguous(),
              "w must be a contiguous 2-D CPU bf16 tensor");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(N % 32 == 0 && K % 32 == 0, "both sides of w must be multiples of 32, not ", N, " x ", K);
  auto out = torch::empty({N / 32, K / 32, 16, 32, 2}, w.options());
  const auto* src = reinterpret_cast<const uint32_t*>(w.data_ptr<at::BFloat16>());
  auto* dst = reinterpret_cast<uint32_t*>(out.data_ptr<at::BFloat16>());
  const int64_t pairs = K / 2, KB = K / 32;
  esft_kernels::parallel_range(N / 32, 8, [&](int64_t nb0, int64_t nb1) {
    for (int64_t nb = nb0; nb < nb1; ++nb) {
      for (int64_t kb = 0; kb < KB; ++kb) {
        const uint32_t* s = src + nb * 32 * pairs + kb * 16;
        uint32_t* d = dst + (nb * KB + kb) * 512;
        for (int p = 0; p < 16; ++p) {
          for (int r = 0; r < 32; ++r) d[p * 32 + r] = s[r * pairs + p];
        }
      }
    }
  });
  return out;
}

namespace {

// One weight row's 32 columns 32k..32k+31, rounded (fma(e, step, m), or m alone where e is null), into column r of
// its 2 KB tile block d: pair p of the row (columns 2p, 2p + 1) is dword p * 32 + r of the block.
inline void rounded_row_into_block(const float* m, const float* e, float step, uint32_t* d) {
#if defined(__AVX512F__)
  const __m512 lo_m = _mm512_loadu_ps(m), hi_m = _mm512_loadu_ps(m + 16);
  const __m512 sv = _mm512_set1_ps(step);
  const __m512 lo = e == nullptr ? lo_m : _mm512_fmadd_ps(_mm512_loadu_ps(e), sv, lo_m);
  const __m512 hi = e == nullptr ? hi_m : _mm512_fmadd_ps(_mm512_loadu_ps(e + 16), sv, hi_m);
  const __m512i pairs = esft_kernels::bf16x32(lo, hi);
  const __m512i rows = _mm512_set_epi32(480, 448, 416, 384, 352, 320, 288, 256, 224, 192, 160, 128, 96, 64, 32, 0);
  _mm512_i32scatter_epi32(d, rows, pairs, 4);
#else
  for (int p = 0; p < 16; ++p) {
    const float a = e == nullptr ? m[2 * p] : std::fma(e[2 * p], step, m[2 * p]);
    const float b = e == nullptr ? m[2 * p + 1] : std::fma(e[2 * p + 1], step, m[2 * p + 1]);
    d[p * 32] = static_cast<uint32_t>(esft_kernels::to_bf16(a)) |
                (static_cast<uint32_t>(esft_kernels::to_bf16(b)) << 16);
  }
#endif
}

// How far ahead of the row segment being rounded its master and noise are prefetched (floats): 2 KB. Without it a
// SmolLM2-135M member's projections took ~64 ms on the 2-core Xeon with AMX, with 128-512 floats ~53 ms, with 1024
// or more 60-68 ms (a plain bf16 write of the same took ~45 ms).
constexpr int64_t PREFETCH_FLOATS = 512;

// 64-byte aligned scratch for a strip's blocks (streaming stores read it in whole cache lines)
struct AlignedBuffer {
  uint32_t* data;
  explicit AlignedBuffer(int64_t n) : data(static_cast<uint32_t*>(::operator new(n * 4, std::align_val_t(64)))) {}
  ~AlignedBuffer() { ::operator delete(data, std::align_val_t(64)); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
};

// n dwords (a multiple of 16, both ends 64-byte aligned) from src to dst, with streaming stores where AVX-512 is
inline void stream_copy(const uint32_t* src, uint32_t* dst, int64_t n) {
#if defined(__AVX512F__)
  for (int64_t i = 0; i < n; i += 16)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), _mm512_load_si512(reinterpret_cast<const void*>(src + i)));
#else
  std::memcpy(dst, src, n * sizeof(uint32_t));
#endif
}

}  // namespace

// A member's weights written straight into the tile layout (ES lanes: esft.es.noise.MasterWeights.tiles): the rows
// of round(fma(eps_i, step, master_i)) for each fp32 master_i [N_i, K] (round(master_i) where `eps` is empty),
// stacked in order, as `pack` lays out a bf16 [sum N_i, K] weight. Element by element the arithmetic of
// param_passes.cpp's add_rounded (torch.add(master, eps, alpha=step).to(torch.bfloat16)), so the bits of writing
// the weights, stacking them and packing them, in one pass instead of three. Each 32-row strip is read in order
// (its rows are contiguous) and written as K/32 blocks that stay in the cache until they are whole.
torch::Tensor rounded_tiles(std::vector<torch::Tensor> masters, std::vector<torch::Tensor> eps, double step) {
  TORCH_CHECK(!masters.empty(), "rounded_tiles: no masters");
  TORCH_CHECK(eps.empty() || eps.size() == masters.size(), "rounded_tiles: one noise tensor per master, or none");
  const int64_t K = masters[0].dim() == 2 ? masters[0].size(1) : -1;
  std::vector<std::pair<const float*, const float*>> strips;  // each 32-row strip's first master and noise row
  for (size_t i = 0; i < masters.size(); ++i) {
    const auto& m = masters[i];
    TORCH_CHECK(m.device().is_cpu() && m.scalar_type() == torch::kFloat32 && m.dim() == 2 && m.is_contiguous() &&
                    m.size(1) == K && K % 32 == 0 && m.size(0) % 32 == 0,
                "rounded_tiles: masters must be contiguous 2-D fp32 CPU tensors with the same number of columns, "
                "both sides multiples of 32");
    if (!eps.empty())
      TORCH_CHECK(eps[i].device().is_cpu() && eps[i].scalar_type() == torch::kFloat32 && eps[i].is_contiguous() &&
                      eps[i].sizes() == m.sizes(),
                  "rounded_tiles: each noise tensor must be a contiguous fp32 CPU tensor of its master's shape");
    for (int64_t r = 0; r < m.size(0); r += 32)
      strips.emplace_back(m.data_ptr<float>() + r * K, eps.empty() ? nullptr : eps[i].data_ptr<float>() + r * K);
  }
  const int64_t S = static_cast<int64_t>(strips.size()), KB = K / 32;
  auto out = torch::empty({S, KB, 16, 32, 2}, torch::TensorOptions().dtype(torch::kBFloat16));
  auto* dst = reinterpret_cast<uint32_t*>(out.data_ptr<at::BFloat16>());
  const float st = static_cast<float>(step);
  esft_kernels::parallel_range(S, 4, [&](int64_t s0, int64_t s1) {
    // a strip's blocks are built in this cache-resident buffer, then streamed out whole: no read-for-ownership of
    // the output's lines, which a scatter straight into them would cost
    AlignedBuffer buf(KB * 512);
    for (int64_t s = s0; s < s1; ++s) {
      const float* m = strips[s].first;
      const float* e = strips[s].second;
      for (int64_t r = 0; r < 32; ++r) {
        for (int64_t kb = 0; kb < KB; ++kb) {
          const int64_t at = r * K + kb * 32;
          __builtin_prefetch(m + at + PREFETCH_FLOATS, 0, 3);
          __builtin_prefetch(m + at + PREFETCH_FLOATS + 16, 0, 3);
          if (e != nullptr) {
            __builtin_prefetch(e + at + PREFETCH_FLOATS, 0, 3);
            __builtin_prefetch(e + at + PREFETCH_FLOATS + 16, 0, 3);
          }
          rounded_row_into_block(m + at, e == nullptr ? nullptr : e + at, st, buf.data + kb * 512 + r);
        }
      }
      stream_copy(buf.data, dst + s * KB * 512, KB * 512);
    }
  });
#if defined(__AVX512F__)
  _mm_sfence();  // streaming stores are weakly ordered: visible before the caller reads `out`
#endif
  return out;
}

// x [M, K] bf16, packed [N/32, K/32, 16, 32, 2] bf16 (`tile_layout`), bias [N] fp32 or None -> [M, N] bf16.
torch::Tensor linear(torch::Tensor x, torch::Tensor packed, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(available(), "the AMX linear is not available on this CPU or build");
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.scalar_type() == torch::kBFloat16 && x.is_contiguous(),
              "x must be a contiguous 2-D CPU bf16 tensor");
  TORCH_CHECK(packed.dim() == 5 && packed.scalar_type() == torch::kBFloat16 && packed.is_contiguous() &&
                  packed.size(2) == 16 && packed.size(3) == 32 && packed.size(4) == 2,
              "packed must be a contiguous bf16 tensor of shape [N/32, K/32, 16, 32, 2]");
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0) * 32;
  TORCH_CHECK(packed.size(1) * 32 == K, "x has ", K, " columns, the packed weight ", packed.size(1) * 32);
  const float* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == torch::kFloat32 && bias->is_contiguous() && bias->numel() == N,
                "bias must be a contiguous fp32 tensor of ", N, " elements");
    b = bias->data_ptr<float>();
  }
  auto out = torch::empty({M, N}, x.options());
#if ESFT_AMX
  if (M > 0) {
    const auto* xs = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
    const auto* ws = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
    auto* os = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
    esft_kernels::parallel_range(N / 32, 1, [&](int64_t nb0, int64_t nb1) {
      column_blocks(xs, ws, b, os, M, N, K, nb0, nb1);
    });
  }
#endif
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("available", &available);
  // without the GIL, as torch's own ops: ES lanes are threads of one process and multiply at the same time
  m.def("pack", &pack, py::call_guard<py::gil_scoped_release>(), "a bf16 weight in the tile layout");
  m.def("rounded_tiles", &rounded_tiles, py::call_guard<py::gil_scoped_release>(),
        "round(master + step * eps) of stacked fp32 masters, straight into the tile layout");
  m.def("linear", &linear, py::call_guard<py::gil_scoped_release>(),
        "x @ W^T for a bf16 x and a tile-packed bf16 W, bf16 out");
}
