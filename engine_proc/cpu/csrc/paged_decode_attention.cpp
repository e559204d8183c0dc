// Decode attention that reads a paged bfloat16 K/V cache in place (x86 CPUs, AVX-512 BF16 or AVX2).
//
// The Python side (engine_proc/cpu/kernels.py) builds this once per machine with
// torch.utils.cpp_extension and falls back to gather + SDPA where it cannot. For each
// (sequence, KV head), in one OpenMP task: (1) block by block, the 16 keys transposed to
// [head_dim][16] floats in registers and every query row's
// scores, up to 4 rows per pass over the keys (16 keys of a block = the 16 lanes of a
// register); (2) each row's softmax over the keys it may see (`row_limits`: a row's query
// position + 1; with a sliding window `row_starts`: the first key it sees) and, with attention
// sinks, its sink logit as one more term of the denominator (`row_sinks`: gpt-oss's learned logit
// per query head, which weighs no value); (3) the probabilities times V, read from the cache
// blocks as bfloat16, up to 4 rows per pass. Float32 throughout, bfloat16 out (rounded to nearest
// even, as torch does).
//
// Keys are read from the block of the item's first start on, in order; a key a row does not see
// weighs an exact 0 in its sums, and every key keeps its lane (position % 16), so a row's bits do
// not depend on the other rows of its item or step (a decode, a prompt chunk, a cached prefix alike).
//
// NOTE: both instruction sets run this same arithmetic (vec16.h), so a row's output is the same bits
// on any x86 CPU. The AVX-512 build once took its scores by bfloat16 dot products (`vdpbf16ps`: one
// chain of sums per row where this has two, the scale after the sums, and subnormals flushed), which
// moved gemma-3-270m's greedy answers on an AVX-512 Xeon away from the AVX2 builds'.

#include <ATen/Parallel.h>
#include <ATen/ATen.h>

#include "vec16.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

using namespace zeroserve;

constexpr int64_t kBlockSize = 16;  // keys per cache block: the lanes of one V16
constexpr int64_t kPrefetchBlocks = 1;  // how far ahead keys are prefetched (2 and 4 measured slower)

// scores[i][0..16) = q[i] · keys of one block, for N rows; keys_t is the block as [head_dim][16].
template <int N>
inline void score_rows(const float* q, int64_t head_dim, const float* keys_t, float* scores, int64_t stride) {
  V16 even[N], odd[N];
  for (int i = 0; i < N; ++i) even[i] = odd[i] = zero16();
  for (int64_t d = 0; d < head_dim; d += 2) {
    const V16 k0 = load16(keys_t + d * kBlockSize), k1 = load16(keys_t + (d + 1) * kBlockSize);
    for (int i = 0; i < N; ++i) {
      even[i] = fmadd(set16(q[i * head_dim + d]), k0, even[i]);
      odd[i] = fmadd(set16(q[i * head_dim + d + 1]), k1, odd[i]);
    }
  }
  for (int i = 0; i < N; ++i) store16(scores + i * stride, even[i] + odd[i]);
}

// out[i][col, col + 16 G) = probs[i] · values over `length` keys, for N rows and G groups of 16
// columns; the values are read as bfloat16 from their cache blocks (`value_blocks`, 16 keys each).
template <int N, int G>
inline void weigh_columns(const float* probs, int64_t stride, const uint16_t* const* value_blocks, int64_t length, float* out,
                          int64_t head_dim, int64_t col) {
  V16 acc[N][G];
  for (int i = 0; i < N; ++i) for (int c = 0; c < G; ++c) acc[i][c] = zero16();
  for (int64_t j = 0; j < length; ++j) {
    const uint16_t* row = value_blocks[j / kBlockSize] + (j % kBlockSize) * head_dim + col;
    V16 v[G];
    for (int c = 0; c < G; ++c) v[c] = load_bf16(row + c * 16);
    for (int i = 0; i < N; ++i) {
      const V16 p = set16(probs[i * stride + j]);
      for (int c = 0; c < G; ++c) acc[i][c] = fmadd(p, v[c], acc[i][c]);
    }
  }
  for (int i = 0; i < N; ++i) for (int c = 0; c < G; ++c) store16(out + i * head_dim + col + c * 16, acc[i][c]);
}

