// A weight kept as GGUF's Q6_K blocks (6-bit codes q in 0..63, a signed 8-bit scale s per sub-block
// of 16 inputs, a float16 d per super-block of 256: w = d·s·(q − 32)) multiplied by bfloat16 rows
// rounded to 8 bits per group of 32 (q8_rows.h), as llama.cpp multiplies Q6_K: integer products of
// the codes (unsigned) with x̂ (signed) by AVX-512 VNNI `vpdpbusd` or AVX2 `vpmaddubsw` + `vpmaddwd`,
// the offset 32 taken out by the sub-block's integer sum of x̂ (b_j = Σ_{k∈j} x̂_k):
//
//   y = Σ_g a_g · (d·s_{2g} · (Σ_{k∈2g} q_k x̂_k − 32·b_{2g}) + d·s_{2g+1} · (Σ_{k∈2g+1} q_k x̂_k − 32·b_{2g+1}))
//
// The integer sums are exact in both builds and the float32 steps are the same per output, so both
// builds give the same bits, and a row's result never depends on the other rows.
//
// Layout (`pack_int6k_q8`), 6.56 bits a weight as in the file: the codes' low 4 bits as int4_q8's
// (nibble_layout.h: [N / 16, G, 4 quarters, 64]); their top two bits [N / 16, G, 2, 64], pair p's
// byte 4o + j holding, two bits each from the lowest, output o's inputs 16p + j, 16p + 4 + j,
// 16p + 8 + j, 16p + 12 + j (quarters 2p and 2p + 1, as their nibbles hold them); the scales int8
// [N / 16, K / 16, 16]; d as the file's float16 [N / 16, K / 256, 16].
#include <ATen/Parallel.h>
#include <ATen/ATen.h>

#include "nibble_layout.h"
#include "q8_rows.h"
#include "vec16.h"

#include <array>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace {

using namespace zeroserve;

constexpr int64_t kGroup = kNibbleGroup;
constexpr int64_t kBlock = kNibbleBlock;
constexpr int64_t kLowBytes = kGroup * kBlock / 2;  // a group's low nibbles for one block
constexpr int64_t kHighBytes = kGroup * kBlock / 4;  // its top bit pairs
constexpr int64_t kSuperGroups = 8;  // groups per super-block
constexpr int kMaxTile = 8;  // rows per pass: their sums stay in registers

// The weights of one block (16 outputs) and the rows' rounding for the tile functions.
struct BlockWeights {
  const uint8_t* low;  // [G, 4, 64]
  const uint8_t* high;  // [G, 2, 64]
  const int8_t* scales;  // [2G, 16]
  const uint16_t* d;  // [G / 8, 16]
};

struct TileRows {
  const int8_t* q;  // x̂ [TILE, K], `k` apart
  int64_t k;
  const float* qscales;  // a [TILE, G]
  const int32_t* sub_sums;  // b [TILE, 2G]
};

#if ZEROSERVE_AVX512

// d·s of sub-block j for the block's 16 outputs.
inline __m512 sub_scale(const BlockWeights& w, int64_t j) {
  const __m512 s = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.scales + j * kBlock))));
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.d + j / 2 / kSuperGroups * kBlock)));
  return _mm512_mul_ps(s, d);
}

// Rows [0, TILE) times one block of 16 outputs into `out` (bf16, `out_stride` apart).
template <int TILE>
void tile_block(TileRows rows, int64_t num_groups, BlockWeights w, uint16_t* out, int64_t out_stride) {
  const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
  const __m512i top_pair = _mm512_set1_epi8(0x30);
  __m512 acc[TILE];
  for (int r = 0; r < TILE; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < num_groups; ++g) {
    __m512i dot[2][TILE];
    const int8_t* group_q = rows.q + g * kGroup;
    prefetch_ahead(w.low + g * kLowBytes, kLowBytes);
    prefetch_ahead(w.high + g * kHighBytes, kHighBytes);
    for (int p = 0; p < 2; ++p) {  // sub-block 2g + p: quarters 2p, 2p + 1
      for (int r = 0; r < TILE; ++r) dot[p][r] = _mm512_setzero_si512();
      const __m512i high = _mm512_loadu_si512(w.high + g * kHighBytes + 64 * p);
      const __m512i highs[4] = {
          _mm512_and_si512(_mm512_slli_epi16(high, 4), top_pair), _mm512_and_si512(_mm512_slli_epi16(high, 2), top_pair),
          _mm512_and_si512(high, top_pair), _mm512_and_si512(_mm512_srli_epi16(high, 2), top_pair)};
      for (int h = 0; h < 2; ++h) {
        const int c = 2 * p + h;
        const __m512i bytes = _mm512_loadu_si512(w.low + g * kLowBytes + 64 * c);
        const __m512i first = _mm512_or_si512(_mm512_and_si512(bytes, low_nibbles), highs[2 * h]);
        const __m512i second = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(bytes, 4), low_nibbles), highs[2 * h + 1]);
        for (int r = 0; r < TILE; ++r) {
          dot[p][r] = _mm512_dpbusd_epi32(dot[p][r], first, _mm512_set1_epi32(load_int32(group_q + r * rows.k + 8 * c)));
          dot[p][r] = _mm512_dpbusd_epi32(dot[p][r], second, _mm512_set1_epi32(load_int32(group_q + r * rows.k + 8 * c + 4)));
        }
      }
    }
    const __m512 s0 = sub_scale(w, 2 * g), s1 = sub_scale(w, 2 * g + 1);
    for (int r = 0; r < TILE; ++r) {
      const int32_t* b = rows.sub_sums + r * 2 * num_groups + 2 * g;
      const __m512 v0 = _mm512_cvtepi32_ps(_mm512_sub_epi32(dot[0][r], _mm512_set1_epi32(32 * b[0])));
      const __m512 v1 = _mm512_cvtepi32_ps(_mm512_sub_epi32(dot[1][r], _mm512_set1_epi32(32 * b[1])));
      const __m512 t = _mm512_fmadd_ps(v1, s1, _mm512_mul_ps(v0, s0));
      acc[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(rows.qscales[r * num_groups + g]), acc[r]);
    }
  }
  for (int r = 0; r < TILE; ++r) store_bf16(out + r * out_stride, V16{acc[r]});
}

