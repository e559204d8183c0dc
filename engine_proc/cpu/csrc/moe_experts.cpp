// A mixture-of-experts layer's experts for one step in one call (engine_proc/models/moe.py): each expert's
// tokens gathered, its gate/up projection, SiLU·up and down projection on the same kernel forms a lone
// projection runs (so the same bits), each output times its router weight in float32, and a token's
// experts added in the order the router ranked them, rounded once to bfloat16: what moe.py's loop of torch
// ops computes, without a Python call per expert.
#include "moe_experts.h"
#include "kernel_forms.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

namespace {

// gpt-oss's clamped SwiGLU of gate_up [M, 2W] (gate, then up), by the torch ops gpt_oss.py's
// `clamped_swiglu` runs, in its order: the same bits.
at::Tensor clamped_swiglu(const at::Tensor& gate_up, int64_t width) {
  const auto gate = gate_up.narrow(1, 0, width).clamp_max(7.0);
  const auto up = gate_up.narrow(1, width, width).clamp(-7.0, 7.0);
  return (up + 1) * (gate * at::sigmoid(gate * 1.702));
}

at::Tensor with_bias(at::Tensor out, const std::vector<at::Tensor>& biases, int64_t e) {
  return biases.empty() ? out : out + biases[e];
}

inline float bf16_sum(float a, float b) { return static_cast<float>(c10::BFloat16(a + b)); }

// `clamped_swiglu(with_bias(gate_up))` for bfloat16 gate_up [M, 2W] and bias [2W] (or none), each torch op's
// bfloat16 rounding in turn (tested against the loop's bits), the sigmoid by torch's own: two passes and one
// op, not the ten torch ops an expert that took a twentieth of a one-stream step.
at::Tensor biased_clamped_swiglu(const at::Tensor& gate_up, const at::Tensor* bias, int64_t width) {
  const int64_t m = gate_up.size(0);
  const auto* in = reinterpret_cast<const c10::BFloat16*>(gate_up.data_ptr());
  const auto* b = bias == nullptr ? nullptr : reinterpret_cast<const c10::BFloat16*>(bias->data_ptr());
  // (gate, up) of output i in row r: the bias added (rounded), then clamped as gpt-oss clamps them
  const auto clamped = [&](int64_t r, int64_t i, float& gate, float& up) {
    gate = static_cast<float>(in[r * 2 * width + i]);
    up = static_cast<float>(in[r * 2 * width + width + i]);
    if (b != nullptr) {
      gate = bf16_sum(gate, static_cast<float>(b[i]));
      up = bf16_sum(up, static_cast<float>(b[width + i]));
    }
    gate = gate > 7.0f ? 7.0f : gate;  // NOTE: NaN passes, as torch's clamp passes it
    up = up < -7.0f ? -7.0f : (up > 7.0f ? 7.0f : up);
  };
  auto gated = at::empty({m, width}, gate_up.options());
  auto* g = reinterpret_cast<c10::BFloat16*>(gated.data_ptr());
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t i = 0; i < width; ++i) {
      float gate, up;
      clamped(r, i, gate, up);
      g[r * width + i] = c10::BFloat16(gate * 1.702f);
    }
  }
  gated.sigmoid_();
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t i = 0; i < width; ++i) {
      float gate, up;
      clamped(r, i, gate, up);
      const float times_sigmoid = static_cast<float>(c10::BFloat16(gate * static_cast<float>(g[r * width + i])));
      g[r * width + i] = c10::BFloat16(bf16_sum(up, 1.0f) * times_sigmoid);
    }
  }
  return gated;
}

// The rows of x [T, H] of an expert's (token, rank) pairs, in their order.
at::Tensor gathered(const at::Tensor& x, const std::vector<int64_t>& pairs, int64_t num_chosen) {
  const int64_t count = static_cast<int64_t>(pairs.size());
  auto tokens = at::empty({count}, x.options().dtype(at::kLong));
  int64_t* token = tokens.data_ptr<int64_t>();
  for (int64_t j = 0; j < count; ++j) token[j] = pairs[j] / num_chosen;
  return x.index_select(0, tokens);
}

// Expert e's gate/up projection of `rows` and its activation: gpt-oss's on bfloat16 in one pass where it can.
at::Tensor activated(const MoeExperts& experts, const at::Tensor& rows, int64_t e) {
  const int64_t width = experts.width;
  auto projected = run_form(experts.gate_up_form, rows, experts.gate_up[e], 2 * width);
  const at::Tensor* bias = experts.gate_up_bias.empty() ? nullptr : &experts.gate_up_bias[e];
  if (experts.is_clamped_swiglu && projected.scalar_type() == at::kBFloat16 && projected.is_contiguous() &&
      (bias == nullptr || (bias->scalar_type() == at::kBFloat16 && bias->is_contiguous() && bias->numel() == 2 * width))) {
    return biased_clamped_swiglu(projected, bias, width);
  }
  projected = with_bias(projected, experts.gate_up_bias, e);
  return experts.is_clamped_swiglu ? clamped_swiglu(projected, width).contiguous() : silu_and_mul(projected);
}

}  // namespace

