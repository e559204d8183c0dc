// Greedy picks straight from the output head (x86 CPUs with AMX BF16): each row's argmax of
// hidden @ weight.T, the logits computed 32 rows × 32 ids at a time in AMX tiles and compared
// where they land, so the [rows, vocab] logits are never written out. Each logit is rounded to
// bfloat16 as the bfloat16 matmul's output would be, and 32 of them are compared at once as
// 16-bit integers in the floats' order, so ties resolve as `argmax` over those logits does:
// the first maximum wins.
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <ATen/ATen.h>
#include <unistd.h>

#include <cstdint>
#include <limits>

namespace {

constexpr int64_t kTileRows = 16;  // rows, and vocabulary ids, of one tile
constexpr int64_t kTileDepth = 32;  // bfloat16 features one tile multiplies
constexpr int64_t kTileElements = kTileRows * kTileDepth;
constexpr int64_t kBlockIds = 2 * kTileRows;  // ids of one step: two weight tiles
constexpr int64_t kBlockRows = 2 * kTileRows;  // rows of one step: two hidden tiles
constexpr int64_t kChunkBytes = 512 * 1024;  // of weights in one work item: they stay in L2 across its rows

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

// bfloat16 bit patterns -> 16-bit integers in the floats' order (negative values' magnitude
// bits flipped; -0 taken as +0, which argmax counts as equal).
inline __m512i ordered_keys(__m512i bits) {
  bits = _mm512_mask_mov_epi16(bits, _mm512_cmpeq_epi16_mask(bits, _mm512_set1_epi16(static_cast<int16_t>(0x8000))),
                               _mm512_setzero_si512());
  return _mm512_xor_si512(bits, _mm512_and_si512(_mm512_srai_epi16(bits, 15), _mm512_set1_epi16(0x7FFF)));
}

// Folds one block's 32 rows × 32 ids of logits into each row's running best: per lane (id mod
// 32) the largest bf16 logit so far, as an ordered key, and the block it came from.
inline void update_best(const float (&logits)[4][kTileRows][kTileRows], int16_t block, __mmask32 is_valid,
                        int16_t (&best_keys)[kBlockRows][kBlockIds], int16_t (&best_blocks)[kBlockRows][kBlockIds]) {
  const __m512i block_vec = _mm512_set1_epi16(block);
  for (int64_t half = 0; half < 2; ++half) {
    for (int64_t row = 0; row < kTileRows; ++row) {
      // NOTE: ids 0-15 of the block from the first tile, 16-31 from the second, rounded to bf16 as torch rounds.
      const __m512bh rounded = _mm512_cvtne2ps_pbh(_mm512_load_ps(logits[2 * half + 1][row]), _mm512_load_ps(logits[2 * half][row]));
      const __m512i keys = ordered_keys(reinterpret_cast<const __m512i&>(rounded));
      int16_t* row_keys = best_keys[half * kTileRows + row];
      int16_t* row_blocks = best_blocks[half * kTileRows + row];
      const __m512i best = _mm512_load_si512(row_keys);
      // NOTE: strictly greater, and blocks rise: a lane keeps its first maximum.
      const __mmask32 is_better = _mm512_mask_cmpgt_epi16_mask(is_valid, keys, best);
      _mm512_store_si512(row_keys, _mm512_mask_mov_epi16(best, is_better, keys));
      _mm512_store_si512(row_blocks, _mm512_mask_mov_epi16(_mm512_load_si512(row_blocks), is_better, block_vec));
    }
  }
}

}  // namespace

// weight [vocab, hidden] bf16 -> the AMX tile layout greedy_head reads: [ceil(vocab / 32) * 2,
// hidden / 32, 16, 32], each 16 × 32 tile holding 16 ids' pairs of features side by side.
at::Tensor pack_greedy_head(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16 && weight.size(1) % kTileDepth == 0);
  const int64_t vocab_size = weight.size(0), hidden = weight.size(1);
  const int64_t padded = (vocab_size + kBlockIds - 1) / kBlockIds * kBlockIds;
  auto padded_weight = at::zeros({padded, hidden}, weight.options());
  padded_weight.narrow(0, 0, vocab_size).copy_(weight);
  // [tile, id, depth chunk, pair, two] -> [tile, depth chunk, pair, id, two]
  return padded_weight.view({padded / kTileRows, kTileRows, hidden / kTileDepth, kTileRows, 2})
      .permute({0, 2, 3, 1, 4})
      .contiguous()
      .view({padded / kTileRows, hidden / kTileDepth, kTileRows, kTileDepth});
}

