// A dense decoder's layers for a step of one-token decodes in one call (engine_proc/models/llama.py's
// `LlamaForCausalLM._fuse_layers`): the kernels the layers' modules call one by one from Python (norms,
// each projection's kernel forms, rotary with the K/V write, paged attention, SiLU·up), on the same
// inputs in the same order, so the same bits, without the interpreter between them.
//
// With more than one thread, the whole stack runs in one parallel region: each projection's outputs and the
// attention's (sequence, KV head) items shared among the threads as at::parallel_for would share them, the
// small per-row kernels on the first thread, the threads meeting at a spin barrier between steps of a layer.
// Starting and joining a parallel region took 2.5 us on a 2-core Zen 5, five times a layer (a form's outputs
// split among threads do not change a row's bits: each output's sums are its own).
#include "decoder_layers.h"

#include "kernel_forms.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <omp.h>

#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

namespace {

constexpr int64_t kBlock = 16;  // outputs per block of every kernel form's packing
constexpr int64_t kSpinsBeforeYield = 4096;  // about 20-100 us of `pause`

// Threads meet here between the steps of a layer; a thread that failed lets the others through, `wait` then false.
class SpinBarrier {
 public:
  explicit SpinBarrier(int64_t num_threads) : num_threads_(num_threads) {}

  bool wait() {
    const int64_t generation = generation_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) == num_threads_ - 1) {
      count_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
    } else {
      // NOTE: a thread that waits long has most likely lost its partner's core to another process (a server's
      // gateway): its own core is then handed back to the scheduler in turns, not spun on.
      for (int64_t spins = 0; generation_.load(std::memory_order_acquire) == generation; ++spins) {
        if (failed_.load(std::memory_order_relaxed)) return false;
        if (spins < kSpinsBeforeYield) {
          _mm_pause();
        } else {
          std::this_thread::yield();
        }
      }
    }
    return !failed_.load(std::memory_order_relaxed);
  }

  void fail() { failed_.store(true, std::memory_order_relaxed); }

 private:
  const int64_t num_threads_;
  std::atomic<int64_t> count_{0};
  std::atomic<int64_t> generation_{0};
  std::atomic<bool> failed_{false};
};

}  // namespace

at::Tensor Projection::operator()(const at::Tensor& x) const {
  const int64_t num_parts = static_cast<int64_t>(forms.size());
  at::Tensor out;
  if (num_parts == 1) {
    out = run_form(forms[0], x, packed[0], widths[0]);
  } else {
    std::vector<at::Tensor> outs;
    outs.reserve(num_parts);
    for (int64_t i = 0; i < num_parts; ++i) outs.push_back(run_form(forms[i], x, packed[i], widths[i]));
    out = at::cat(outs, -1);
  }
  return bias ? out + *bias : out;
}

int64_t Projection::width() const {
  int64_t total = 0;
  for (const int64_t w : widths) total += w;
  return total;
}

void Projection::share(int64_t num_threads) {
  shares.assign(num_threads, ProjectionShare{});
  int64_t column = 0;
  for (size_t p = 0; p < forms.size(); ++p) {
    const int64_t num_blocks = packed[p][0].size(0);
    for (int64_t t = 0; t < num_threads; ++t) {
      const int64_t begin = num_blocks * t / num_threads, end = num_blocks * (t + 1) / num_threads;
      const int64_t first = begin * kBlock, last = std::min(end * kBlock, widths[p]);
      if (last <= first) continue;
      std::vector<at::Tensor> slices;
      for (const auto& tensor : packed[p]) slices.push_back(tensor.narrow(0, begin, end - begin));
      ProjectionShare& mine = shares[t];
      mine.parts.push_back(static_cast<int64_t>(p));
      mine.packed.push_back(std::move(slices));
      mine.widths.push_back((end - begin) * kBlock);
      mine.columns.push_back(column + first);
      mine.num_columns.push_back(last - first);
    }
    column += widths[p];
  }
}

