// A weight kept as its GGUF 4-bit blocks (codes q in 0..15, a scale d and a minimum m per group of
// 32 inputs: w = q·d + m) multiplied by bfloat16 rows that are first rounded to 8 bits per group of
// 32 (a scale a per row and group: x̂ = round(x / a), a = max|x| / 127, as llama.cpp's Q8
// activations): integer products of the codes (unsigned) with x̂ (signed), by AVX-512 VNNI
// `vpdpbusd` (64 products an instruction) or AVX2 `vpmaddubsw` + `vpmaddwd`.
//
//   y = Σ_g d_g · a_g · Σ_{k∈g} q_k x̂_k + m_g · a_g · Σ_{k∈g} x̂_k  =  x̂ · w
//
// The minimum's part sums the rounded inputs too (q8_rows.h), as llama.cpp's Q8_1 does: x's 8-bit
// rounding (at most half a step, a / 2, per input) then meets the weight w itself. With the exact sums
// of x it met the codes' unsigned part d·q alone, about 8 steps of d off centre, and on the default
// model's FFN down rows the products strayed 1.5% from x̂ · w instead of 0.15%.
//
// Layout (`pack_int4_q8`): for each block of 16 outputs, each group, each quarter c of it (inputs
// 8c .. 8c + 7), 64 bytes: byte 4o + j holds output o's input 8c + j in its low nibble and input
// 8c + 4 + j in its high one (a lane of four bytes per output, as `vpdpbusd` reads them). Scales
// and minimums as the file's float16, [N / 16, G, 16] (float32 would add half again to the bytes a step reads).
//
// `int4k_q8` multiplies GGUF's Q4_K the same way: its codes in the same layout, and per group a 6-bit
// scale s and minimum m ([N / 16, G, 16] bytes) that multiply the float16 d and dmin of their
// super-block of 8 groups ([N / 16, G / 8, 16]): d_g = d·s, m_g = −dmin·m, as the file holds them
// (4.6 bits a weight where the file has 4.5), each computed once per group and block for all rows.
//
// `int5_q8` (GGUF's Q5_0, Q5_1) and `int5k_q8` (Q5_K) take 5-bit codes (0..31): the low 4 bits in the
// same layout, the fifth bits beside them ([N / 16, G, 64]: per output's lane of four, bit 2c + h of
// byte 4o + j is the input that nibble h of quarter c holds), put back at bit 4 before the products.
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

constexpr int64_t kGroup = 32;
constexpr int64_t kBlock = 16;  // outputs per block
constexpr int64_t kGroupBytes = kGroup * kBlock / 2;
constexpr int64_t kHighBytes = kGroup * kBlock / 8;  // a group's fifth bits for one block
constexpr int64_t kSuperGroups = 8;  // groups per Q4_K super-block
constexpr int kMaxTile = 8;  // rows per pass: their sums stay in registers

#if ZEROSERVE_AVX512
using Lanes = __m512;  // one block's 16 outputs
inline Lanes load_half(const uint16_t* src) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))); }
inline Lanes load_bytes(const uint8_t* src) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)))); }
inline Lanes mul(Lanes a, Lanes b) { return _mm512_mul_ps(a, b); }
inline Lanes negate(Lanes a) { return _mm512_sub_ps(_mm512_setzero_ps(), a); }
constexpr int kLanes = 16;
#else
using Lanes = __m256;  // half a block's outputs
inline Lanes load_half(const uint16_t* src) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))); }
inline Lanes load_bytes(const uint8_t* src) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src)))); }
inline Lanes mul(Lanes a, Lanes b) { return _mm256_mul_ps(a, b); }
inline Lanes negate(Lanes a) { return _mm256_sub_ps(_mm256_setzero_ps(), a); }
constexpr int kLanes = 8;
#endif

// int4_q8's scales and minimums: the file's float16 per group ([G, 16] for one block of outputs).
struct GroupScales {
  const uint16_t* scales;
  const uint16_t* mins;

