// A weight kept as 8-bit blocks (GGUF's Q8_0: codes q in -127..127 and a scale d per group of 32
// inputs, w = q·d) multiplied by bfloat16 rows rounded to 8 bits per group of 32 (q8_rows.h), as
// llama.cpp multiplies a Q8_0 tensor: integer products by AVX-512 VNNI `vpdpbusd` or AVX2
// `vpmaddubsw` + `vpmaddwd`, each group's integer sum then scaled in float32.
//
//   y = Σ_g d_g · a_g · Σ_{k∈g} q_k x̂_k      (groups added in order, one float32 FMA each)
//
// The integer sums are exact in both builds, and the float32 steps are the same per output, so
// both builds give the same bits, and a row's result never depends on the other rows.
// `vpdpbusd` multiplies unsigned by signed bytes: it takes the codes as q + 128 (their top bit flipped
// as they are loaded, or looked up so in IQ4_XS's table) against x̂, and each group's sum takes
// 128 · Σ x̂ (q8_rows.h keeps it per row and group) back out, so the pack holds no more than the file.
// AVX2 multiplies |q| by x̂ with q's sign (`vpsignb`, as llama.cpp does), so
// a pair of products (at most 2 · 128 · 127) fits the 16 bits `vpmaddubsw` sums them in.
//
// Layout (`pack_int8_q8`): for each block of 16 outputs, each group, each eighth e of it (inputs
// 4e .. 4e + 3), 64 bytes: byte 4o + j holds output o's input 4e + j (a lane of four bytes per
// output, as `vpdpbusd` reads them). Scales as the file's float16 [N / 16, G, 16].
//
// `iq4xs_q8` multiplies GGUF's IQ4_XS the same way: 4-bit indices into llama.cpp's table of 16 signed
// 8-bit values (kvalues_iq4nl), packed as int4_q8 packs its codes (nibble_layout.h: quarter c's low
// nibbles are eighth 2c, its high ones eighth 2c + 1) and looked up by `vpshufb` before the
// products; per group a signed 6-bit scale s ([N / 16, G, 16] int8) times the float16 d of its
// super-block of 8 groups ([N / 16, G / 8, 16]): d_g = d·s, 4.3 bits a weight as in the file.
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
constexpr int64_t kSuperGroups = 8;  // groups per IQ4_XS super-block
constexpr int kMaxTile = 8;  // rows per pass: their sums stay in registers

// llama.cpp's kvalues_iq4nl: the values an IQ4_NL or IQ4_XS index stands for.
constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

#if ZEROSERVE_AVX512
using Bytes = __m512i;  // one block's 16 outputs × 4 inputs
constexpr int64_t kBytes = 64;
inline Bytes load_bytes(const void* src) { return _mm512_loadu_si512(src); }
inline Bytes nibbles_low(Bytes b) { return _mm512_and_si512(b, _mm512_set1_epi8(0x0F)); }
inline Bytes nibbles_high(Bytes b) { return _mm512_and_si512(_mm512_srli_epi16(b, 4), _mm512_set1_epi8(0x0F)); }
// The table's values + 128, unsigned, as `vpdpbusd` takes them: kIq4Values with their top bits flipped.
inline Bytes look_up(Bytes indices) {
  const __m128i table = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Values)), _mm_set1_epi8(static_cast<char>(0x80)));
  return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(table), indices);
}
// Signed codes q as q + 128, unsigned.
inline Bytes as_unsigned(Bytes codes) { return _mm512_xor_si512(codes, _mm512_set1_epi8(static_cast<char>(0x80))); }
using Lanes = __m512;
inline Lanes load_half(const uint16_t* src) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))); }
inline Lanes load_int8s(const int8_t* src) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)))); }
inline Lanes mul(Lanes a, Lanes b) { return _mm512_mul_ps(a, b); }
#else
using Bytes = __m256i;  // half a block's outputs × 4 inputs
constexpr int64_t kBytes = 32;
inline Bytes load_bytes(const void* src) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)); }
inline Bytes nibbles_low(Bytes b) { return _mm256_and_si256(b, _mm256_set1_epi8(0x0F)); }
inline Bytes nibbles_high(Bytes b) { return _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi8(0x0F)); }
inline Bytes as_unsigned(Bytes codes) { return codes; }  // NOTE: AVX2 multiplies the signed codes (vpsignb)
inline Bytes look_up(Bytes indices) {
  return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Values))), indices);
}
using Lanes = __m256;
inline Lanes load_half(const uint16_t* src) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))); }
inline Lanes load_int8s(const int8_t* src) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src)))); }
inline Lanes mul(Lanes a, Lanes b) { return _mm256_mul_ps(a, b); }
#endif