#else  // AVX2 + FMA + F16C

inline __m256 sub_scale(const BlockWeights& w, int64_t j, int first) {
  const __m256 s = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.scales + j * kBlock + first))));
  const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.d + j / 2 / kSuperGroups * kBlock + first)));
  return _mm256_mul_ps(s, d);
}

// As the AVX-512 tile, 8 outputs a register: `vpmaddubsw` (pairs of products, at most 2·63·127), a
// quarter's two of them added in 16 bits (at most 32004), then `vpmaddwd` by ones into 32-bit sums.
template <int TILE>
void tile_block(TileRows rows, int64_t num_groups, BlockWeights w, uint16_t* out, int64_t out_stride) {
  const __m256i low_nibbles = _mm256_set1_epi8(0x0F);
  const __m256i top_pair = _mm256_set1_epi8(0x30);
  const __m256i ones = _mm256_set1_epi16(1);
  alignas(32) float acc[TILE][kBlock] = {};
  for (int64_t g = 0; g < num_groups; ++g) {
    const int8_t* group_q = rows.q + g * kGroup;
    prefetch_ahead(w.low + g * kLowBytes, kLowBytes);
    prefetch_ahead(w.high + g * kHighBytes, kHighBytes);
    for (int half = 0; half < 2; ++half) {  // outputs 8·half .. 8·half + 7
      __m256 t[TILE];
      for (int p = 0; p < 2; ++p) {
        __m256i dot[TILE];
        for (int r = 0; r < TILE; ++r) dot[r] = _mm256_setzero_si256();
        const __m256i high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.high + g * kHighBytes + 64 * p + 32 * half));
        const __m256i highs[4] = {
            _mm256_and_si256(_mm256_slli_epi16(high, 4), top_pair), _mm256_and_si256(_mm256_slli_epi16(high, 2), top_pair),
            _mm256_and_si256(high, top_pair), _mm256_and_si256(_mm256_srli_epi16(high, 2), top_pair)};
        for (int h = 0; h < 2; ++h) {
          const int c = 2 * p + h;
          const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.low + g * kLowBytes + 64 * c + 32 * half));
          const __m256i first = _mm256_or_si256(_mm256_and_si256(bytes, low_nibbles), highs[2 * h]);
          const __m256i second = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bytes, 4), low_nibbles), highs[2 * h + 1]);
          for (int r = 0; r < TILE; ++r) {
            const __m256i pairs = _mm256_add_epi16(
                _mm256_maddubs_epi16(first, _mm256_set1_epi32(load_int32(group_q + r * rows.k + 8 * c))),
                _mm256_maddubs_epi16(second, _mm256_set1_epi32(load_int32(group_q + r * rows.k + 8 * c + 4))));
            dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(pairs, ones));
          }
        }
        const __m256 s = sub_scale(w, 2 * g + p, 8 * half);
        for (int r = 0; r < TILE; ++r) {
          const int32_t b = rows.sub_sums[r * 2 * num_groups + 2 * g + p];
          const __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(dot[r], _mm256_set1_epi32(32 * b)));
          t[r] = p == 0 ? _mm256_mul_ps(v, s) : _mm256_fmadd_ps(v, s, t[r]);
        }
      }
      for (int r = 0; r < TILE; ++r) {
        float* row_acc = acc[r] + 8 * half;
        _mm256_store_ps(row_acc, _mm256_fmadd_ps(t[r], _mm256_set1_ps(rows.qscales[r * num_groups + g]), _mm256_load_ps(row_acc)));
      }
    }
  }
  for (int r = 0; r < TILE; ++r) store_bf16(out + r * out_stride, load16(acc[r]));
}

#endif