  GroupScales at_block(int64_t b, int64_t num_groups) const {
    return {scales + b * num_groups * kBlock, mins + b * num_groups * kBlock};
  }
  // Outputs `first` .. first + kLanes − 1 of group g.
  Lanes scale(int64_t g, int first) const { return load_half(scales + g * kBlock + first); }
  Lanes min(int64_t g, int first) const { return load_half(mins + g * kBlock + first); }
};

// int4k_q8's (Q4_K): 6-bit integers per group times the float16 d and dmin of the group's super-block.
struct SuperBlockScales {
  const uint8_t* scales;
  const uint8_t* mins;
  const uint16_t* d;
  const uint16_t* dmin;

  SuperBlockScales at_block(int64_t b, int64_t num_groups) const {
    const int64_t num_supers = num_groups / kSuperGroups;
    return {scales + b * num_groups * kBlock, mins + b * num_groups * kBlock, d + b * num_supers * kBlock,
            dmin + b * num_supers * kBlock};
  }
  Lanes scale(int64_t g, int first) const {
    return mul(load_bytes(scales + g * kBlock + first), load_half(d + g / kSuperGroups * kBlock + first));
  }
  Lanes min(int64_t g, int first) const {
    return negate(mul(load_bytes(mins + g * kBlock + first), load_half(dmin + g / kSuperGroups * kBlock + first)));
  }
};

#if ZEROSERVE_AVX512

// Rows [0, TILE) of x̂ (`k` apart; scales and sums [TILE, G]) times one block of 16 outputs into
// `out` (bf16, `out_stride` apart); with HIGH, each code's fifth bit from `high` ([G, 64]).
template <int TILE, typename Scales, bool HIGH>
void tile_block(const int8_t* q, int64_t k, const float* qscales, const float* sums, int64_t num_groups,
                const uint8_t* codes, const uint8_t* high, Scales block_scales, uint16_t* out, int64_t out_stride) {
  const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
  const __m512i fifth_bit = _mm512_set1_epi8(0x10);
  __m512 acc[TILE];
  for (int r = 0; r < TILE; ++r) acc[r] = _mm512_setzero_ps();
  // NOTE: a group's 8 products per row into kChains sums, added at its end: one sum's chain of 8 `vpdpbusd` (each
  // waiting for the last) held one row to 12 weights a cycle, below DRAM's rate on Zen 5; integer sums, so the
  // same bits in any order.
  constexpr int kChains = TILE == 1 ? 4 : (TILE <= 4 ? 2 : 1);
  for (int64_t g = 0; g < num_groups; ++g) {
    __m512i dot[kChains][TILE];
    for (int j = 0; j < kChains; ++j) {
      for (int r = 0; r < TILE; ++r) dot[j][r] = _mm512_setzero_si512();
    }
    const uint8_t* group_codes = codes + g * kGroupBytes;
    const int8_t* group_q = q + g * kGroup;
    prefetch_ahead(group_codes, kGroupBytes);
    __m512i highs = HIGH ? _mm512_loadu_si512(high + g * kHighBytes) : _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      const __m512i bytes = _mm512_loadu_si512(group_codes + 64 * c);
      __m512i first = _mm512_and_si512(bytes, low_nibbles);
      __m512i second = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low_nibbles);
      if constexpr (HIGH) {  // quarter c's bits at 2c, 2c + 1 (shifted down to 0, 1 as c goes) to bit 4
        first = _mm512_or_si512(first, _mm512_and_si512(_mm512_slli_epi16(highs, 4), fifth_bit));
        second = _mm512_or_si512(second, _mm512_and_si512(_mm512_slli_epi16(highs, 3), fifth_bit));
        highs = _mm512_srli_epi16(highs, 2);
      }
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
    const __m512 d = block_scales.scale(g, 0);
    const __m512 m = block_scales.min(g, 0);
    for (int r = 0; r < TILE; ++r) {
      const __m512 scaled = _mm512_mul_ps(_mm512_cvtepi32_ps(dot[0][r]), _mm512_set1_ps(qscales[r * num_groups + g]));
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(sums[r * num_groups + g]), m, _mm512_fmadd_ps(scaled, d, acc[r]));
    }
  }
  for (int r = 0; r < TILE; ++r) store_bf16(out + r * out_stride, V16{acc[r]});
}

