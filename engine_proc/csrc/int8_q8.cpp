// A weight kept as 8-bit blocks (GGUF's Q8_0: codes q in -127..127 and a scale d per group of 32
// inputs, w = q·d) multiplied by bfloat16 rows rounded to 8 bits per group of 32 (q8_rows.h), as
// llama.cpp multiplies a Q8_0 tensor: integer products by AVX-512 VNNI `vpdpbusd` or AVX2
// `vpmaddubsw` + `vpmaddwd`, each group's integer sum then scaled in float32.
//
//   y = Σ_g d_g · a_g · Σ_{k∈g} q_k x̂_k      (groups added in order, one float32 FMA each)
//
// The integer sums are exact in both builds, and the float32 steps are the same per output, so
// both builds give the same bits, and a row's result never depends on the other rows.
// `vpdpbusd` multiplies unsigned by signed bytes: it takes x̂ + 128 (x̂ with its top bit flipped)
// against the signed codes, and the pack's `offsets` (128 · Σ_{k∈g} q_k per output and group) take
// the extra part back out. AVX2 multiplies |q| by x̂ with q's sign (`vpsignb`, as llama.cpp does), so
// a pair of products (at most 2 · 128 · 127) fits the 16 bits `vpmaddubsw` sums them in.
//
// Layout (`pack_int8_q8`): for each block of 16 outputs, each group, each eighth e of it (inputs
// 4e .. 4e + 3), 64 bytes: byte 4o + j holds output o's input 4e + j (a lane of four bytes per
// output, as `vpdpbusd` reads them). Scales as the file's float16 [N / 16, G, 16]; offsets int32, the same shape.
#include <ATen/Parallel.h>
#include <ATen/ATen.h>

#include "q8_rows.h"
#include "vec16.h"

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

namespace {

using namespace zeroserve;

constexpr int64_t kGroup = kQ8Group;
constexpr int64_t kBlock = 16;  // outputs per block
constexpr int64_t kGroupBytes = kGroup * kBlock;
constexpr int kMaxTile = 8;  // rows per pass: their sums stay in registers

#if defined(__AVX512F__) && defined(__AVX512VNNI__)

inline __m512 load_half16(const uint16_t* src) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
}

// Rows [0, TILE) of x̂ (`k` apart; scales [TILE, G]) times one block of 16 outputs into `out`
// (bf16, `out_stride` apart).
template <int TILE>
void tile_block(const int8_t* q, int64_t k, const float* qscales, int64_t num_groups, const int8_t* codes,
                const uint16_t* scales, const int32_t* offsets, uint16_t* out, int64_t out_stride) {
  __m512 acc[TILE];
  for (int r = 0; r < TILE; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < num_groups; ++g) {
    __m512i dot[TILE];
    for (int r = 0; r < TILE; ++r) dot[r] = _mm512_setzero_si512();
    const int8_t* group_codes = codes + g * kGroupBytes;
    const int8_t* group_q = q + g * kGroup;
    for (int e = 0; e < 8; ++e) {
      const __m512i weights = _mm512_loadu_si512(group_codes + 64 * e);
      for (int r = 0; r < TILE; ++r) {
        const int32_t shifted = load_int32(group_q + r * k + 4 * e) ^ static_cast<int32_t>(0x80808080u);
        dot[r] = _mm512_dpbusd_epi32(dot[r], _mm512_set1_epi32(shifted), weights);
      }
    }
    const __m512i offset = _mm512_loadu_si512(offsets + g * kBlock);
    const __m512 d = load_half16(scales + g * kBlock);
    for (int r = 0; r < TILE; ++r) {
      const __m512 sum = _mm512_cvtepi32_ps(_mm512_sub_epi32(dot[r], offset));
      acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(sum, _mm512_set1_ps(qscales[r * num_groups + g])), d, acc[r]);
    }
  }
  for (int r = 0; r < TILE; ++r) store_bf16(out + r * out_stride, V16{acc[r]});
}

#else  // AVX2 + FMA + F16C

inline __m256 load_half8(const uint16_t* src) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
}