using TileFn = void (*)(TileRows, int64_t, BlockWeights, uint16_t*, int64_t);

template <int... TILES>
constexpr std::array<TileFn, sizeof...(TILES)> tile_table(std::integer_sequence<int, TILES...>) {
  return {&tile_block<TILES + 1>...};
}

}  // namespace

// Q6_K: codes [N, K] uint8 (0..63), scales [N, K / 16] int8, d [N, K / 256] float32 (float16-exact) ->
// (low nibbles [N / 16, K / 32, 4, 64] uint8, top bit pairs [N / 16, K / 32, 2, 64] uint8, scales
// [N / 16, K / 16, 16] int8, d [N / 16, K / 256, 16] float16).
std::vector<at::Tensor> pack_int6k_q8(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& d) {
  TORCH_CHECK(scales.scalar_type() == at::kChar && d.scalar_type() == at::kFloat);
  TORCH_CHECK(codes.dim() == 2 && codes.size(1) % (kGroup * kSuperGroups) == 0);
  TORCH_CHECK(scales.size(0) == codes.size(0) && scales.size(1) * 16 == codes.size(1) && d.size(1) * 16 == scales.size(1));
  // the top two bits per lane: pair p's byte = quarter 2p's two nibbles' then quarter 2p + 1's, two bits each
  const auto lanes = nibble_lanes(codes).bitwise_right_shift(4);  // [N/16, G, 4, 2, 16, 4]
  auto pairs = at::empty({lanes.size(0), lanes.size(1), 2, 64}, codes.options());
  for (int p = 0; p < 2; ++p) {
    pairs.select(2, p).copy_(lanes.select(2, 2 * p).select(2, 0)
        .bitwise_or(lanes.select(2, 2 * p).select(2, 1).bitwise_left_shift(2))
        .bitwise_or(lanes.select(2, 2 * p + 1).select(2, 0).bitwise_left_shift(4))
        .bitwise_or(lanes.select(2, 2 * p + 1).select(2, 1).bitwise_left_shift(6)).reshape({lanes.size(0), lanes.size(1), 64}));
  }
  return {pack_low_nibbles(codes), pairs, by_block(scales, at::kChar), by_block(d, at::kHalf)};
}

// x [M, K] bf16 @ the packed Q6_K weight's transpose -> [M, N] bf16, x rounded to 8 bits per group of 32.
at::Tensor int6k_q8(const at::Tensor& x, const at::Tensor& low, const at::Tensor& high, const at::Tensor& scales,
                    const at::Tensor& d) {
  TORCH_CHECK(low.dim() == 4 && low.size(2) == 4 && low.size(3) == 64 && low.is_contiguous() && low.scalar_type() == at::kByte);
  TORCH_CHECK(high.is_contiguous() && high.scalar_type() == at::kByte && high.numel() * 2 == low.numel());
  TORCH_CHECK(scales.is_contiguous() && scales.scalar_type() == at::kChar && scales.numel() * 16 == low.numel() * 2);
  TORCH_CHECK(d.is_contiguous() && d.scalar_type() == at::kHalf && d.numel() * 256 == low.numel() * 2);
  const Q8Rows rows(x);
  const int64_t num_blocks = low.size(0), num_groups = low.size(1), n = num_blocks * kBlock;
  TORCH_CHECK(num_groups == rows.num_groups, "int6k_q8: the input has ", rows.k, " columns, the weight ", num_groups * kGroup);
  // b: each row's integer sum of x̂ per sub-block of 16
  std::unique_ptr<int32_t[]> sub_sums(new int32_t[rows.m * 2 * num_groups]);
  at::parallel_for(0, rows.m * 2 * num_groups, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      int32_t sum = 0;
      for (int64_t j = 0; j < 16; ++j) sum += rows.q[i * 16 + j];
      sub_sums[i] = sum;
    }
  });
  auto out = at::empty({rows.m, n}, x.options());
  static constexpr auto kTiles = tile_table(std::make_integer_sequence<int, kMaxTile>{});
  const auto* lows = low.data_ptr<uint8_t>();
  const auto* highs = high.data_ptr<uint8_t>();
  const auto* ss = scales.data_ptr<int8_t>();
  const auto* ds = reinterpret_cast<const uint16_t*>(d.data_ptr());
  auto* os = reinterpret_cast<uint16_t*>(out.data_ptr());
  for_each_tile(num_blocks, rows.m, kMaxTile, [&](int64_t b, int64_t row, int64_t num_rows) {
    const TileRows tile{rows.q.get() + row * rows.k, rows.k, rows.scales.get() + row * num_groups,
                        sub_sums.get() + row * 2 * num_groups};
    const BlockWeights w{lows + b * num_groups * kLowBytes, highs + b * num_groups * kHighBytes,
                         ss + b * 2 * num_groups * kBlock, ds + b * (num_groups / kSuperGroups) * kBlock};
    kTiles[num_rows - 1](tile, num_groups, w, os + row * n + b * kBlock, n);
  });
  return out;
}