#else  // AVX2 + FMA + F16C

// As the AVX-512 tile, 8 outputs a register: `vpmaddubsw` (pairs of products, at most 2·15·127, or
// 2·31·127 with a fifth bit), added per row in 16 bits (4-bit: the group's 8 of them, at most 8·3810 =
// 30480; 5-bit: 4 of them, at most 4·7874 = 31496: no overflow), then `vpmaddwd` by ones (the two
// pairs of a lane of four) into 32-bit sums.
template <int TILE, typename Scales, bool HIGH>
void tile_block(const int8_t* q, int64_t k, const float* qscales, const float* sums, int64_t num_groups,
                const uint8_t* codes, const uint8_t* high, Scales block_scales, uint16_t* out, int64_t out_stride) {
  const __m256i low_nibbles = _mm256_set1_epi8(0x0F);
  const __m256i fifth_bit = _mm256_set1_epi8(0x10);
  const __m256i ones = _mm256_set1_epi16(1);
  alignas(32) float acc[TILE][kBlock] = {};
  for (int64_t g = 0; g < num_groups; ++g) {
    const uint8_t* group_codes = codes + g * kGroupBytes;
    const int8_t* group_q = q + g * kGroup;
    prefetch_ahead(group_codes, kGroupBytes);
    for (int half = 0; half < 2; ++half) {  // outputs 8·half .. 8·half + 7
      __m256i pairs[TILE];
      __m256i first_half[HIGH ? TILE : 1];  // 5-bit: the 32-bit sums of quarters 0 and 1
      for (int r = 0; r < TILE; ++r) pairs[r] = _mm256_setzero_si256();
      __m256i highs = HIGH ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(high + g * kHighBytes + 32 * half))
                           : _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group_codes + 64 * c + 32 * half));
        __m256i first = _mm256_and_si256(bytes, low_nibbles);
        __m256i second = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low_nibbles);
        if constexpr (HIGH) {
          first = _mm256_or_si256(first, _mm256_and_si256(_mm256_slli_epi16(highs, 4), fifth_bit));
          second = _mm256_or_si256(second, _mm256_and_si256(_mm256_slli_epi16(highs, 3), fifth_bit));
          highs = _mm256_srli_epi16(highs, 2);
        }
        for (int r = 0; r < TILE; ++r) {
          pairs[r] = _mm256_add_epi16(pairs[r], _mm256_add_epi16(
              _mm256_maddubs_epi16(first, _mm256_set1_epi32(load_int32(group_q + r * k + 8 * c))),
              _mm256_maddubs_epi16(second, _mm256_set1_epi32(load_int32(group_q + r * k + 8 * c + 4)))));
          if constexpr (HIGH) {
            if (c == 1) {
              first_half[r] = _mm256_madd_epi16(pairs[r], ones);
              pairs[r] = _mm256_setzero_si256();
            }
          }
        }
      }
      const __m256 d = block_scales.scale(g, 8 * half);
      const __m256 m = block_scales.min(g, 8 * half);
      for (int r = 0; r < TILE; ++r) {
        __m256i dot = _mm256_madd_epi16(pairs[r], ones);
        if constexpr (HIGH) dot = _mm256_add_epi32(first_half[r], dot);
        const __m256 scaled = _mm256_mul_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(qscales[r * num_groups + g]));
        float* row_acc = acc[r] + 8 * half;
        _mm256_store_ps(row_acc, _mm256_fmadd_ps(_mm256_set1_ps(sums[r * num_groups + g]), m,
                                                 _mm256_fmadd_ps(scaled, d, _mm256_load_ps(row_acc))));
      }
    }
  }
  for (int r = 0; r < TILE; ++r) store_bf16(out + r * out_stride, load16(acc[r]));
}

