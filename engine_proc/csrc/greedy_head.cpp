// Greedy picks straight from the output head (x86 CPUs with AMX BF16): each row's argmax of
// hidden @ weight.T, the logits computed 32 rows × 32 ids at a time in AMX tiles and compared
// where they land, so the [rows, vocab] logits are never written out. Each logit is rounded to
// bfloat16 before it is compared, as the bfloat16 matmul's output would be, so ties resolve as
// `argmax` over those logits does: the first maximum wins.
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <torch/extension.h>
#include <unistd.h>

#include "vec_bf16.h"

#include <cstdint>
#include <limits>

using zeroserve::round_bf16;

namespace {

constexpr int64_t kTileRows = 16;  // rows, and vocabulary ids, of one tile
constexpr int64_t kTileDepth = 32;  // bfloat16 features one tile multiplies
constexpr int64_t kTileElements = kTileRows * kTileDepth;
constexpr int64_t kBlockIds = 2 * kTileRows;  // ids of one step: two weight tiles
constexpr int64_t kBlockRows = 2 * kTileRows;  // rows of one step: two hidden tiles
constexpr int64_t kChunkBlocks = 32;  // blocks of ids in one work item (1024 ids)

// The AMX palette-1 configuration: eight tiles of 16 rows × 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};

  TileConfig() {
    for (int tile = 0; tile < 8; ++tile) {
      colsb[tile] = 64;
      rows[tile] = kTileRows;
    }
  }
};

// Linux hands out AMX tile state only to a process that asked for it.
bool is_amx_granted() {
  static const bool granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return granted;
}

// Folds one block's 32 × 32 logits into each row's running best per lane (lane l holds ids ≡ l mod 16).
inline void update_best(const float (&logits)[4][kTileRows][kTileRows], int32_t first_id, int64_t vocab_size,
                        float (&best)[kBlockRows][kTileRows], int32_t (&best_ids)[kBlockRows][kTileRows]) {
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i ids0 = _mm512_add_epi32(_mm512_set1_epi32(first_id), lanes);
  const __m512i ids1 = _mm512_add_epi32(ids0, _mm512_set1_epi32(kTileRows));
  const __m512i limit = _mm512_set1_epi32(static_cast<int32_t>(vocab_size));
  const __mmask16 valid0 = _mm512_cmplt_epi32_mask(ids0, limit);
  const __mmask16 valid1 = _mm512_cmplt_epi32_mask(ids1, limit);
  for (int64_t half = 0; half < 2; ++half) {
    for (int64_t row = 0; row < kTileRows; ++row) {
      float* row_best = best[half * kTileRows + row];
      int32_t* row_ids = best_ids[half * kTileRows + row];
      __m512 values = _mm512_load_ps(row_best);
      __m512i ids = _mm512_load_si512(row_ids);
      // NOTE: strictly greater, and ids rise along a lane: a lane keeps its first maximum.
      const __m512 first = round_bf16(_mm512_load_ps(logits[2 * half][row]));
      const __mmask16 is_better0 = _mm512_mask_cmp_ps_mask(valid0, first, values, _CMP_GT_OQ);
      values = _mm512_mask_mov_ps(values, is_better0, first);
      ids = _mm512_mask_mov_epi32(ids, is_better0, ids0);
      const __m512 second = round_bf16(_mm512_load_ps(logits[2 * half + 1][row]));
      const __mmask16 is_better1 = _mm512_mask_cmp_ps_mask(valid1, second, values, _CMP_GT_OQ);
      values = _mm512_mask_mov_ps(values, is_better1, second);
      ids = _mm512_mask_mov_epi32(ids, is_better1, ids1);
      _mm512_store_ps(row_best, values);
      _mm512_store_si512(row_ids, ids);
    }
  }
}

}  // namespace

// weight [vocab, hidden] bf16 -> the AMX tile layout greedy_head reads: [ceil(vocab / 32) * 2,
// hidden / 32, 16, 32], each 16 × 32 tile holding 16 ids' pairs of features side by side.
torch::Tensor pack_greedy_head(const torch::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16 && weight.size(1) % kTileDepth == 0);
  const int64_t vocab_size = weight.size(0), hidden = weight.size(1);
  const int64_t padded = (vocab_size + kBlockIds - 1) / kBlockIds * kBlockIds;
  auto padded_weight = torch::zeros({padded, hidden}, weight.options());
  padded_weight.narrow(0, 0, vocab_size).copy_(weight);
  // [tile, id, depth chunk, pair, two] -> [tile, depth chunk, pair, id, two]
  return padded_weight.view({padded / kTileRows, kTileRows, hidden / kTileDepth, kTileRows, 2})
      .permute({0, 2, 3, 1, 4})
      .contiguous()
      .view({padded / kTileRows, hidden / kTileDepth, kTileRows, kTileDepth});
}

