// A weight kept as its GGUF 4-bit blocks (codes q in 0..15, a scale d and a minimum m per group of
// 32 inputs: w = q·d + m) multiplied by bfloat16 rows, for the batch sizes between one token and a
// prefill (a decode step of many streams): with AVX-512 BF16 dot products on the codes, or on AVX2
// with float32 FMAs over each group's codes widened once into a small buffer that all rows share.
//
// The codes are exact in bfloat16 (and float32), so the products run on them and the affine part is
// applied per group in float32: y = Σ_g d_g · Σ_{k∈g} x_k q_k + m_g · Σ_{k∈g} x_k. No weight is
// rounded on the way (torch's int4 kernel rounds d and m to bfloat16; the packed bfloat16 weight
// rounds w).
//
// Layout (`pack_int4_dot`): for each block of 16 outputs, each group, each two pairs of inputs
// (2p, 2p + 1 and 2p + 2, 2p + 3; p even) within the group, 32 bytes: the 32 codes of each pair for
// the 16 outputs in the order `vdpbf16ps` pairs them (output i's two codes in 16-bit words 2i and
// 2i + 1), word w in byte w's low nibble for the first pair, its high nibble for the second. Scales and minimums as
// the file's float16 [N / 16, G, 16] (float32 would add half again to the bytes a step reads).
#include <ATen/Parallel.h>
#include <ATen/ATen.h>

#include "vec16.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace {

using namespace zeroserve;

constexpr int64_t kGroup = 32;
constexpr int64_t kBlock = 16;  // outputs per block: one V16 of float32 sums
constexpr int64_t kGroupBytes = kGroup * kBlock / 2;

#if defined(__AVX512F__) && defined(__AVX512BF16__)

constexpr int kMaxTile = 16;  // rows per pass: their dot products stay in registers

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

// One block of 16 outputs for all `m` rows of x (bf16 [m, k]), into `out` ([m, n] bf16, at the block's column).
struct BlockMatmul {
  const uint16_t* x;
  int64_t m, k, n, num_groups;
  const float* sums;  // [m, G]: each row's sum of x over each group
  __m512i table;

  explicit BlockMatmul(const at::Tensor& x_in, const at::Tensor& sums_in, int64_t n_out)
      : x(reinterpret_cast<const uint16_t*>(x_in.data_ptr())), m(x_in.size(0)), k(x_in.size(1)), n(n_out),
        num_groups(x_in.size(1) / kGroup), sums(sums_in.data_ptr<float>()) {
    alignas(64) uint16_t small_ints[32];
    for (int i = 0; i < 32; ++i) {
      const float value = static_cast<float>(i & 15);
      uint32_t bits;
      std::memcpy(&bits, &value, sizeof(bits));
      small_ints[i] = static_cast<uint16_t>(bits >> 16);  // exact: small integers need no rounding
    }
    table = _mm512_load_si512(small_ints);
  }

  void operator()(const uint8_t* codes, const uint16_t* scales, const uint16_t* mins, uint16_t* out) const {
    static constexpr auto kTiles = tile_table(std::make_integer_sequence<int, kMaxTile>{});
    const int64_t num_tiles = (m + kMaxTile - 1) / kMaxTile;
    for (int64_t t = 0, row = 0; t < num_tiles; ++t) {
      const int64_t rows = (m - row) / (num_tiles - t);  // tiles as even as they come
      kTiles[rows - 1](x + row * k, k, codes, scales, mins, sums + row * num_groups, num_groups, out + row * n, n, table);
      row += rows;
    }
  }
};

#else  // AVX2 + FMA + F16C

inline V16 load_half16(const uint16_t* src) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 8)))};
}

// 16 bytes (one per output) widened to floats at dst[0..16).
inline void store_bytes_as_floats(__m128i bytes, float* dst) {
  _mm256_storeu_ps(dst, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)));
  _mm256_storeu_ps(dst + 8, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8))));
}