// As the AVX-512 tile, 8 outputs a register: |q| times x̂ with q's sign by `vpmaddubsw`, then
// `vpmaddwd` by ones (the two pairs of a lane of four) into 32-bit sums.
template <int TILE>
void tile_block(const int8_t* q, int64_t k, const float* qscales, int64_t num_groups, const int8_t* codes,
                const uint16_t* scales, const int32_t* /*offsets*/, uint16_t* out, int64_t out_stride) {
  const __m256i ones = _mm256_set1_epi16(1);
  alignas(32) float acc[TILE][kBlock] = {};
  for (int64_t g = 0; g < num_groups; ++g) {
    const int8_t* group_codes = codes + g * kGroupBytes;
    const int8_t* group_q = q + g * kGroup;
    for (int half = 0; half < 2; ++half) {  // outputs 8·half .. 8·half + 7
      __m256i dot[TILE];
      for (int r = 0; r < TILE; ++r) dot[r] = _mm256_setzero_si256();
      for (int e = 0; e < 8; ++e) {
        const __m256i weights = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group_codes + 64 * e + 32 * half));
        const __m256i magnitudes = _mm256_sign_epi8(weights, weights);
        for (int r = 0; r < TILE; ++r) {
          const __m256i signed_q = _mm256_sign_epi8(_mm256_set1_epi32(load_int32(group_q + r * k + 4 * e)), weights);
          dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitudes, signed_q), ones));
        }
      }
      const __m256 d = load_half8(scales + g * kBlock + 8 * half);
      for (int r = 0; r < TILE; ++r) {
        const __m256 sum = _mm256_cvtepi32_ps(dot[r]);
        float* row_acc = acc[r] + 8 * half;
        _mm256_store_ps(row_acc, _mm256_fmadd_ps(_mm256_mul_ps(sum, _mm256_set1_ps(qscales[r * num_groups + g])), d,
                                                 _mm256_load_ps(row_acc)));
      }
    }
  }
  for (int r = 0; r < TILE; ++r) store_bf16(out + r * out_stride, load16(acc[r]));
}

#endif

using TileFn = void (*)(const int8_t*, int64_t, const float*, int64_t, const int8_t*, const uint16_t*, const int32_t*,
                        uint16_t*, int64_t);

template <int... TILES>
constexpr std::array<TileFn, sizeof...(TILES)> tile_table(std::integer_sequence<int, TILES...>) {
  return {&tile_block<TILES + 1>...};
}

}  // namespace

// codes [N, K] int8, scales [N, K / 32] float32 (float16-exact) -> (packed codes [N / 16, K / 32, 8, 64]
// int8, scales [N / 16, K / 32, 16] float16, offsets [N / 16, K / 32, 16] int32: 128 · Σ q per group).
std::vector<at::Tensor> pack_int8_q8(const at::Tensor& codes, const at::Tensor& scales) {
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == at::kChar && scales.scalar_type() == at::kFloat);
  const int64_t n = codes.size(0), k = codes.size(1);
  TORCH_CHECK(n % kBlock == 0 && k % kGroup == 0 && scales.size(0) == n && scales.size(1) == k / kGroup);
  const int64_t num_groups = k / kGroup;
  // [N/16, 16 outputs, G, 8 eighths, 4] -> [N/16, G, 8 eighths, 16 outputs, 4]
  auto packed = codes.contiguous().view({n / kBlock, kBlock, num_groups, 8, 4}).permute({0, 2, 3, 1, 4}).contiguous();
  auto block_view = [&](const at::Tensor& t) { return t.contiguous().view({n / kBlock, kBlock, num_groups}).permute({0, 2, 1}); };
  auto offsets = codes.view({n, num_groups, kGroup}).sum(-1, false, at::kInt).mul(128);
  return {packed.view({n / kBlock, num_groups, 8, 64}), block_view(scales).to(at::kHalf).contiguous(),
          block_view(offsets).contiguous()};
}

// x [M, K] bf16 @ the packed weight's transpose -> [M, N] bf16, x rounded to 8 bits per group of 32.
at::Tensor int8_q8(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& offsets) {
  TORCH_CHECK(codes.dim() == 4 && codes.scalar_type() == at::kChar && codes.size(2) == 8 && codes.size(3) == 64 && codes.is_contiguous());
  TORCH_CHECK(scales.scalar_type() == at::kHalf && scales.is_contiguous() && offsets.scalar_type() == at::kInt && offsets.is_contiguous());
  const Q8Rows rows(x);
  const int64_t num_blocks = codes.size(0), num_groups = codes.size(1), n = num_blocks * kBlock;
  TORCH_CHECK(num_groups == rows.num_groups, "int8_q8: the input has ", rows.k, " columns, the weight ", num_groups * kGroup);
  auto out = at::empty({rows.m, n}, x.options());
  static constexpr auto kTiles = tile_table(std::make_integer_sequence<int, kMaxTile>{});
  const auto* cs = codes.data_ptr<int8_t>();
  const auto* ds = reinterpret_cast<const uint16_t*>(scales.data_ptr());
  const auto* os = offsets.data_ptr<int32_t>();
  auto* outs = reinterpret_cast<uint16_t*>(out.data_ptr());
  for_each_tile(num_blocks, rows.m, kMaxTile, [&](int64_t b, int64_t row, int64_t num_rows) {
    kTiles[num_rows - 1](rows.q.get() + row * rows.k, rows.k, rows.scales.get() + row * num_groups, num_groups,
                         cs + b * num_groups * kGroupBytes, ds + b * num_groups * kBlock, os + b * num_groups * kBlock,
                         outs + row * n + b * kBlock, n);
  });
  return out;
}