#endif

template <typename Scales, bool HIGH>
using TileFn = void (*)(const int8_t*, int64_t, const float*, const float*, int64_t, const uint8_t*, const uint8_t*, Scales,
                        uint16_t*, int64_t);

template <typename Scales, bool HIGH, int... TILES>
constexpr std::array<TileFn<Scales, HIGH>, sizeof...(TILES)> tile_table(std::integer_sequence<int, TILES...>) {
  return {&tile_block<TILES + 1, Scales, HIGH>...};
}

// x [M, K] bf16 times the packed codes (with HIGH, their fifth bits `high`), scaled per group as
// `scales` says -> [M, N] bf16.
template <typename Scales, bool HIGH = false>
at::Tensor matmul(const char* name, const at::Tensor& x, const at::Tensor& codes, Scales scales, const at::Tensor* high = nullptr) {
  TORCH_CHECK(codes.dim() == 4 && codes.size(2) == 4 && codes.size(3) == 64 && codes.is_contiguous());
  const uint8_t* hs = nullptr;
  if constexpr (HIGH) {
    TORCH_CHECK(high->is_contiguous() && high->scalar_type() == at::kByte && high->numel() * 4 == codes.numel());
    hs = high->data_ptr<uint8_t>();
  }
  const Q8Rows rows(x);
  const int64_t num_blocks = codes.size(0), num_groups = codes.size(1), n = num_blocks * kBlock;
  TORCH_CHECK(num_groups == rows.num_groups, name, ": the input has ", rows.k, " columns, the weight ", num_groups * kGroup);
  auto out = at::empty({rows.m, n}, x.options());
  static constexpr auto kTiles = tile_table<Scales, HIGH>(std::make_integer_sequence<int, kMaxTile>{});
  const auto* cs = codes.data_ptr<uint8_t>();
  auto* os = reinterpret_cast<uint16_t*>(out.data_ptr());
  for_each_tile(num_blocks, rows.m, kMaxTile, [&](int64_t b, int64_t row, int64_t num_rows) {
    kTiles[num_rows - 1](rows.q.get() + row * rows.k, rows.k, rows.scales.get() + row * num_groups,
                         rows.sums.get() + row * num_groups, num_groups, cs + b * num_groups * kGroupBytes,
                         HIGH ? hs + b * num_groups * kHighBytes : nullptr, scales.at_block(b, num_groups),
                         os + row * n + b * kBlock, n);
  });
  return out;
}

// The fifth bits of codes [N, K] (0..31): [N / 16, K / 32, 64], byte 4o + j holding at bit 2c + h output
// o's input 8c + 4h + j (the input its nibble h of quarter c holds).
at::Tensor pack_fifth_bits(const at::Tensor& codes) {
  const auto lanes = nibble_lanes(codes).bitwise_right_shift(4).bitwise_and(1);  // [N/16, G, 4, 2, 16, 4]
  auto bits = at::zeros({lanes.size(0), lanes.size(1), 16, 4}, codes.options());
  for (int c = 0; c < 4; ++c) {
    for (int h = 0; h < 2; ++h) bits.bitwise_or_(lanes.select(2, c).select(2, h).bitwise_left_shift(2 * c + h));
  }
  return bits.view({lanes.size(0), lanes.size(1), 64});
}

const uint16_t* halves(const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kHalf && t.is_contiguous());
  return reinterpret_cast<const uint16_t*>(t.data_ptr());
}

const uint8_t* bytes(const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kByte && t.is_contiguous());
  return t.data_ptr<uint8_t>();
}

}  // namespace