// hidden [rows, H] bf16, packed_weight from pack_greedy_head -> int64 [rows]: each row's first argmax
// of bf16(hidden @ weight.T) over the first vocab_size ids.
at::Tensor greedy_head(const at::Tensor& hidden, const at::Tensor& packed_weight, int64_t vocab_size) {
  TORCH_CHECK(hidden.dim() == 2 && hidden.scalar_type() == at::kBFloat16 && packed_weight.scalar_type() == at::kBFloat16);
  TORCH_CHECK(is_amx_granted(), "the kernel asked Linux for AMX tile state and was refused");
  const int64_t num_rows = hidden.size(0), depth = hidden.size(1), num_chunks_k = depth / kTileDepth;
  TORCH_CHECK(depth % kTileDepth == 0 && packed_weight.size(1) == num_chunks_k);
  const int64_t num_blocks = packed_weight.size(0) / 2;
  TORCH_CHECK(num_blocks * kBlockIds >= vocab_size && num_blocks <= std::numeric_limits<int16_t>::max());
  const int64_t padded_rows = (num_rows + kBlockRows - 1) / kBlockRows * kBlockRows;
  auto x = hidden.contiguous();
  if (padded_rows != num_rows) {
    x = at::cat({x, at::zeros({padded_rows - num_rows, depth}, x.options())});
  }
  const int64_t num_row_blocks = padded_rows / kBlockRows;
  const int64_t chunk_blocks = std::max<int64_t>(1, kChunkBytes / (kBlockIds * depth * 2));
  const int64_t num_chunks = (num_blocks + chunk_blocks - 1) / chunk_blocks;
  auto chunk_best = at::empty({padded_rows, num_chunks}, hidden.options().dtype(at::kShort));
  auto chunk_ids = at::empty({padded_rows, num_chunks}, hidden.options().dtype(at::kInt));
  const auto* xs = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const auto* ws = reinterpret_cast<const uint16_t*>(packed_weight.data_ptr());
  auto* chunk_best_out = chunk_best.data_ptr<int16_t>();
  auto* chunk_ids_out = chunk_ids.data_ptr<int32_t>();
  const int64_t x_stride = depth * 2;  // bytes

  // NOTE: work items run chunk-major, so a thread's consecutive items reuse one chunk of the
  // weight (from L2) across every block of rows.
  at::parallel_for(0, num_chunks * num_row_blocks, 1, [&](int64_t begin, int64_t end) {
    const TileConfig config;
    _tile_loadconfig(&config);
    alignas(64) float logits[4][kTileRows][kTileRows];
    alignas(64) int16_t best_keys[kBlockRows][kBlockIds];
    alignas(64) int16_t best_blocks[kBlockRows][kBlockIds];
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t chunk = item / num_row_blocks, row_block = item % num_row_blocks;
      for (int64_t row = 0; row < kBlockRows; ++row) {
        _mm512_store_si512(best_keys[row], _mm512_set1_epi16(std::numeric_limits<int16_t>::min()));
        _mm512_store_si512(best_blocks[row], _mm512_setzero_si512());
      }
      const uint16_t* x0 = xs + row_block * kBlockRows * depth;
      const uint16_t* x1 = x0 + kTileRows * depth;
      const int64_t block_end = std::min(num_blocks, (chunk + 1) * chunk_blocks);
      for (int64_t block = chunk * chunk_blocks; block < block_end; ++block) {
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
        const int64_t num_valid = std::min<int64_t>(kBlockIds, vocab_size - block * kBlockIds);
        const __mmask32 is_valid = num_valid >= kBlockIds ? ~__mmask32{0} : (__mmask32{1} << num_valid) - 1;
        update_best(logits, static_cast<int16_t>(block), is_valid, best_keys, best_blocks);
      }
      for (int64_t row = 0; row < kBlockRows; ++row) {
        // NOTE: the largest key, then the smallest id holding it: the chunk's first maximum.
        const __m512i keys0 = _mm512_cvtepi16_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(best_keys[row])));
        const __m512i keys1 = _mm512_cvtepi16_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(best_keys[row] + 16)));
        const int32_t top = _mm512_reduce_max_epi32(_mm512_max_epi32(keys0, keys1));
        const __m512i blocks0 = _mm512_cvtepi16_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(best_blocks[row])));
        const __m512i blocks1 = _mm512_cvtepi16_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(best_blocks[row] + 16)));
        const __m512i ids0 = _mm512_add_epi32(_mm512_slli_epi32(blocks0, 5), lanes);
        const __m512i ids1 = _mm512_add_epi32(_mm512_slli_epi32(blocks1, 5), _mm512_add_epi32(lanes, _mm512_set1_epi32(16)));
        const __m512i none = _mm512_set1_epi32(std::numeric_limits<int32_t>::max());
        const __m512i top_vec = _mm512_set1_epi32(top);
        const __m512i candidates = _mm512_min_epi32(_mm512_mask_mov_epi32(none, _mm512_cmpeq_epi32_mask(keys0, top_vec), ids0),
                                                    _mm512_mask_mov_epi32(none, _mm512_cmpeq_epi32_mask(keys1, top_vec), ids1));
        const int64_t out_row = row_block * kBlockRows + row;
        chunk_best_out[out_row * num_chunks + chunk] = static_cast<int16_t>(top);
        chunk_ids_out[out_row * num_chunks + chunk] = _mm512_reduce_min_epi32(candidates);
      }
    }
    _tile_release();
  });

  auto token_ids = at::empty({num_rows}, hidden.options().dtype(at::kLong));
  auto* out = token_ids.data_ptr<int64_t>();
  for (int64_t row = 0; row < num_rows; ++row) {
    // NOTE: chunks in id order, strictly greater: the first maximum wins across chunks too.
    int16_t top = chunk_best_out[row * num_chunks];
    int32_t top_id = chunk_ids_out[row * num_chunks];
    for (int64_t chunk = 1; chunk < num_chunks; ++chunk) {
      if (chunk_best_out[row * num_chunks + chunk] > top) {
        top = chunk_best_out[row * num_chunks + chunk];
        top_id = chunk_ids_out[row * num_chunks + chunk];
      }
    }
    out[row] = top_id;
  }
  return token_ids;
}