void Projection::run_share(const at::Tensor& x, at::Tensor& out, int64_t thread) const {
  const ProjectionShare& mine = shares[thread];
  const int64_t m = x.size(0), out_width = out.size(1);
  auto* dst = reinterpret_cast<uint16_t*>(out.data_ptr());
  const auto* b = bias ? reinterpret_cast<const c10::BFloat16*>(bias->data_ptr()) : nullptr;
  for (size_t i = 0; i < mine.parts.size(); ++i) {
    const auto part = run_form(forms[mine.parts[i]], x, mine.packed[i], mine.widths[i]);
    const auto* src = reinterpret_cast<const uint16_t*>(part.data_ptr());
    const int64_t column = mine.columns[i], count = mine.num_columns[i], stride = part.size(1);
    for (int64_t r = 0; r < m; ++r) {
      uint16_t* row = dst + r * out_width + column;
      std::memcpy(row, src + r * stride, count * sizeof(uint16_t));
      if (b == nullptr) continue;
      // NOTE: as torch adds two bfloat16 tensors: in float, rounded to nearest even.
      for (int64_t c = 0; c < count; ++c) {
        const float sum = static_cast<float>(c10::BFloat16(row[c], c10::BFloat16::from_bits())) + static_cast<float>(b[column + c]);
        row[c] = c10::BFloat16(sum).x;
      }
    }
  }
}

void DecoderLayers::share(int64_t threads) {
  num_threads = 1;
  if (threads <= 1 || layers.empty()) return;
  const DecoderLayer& first = layers[0];
  for (const DecoderLayer& layer : layers) {
    const bool is_same = layer.qkv.width() == first.qkv.width() && layer.o.width() == first.o.width() &&
                         layer.gate_up.width() == first.gate_up.width() && layer.down.width() == first.down.width();
    for (const Projection* projection : {&layer.qkv, &layer.o, &layer.gate_up, &layer.down}) {
      // NOTE: `run_share` adds a bias in bfloat16 alone (as the model's dtype makes it).
      if (!is_same || (projection->bias && (projection->bias->scalar_type() != at::kBFloat16 || !projection->bias->is_contiguous()))) return;
    }
  }
  for (DecoderLayer& layer : layers) {
    for (Projection* projection : {&layer.qkv, &layer.o, &layer.gate_up, &layer.down}) projection->share(threads);
  }
  num_threads = threads;
}

// hidden [T, H] bf16 (the token embeddings), cos_sin [T, 2D] (rotary_store_kv's table), slots [T] (each
// token's cache slot), caches: each layer's [2, KVH, num_slots, D], block_table [T, max_blocks] and row_limits
// [T, group] (paged_decode_attention's, one sequence a token) -> {the last layer's output, the residual
// stream}, not yet added (the final norm adds them, as after LlamaDecoderLayer).
std::vector<at::Tensor> DecoderLayers::serial(const at::Tensor& hidden, const at::Tensor& cos_sin, const at::Tensor& slots,
                                              const std::vector<at::Tensor>& caches, const at::Tensor& block_table,
                                              const at::Tensor& row_limits, double scale) const {
  const int64_t num_tokens = hidden.size(0);
  const int64_t group = num_heads / num_kv_heads;
  at::Tensor h = hidden;
  at::Tensor residual;
  for (size_t i = 0; i < layers.size(); ++i) {
    const DecoderLayer& layer = layers[i];
    at::Tensor cache = caches[i];
    at::Tensor x;
    if (i == 0) {
      x = rms_norm(h, layer.input_norm, layer.eps);
      residual = h;
    } else {
      x = add_rms_norm(h, residual, layer.input_norm, layer.eps);
    }
    const auto query_key = rotary_store_kv(layer.qkv(x), cos_sin, slots, cache, num_heads, layer.q_norm, layer.k_norm, layer.head_eps);
    const auto rows = query_key[0].reshape({num_tokens, num_kv_heads, group, head_dim}).contiguous();
    const auto attended = paged_decode_attention(rows, cache, block_table, row_limits, scale, std::nullopt, std::nullopt);
    x = add_rms_norm(layer.o(attended.reshape({num_tokens, num_heads * head_dim})), residual, layer.post_norm, layer.eps);
    h = layer.down(silu_and_mul(layer.gate_up(x)));
  }
  return {h, residual};
}