// int8_q8's codes: eighth e of group g, 64 bytes ([G, 8, 64] for one block of outputs).
struct Int8Codes {
  const int8_t* codes;
  static constexpr int64_t kGroupBytes = kGroup * kBlock;

  void prefetch(int64_t g) const { prefetch_ahead(codes + g * kGroupBytes, kGroupBytes); }

  // The weights of eighths 2c and 2c + 1 of group g, for the outputs from `half` (AVX2: 8·half, signed;
  // AVX-512: all 16, + 128).
  void quarter(int64_t g, int c, int half, Bytes& first, Bytes& second) const {
    first = as_unsigned(load_bytes(codes + g * kGroupBytes + 64 * (2 * c) + kBytes * half));
    second = as_unsigned(load_bytes(codes + g * kGroupBytes + 64 * (2 * c + 1) + kBytes * half));
  }
};

// iq4xs_q8's codes: 4-bit indices in int4_q8's layout ([G, 4, 64]), each looked up in kIq4Values.
struct Iq4Codes {
  const uint8_t* codes;
  static constexpr int64_t kGroupBytes = kGroup * kBlock / 2;

  void prefetch(int64_t g) const { prefetch_ahead(codes + g * kGroupBytes, kGroupBytes); }

  void quarter(int64_t g, int c, int half, Bytes& first, Bytes& second) const {
    const Bytes bytes = load_bytes(codes + g * kGroupBytes + 64 * c + kBytes * half);
    first = look_up(nibbles_low(bytes));
    second = look_up(nibbles_high(bytes));
  }
};

// int8_q8's scales: the file's float16 per group ([G, 16]).
struct GroupScales {
  const uint16_t* scales;
  Lanes scale(int64_t g, int first) const { return load_half(scales + g * kBlock + first); }
};

// iq4xs_q8's: a signed integer per group times the float16 d of its super-block.
struct SuperBlockScales {
  const int8_t* scales;  // [G, 16]
  const uint16_t* d;  // [G / 8, 16]
  Lanes scale(int64_t g, int first) const {
    return mul(load_int8s(scales + g * kBlock + first), load_half(d + g / kSuperGroups * kBlock + first));
  }
};

#if ZEROSERVE_AVX512

// Rows [0, TILE) of x̂ (`k` apart; scales and Σ x̂ [TILE, G]) times one block of 16 outputs into `out`
// (bf16, `out_stride` apart).
template <int TILE, typename Codes, typename Scales>
void tile_block(const int8_t* q, int64_t k, const float* qscales, const int32_t* totals, int64_t num_groups,
                Codes codes, Scales scales, uint16_t* out, int64_t out_stride) {
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
    const int8_t* group_q = q + g * kGroup;
    codes.prefetch(g);
    for (int c = 0; c < 4; ++c) {
      __m512i weights[2];
      codes.quarter(g, c, 0, weights[0], weights[1]);
      for (int h = 0; h < 2; ++h) {
        auto& chain = dot[(2 * c + h) % kChains];
        for (int r = 0; r < TILE; ++r) {
          chain[r] = _mm512_dpbusd_epi32(chain[r], weights[h], _mm512_set1_epi32(load_int32(group_q + r * k + 8 * c + 4 * h)));
        }
      }
    }
    for (int j = 1; j < kChains; ++j) {
      for (int r = 0; r < TILE; ++r) dot[0][r] = _mm512_add_epi32(dot[0][r], dot[j][r]);
    }
    const __m512 d = scales.scale(g, 0);
    for (int r = 0; r < TILE; ++r) {
      const __m512 sum = _mm512_cvtepi32_ps(_mm512_sub_epi32(dot[0][r], _mm512_set1_epi32(128 * totals[r * num_groups + g])));
      acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(sum, _mm512_set1_ps(qscales[r * num_groups + g])), d, acc[r]);
    }
  }
  for (int r = 0; r < TILE; ++r) store_bf16(out + r * out_stride, V16{acc[r]});
}

