// The AVX-512 intrinsics the kernels use that SIMDe 0.7 (Debian's libsimde-dev) lacks, lane by lane as
// Intel's manual defines them: vec16.h includes this when the AVX-512 bodies are built through SIMDe
// (tests/engine_proc/cpu/test_kernel_bodies.py). A SIMDe that has one defines its alias, and this one steps aside.
#pragma once

#include <immintrin.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace zeroserve_simde {

template <typename To, typename From>
inline To bits(const From& from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof(to));
  return to;
}

template <typename Out, typename In, int N, typename From>
inline simde__m512i widen(const From& a) {
  In in[N];
  std::memcpy(in, &a, sizeof(in));
  Out out[16];
  for (int i = 0; i < 16; ++i) out[i] = static_cast<Out>(in[i]);
  return bits<simde__m512i>(out);
}

inline simde__m512i cvtepu16_epi32(simde__m256i a) { return widen<int32_t, uint16_t, 16>(a); }
inline simde__m512i cvtepi16_epi32(simde__m256i a) { return widen<int32_t, int16_t, 16>(a); }
inline simde__m512i cvtepu8_epi32(simde__m128i a) { return widen<int32_t, uint8_t, 16>(a); }
inline simde__m512i cvtepi8_epi32(simde__m128i a) { return widen<int32_t, int8_t, 16>(a); }

inline simde__m512 cvtepi32_ps(simde__m512i a) {
  const auto in = bits<std::array<int32_t, 16>>(a);
  float out[16];
  for (int i = 0; i < 16; ++i) out[i] = static_cast<float>(in[i]);  // rounded to nearest even, as MXCSR's default
  return bits<simde__m512>(out);
}

// Rounded to nearest even (MXCSR's default); out of range or NaN: the "integer indefinite" 0x80000000.
inline simde__m512i cvtps_epi32(simde__m512 a) {
  const auto in = bits<std::array<float, 16>>(a);
  int32_t out[16];
  for (int i = 0; i < 16; ++i) {
    const float r = std::nearbyint(in[i]);
    out[i] = (r >= -2147483648.0f && r < 2147483648.0f) ? static_cast<int32_t>(r) : INT32_MIN;
  }
  return bits<simde__m512i>(out);
}

// Truncated to the low 16 bits (vpmovdw).
inline simde__m256i cvtepi32_epi16(simde__m512i a) {
  const auto in = bits<std::array<int32_t, 16>>(a);
  uint16_t out[16];
  for (int i = 0; i < 16; ++i) out[i] = static_cast<uint16_t>(in[i]);
  return bits<simde__m256i>(out);
}

// float16 to float32: exact, by this CPU's own F16C a half at a time.
inline simde__m512 cvtph_ps(simde__m256i a) {
  const auto halves = bits<std::array<__m128i, 2>>(a);
  const std::array<__m256, 2> out = {_mm256_cvtph_ps(halves[0]), _mm256_cvtph_ps(halves[1])};
  return bits<simde__m512>(out);
}

inline simde__m512i i32gather_epi32(simde__m512i index, const void* base, int scale) {
  const auto offsets = bits<std::array<int32_t, 16>>(index);
  int32_t out[16];
  for (int i = 0; i < 16; ++i) {
    std::memcpy(&out[i], static_cast<const char*>(base) + static_cast<int64_t>(offsets[i]) * scale, sizeof(int32_t));
  }
  return bits<simde__m512i>(out);
}

}  // namespace zeroserve_simde

#ifndef _mm512_cvtepu16_epi32
#define _mm512_cvtepu16_epi32(a) zeroserve_simde::cvtepu16_epi32(a)
#endif
#ifndef _mm512_cvtepi16_epi32
#define _mm512_cvtepi16_epi32(a) zeroserve_simde::cvtepi16_epi32(a)
#endif
#ifndef _mm512_cvtepu8_epi32
#define _mm512_cvtepu8_epi32(a) zeroserve_simde::cvtepu8_epi32(a)
#endif
#ifndef _mm512_cvtepi8_epi32
#define _mm512_cvtepi8_epi32(a) zeroserve_simde::cvtepi8_epi32(a)
#endif
#ifndef _mm512_cvtepi32_ps
#define _mm512_cvtepi32_ps(a) zeroserve_simde::cvtepi32_ps(a)
#endif
#ifndef _mm512_cvtps_epi32
#define _mm512_cvtps_epi32(a) zeroserve_simde::cvtps_epi32(a)
#endif
#ifndef _mm512_cvtepi32_epi16
#define _mm512_cvtepi32_epi16(a) zeroserve_simde::cvtepi32_epi16(a)
#endif
#ifndef _mm512_cvtph_ps
#define _mm512_cvtph_ps(a) zeroserve_simde::cvtph_ps(a)
#endif
#ifndef _mm512_i32gather_epi32
#define _mm512_i32gather_epi32(index, base, scale) zeroserve_simde::i32gather_epi32(index, base, scale)
#endif