std::vector<at::Tensor> DecoderLayers::run(const at::Tensor& hidden, const at::Tensor& cos_sin, const at::Tensor& slots,
                                           const std::vector<at::Tensor>& caches, const at::Tensor& block_table,
                                           const at::Tensor& row_limits, double scale) const {
  TORCH_CHECK(caches.size() == layers.size(), "decoder_layers: a cache a layer");
  TORCH_CHECK(hidden.dim() == 2 && hidden.is_contiguous() && hidden.scalar_type() == at::kBFloat16);
  if (num_threads <= 1 || at::get_num_threads() != num_threads || at::in_parallel_region() || layers.empty()) {
    return serial(hidden, cos_sin, slots, caches, block_table, row_limits, scale);
  }
  const int64_t num_tokens = hidden.size(0), group = num_heads / num_kv_heads, num_items = num_tokens * num_kv_heads;
  const DecoderLayer& first = layers[0];
  const auto options = hidden.options();
  // NOTE: every layer's outputs in these, made once a step (each is read before the next layer writes it again).
  auto qkv = at::empty({num_tokens, first.qkv.width()}, options);
  auto attended = at::empty({num_tokens, num_kv_heads, group, head_dim}, options);
  auto projected = at::empty({num_tokens, first.o.width()}, options);
  auto gate_up = at::empty({num_tokens, first.gate_up.width()}, options);
  auto down = at::empty({num_tokens, first.down.width()}, options);
  TORCH_CHECK(first.o.width() == hidden.size(1) && first.down.width() == hidden.size(1), "decoder_layers: output widths");
  at::Tensor h = hidden, residual = hidden, x, rows, activated;
  SpinBarrier barrier(num_threads);
  std::exception_ptr error;
  std::mutex error_mutex;
#pragma omp parallel num_threads(num_threads)
  {
    const int64_t t = omp_get_thread_num();
    try {
      TORCH_CHECK(omp_get_num_threads() == num_threads, "decoder_layers: fewer threads than shares");
      for (size_t i = 0; i < layers.size(); ++i) {
        const DecoderLayer& layer = layers[i];
        if (t == 0) x = i == 0 ? rms_norm(h, layer.input_norm, layer.eps) : add_rms_norm(h, residual, layer.input_norm, layer.eps);
        if (!barrier.wait()) break;
        layer.qkv.run_share(x, qkv, t);
        if (!barrier.wait()) break;
        if (t == 0) {
          at::Tensor cache = caches[i];
          const auto query_key = rotary_store_kv(qkv, cos_sin, slots, cache, num_heads, layer.q_norm, layer.k_norm, layer.head_eps);
          rows = query_key[0].reshape({num_tokens, num_kv_heads, group, head_dim}).contiguous();
        }
        if (!barrier.wait()) break;
        paged_decode_attention_items(rows, caches[i], block_table, row_limits, scale, std::nullopt, std::nullopt, &attended,
                                     num_items * t / num_threads, num_items * (t + 1) / num_threads);
        if (!barrier.wait()) break;
        layer.o.run_share(attended.view({num_tokens, num_heads * head_dim}), projected, t);
        if (!barrier.wait()) break;
        if (t == 0) x = add_rms_norm(projected, residual, layer.post_norm, layer.eps);
        if (!barrier.wait()) break;
        layer.gate_up.run_share(x, gate_up, t);
        if (!barrier.wait()) break;
        if (t == 0) activated = silu_and_mul(gate_up);
        if (!barrier.wait()) break;
        layer.down.run_share(activated, down, t);
        if (!barrier.wait()) break;
        if (t == 0) h = down;
      }
    } catch (...) {
      {
        const std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
      barrier.fail();
    }
  }
  if (error) std::rethrow_exception(error);
  return {h, residual};
}
