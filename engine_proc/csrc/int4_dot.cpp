// A weight kept as its GGUF 4-bit blocks (codes q in 0..15, a scale d and a minimum m per group of
// 32 inputs: w = q·d + m) multiplied by bfloat16 rows with AVX-512 BF16 dot products, for the
// batch sizes between one token and a prefill (a decode step of many streams).
//
// The codes are exact in bfloat16, so the dot products run on them and the affine part is applied
// per group in float32: y = Σ_g d_g · Σ_{k∈g} x_k q_k + m_g · Σ_{k∈g} x_k. No weight is rounded to
// bfloat16 on the way (torch's int4 kernel rounds d and m; the packed bfloat16 weight rounds w).
//
// Layout (`pack_int4_dot`): for each block of 16 outputs, each group, each two pairs of inputs
// (2p, 2p + 1 and 2p + 2, 2p + 3; p even) within the group, 32 bytes: the 32 codes of each pair for
// the 16 outputs in the order `vdpbf16ps` pairs them (output i's two codes in 16-bit words 2i and
// 2i + 1), word w in byte w's low nibble for the first pair, its high nibble for the second. Scales and minimums as
// the file's float16 [N / 16, G, 16] (float32 would add half again to the bytes a step reads).
#include <ATen/Parallel.h>
#include <ATen/ATen.h>

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace {

constexpr int64_t kGroup = 32;
constexpr int64_t kBlock = 16;  // outputs per block: one register of float32 sums
constexpr int kMaxTile = 16;    // rows per pass: their dot products stay in registers

// The codes of two input pairs for one block of 16 outputs (32 bytes), as bfloat16 values: the
// pair in the low nibbles, then the next pair in the high ones.
inline void load_codes(const uint8_t* src, __m512i table, __m512bh& first, __m512bh& second) {
  const __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  first = reinterpret_cast<__m512bh>(_mm512_permutexvar_epi16(_mm512_and_si512(bytes, _mm512_set1_epi16(0x0F)), table));
  second = reinterpret_cast<__m512bh>(_mm512_permutexvar_epi16(_mm512_srli_epi16(bytes, 4), table));
}

// 16 float16 values widened (exactly) to float.
inline __m512 load_half16(const uint16_t* src) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
}

// Rows [0, TILE) of x (bf16, `k` columns, `x_stride` apart) times one block of 16 outputs into
// `out` (bf16, `out_stride` apart). `sums` [TILE, G]: each row's sum of x over each group.
template <int TILE>
void tile_block(
    const uint16_t* x, int64_t x_stride, const uint8_t* codes, const uint16_t* scales, const uint16_t* mins,
    const float* sums, int64_t num_groups, uint16_t* out, int64_t out_stride, __m512i table) {
  alignas(64) float acc[TILE][kBlock] = {};
  for (int64_t g = 0; g < num_groups; ++g) {
    __m512 dot[TILE];
    for (int r = 0; r < TILE; ++r) dot[r] = _mm512_setzero_ps();
    const uint8_t* group_codes = codes + g * (kGroup / 2) * 16;
    const int64_t k0 = g * kGroup;
    for (int64_t p = 0; p < kGroup / 2; p += 2) {
      __m512bh w[2];
      load_codes(group_codes + p * 16, table, w[0], w[1]);
      for (int half = 0; half < 2; ++half) {
        for (int r = 0; r < TILE; ++r) {
          int32_t pair;
          std::memcpy(&pair, x + r * x_stride + k0 + 2 * (p + half), sizeof(pair));
          dot[r] = _mm512_dpbf16_ps(dot[r], w[half], reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair)));
        }
      }
    }
    const __m512 d = load_half16(scales + g * kBlock);
    const __m512 m = load_half16(mins + g * kBlock);
    for (int r = 0; r < TILE; ++r) {
      __m512 sum = _mm512_fmadd_ps(dot[r], d, _mm512_load_ps(acc[r]));
      _mm512_store_ps(acc[r], _mm512_fmadd_ps(_mm512_set1_ps(sums[r * num_groups + g]), m, sum));
    }
  }
  for (int r = 0; r < TILE; ++r) {
    const __m256bh packed = _mm512_cvtneps_pbh(_mm512_load_ps(acc[r]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * out_stride), reinterpret_cast<const __m256i&>(packed));
  }
}

using TileFn = void (*)(const uint16_t*, int64_t, const uint8_t*, const uint16_t*, const uint16_t*, const float*,
                        int64_t, uint16_t*, int64_t, __m512i);