// out[i] = probs[i] · values over `length` keys, for N rows, up to 64 columns at a time.
template <int N>
inline void weigh_rows(const float* probs, int64_t stride, const uint16_t* const* value_blocks, int64_t length, float* out,
                       int64_t head_dim) {
  int64_t col = 0;
  for (; col + 64 <= head_dim; col += 64) weigh_columns<N, 4>(probs, stride, value_blocks, length, out, head_dim, col);
  switch ((head_dim - col) / 16) {
    case 3: weigh_columns<N, 3>(probs, stride, value_blocks, length, out, head_dim, col); break;
    case 2: weigh_columns<N, 2>(probs, stride, value_blocks, length, out, head_dim, col); break;
    case 1: weigh_columns<N, 1>(probs, stride, value_blocks, length, out, head_dim, col); break;
    default: break;
  }
}

// fn(N, r) over rows [0, num_rows): 4 rows at a time, then the 3, 2 or 1 left (N a compile-time constant).
template <typename Fn>
inline void by_row_groups(int64_t num_rows, Fn&& fn) {
  int64_t r = 0;
  for (; r + 4 <= num_rows; r += 4) fn(std::integral_constant<int, 4>{}, r);
  switch (num_rows - r) {
    case 3: fn(std::integral_constant<int, 3>{}, r); break;
    case 2: fn(std::integral_constant<int, 2>{}, r); break;
    case 1: fn(std::integral_constant<int, 1>{}, r); break;
    default: break;
  }
}

// Asks for the cache lines of `count` bfloat16 values from `src` to be loaded (a hint: never faults).
inline void prefetch_lines(const uint16_t* src, int64_t count) {
  for (int64_t i = 0; i < count; i += 32) _mm_prefetch(reinterpret_cast<const char*>(src + i), _MM_HINT_T0);
}

// Lanes of x in [lo, hi) (counted from this vector's first), the others from `fill`.
inline V16 lanes_between(V16 x, int64_t lo, int64_t hi, V16 fill) {
  return first_lanes(fill, lo, first_lanes(x, hi, fill));
}

// e^x for one float, by exp16's arithmetic.
inline float exp1(float x) {
  alignas(64) float lanes[16];
  store16(lanes, exp16(set16(x)));
  return lanes[0];
}

float* aligned(std::vector<float>& buffer) {
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buffer.data()) + 63) & ~uintptr_t{63});
}

}  // namespace

