// A weight kept as GGUF's MXFP4 blocks (gpt-oss's experts: per group of 32 inputs, 4-bit codes q standing
// for ggml's kvalues_mxfp4, e2m1's values doubled, v(q) in −12..12, and an 8-bit exponent E: w = v(q)·2^(E − 128))
// multiplied by bfloat16 rows rounded to 8 bits per group of 32 (q8_rows.h: x̂ and a scale a per row and
// group): integer products by AVX-512 VNNI `vpdpbusd` or AVX2 `vpmaddubsw` + `vpmaddwd`, each group's
// integer sum then scaled in float32.
//
//   y = Σ_g (a_g · Σ_{k∈g} v_k x̂_k) · 2^(E_g − 128)      (groups added in order, one float32 FMA each)
//
// The multiplying instructions take one operand unsigned: the table `vpshufb` looks the codes up in holds
// v + 12 (0..24), and each group's integer sum takes 12 · Σ x̂ (q8_rows.h keeps it per row and group) back
// out: no per-weight offsets to store, as int8_q8 keeps for its signed codes. The integer sums are exact in
// both builds (AVX2: pairs at most 2 · 24 · 127, two quarters of them summed in 16 bits, at most 24384)
// and the float32 steps are the same per output, so both builds give the same bits, and a row's result
// never depends on the other rows.
//
// 2^(E − 128) is built from its bits as 2^(E − 126) · 0.25, exact for every E the pack takes (0..252; E 0
// and 1 give subnormal scales). Above 252 a block's weights (up to 12 · 2^(E − 128)) pass float32's range:
// the pack refuses them (e8m0's 255 is not a number at all).
//
// Layout (`pack_mxfp4_q8`): the codes as int4_q8 packs its own (nibble_layout.h), the exponents as the
// file's bytes [N / 16, G, 16]: 17 bytes per 32 weights, as the file holds them.
#include <ATen/Parallel.h>
#include <ATen/ATen.h>

#include "nibble_layout.h"
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
constexpr int64_t kGroupBytes = kGroup * kBlock / 2;
constexpr int kMaxTile = 8;  // rows per pass: their sums stay in registers
constexpr int32_t kOffset = 12;  // added to each value so that it is unsigned
constexpr int64_t kMaxExponent = 252;  // 12 · 2^124 is float32's; 12 · 2^125 is not

// ggml's kvalues_mxfp4 {0, 1, 2, 3, 4, 6, 8, 12, 0, −1, −2, −3, −4, −6, −8, −12} plus kOffset.
alignas(16) constexpr uint8_t kShiftedValues[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

#if ZEROSERVE_AVX512

// 2^(E − 128) for the 16 exponents at `src`.
inline __m512 steps(const uint8_t* src) {
  const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  const __m512 four_steps = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(1)), 23));
  return _mm512_mul_ps(four_steps, _mm512_set1_ps(0.25f));
}

// Rows [0, TILE) of x̂ (`k` apart; scales and Σ x̂ [TILE, G]) times one block of 16 outputs into `out`
// (bf16, `out_stride` apart).
template <int TILE>
void tile_block(const int8_t* q, int64_t k, const float* qscales, const int32_t* totals, int64_t num_groups,
                const uint8_t* codes, const uint8_t* exponents, uint16_t* out, int64_t out_stride) {
  const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kShiftedValues)));
  const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
  __m512 acc[TILE];
  for (int r = 0; r < TILE; ++r) acc[r] = _mm512_setzero_ps();
  constexpr int kChains = TILE == 1 ? 4 : (TILE <= 4 ? 2 : 1);
  for (int64_t g = 0; g < num_groups; ++g) {
    // NOTE: a row's 8 products into kChains sums, added at the group's end (int4_q8.cpp's reason): integer sums,
    // the same bits in any order.
    __m512i dot[kChains][TILE];
    for (int j = 0; j < kChains; ++j) {
      for (int r = 0; r < TILE; ++r) dot[j][r] = _mm512_setzero_si512();
    }
    prefetch_ahead(codes + g * kGroupBytes, kGroupBytes);
    const int8_t* group_q = q + g * kGroup;
    for (int c = 0; c < 4; ++c) {
      const __m512i bytes = _mm512_loadu_si512(codes + g * kGroupBytes + 64 * c);
      const __m512i first = _mm512_shuffle_epi8(table, _mm512_and_si512(bytes, low_nibbles));
      const __m512i second = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low_nibbles));
      auto& even = dot[(2 * c) % kChains];
      auto& odd = dot[(2 * c + 1) % kChains];
      for (int r = 0; r < TILE; ++r) {
        even[r] = _mm512_dpbusd_epi32(even[r], first, _mm512_set1_epi32(load_int32(group_q + r * k + 8 * c)));
        odd[r] = _mm512_dpbusd_epi32(odd[r], second, _mm512_set1_epi32(load_int32(group_q + r * k + 8 * c + 4)));
      }
    }
    for (int j = 1; j < kChains; ++j) {
      for (int r = 0; r < TILE; ++r) dot[0][r] = _mm512_add_epi32(dot[0][r], dot[j][r]);
    }
    const __m512 step = steps(exponents + g * kBlock);
    for (int r = 0; r < TILE; ++r) {
      const __m512i sum = _mm512_sub_epi32(dot[0][r], _mm512_set1_epi32(kOffset * totals[r * num_groups + g]));
      acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(qscales[r * num_groups + g])), step, acc[r]);
    }
  }
  for (int r = 0; r < TILE; ++r) store_bf16(out + r * out_stride, V16{acc[r]});
}

#else  // AVX2 + FMA + F16C