#else  // AVX2 + FMA + F16C

// As the AVX-512 tile, 8 outputs a register: |q| times x̂ with q's sign by `vpmaddubsw`, then
// `vpmaddwd` by ones (the two pairs of a lane of four) into 32-bit sums.
template <int TILE, typename Codes, typename Scales>
void tile_block(const int8_t* q, int64_t k, const float* qscales, const int32_t* /*totals*/, int64_t num_groups,
                Codes codes, Scales scales, uint16_t* out, int64_t out_stride) {
  const __m256i ones = _mm256_set1_epi16(1);
  alignas(32) float acc[TILE][kBlock] = {};
  for (int64_t g = 0; g < num_groups; ++g) {
    const int8_t* group_q = q + g * kGroup;
    codes.prefetch(g);
    for (int half = 0; half < 2; ++half) {  // outputs 8·half .. 8·half + 7
      __m256i dot[TILE];
      for (int r = 0; r < TILE; ++r) dot[r] = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        __m256i weights[2];
        codes.quarter(g, c, half, weights[0], weights[1]);
        for (int h = 0; h < 2; ++h) {
          const __m256i magnitudes = _mm256_sign_epi8(weights[h], weights[h]);
          for (int r = 0; r < TILE; ++r) {
            const __m256i signed_q = _mm256_sign_epi8(_mm256_set1_epi32(load_int32(group_q + r * k + 8 * c + 4 * h)), weights[h]);
            dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitudes, signed_q), ones));
          }
        }
      }
      const __m256 d = scales.scale(g, 8 * half);
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

template <typename Codes, typename Scales>
using TileFn = void (*)(const int8_t*, int64_t, const float*, const int32_t*, int64_t, Codes, Scales, uint16_t*, int64_t);

template <typename Codes, typename Scales, int... TILES>
constexpr std::array<TileFn<Codes, Scales>, sizeof...(TILES)> tile_table(std::integer_sequence<int, TILES...>) {
  return {&tile_block<TILES + 1, Codes, Scales>...};
}

// x [M, K] bf16 times a block's codes as `codes_at(b)` and `scales_at(b)` give them -> [M, N] bf16.
template <typename Codes, typename Scales, typename CodesAt, typename ScalesAt>
at::Tensor matmul(const char* name, const at::Tensor& x, int64_t num_blocks, int64_t num_groups, CodesAt codes_at,
                  ScalesAt scales_at) {
  const Q8Rows rows(x);
  const int64_t n = num_blocks * kBlock;
  TORCH_CHECK(num_groups == rows.num_groups, name, ": the input has ", rows.k, " columns, the weight ", num_groups * kGroup);
  auto out = at::empty({rows.m, n}, x.options());
  static constexpr auto kTiles = tile_table<Codes, Scales>(std::make_integer_sequence<int, kMaxTile>{});
  auto* outs = reinterpret_cast<uint16_t*>(out.data_ptr());
  for_each_tile(num_blocks, rows.m, kMaxTile, [&](int64_t b, int64_t row, int64_t num_rows) {
    kTiles[num_rows - 1](rows.q.get() + row * rows.k, rows.k, rows.scales.get() + row * num_groups,
                         rows.totals.get() + row * num_groups, num_groups, codes_at(b), scales_at(b),
                         outs + row * n + b * kBlock, n);
  });
  return out;
}


}  // namespace