// One group's codes for one block (the layout above) as floats [32 inputs][16 outputs].
inline void widen_group(const uint8_t* codes, float* widened) {
  // NOTE: byte 2i holds output i's inputs 4c and 4c + 2 (low, high nibble), byte 2i + 1 its 4c + 1 and 4c + 3.
  const __m256i even_odd = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                            0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  const __m256i low_nibbles = _mm256_set1_epi8(0x0F);
  for (int64_t c = 0; c < kGroup / 4; ++c) {
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * c));
    for (int half = 0; half < 2; ++half) {
      const __m256i nibbles = _mm256_and_si256(half == 0 ? bytes : _mm256_srli_epi16(bytes, 4), low_nibbles);
      // [even bytes of lane 0, odd of lane 0, even of lane 1, odd of lane 1] -> [16 even | 16 odd]
      const __m256i split = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(nibbles, even_odd), 0xD8);
      store_bytes_as_floats(_mm256_castsi256_si128(split), widened + (4 * c + 2 * half) * kBlock);
      store_bytes_as_floats(_mm256_extracti128_si256(split, 1), widened + (4 * c + 2 * half + 1) * kBlock);
    }
  }
}

// Rows [0, N) of x (float32, `k` apart) times one group's widened codes, applied to `acc` (float32 [N][16]).
template <int N>
inline void rows_times_group(const float* x, int64_t k, const float* widened, V16 d, V16 mn, const float* sums,
                             int64_t num_groups, float* acc) {
  V16 dot[N];
  for (int i = 0; i < N; ++i) dot[i] = zero16();
  for (int64_t j = 0; j < kGroup; ++j) {
    const V16 w = load16(widened + j * kBlock);
    for (int i = 0; i < N; ++i) dot[i] = fmadd(set16(x[i * k + j]), w, dot[i]);
  }
  for (int i = 0; i < N; ++i) store16(acc + i * kBlock, fmadd(set16(sums[i * num_groups]), mn, fmadd(dot[i], d, load16(acc + i * kBlock))));
}

struct BlockMatmul {
  at::Tensor x_float;  // the rows widened once per call
  const float* x;
  int64_t m, k, n, num_groups;
  const float* sums;

  explicit BlockMatmul(const at::Tensor& x_in, const at::Tensor& sums_in, int64_t n_out)
      : x_float(x_in.to(at::kFloat).contiguous()), x(x_float.data_ptr<float>()), m(x_in.size(0)), k(x_in.size(1)),
        n(n_out), num_groups(x_in.size(1) / kGroup), sums(sums_in.data_ptr<float>()) {}

  void operator()(const uint8_t* codes, const uint16_t* scales, const uint16_t* mins, uint16_t* out) const {
    alignas(64) float widened[kGroup * kBlock];
    std::vector<float> acc(m * kBlock, 0.0f);
    for (int64_t g = 0; g < num_groups; ++g) {
      widen_group(codes + g * kGroupBytes, widened);
      const V16 d = load_half16(scales + g * kBlock), mn = load_half16(mins + g * kBlock);
      const float* xg = x + g * kGroup;
      int64_t r = 0;
      for (; r + 4 <= m; r += 4) rows_times_group<4>(xg + r * k, k, widened, d, mn, sums + r * num_groups + g, num_groups, acc.data() + r * kBlock);
      switch (m - r) {
        case 3: rows_times_group<3>(xg + r * k, k, widened, d, mn, sums + r * num_groups + g, num_groups, acc.data() + r * kBlock); break;
        case 2: rows_times_group<2>(xg + r * k, k, widened, d, mn, sums + r * num_groups + g, num_groups, acc.data() + r * kBlock); break;
        case 1: rows_times_group<1>(xg + r * k, k, widened, d, mn, sums + r * num_groups + g, num_groups, acc.data() + r * kBlock); break;
        default: break;
      }
    }
    for (int64_t r = 0; r < m; ++r) store_bf16(out + r * n, load16(acc.data() + r * kBlock));
  }
};

#endif

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
  const BlockMatmul block_matmul(x, sums, n);
  const auto* cs = codes.data_ptr<uint8_t>();
  const auto* ds = reinterpret_cast<const uint16_t*>(scales.data_ptr());
  const auto* ms = reinterpret_cast<const uint16_t*>(mins.data_ptr());
  auto* os = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, num_blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      block_matmul(cs + b * num_groups * kGroupBytes, ds + b * num_groups * kBlock, ms + b * num_groups * kBlock, os + b * kBlock);
    }
  });
  return out;
}