template <int... TILES>
constexpr std::array<TileFn, sizeof...(TILES)> tile_table(std::integer_sequence<int, TILES...>) {
  return {&tile_block<TILES + 1>...};
}

}  // namespace

// codes [N, K] uint8 (0..15), scales and mins [N, K / 32] float32 (values a float16 holds exactly, as
// a GGUF stores them) -> (packed codes [N / 16, K / 32, 16, 16] uint8, scales [N / 16, K / 32, 16]
// float16, mins the same).
std::vector<at::Tensor> pack_int4_dot(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins) {
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == at::kByte && scales.scalar_type() == at::kFloat && mins.scalar_type() == at::kFloat);
  const int64_t n = codes.size(0), k = codes.size(1);
  TORCH_CHECK(n % kBlock == 0 && k % kGroup == 0 && scales.size(0) == n && scales.size(1) == k / kGroup && mins.sizes() == scales.sizes());
  const int64_t num_groups = k / kGroup;
  // [N/16, 16, G, 8, 2 pairs, 2] -> [N/16, G, 8, 2 pairs, 16 outputs, 2]: the 32 words of each pair in
  // dot-product order, two pairs (low and high nibbles) in 32 bytes.
  auto words = codes.contiguous().view({n / kBlock, kBlock, num_groups, kGroup / 4, 2, 2}).permute({0, 2, 3, 4, 1, 5}).contiguous();
  auto pairs = words.view({-1, 2, 32});
  auto packed = pairs.select(1, 0).bitwise_or(pairs.select(1, 1).bitwise_left_shift(4));
  auto block_view = [&](const at::Tensor& t) {
    return t.contiguous().view({n / kBlock, kBlock, num_groups}).permute({0, 2, 1}).to(at::kHalf).contiguous();
  };
  return {packed.contiguous().view({n / kBlock, num_groups, kGroup / 2, 16}), block_view(scales), block_view(mins)};
}

// x [M, K] bf16 @ the packed weight's transpose -> [M, N] bf16.
at::Tensor int4_dot(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous());
  TORCH_CHECK(codes.dim() == 4 && codes.size(2) == kGroup / 2 && codes.size(3) == 16 && codes.is_contiguous());
  TORCH_CHECK(scales.scalar_type() == at::kHalf && mins.scalar_type() == at::kHalf && scales.is_contiguous() && mins.is_contiguous());
  const int64_t m = x.size(0), k = x.size(1), num_blocks = codes.size(0), num_groups = codes.size(1);
  TORCH_CHECK(num_groups * kGroup == k, "int4_dot: the input has ", k, " columns, the weight ", num_groups * kGroup);
  const int64_t n = num_blocks * kBlock;
  auto out = at::empty({m, n}, x.options());
  auto sums = x.view({m, num_groups, kGroup}).sum(-1, false, at::kFloat).contiguous();
  const auto* xs = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const auto* cs = codes.data_ptr<uint8_t>();
  const auto* ds = reinterpret_cast<const uint16_t*>(scales.data_ptr());
  const auto* ms = reinterpret_cast<const uint16_t*>(mins.data_ptr());
  const float* ss = sums.data_ptr<float>();
  auto* os = reinterpret_cast<uint16_t*>(out.data_ptr());
  alignas(64) uint16_t small_ints[32];
  for (int i = 0; i < 32; ++i) {
    const float value = static_cast<float>(i & 15);
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    small_ints[i] = static_cast<uint16_t>(bits >> 16);  // exact: small integers need no rounding
  }
  const __m512i table = _mm512_load_si512(small_ints);
  static constexpr auto kTiles = tile_table(std::make_integer_sequence<int, kMaxTile>{});
  const int64_t num_tiles = (m + kMaxTile - 1) / kMaxTile;
  const int64_t block_bytes = num_groups * (kGroup / 2) * 16;
  at::parallel_for(0, num_blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t t = 0, row = 0; t < num_tiles; ++t) {
        const int64_t rows = (m - row) / (num_tiles - t);  // tiles as even as they come
        kTiles[rows - 1](xs + row * k, k, cs + b * block_bytes, ds + b * num_groups * kBlock, ms + b * num_groups * kBlock,
                         ss + row * num_groups, num_groups, os + row * n + b * kBlock, n, table);
        row += rows;
      }
    }
  });
  return out;
}