// codes [N, K] uint8 (0..15), scales and mins [N, K / 32] float32 (float16-exact) -> (packed codes
// [N / 16, K / 32, 4, 64] uint8, scales [N / 16, K / 32, 16] float16, mins the same).
std::vector<at::Tensor> pack_int4_q8(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins) {
  TORCH_CHECK(scales.scalar_type() == at::kFloat && mins.scalar_type() == at::kFloat && mins.sizes() == scales.sizes());
  TORCH_CHECK(scales.size(0) == codes.size(0) && scales.size(1) * kGroup == codes.size(1));
  return {pack_low_nibbles(codes), by_block(scales, at::kHalf), by_block(mins, at::kHalf)};
}

// Q5_0, Q5_1: codes [N, K] uint8 (0..31), scales and mins as pack_int4_q8's -> (its packing of the low
// 4 bits, the fifth bits [N / 16, K / 32, 64] uint8, scales, mins).
std::vector<at::Tensor> pack_int5_q8(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins) {
  auto packed = pack_int4_q8(codes, scales, mins);
  packed.insert(packed.begin() + 1, pack_fifth_bits(codes));
  return packed;
}

// x [M, K] bf16 @ the packed weight's transpose -> [M, N] bf16, x rounded to 8 bits per group of 32.
at::Tensor int4_q8(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins) {
  return matmul("int4_q8", x, codes, GroupScales{halves(scales), halves(mins)});
}

at::Tensor int5_q8(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& high, const at::Tensor& scales,
                   const at::Tensor& mins) {
  return matmul<GroupScales, true>("int5_q8", x, codes, GroupScales{halves(scales), halves(mins)}, &high);
}

// Q4_K: codes [N, K] uint8 (0..15), scales and mins [N, K / 32] uint8 (0..63), d and dmin [N, K / 256]
// float32 (float16-exact) -> (packed codes as int4_q8's, scales and mins [N / 16, K / 32, 16] uint8,
// d and dmin [N / 16, K / 256, 16] float16).
std::vector<at::Tensor> pack_int4k_q8(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                                      const at::Tensor& d, const at::Tensor& dmin) {
  TORCH_CHECK(scales.scalar_type() == at::kByte && mins.scalar_type() == at::kByte && mins.sizes() == scales.sizes());
  TORCH_CHECK(d.scalar_type() == at::kFloat && dmin.sizes() == d.sizes() && codes.size(1) % (kGroup * kSuperGroups) == 0);
  TORCH_CHECK(scales.size(1) * kGroup == codes.size(1) && d.size(1) * kSuperGroups == scales.size(1));
  return {pack_low_nibbles(codes), by_block(scales, at::kByte), by_block(mins, at::kByte), by_block(d, at::kHalf),
          by_block(dmin, at::kHalf)};
}

// x [M, K] bf16 @ the packed Q4_K weight's transpose -> [M, N] bf16, x rounded to 8 bits per group of 32.
at::Tensor int4k_q8(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                    const at::Tensor& d, const at::Tensor& dmin) {
  return matmul("int4k_q8", x, codes, SuperBlockScales{bytes(scales), bytes(mins), halves(d), halves(dmin)});
}

// Q5_K: codes [N, K] uint8 (0..31), the rest as pack_int4k_q8's -> (its packing of the low 4 bits, the
// fifth bits [N / 16, K / 32, 64] uint8, scales, mins, d, dmin).
std::vector<at::Tensor> pack_int5k_q8(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                                      const at::Tensor& d, const at::Tensor& dmin) {
  auto packed = pack_int4k_q8(codes, scales, mins, d, dmin);
  packed.insert(packed.begin() + 1, pack_fifth_bits(codes));
  return packed;
}

at::Tensor int5k_q8(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& high, const at::Tensor& scales,
                    const at::Tensor& mins, const at::Tensor& d, const at::Tensor& dmin) {
  return matmul<SuperBlockScales, true>("int5k_q8", x, codes, SuperBlockScales{bytes(scales), bytes(mins), halves(d), halves(dmin)}, &high);
}