// 2^(E − 128) for the 8 exponents at `src`.
inline __m256 steps(const uint8_t* src) {
  const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src)));
  const __m256 four_steps = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(1)), 23));
  return _mm256_mul_ps(four_steps, _mm256_set1_ps(0.25f));
}

// As the AVX-512 tile, 8 outputs a register: `vpmaddubsw` (pairs of products), two quarters' pairs added
// in 16 bits, then `vpmaddwd` by ones (the two pairs of a lane of four) into 32-bit sums.
template <int TILE>
void tile_block(const int8_t* q, int64_t k, const float* qscales, const int32_t* totals, int64_t num_groups,
                const uint8_t* codes, const uint8_t* exponents, uint16_t* out, int64_t out_stride) {
  const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kShiftedValues)));
  const __m256i low_nibbles = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  alignas(32) float acc[TILE][kBlock] = {};
  for (int64_t g = 0; g < num_groups; ++g) {
    const int8_t* group_q = q + g * kGroup;
    prefetch_ahead(codes + g * kGroupBytes, kGroupBytes);
    for (int half = 0; half < 2; ++half) {  // outputs 8·half .. 8·half + 7
      __m256i dot[TILE], pairs[TILE];
      for (int r = 0; r < TILE; ++r) dot[r] = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + g * kGroupBytes + 64 * c + 32 * half));
        const __m256i first = _mm256_shuffle_epi8(table, _mm256_and_si256(bytes, low_nibbles));
        const __m256i second = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low_nibbles));
        for (int r = 0; r < TILE; ++r) {
          const __m256i both = _mm256_add_epi16(
              _mm256_maddubs_epi16(first, _mm256_set1_epi32(load_int32(group_q + r * k + 8 * c))),
              _mm256_maddubs_epi16(second, _mm256_set1_epi32(load_int32(group_q + r * k + 8 * c + 4))));
          pairs[r] = c % 2 == 0 ? both : _mm256_add_epi16(pairs[r], both);
          if (c % 2 == 1) dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(pairs[r], ones));
        }
      }
      const __m256 step = steps(exponents + g * kBlock + 8 * half);
      for (int r = 0; r < TILE; ++r) {
        const __m256i sum = _mm256_sub_epi32(dot[r], _mm256_set1_epi32(kOffset * totals[r * num_groups + g]));
        float* row_acc = acc[r] + 8 * half;
        _mm256_store_ps(row_acc, _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(qscales[r * num_groups + g])),
                                                 step, _mm256_load_ps(row_acc)));
      }
    }
  }
  for (int r = 0; r < TILE; ++r) store_bf16(out + r * out_stride, load16(acc[r]));
}

#endif

using TileFn = void (*)(const int8_t*, int64_t, const float*, const int32_t*, int64_t, const uint8_t*, const uint8_t*,
                        uint16_t*, int64_t);

template <int... TILES>
constexpr std::array<TileFn, sizeof...(TILES)> tile_table(std::integer_sequence<int, TILES...>) {
  return {&tile_block<TILES + 1>...};
}

}  // namespace

// MXFP4: codes [N, K] uint8 (0..15), exponents [N, K / 32] uint8 (0..252) -> (packed codes as int4_q8's
// [N / 16, K / 32, 4, 64] uint8, exponents [N / 16, K / 32, 16] uint8).
std::vector<at::Tensor> pack_mxfp4_q8(const at::Tensor& codes, const at::Tensor& exponents) {
  TORCH_CHECK(exponents.dim() == 2 && exponents.scalar_type() == at::kByte);
  TORCH_CHECK(codes.dim() == 2 && exponents.size(0) == codes.size(0) && exponents.size(1) * kGroup == codes.size(1));
  const int64_t top = exponents.numel() == 0 ? 0 : exponents.max().item<uint8_t>();
  TORCH_CHECK(top <= kMaxExponent, "mxfp4_q8: an MXFP4 block's exponent is ", top, ": above ", kMaxExponent,
              " its weights (up to 12 · 2^(E − 128)) pass float32's range");
  return {pack_low_nibbles(codes), by_block(exponents, at::kByte)};
}

// x [M, K] bf16 @ the packed MXFP4 weight's transpose -> [M, N] bf16, x rounded to 8 bits per group of 32.
at::Tensor mxfp4_q8(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& exponents) {
  TORCH_CHECK(codes.dim() == 4 && codes.scalar_type() == at::kByte && codes.size(2) == 4 && codes.size(3) == 64 && codes.is_contiguous());
  TORCH_CHECK(exponents.scalar_type() == at::kByte && exponents.is_contiguous() && exponents.numel() * kGroupBytes / kBlock == codes.numel());
  const Q8Rows rows(x);
  const int64_t num_blocks = codes.size(0), num_groups = codes.size(1), n = num_blocks * kBlock;
  TORCH_CHECK(num_groups == rows.num_groups, "mxfp4_q8: the input has ", rows.k, " columns, the weight ", num_groups * kGroup);
  auto out = at::empty({rows.m, n}, x.options());
  static constexpr auto kTiles = tile_table(std::make_integer_sequence<int, kMaxTile>{});
  const auto* cs = codes.data_ptr<uint8_t>();
  const auto* es = exponents.data_ptr<uint8_t>();
  auto* os = reinterpret_cast<uint16_t*>(out.data_ptr());
  for_each_tile(num_blocks, rows.m, kMaxTile, [&](int64_t b, int64_t row, int64_t num_rows) {
    kTiles[num_rows - 1](rows.q.get() + row * rows.k, rows.k, rows.scales.get() + row * num_groups,
                         rows.totals.get() + row * num_groups, num_groups, cs + b * num_groups * kGroupBytes,
                         es + b * num_groups * kBlock, os + row * n + b * kBlock, n);
  });
  return out;
}
