// The packed layout the integer kernels share (int4_q8.cpp, int6k_q8.cpp): a weight's codes in blocks
// of 16 outputs, per group of 32 inputs, as lanes of four bytes per output, the way `vpdpbusd` reads
// them; and a per-row table (scales, minimums) regrouped per block of 16 outputs.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace zeroserve {

constexpr int64_t kNibbleBlock = 16;  // outputs per block
constexpr int64_t kNibbleGroup = 32;  // inputs per group

// codes [N, K] [N/16, 16 outputs, G, 4 quarters, 2 nibbles, 4] -> [N/16, G, 4 quarters, 2 nibbles, 16 outputs, 4]:
// quarter c of a group (inputs 8c .. 8c + 7), nibble h its inputs 8c + 4h .. 8c + 4h + 3, each output's four.
inline at::Tensor nibble_lanes(const at::Tensor& codes) {
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == at::kByte);
  const int64_t n = codes.size(0), k = codes.size(1);
  TORCH_CHECK(n % kNibbleBlock == 0 && k % kNibbleGroup == 0);
  return codes.contiguous().view({n / kNibbleBlock, kNibbleBlock, k / kNibbleGroup, 4, 2, 4}).permute({0, 2, 3, 4, 1, 5}).contiguous();
}

// The low 4 bits of codes [N, K] packed: [N / 16, K / 32, 4, 64], quarter c's byte 4o + j holding output
// o's input 8c + j in its low nibble and input 8c + 4 + j in its high one.
inline at::Tensor pack_low_nibbles(const at::Tensor& codes) {
  const auto lanes = nibble_lanes(codes).bitwise_and(0x0F);
  const auto packed = lanes.select(3, 0).bitwise_or(lanes.select(3, 1).bitwise_left_shift(4));
  return packed.contiguous().view({codes.size(0) / kNibbleBlock, codes.size(1) / kNibbleGroup, 4, 64});
}

// A per-row table [N, C] (per group, sub-block or super-block) as [N / 16, C, 16] in `dtype`.
inline at::Tensor by_block(const at::Tensor& t, at::ScalarType dtype) {
  const int64_t n = t.size(0), c = t.size(1);
  return t.contiguous().view({n / kNibbleBlock, kNibbleBlock, c}).permute({0, 2, 1}).to(dtype).contiguous();
}

}  // namespace zeroserve