// codes [N, K] int8, scales [N, K / 32] float32 (float16-exact) -> (packed codes [N / 16, K / 32, 8, 64]
// int8, scales [N / 16, K / 32, 16] float16).
std::vector<at::Tensor> pack_int8_q8(const at::Tensor& codes, const at::Tensor& scales) {
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == at::kChar && scales.scalar_type() == at::kFloat);
  const int64_t n = codes.size(0), k = codes.size(1);
  TORCH_CHECK(n % kBlock == 0 && k % kGroup == 0 && scales.size(0) == n && scales.size(1) == k / kGroup);
  const int64_t num_groups = k / kGroup;
  // [N/16, 16 outputs, G, 8 eighths, 4] -> [N/16, G, 8 eighths, 16 outputs, 4]
  auto packed = codes.contiguous().view({n / kBlock, kBlock, num_groups, 8, 4}).permute({0, 2, 3, 1, 4}).contiguous();
  return {packed.view({n / kBlock, num_groups, 8, 64}), by_block(scales, at::kHalf)};
}

// x [M, K] bf16 @ the packed weight's transpose -> [M, N] bf16, x rounded to 8 bits per group of 32.
at::Tensor int8_q8(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales) {
  TORCH_CHECK(codes.dim() == 4 && codes.scalar_type() == at::kChar && codes.size(2) == 8 && codes.size(3) == 64 && codes.is_contiguous());
  TORCH_CHECK(scales.scalar_type() == at::kHalf && scales.is_contiguous() && scales.numel() == codes.size(0) * codes.size(1) * kBlock);
  const int64_t num_groups = codes.size(1);
  const auto* cs = codes.data_ptr<int8_t>();
  const auto* ds = reinterpret_cast<const uint16_t*>(scales.data_ptr());
  return matmul<Int8Codes, GroupScales>(
      "int8_q8", x, codes.size(0), num_groups,
      [&](int64_t b) { return Int8Codes{cs + b * num_groups * Int8Codes::kGroupBytes}; },
      [&](int64_t b) { return GroupScales{ds + b * num_groups * kBlock}; });
}

// IQ4_XS: indices [N, K] uint8 (0..15), scales [N, K / 32] int8 (−32..31), d [N, K / 256] float32
// (float16-exact) -> (packed indices as int4_q8's [N / 16, K / 32, 4, 64] uint8, scales [N / 16, K / 32, 16]
// int8, d [N / 16, K / 256, 16] float16).
std::vector<at::Tensor> pack_iq4xs_q8(const at::Tensor& indices, const at::Tensor& scales, const at::Tensor& d) {
  TORCH_CHECK(scales.scalar_type() == at::kChar && d.scalar_type() == at::kFloat);
  TORCH_CHECK(indices.dim() == 2 && indices.size(1) % (kGroup * kSuperGroups) == 0 && scales.size(1) * kGroup == indices.size(1));
  TORCH_CHECK(d.size(1) * kSuperGroups == scales.size(1));
  return {pack_low_nibbles(indices), by_block(scales, at::kChar), by_block(d, at::kHalf)};
}

// x [M, K] bf16 @ the packed IQ4_XS weight's transpose -> [M, N] bf16, x rounded to 8 bits per group of 32.
at::Tensor iq4xs_q8(const at::Tensor& x, const at::Tensor& indices, const at::Tensor& scales, const at::Tensor& d) {
  TORCH_CHECK(indices.dim() == 4 && indices.scalar_type() == at::kByte && indices.size(2) == 4 && indices.size(3) == 64 && indices.is_contiguous());
  TORCH_CHECK(scales.scalar_type() == at::kChar && scales.is_contiguous() && scales.numel() == indices.size(0) * indices.size(1) * kBlock);
  TORCH_CHECK(d.scalar_type() == at::kHalf && d.is_contiguous() && d.numel() * kSuperGroups == scales.numel());
  const int64_t num_groups = indices.size(1);
  const auto* is = indices.data_ptr<uint8_t>();
  const auto* ss = scales.data_ptr<int8_t>();
  const auto* ds = reinterpret_cast<const uint16_t*>(d.data_ptr());
  return matmul<Iq4Codes, SuperBlockScales>(
      "iq4xs_q8", x, indices.size(0), num_groups,
      [&](int64_t b) { return Iq4Codes{is + b * num_groups * Iq4Codes::kGroupBytes}; },
      [&](int64_t b) { return SuperBlockScales{ss + b * num_groups * kBlock, ds + b * (num_groups / kSuperGroups) * kBlock}; });
}
