// bfloat16 rows rounded to 8 bits per group of 32 inputs, as llama.cpp rounds activations for its
// integer dot products (Q8): a scale a = max|x| / 127 per row and group, x̂ = round(x / a) (ties to
// even) in -127..127. Every integer matmul form (int4_q8.cpp, int6k_q8.cpp, int8_q8.cpp, mxfp4_q8.cpp)
// rounds through here, so a row's x̂ depends on that row alone.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "vec16.h"

#include <cstdint>
#include <cstring>
#include <memory>

namespace zeroserve {

constexpr int64_t kQ8Group = 32;

#if ZEROSERVE_AVX512

// 16 floats rounded to the nearest whole number (ties to even), saturated to signed bytes.
inline void store_int8(int8_t* dst, V16 x) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(x.v)));
}

#else  // AVX2

inline void store_int8(int8_t* dst, V16 x) {
  // packs work within 128-bit lanes: [lo 0-3, hi 0-3 | lo 4-7, hi 4-7] back into order, then to bytes
  const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(_mm256_cvtps_epi32(x.lo), _mm256_cvtps_epi32(x.hi)), 0xD8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1)));
}

#endif

// One group of 32 bfloat16 inputs -> 32 signed bytes x̂, their scale a and the sum of the rounded
// inputs, a · Σ x̂ (as llama.cpp's Q8_1 keeps it: a weight's minimum then meets the same rounded x as
// its codes do, and the group's product is x̂ · w, whose error follows the weight, not the codes'
// offset), and Σ x̂ itself (mxfp4_q8 takes its codes' offset back out in integers). Σ x̂ is an integer
// (at most 32 · 127), summed in order: the same bits in every build.
inline void quantize_group(const uint16_t* x, int8_t* q, float* scale, float* sum, int32_t* total_out) {
  const V16 low = load_bf16(x), high = load_bf16(x + 16);
  const V16 zero = zero16();
  const float max_abs = reduce_max(max16(max16(low, zero - low), max16(high, zero - high)));
  *scale = max_abs / 127.0f;
  const V16 inverse = set16(max_abs > 0.0f ? 127.0f / max_abs : 0.0f);
  store_int8(q, low * inverse);
  store_int8(q + 16, high * inverse);
  int32_t total = 0;
  for (int i = 0; i < 32; ++i) total += q[i];
  *sum = *scale * static_cast<float>(total);
  *total_out = total;
}

// A batch of bfloat16 rows x [m, k] rounded: x̂ [m, k] int8, and a scale, the sum a · Σ x̂ and Σ x̂ per row and group.
struct Q8Rows {
  int64_t m, k, num_groups;
  // NOTE: uninitialized (vectors would zero them first, each call): every element is written here.
  std::unique_ptr<int8_t[]> q;
  std::unique_ptr<float[]> scales, sums;
  std::unique_ptr<int32_t[]> totals;

  explicit Q8Rows(const at::Tensor& x)
      : m(x.size(0)), k(x.size(1)), num_groups(x.size(1) / kQ8Group), q(new int8_t[x.size(0) * x.size(1)]),
        scales(new float[x.size(0) * num_groups]), sums(new float[x.size(0) * num_groups]),
        totals(new int32_t[x.size(0) * num_groups]) {
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous() && k % kQ8Group == 0);
    const auto* xs = reinterpret_cast<const uint16_t*>(x.data_ptr());
    at::parallel_for(0, m * num_groups, 256, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) quantize_group(xs + i * kQ8Group, q.get() + i * kQ8Group, &scales[i], &sums[i], &totals[i]);
    });
  }
};

// fn(block, first_row, num_rows) for each block of outputs (in parallel) and each tile of its rows,
// at most `max_tile` rows, the tiles as even as they come: a row's tile changes how many rows share
// its pass, never its arithmetic.
template <typename Fn>
inline void for_each_tile(int64_t num_blocks, int64_t m, int64_t max_tile, Fn&& fn) {
  const int64_t num_tiles = (m + max_tile - 1) / max_tile;
  at::parallel_for(0, num_blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t t = 0, row = 0; t < num_tiles; ++t) {
        const int64_t rows = (m - row) / (num_tiles - t);
        fn(b, row, rows);
        row += rows;
      }
    }
  });
}

// NOTE: a weight's bytes asked for 4 KiB before a tile reaches them: one row's pass is too quick for the
// hardware prefetcher alone to keep DRAM busy (on a 2-core Zen 2 one thread's Q4_K rows went 14 -> 16 GB/s, two
// threads' 21 -> 26 GB/s, asked a kilobyte ahead). A kilobyte was a few groups' time ahead, less than DRAM's
// latency on a faster core: on a 2-core Zen 5, one row, the variants alternated in one process, 1 -> 4 KiB took
// MXFP4 rows from 48.9 to 60.0 GB/s on two threads (29.8 -> 34.7 on one), Q8_0 54.3 -> 62.1, Q4_K 45.0 -> 49.1;
// 8 KiB gave the same as 4. Past a block's end it reads on into the next block, as threads take them.
constexpr int64_t kPrefetchBytes = 4096;

inline void prefetch_ahead(const void* bytes, int64_t count) {
  const char* ahead = static_cast<const char*>(bytes) + kPrefetchBytes;
  for (int64_t line = 0; line < count; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
}

inline int32_t load_int32(const int8_t* src) {
  int32_t value;
  std::memcpy(&value, src, sizeof(value));
  return value;
}

}  // namespace zeroserve
