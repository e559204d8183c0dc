// 16 floats as one value, for the CPU kernels: one AVX-512 register, or two AVX2 registers.
// Each build compiles the kernels for one instruction set (engine_proc/cpu/kernels.py passes
// its flags): with AVX-512 F/BW/VL/BF16/VNNI the AVX-512 bodies (`ZEROSERVE_AVX512`), with
// AVX2 + FMA + F16C the others.
//
// The two bodies give the same bits: every lane does the same IEEE operations in the same order
// (sums across lanes by one tree, `reduce8`), and neither uses an instruction whose rounding is
// its own: bfloat16 conversions round to nearest even by integer arithmetic, keeping subnormals
// and making NaNs quiet as torch does (AVX-512's `vcvtneps2bf16` would flush subnormals to zero),
// 2^n is built from its bits, and no approximate reciprocal or bfloat16 dot product appears.
// tests/engine_proc/cpu/test_kernel_bodies.py holds this: it builds the AVX-512 bodies through SIMDe
// (`ZEROSERVE_SIMDE_AVX512`) on an AVX2 CPU and compares every kernel's output bit for bit.
#pragma once

#include <immintrin.h>

#if defined(ZEROSERVE_SIMDE_AVX512)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include "simde_extras.h"  // what this SIMDe lacks (the test's folder is on the include path)
#define ZEROSERVE_AVX512 1
#elif defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512VNNI__)
#define ZEROSERVE_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define ZEROSERVE_AVX512 0
#else
#error "zeroserve's CPU kernels need AVX-512 BF16 and VNNI, or AVX2 with FMA and F16C"
#endif

#include <cstdint>

namespace zeroserve {

// The sum or the largest of 8 floats: halves, then pairs, then the last two (both bodies' one tree).
inline float reduce8(__m256 x, bool is_max) {
  __m128 v = is_max ? _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1))
                    : _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  const __m128 swapped = _mm_movehl_ps(v, v);
  v = is_max ? _mm_max_ps(v, swapped) : _mm_add_ps(v, swapped);
  const __m128 last = _mm_shuffle_ps(v, v, 1);
  return _mm_cvtss_f32(is_max ? _mm_max_ss(v, last) : _mm_add_ss(v, last));
}

// The float's bits rounded to the nearest even bfloat16 (in the high half; NaN as a quiet NaN).
inline __m256i round_bits(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
  const __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  const __m256i kept = _mm256_and_si256(rounded, _mm256_set1_epi32(static_cast<int>(0xFFFF0000)));
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(kept), _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), is_nan));
}

// 2^n for whole-number floats n in [-126, 127], from its exponent bits.
inline __m256 pow2(__m256 n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}

#if ZEROSERVE_AVX512

struct V16 {
  __m512 v;
};

inline V16 zero16() { return {_mm512_setzero_ps()}; }
inline V16 set16(float x) { return {_mm512_set1_ps(x)}; }
inline V16 load16(const float* src) { return {_mm512_loadu_ps(src)}; }
inline void store16(float* dst, V16 x) { _mm512_storeu_ps(dst, x.v); }
inline V16 operator+(V16 a, V16 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline V16 operator-(V16 a, V16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline V16 operator*(V16 a, V16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline V16 operator/(V16 a, V16 b) { return {_mm512_div_ps(a.v, b.v)}; }
inline V16 fmadd(V16 a, V16 b, V16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline V16 max16(V16 a, V16 b) { return {_mm512_max_ps(a.v, b.v)}; }
inline V16 min16(V16 a, V16 b) { return {_mm512_min_ps(a.v, b.v)}; }
inline __m256 low_half(V16 x) { return _mm512_castps512_ps256(x.v); }
inline __m256 high_half(V16 x) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x.v), 1)); }
inline V16 join_halves(__m256 low, __m256 high) {
  return {_mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(low)), _mm256_castps_pd(high), 1))};
}
inline float reduce_add(V16 x) { return reduce8(_mm256_add_ps(low_half(x), high_half(x)), false); }
inline float reduce_max(V16 x) { return reduce8(_mm256_max_ps(low_half(x), high_half(x)), true); }

// Lanes below `count` from `x`, the others from `fill`.
inline V16 first_lanes(V16 x, int64_t count, V16 fill) {
  const __mmask16 mask = count <= 0 ? 0 : count >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << count) - 1u);
  return {_mm512_mask_mov_ps(fill.v, mask, x.v)};
}

// 16 bfloat16 values widened to float.
inline V16 load_bf16(const uint16_t* src) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16))};
}

// 16 floats rounded to bfloat16.
inline void store_bf16(uint16_t* dst, V16 x) {
  const __m512i rounded = _mm512_castps_si512(join_halves(_mm256_castsi256_ps(round_bits(low_half(x))),
                                                          _mm256_castsi256_ps(round_bits(high_half(x)))).v);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
}

// The value bfloat16 rounding gives, as float.
inline V16 round_bf16(V16 x) {
  return join_halves(_mm256_castsi256_ps(round_bits(low_half(x))), _mm256_castsi256_ps(round_bits(high_half(x))));
}