// x [T, H] bf16, expert_ids [T, K] int64 and weights [T, K] float32 (each token's experts, best first) ->
// [T, H] bf16. `gate_up[e]` and `down[e]`: expert e's packings for forms `gate_up_form` and `down_form`;
// with biases (gpt-oss's), expert e's added to its projections' outputs as torch adds them.
at::Tensor moe_experts(const at::Tensor& x, const at::Tensor& expert_ids, const at::Tensor& weights, const MoeExperts& experts) {
  const int64_t down_form = experts.down_form;
  const auto& gate_up = experts.gate_up;
  const auto& down = experts.down;
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.is_contiguous() && x.dim() == 2);
  TORCH_CHECK(expert_ids.scalar_type() == at::kLong && weights.scalar_type() == at::kFloat);
  TORCH_CHECK(expert_ids.sizes() == weights.sizes() && expert_ids.size(0) == x.size(0) && gate_up.size() == down.size());
  TORCH_CHECK(experts.gate_up_bias.empty() || experts.gate_up_bias.size() == gate_up.size());
  TORCH_CHECK(experts.down_bias.empty() || experts.down_bias.size() == down.size());
  const int64_t num_tokens = x.size(0), hidden = x.size(1), num_chosen = expert_ids.size(1);
  const int64_t num_experts = static_cast<int64_t>(gate_up.size());
  const auto ids = expert_ids.contiguous();
  const auto scales = weights.contiguous();
  const int64_t* id = ids.data_ptr<int64_t>();
  const float* scale = scales.data_ptr<float>();
  // (token, rank) pairs by expert, each expert's in token order
  std::vector<std::vector<int64_t>> pairs(num_experts);
  for (int64_t i = 0; i < num_tokens * num_chosen; ++i) {
    TORCH_CHECK(id[i] >= 0 && id[i] < num_experts, "moe_experts: expert id ", id[i], " of ", num_experts);
    pairs[id[i]].push_back(i);
  }
  auto outputs = at::empty({num_tokens * num_chosen, hidden}, x.options().dtype(at::kFloat));
  float* out = outputs.data_ptr<float>();
  // NOTE: the step's experts shared out among the threads, the most rows first, each expert's projections on
  // one thread (a kernel form's bits do not depend on how its outputs are split): one parallel region a
  // layer instead of three an expert, and each thread streaming weights of its own.
  std::vector<int64_t> active;
  for (int64_t e = 0; e < num_experts; ++e) {
    if (!pairs[e].empty()) active.push_back(e);
  }
  std::stable_sort(active.begin(), active.end(), [&](int64_t a, int64_t b) { return pairs[a].size() > pairs[b].size(); });
  std::atomic<int64_t> next{0};
  const int64_t num_active = static_cast<int64_t>(active.size());
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), num_active), 1, [&](int64_t, int64_t) {
    for (int64_t i = next++; i < num_active; i = next++) {
      const int64_t e = active[i];
      const auto& mine = pairs[e];
      const int64_t count = static_cast<int64_t>(mine.size());
      const auto rows = count == 1 ? x.narrow(0, mine[0] / num_chosen, 1) : gathered(x, mine, num_chosen);
      auto result = run_form(down_form, activated(experts, rows, e), down[e], hidden);
      // NOTE: a bfloat16 bias is added (rounded) in the loop below, as torch adds it; another goes through torch.
      const c10::BFloat16* bias = nullptr;
      if (!experts.down_bias.empty()) {
        const auto& b = experts.down_bias[e];
        const bool is_fusable = result.scalar_type() == at::kBFloat16 && b.scalar_type() == at::kBFloat16 &&
                                b.is_contiguous() && b.numel() == hidden;
        if (is_fusable) {
          bias = reinterpret_cast<const c10::BFloat16*>(b.data_ptr());
        } else {
          result = result + b;
        }
      }
      // NOTE: a float32 bias makes the output float32, as in torch: then not rounded to bfloat16 before its weight.
      const bool is_float = result.scalar_type() == at::kFloat;
      const auto contiguous = result.contiguous();
      const auto* halves = is_float ? nullptr : reinterpret_cast<const c10::BFloat16*>(contiguous.data_ptr());
      const auto* floats = is_float ? contiguous.data_ptr<float>() : nullptr;
      for (int64_t j = 0; j < count; ++j) {
        float* row = out + mine[j] * hidden;
        const float weight = scale[mine[j]];
        for (int64_t h = 0; h < hidden; ++h) {
          const int64_t i = j * hidden + h;
          float value = is_float ? floats[i] : static_cast<float>(halves[i]);
          if (bias != nullptr) value = bf16_sum(value, static_cast<float>(bias[h]));
          row[h] = value * weight;
        }
      }
    }
  });
  auto summed = at::empty({num_tokens, hidden}, x.options());
  auto* sum = reinterpret_cast<c10::BFloat16*>(summed.data_ptr());
  at::parallel_for(0, num_tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* first = out + t * num_chosen * hidden;
      for (int64_t h = 0; h < hidden; ++h) {
        float total = first[h];
        for (int64_t r = 1; r < num_chosen; ++r) total += first[r * hidden + h];
        sum[t * hidden + h] = c10::BFloat16(total);
      }
    }
  });
  return summed;
}

at::Tensor MoeExperts::run(const at::Tensor& x, const at::Tensor& expert_ids, const at::Tensor& weights) const {
  return moe_experts(x, expert_ids, weights, *this);
}