// query [S, KVH, R, D] (R rows per KV head: its query heads × the sequence's query tokens),
// cache [2, KVH, num_slots, D] (slot = block * 16 + offset), block_table [S, max_blocks],
// row_limits [S, R] (how many keys each row sees), row_starts [S, R] or None (the first key each
// row sees; None: key 0), row_sinks [KVH, R] float32 or None (each row's sink logit, in the
// scaled scores' units); returns [S, KVH, R, D].
// With `out` given ([S, KVH, R, D] bf16, contiguous), only the (sequence, KV head) items [item_begin, item_end) are
// attended, into it, on the calling thread: a share of a step for a thread of decoder_layers.cpp's one region.
at::Tensor paged_decode_attention_items(
    const at::Tensor& query, const at::Tensor& cache, const at::Tensor& block_table,
    const at::Tensor& row_limits, double scale, const std::optional<at::Tensor>& row_starts,
    const std::optional<at::Tensor>& row_sinks, const at::Tensor* given_out, int64_t item_begin, int64_t item_end) {
  TORCH_CHECK(query.scalar_type() == at::kBFloat16 && cache.scalar_type() == at::kBFloat16, "bfloat16 only");
  TORCH_CHECK(block_table.scalar_type() == at::kLong && row_limits.scalar_type() == at::kLong, "int64 tables");
  TORCH_CHECK(query.is_contiguous() && cache.is_contiguous() && block_table.is_contiguous() && row_limits.is_contiguous());
  const int64_t num_seqs = query.size(0), num_kv_heads = query.size(1), num_rows = query.size(2), head_dim = query.size(3);
  TORCH_CHECK(head_dim % 16 == 0 && cache.size(3) == head_dim && cache.size(1) == num_kv_heads, "head_dim must be a multiple of 16");
  TORCH_CHECK(row_limits.size(0) == num_seqs && row_limits.size(1) == num_rows && block_table.size(0) == num_seqs);
  if (row_starts) {
    TORCH_CHECK(row_starts->scalar_type() == at::kLong && row_starts->is_contiguous() && row_starts->sizes() == row_limits.sizes(),
                "row_starts: int64, contiguous, shaped as row_limits");
  }
  if (row_sinks) {
    TORCH_CHECK(row_sinks->scalar_type() == at::kFloat && row_sinks->is_contiguous() && row_sinks->dim() == 2 &&
                row_sinks->size(0) == num_kv_heads && row_sinks->size(1) == num_rows, "row_sinks: float32 [KVH, R], contiguous");
  }
  const int64_t* starts_all = row_starts ? row_starts->data_ptr<int64_t>() : nullptr;
  const float* sinks_all = row_sinks ? row_sinks->data_ptr<float>() : nullptr;
  const int64_t num_slots = cache.size(2), max_blocks = block_table.size(1);
  auto out = given_out == nullptr ? at::empty_like(query) : *given_out;
  TORCH_CHECK(out.sizes() == query.sizes() && out.scalar_type() == at::kBFloat16 && out.is_contiguous());
  const auto* queries = reinterpret_cast<const uint16_t*>(query.data_ptr());
  const auto* kv = reinterpret_cast<const uint16_t*>(cache.data_ptr());
  const int64_t* tables = block_table.data_ptr<int64_t>();
  const int64_t* limits_all = row_limits.data_ptr<int64_t>();
  auto* outs = reinterpret_cast<uint16_t*>(out.data_ptr());
  int64_t longest = 0;
  for (int64_t i = 0; i < num_seqs * num_rows; ++i) longest = std::max(longest, limits_all[i]);
  TORCH_CHECK(longest <= max_blocks * kBlockSize, "a row sees more keys than its blocks hold");
  const int64_t max_keys = (longest + kBlockSize - 1) / kBlockSize * kBlockSize;
  const V16 vscale = set16(static_cast<float>(scale));

  const auto attend = [&](int64_t begin, int64_t end) {
    std::vector<float> q_buf(num_rows * head_dim + 16), k_buf(kBlockSize * head_dim + 16), s_buf(num_rows * max_keys + 16),
        o_buf(num_rows * head_dim + 16);
    std::vector<const uint16_t*> value_blocks(max_keys / kBlockSize);
    float *q = aligned(q_buf), *keys_t = aligned(k_buf), *scores = aligned(s_buf), *o = aligned(o_buf);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t seq = item / num_kv_heads, head = item % num_kv_heads;
      const int64_t* limits = limits_all + seq * num_rows;
      const int64_t* starts = starts_all == nullptr ? nullptr : starts_all + seq * num_rows;
      const int64_t num_keys = *std::max_element(limits, limits + num_rows);
      const int64_t first_key = starts == nullptr ? 0 : std::min(*std::min_element(starts, starts + num_rows), num_keys);
      // NOTE: the item's keys from the block of its first start on: scores and values are indexed from `base`.
      const int64_t first_block = first_key / kBlockSize, base = first_block * kBlockSize;
      const int64_t num_blocks = (num_keys + kBlockSize - 1) / kBlockSize, length = num_blocks * kBlockSize - base;
      const uint16_t* q_in = queries + item * num_rows * head_dim;
      for (int64_t i = 0; i < num_rows * head_dim; i += 16) store16(q + i, load_bf16(q_in + i) * vscale);
      // 1) keys and values of the sequence's blocks, then the scores block by block.
      const uint16_t* k_cache = kv + head * num_slots * head_dim;
      const uint16_t* v_cache = kv + (num_kv_heads + head) * num_slots * head_dim;
      const int64_t block_elems = kBlockSize * head_dim;
      for (int64_t b = first_block; b < num_blocks; ++b) {
        const int64_t block = tables[seq * max_blocks + b];
        const uint16_t* k_block = k_cache + block * block_elems;
        const uint16_t* v_block = v_cache + block * block_elems;
        value_blocks[b - first_block] = v_block;
        // NOTE: blocks lie anywhere in the cache, out of the hardware prefetcher's sight: the next
        // block's keys and this block's values (read in 3) are asked for while this block's scores run.
        if (b + kPrefetchBlocks < num_blocks) {
          prefetch_lines(k_cache + tables[seq * max_blocks + b + kPrefetchBlocks] * block_elems, block_elems);
        }
        prefetch_lines(v_block, block_elems);
        load_bf16_block_transposed(k_block, head_dim, keys_t);
        const int64_t offset = (b - first_block) * kBlockSize;
        by_row_groups(num_rows, [&](auto n, int64_t r) {
          score_rows<decltype(n)::value>(q + r * head_dim, head_dim, keys_t, scores + r * length + offset, length);
        });
      }
      // 2) each row's softmax over its keys [starts[r], limits[r]) (and its sink); the others weigh 0.
      const float* sinks = sinks_all == nullptr ? nullptr : sinks_all + head * num_rows;
      for (int64_t r = 0; r < num_rows; ++r) {
        float* row = scores + r * length;
        const int64_t lo = (starts == nullptr ? 0 : starts[r]) - base, hi = std::min(limits[r] - base, length);
        const V16 lowest = set16(-1e30f);
        V16 row_max = lowest;
        for (int64_t j = 0; j < length; j += 16) row_max = max16(row_max, lanes_between(load16(row + j), lo - j, hi - j, lowest));
        const float top = sinks == nullptr ? reduce_max(row_max) : std::max(reduce_max(row_max), sinks[r]);
        const V16 vtop = set16(top);
        V16 sum = zero16();
        for (int64_t j = 0; j < length; j += 16) {
          const V16 e = lanes_between(exp16(load16(row + j) - vtop), lo - j, hi - j, zero16());
          sum = sum + e;
          store16(row + j, e);
        }
        const float total = sinks == nullptr ? reduce_add(sum) : reduce_add(sum) + exp1(sinks[r] - top);
        const V16 inverse = set16(total > 0.f ? 1.f / total : 0.f);
        for (int64_t j = 0; j < length; j += 16) store16(row + j, load16(row + j) * inverse);
      }
      // 3) probabilities times values.
      by_row_groups(num_rows, [&](auto n, int64_t r) {
        weigh_rows<decltype(n)::value>(scores + r * length, length, value_blocks.data(), length, o + r * head_dim, head_dim);
      });
      uint16_t* o_out = outs + item * num_rows * head_dim;
      for (int64_t i = 0; i < num_rows * head_dim; i += 16) store_bf16(o_out + i, load16(o + i));
    }
  };
  if (given_out == nullptr) {
    at::parallel_for(0, num_seqs * num_kv_heads, 1, attend);
  } else if (item_begin < item_end) {
    TORCH_CHECK(item_begin >= 0 && item_end <= num_seqs * num_kv_heads, "paged_decode_attention: items out of range");
    attend(item_begin, item_end);
  }
  return out;
}

at::Tensor paged_decode_attention(
    const at::Tensor& query, const at::Tensor& cache, const at::Tensor& block_table,
    const at::Tensor& row_limits, double scale, const std::optional<at::Tensor>& row_starts,
    const std::optional<at::Tensor>& row_sinks) {
  return paged_decode_attention_items(query, cache, block_table, row_limits, scale, row_starts, row_sinks, nullptr, 0, 0);
}