// p * 2^n for whole-number floats n in [-126, 127].
inline V16 scale_pow2(V16 p, V16 n) { return p * join_halves(pow2(low_half(n)), pow2(high_half(n))); }
inline V16 round_nearest(V16 x) { return {_mm512_roundscale_ps(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }

// Columns d and d + 1 of 16 bfloat16 rows `row_stride` apart, from `src` = row 0's column d.
inline void load_bf16_column_pair(const uint16_t* src, int64_t row_stride, V16& even, V16& odd) {
  const __m512i rows = _mm512_mullo_epi32(
      _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(static_cast<int>(row_stride)));
  const __m512i pair = _mm512_i32gather_epi32(rows, reinterpret_cast<const int*>(src), 2);
  even = {_mm512_castsi512_ps(_mm512_slli_epi32(pair, 16))};
  odd = {_mm512_castsi512_ps(_mm512_and_si512(pair, _mm512_set1_epi32(static_cast<int>(0xFFFF0000))))};
}

// The 16 x 16 matrix of 32-bit values in rows[0..16) transposed in place.
inline void transpose16_dwords(__m512i rows[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(rows[2 * i], rows[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(rows[2 * i], rows[2 * i + 1]);
  }
  // NOTE: now rows[4 i + c] holds, in its 128-bit lane L, column 4 L + c of rows 4 i .. 4 i + 3.
  for (int i = 0; i < 4; ++i) {
    rows[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    rows[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    rows[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    rows[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i x0 = _mm512_shuffle_i32x4(rows[c], rows[4 + c], 0x44), x1 = _mm512_shuffle_i32x4(rows[c], rows[4 + c], 0xEE);
    const __m512i y0 = _mm512_shuffle_i32x4(rows[8 + c], rows[12 + c], 0x44), y1 = _mm512_shuffle_i32x4(rows[8 + c], rows[12 + c], 0xEE);
    t[c] = _mm512_shuffle_i32x4(x0, y0, 0x88);
    t[4 + c] = _mm512_shuffle_i32x4(x0, y0, 0xDD);
    t[8 + c] = _mm512_shuffle_i32x4(x1, y1, 0x88);
    t[12 + c] = _mm512_shuffle_i32x4(x1, y1, 0xDD);
  }
  for (int i = 0; i < 16; ++i) rows[i] = t[i];
}

// The first columns of a block of 16 bfloat16 rows as floats [column][16], 32 at a time by a
// transpose in registers; returns how many columns it did.
inline int64_t transpose_bf16_block(const uint16_t* block, int64_t head_dim, float* out) {
  int64_t col = 0;
  for (; col + 32 <= head_dim; col += 32) {
    __m512i rows[16];
    for (int j = 0; j < 16; ++j) rows[j] = _mm512_loadu_si512(block + j * head_dim + col);
    transpose16_dwords(rows);
    // NOTE: rows[p] now holds the column pair (col + 2 p, col + 2 p + 1) of the 16 rows.
    for (int p = 0; p < 16; ++p) {
      _mm512_storeu_ps(out + (col + 2 * p) * 16, _mm512_castsi512_ps(_mm512_slli_epi32(rows[p], 16)));
      _mm512_storeu_ps(out + (col + 2 * p + 1) * 16,
                       _mm512_castsi512_ps(_mm512_and_si512(rows[p], _mm512_set1_epi32(static_cast<int>(0xFFFF0000)))));
    }
  }
  return col;
}

#else  // AVX2 + FMA + F16C

struct V16 {
  __m256 lo, hi;
};

inline V16 zero16() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V16 set16(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline V16 load16(const float* src) { return {_mm256_loadu_ps(src), _mm256_loadu_ps(src + 8)}; }
inline void store16(float* dst, V16 x) { _mm256_storeu_ps(dst, x.lo); _mm256_storeu_ps(dst + 8, x.hi); }
inline V16 operator+(V16 a, V16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline V16 operator-(V16 a, V16 b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline V16 operator*(V16 a, V16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline V16 operator/(V16 a, V16 b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline V16 fmadd(V16 a, V16 b, V16 c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline V16 max16(V16 a, V16 b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline V16 min16(V16 a, V16 b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }

inline float reduce_add(V16 x) { return reduce8(_mm256_add_ps(x.lo, x.hi), false); }
inline float reduce_max(V16 x) { return reduce8(_mm256_max_ps(x.lo, x.hi), true); }

inline V16 first_lanes(V16 x, int64_t count, V16 fill) {
  const int limit = count <= 0 ? 0 : count >= 16 ? 16 : static_cast<int>(count);
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 keep_lo = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(limit), lanes));
  const __m256 keep_hi = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(limit - 8), lanes));
  return {_mm256_blendv_ps(fill.lo, x.lo, keep_lo), _mm256_blendv_ps(fill.hi, x.hi, keep_hi)};
}

inline __m256 widen_bf16(__m128i raw) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16)); }

inline V16 load_bf16(const uint16_t* src) {
  return {widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))),
          widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 8)))};
}

inline void store_bf16(uint16_t* dst, V16 x) {
  const __m256i lo = _mm256_srli_epi32(round_bits(x.lo), 16), hi = _mm256_srli_epi32(round_bits(x.hi), 16);
  // NOTE: packus packs within 128-bit lanes (lo0-3, hi0-3, lo4-7, hi4-7); the permute restores the order.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), packed);
}

inline V16 round_bf16(V16 x) { return {_mm256_castsi256_ps(round_bits(x.lo)), _mm256_castsi256_ps(round_bits(x.hi))}; }

inline V16 scale_pow2(V16 p, V16 n) { return {_mm256_mul_ps(p.lo, pow2(n.lo)), _mm256_mul_ps(p.hi, pow2(n.hi))}; }
inline V16 round_nearest(V16 x) {
  constexpr int kMode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(x.lo, kMode), _mm256_round_ps(x.hi, kMode)};
}

inline void load_bf16_column_pair(const uint16_t* src, int64_t row_stride, V16& even, V16& odd) {
  const __m256i rows = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(static_cast<int>(row_stride)));
  const auto* base = reinterpret_cast<const int*>(src);
  const __m256i pair_lo = _mm256_i32gather_epi32(base, rows, 2);
  const __m256i pair_hi = _mm256_i32gather_epi32(base + 4 * row_stride, rows, 2);
  const __m256i high_half = _mm256_set1_epi32(static_cast<int>(0xFFFF0000));
  even = {_mm256_castsi256_ps(_mm256_slli_epi32(pair_lo, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(pair_hi, 16))};
  odd = {_mm256_castsi256_ps(_mm256_and_si256(pair_lo, high_half)), _mm256_castsi256_ps(_mm256_and_si256(pair_hi, high_half))};
}

// The 8 x 8 matrix of 32-bit values in rows[0..8) transposed in place.
inline void transpose8_dwords(__m256i rows[8]) {
  __m256i t[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(rows[2 * i], rows[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(rows[2 * i], rows[2 * i + 1]);
  }
  // NOTE: now u[4 h + c] holds, in its 128-bit lane L, column 4 L + c of rows 4 h .. 4 h + 3.
  __m256i u[8];
  for (int h = 0; h < 2; ++h) {
    u[4 * h] = _mm256_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
    u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
    u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
    u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    rows[c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x20);
    rows[4 + c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x31);
  }
}

// The first columns of a block of 16 bfloat16 rows as floats [column][16], 16 at a time by
// transposes in registers (keys 0-7 and 8-15 apart); returns how many columns it did.
inline int64_t transpose_bf16_block(const uint16_t* block, int64_t head_dim, float* out) {
  const __m256i high_half = _mm256_set1_epi32(static_cast<int>(0xFFFF0000));
  int64_t col = 0;
  for (; col + 16 <= head_dim; col += 16) {
    __m256i first[8], second[8];
    for (int j = 0; j < 8; ++j) {
      first[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + j * head_dim + col));
      second[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + (j + 8) * head_dim + col));
    }
    transpose8_dwords(first);
    transpose8_dwords(second);
    // NOTE: first[p] / second[p] now hold the column pair (col + 2 p, col + 2 p + 1) of keys 0-7 / 8-15.
    for (int p = 0; p < 8; ++p) {
      float* even = out + (col + 2 * p) * 16;
      float* odd = even + 16;
      _mm256_storeu_ps(even, _mm256_castsi256_ps(_mm256_slli_epi32(first[p], 16)));
      _mm256_storeu_ps(even + 8, _mm256_castsi256_ps(_mm256_slli_epi32(second[p], 16)));
      _mm256_storeu_ps(odd, _mm256_castsi256_ps(_mm256_and_si256(first[p], high_half)));
      _mm256_storeu_ps(odd + 8, _mm256_castsi256_ps(_mm256_and_si256(second[p], high_half)));
    }
  }
  return col;
}

#endif

// A block of 16 bfloat16 rows of `head_dim` (even) as floats [head_dim][16]: transposed in
// registers, the columns left over by gathers.
inline void load_bf16_block_transposed(const uint16_t* block, int64_t head_dim, float* out) {
  for (int64_t col = transpose_bf16_block(block, head_dim, out); col < head_dim; col += 2) {
    V16 even, odd;
    load_bf16_column_pair(block + col, head_dim, even, odd);
    store16(out + col * 16, even);
    store16(out + (col + 1) * 16, odd);
  }
}

// e^x (0 below -87, capped at e^88): 2^(x log2 e), a degree-6 polynomial for the fraction.
inline V16 exp16(V16 x) {
  x = max16(min16(x, set16(88.0f)), set16(-87.0f));
  const V16 t = x * set16(1.44269504088896341f);
  const V16 n = round_nearest(t);
  const V16 f = t - n;
  V16 p = set16(1.535336188319500e-4f);
  p = fmadd(p, f, set16(1.339887440266574e-3f));
  p = fmadd(p, f, set16(9.618437357674640e-3f));
  p = fmadd(p, f, set16(5.550332471162809e-2f));
  p = fmadd(p, f, set16(2.402264791363012e-1f));
  p = fmadd(p, f, set16(6.931472028550421e-1f));
  p = fmadd(p, f, set16(1.0f));
  return scale_pow2(p, n);
}

}  // namespace zeroserve