// hidden [rows, H] bf16, packed_weight from pack_greedy_head -> int64 [rows]: each row's first argmax
// of bf16(hidden @ weight.T) over the first vocab_size ids.
torch::Tensor greedy_head(const torch::Tensor& hidden, const torch::Tensor& packed_weight, int64_t vocab_size) {
  TORCH_CHECK(hidden.dim() == 2 && hidden.scalar_type() == at::kBFloat16 && packed_weight.scalar_type() == at::kBFloat16);
  TORCH_CHECK(is_amx_granted(), "the kernel asked Linux for AMX tile state and was refused");
  const int64_t num_rows = hidden.size(0), depth = hidden.size(1), num_chunks_k = depth / kTileDepth;
  TORCH_CHECK(depth % kTileDepth == 0 && packed_weight.size(1) == num_chunks_k);
  const int64_t num_blocks = packed_weight.size(0) / 2;
  TORCH_CHECK(num_blocks * kBlockIds >= vocab_size);
  const int64_t padded_rows = (num_rows + kBlockRows - 1) / kBlockRows * kBlockRows;
  auto x = hidden.contiguous();
  if (padded_rows != num_rows) {
    x = torch::cat({x, torch::zeros({padded_rows - num_rows, depth}, x.options())});
  }
  const int64_t num_row_blocks = padded_rows / kBlockRows;
  const int64_t num_chunks = (num_blocks + kChunkBlocks - 1) / kChunkBlocks;
  auto chunk_best = torch::empty({padded_rows, num_chunks}, hidden.options().dtype(at::kFloat));
  auto chunk_ids = torch::empty({padded_rows, num_chunks}, hidden.options().dtype(at::kInt));
  const auto* xs = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const auto* ws = reinterpret_cast<const uint16_t*>(packed_weight.data_ptr());
  auto* chunk_best_out = chunk_best.data_ptr<float>();
  auto* chunk_ids_out = chunk_ids.data_ptr<int32_t>();
  const int64_t x_stride = depth * 2;  // bytes

  // NOTE: work items run chunk-major, so a thread's consecutive items reuse one chunk of the
  // weight (from L2) across every block of rows.
  at::parallel_for(0, num_chunks * num_row_blocks, 1, [&](int64_t begin, int64_t end) {
    const TileConfig config;
    _tile_loadconfig(&config);
    alignas(64) float logits[4][kTileRows][kTileRows];
    alignas(64) float best[kBlockRows][kTileRows];
    alignas(64) int32_t best_ids[kBlockRows][kTileRows];
    for (int64_t item = begin; item < end; ++item) {
      const int64_t chunk = item / num_row_blocks, row_block = item % num_row_blocks;
      for (int64_t row = 0; row < kBlockRows; ++row) {
        _mm512_store_ps(best[row], _mm512_set1_ps(-std::numeric_limits<float>::infinity()));
        _mm512_store_si512(best_ids[row], _mm512_set1_epi32(std::numeric_limits<int32_t>::max()));
      }
      const uint16_t* x0 = xs + row_block * kBlockRows * depth;
      const uint16_t* x1 = x0 + kTileRows * depth;
      const int64_t block_end = std::min(num_blocks, (chunk + 1) * kChunkBlocks);
      for (int64_t block = chunk * kChunkBlocks; block < block_end; ++block) {
        const uint16_t* w0 = ws + 2 * block * num_chunks_k * kTileElements;
        const uint16_t* w1 = w0 + num_chunks_k * kTileElements;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t k = 0; k < num_chunks_k; ++k) {
          _tile_loadd(4, x0 + k * kTileDepth, x_stride);
          _tile_loadd(5, x1 + k * kTileDepth, x_stride);
          _tile_loadd(6, w0 + k * kTileElements, 64);
          _tile_loadd(7, w1 + k * kTileElements, 64);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, logits[0], 64);
        _tile_stored(1, logits[1], 64);
        _tile_stored(2, logits[2], 64);
        _tile_stored(3, logits[3], 64);
        update_best(logits, static_cast<int32_t>(block * kBlockIds), vocab_size, best, best_ids);
      }
      for (int64_t row = 0; row < kBlockRows; ++row) {
        const __m512 values = _mm512_load_ps(best[row]);
        const float top = _mm512_reduce_max_ps(values);
        const __mmask16 is_top = _mm512_cmp_ps_mask(values, _mm512_set1_ps(top), _CMP_EQ_OQ);
        const __m512i ids = _mm512_mask_mov_epi32(_mm512_set1_epi32(std::numeric_limits<int32_t>::max()), is_top,
                                                  _mm512_load_si512(best_ids[row]));
        const int64_t out_row = row_block * kBlockRows + row;
        chunk_best_out[out_row * num_chunks + chunk] = top;
        chunk_ids_out[out_row * num_chunks + chunk] = _mm512_reduce_min_epi32(ids);
      }
    }
    _tile_release();
  });

  auto token_ids = torch::empty({num_rows}, hidden.options().dtype(at::kLong));
  auto* out = token_ids.data_ptr<int64_t>();
  for (int64_t row = 0; row < num_rows; ++row) {
    // NOTE: chunks in id order, strictly greater: the first maximum wins across chunks too.
    float top = chunk_best_out[row * num_chunks];
    int32_t top_id = chunk_ids_out[row * num_chunks];
    for (int64_t chunk = 1; chunk < num_chunks; ++chunk) {
      if (chunk_best_out[row * num_chunks + chunk] > top) {
        top = chunk_best_out[row * num_chunks + chunk];
        top_id = chunk_ids_out[row * num_chunks + chunk];
      }
    }
    // NOTE: a row of NaNs has no maximum; it gets id 0 rather than one past the vocabulary.
    out[row] = top_id == std::numeric_limits<int32_t>::max() ? 0 : top_id;
  }
  return token_ids;
}
