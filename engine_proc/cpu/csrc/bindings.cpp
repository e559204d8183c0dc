// The Python module of zeroserve's CPU kernels (engine_proc/cpu/kernels.py builds it).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>

#include "decoder_layers.h"
#include "kernel_forms.h"
#include "moe_experts.h"

at::Tensor router_logits(const at::Tensor& x, const at::Tensor& w);
at::Tensor argmax_rows(const at::Tensor& logits);
std::vector<at::Tensor> pack_int4_q8(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins);
std::vector<at::Tensor> pack_int4k_q8(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                                      const at::Tensor& d, const at::Tensor& dmin);
std::vector<at::Tensor> pack_int5_q8(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins);
std::vector<at::Tensor> pack_int5k_q8(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                                      const at::Tensor& d, const at::Tensor& dmin);
std::vector<at::Tensor> pack_int6k_q8(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& d);
std::vector<at::Tensor> pack_int8_q8(const at::Tensor& codes, const at::Tensor& scales);
std::vector<at::Tensor> pack_iq4xs_q8(const at::Tensor& indices, const at::Tensor& scales, const at::Tensor& d);
std::vector<at::Tensor> pack_mxfp4_q8(const at::Tensor& codes, const at::Tensor& exponents);
#ifdef ZEROSERVE_AMX
at::Tensor pack_greedy_head(const at::Tensor& weight);
at::Tensor greedy_head(const at::Tensor& hidden, const at::Tensor& packed_weight, int64_t vocab_size);
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention, "decode attention over a paged bfloat16 K/V cache",
        pybind11::arg("query"), pybind11::arg("cache"), pybind11::arg("block_table"), pybind11::arg("row_limits"),
        pybind11::arg("scale"), pybind11::arg("row_starts") = pybind11::none(), pybind11::arg("row_sinks") = pybind11::none());
  m.def("rms_norm", &rms_norm, "weight * bf16(x / rms(x)) for bfloat16 rows");
  m.def("silu_and_mul", &silu_and_mul, "bf16(silu(gate)) * up for bfloat16 [rows, 2 * width]");
  m.def("router_logits", &router_logits, "float32 rows @ a float32 router's transpose, each sum in one fixed order");
  pybind11::class_<MoeExperts>(m, "MoeExperts", "a layer's experts on their kernel forms, packings held once", pybind11::module_local())
      .def(pybind11::init<int64_t, std::vector<std::vector<at::Tensor>>, int64_t, std::vector<std::vector<at::Tensor>>, int64_t,
                          std::vector<at::Tensor>, std::vector<at::Tensor>, bool>(),
           pybind11::arg("gate_up_form"), pybind11::arg("gate_up"), pybind11::arg("down_form"), pybind11::arg("down"),
           pybind11::arg("width"), pybind11::arg("gate_up_bias") = std::vector<at::Tensor>{},
           pybind11::arg("down_bias") = std::vector<at::Tensor>{}, pybind11::arg("is_clamped_swiglu") = false)
      .def("__call__", &MoeExperts::run, "bfloat16 rows, each token's expert ids and weights (best first) -> the weighted sum of its experts");
  pybind11::class_<Projection>(m, "Projection", "a projection's parts on kernel forms (numbered as FUSED_FORMS), side by side, then its bias", pybind11::module_local())
      .def(pybind11::init<std::vector<int64_t>, std::vector<std::vector<at::Tensor>>, std::vector<int64_t>, std::optional<at::Tensor>>(),
           pybind11::arg("forms"), pybind11::arg("packed"), pybind11::arg("widths"), pybind11::arg("bias") = pybind11::none());
  pybind11::class_<DecoderLayer>(m, "DecoderLayer", "a dense decoder layer's norms and projections on kernel forms", pybind11::module_local())
      .def(pybind11::init<at::Tensor, Projection, std::optional<at::Tensor>, std::optional<at::Tensor>, Projection, at::Tensor,
                          Projection, Projection, double, double>(),
           pybind11::arg("input_norm"), pybind11::arg("qkv"), pybind11::arg("q_norm"), pybind11::arg("k_norm"), pybind11::arg("o"),
           pybind11::arg("post_norm"), pybind11::arg("gate_up"), pybind11::arg("down"), pybind11::arg("eps"), pybind11::arg("head_eps"));
  pybind11::class_<DecoderLayers>(m, "DecoderLayers", "a dense decoder's layers, run over a step of one-token decodes in one call", pybind11::module_local())
      .def(pybind11::init([](std::vector<DecoderLayer> layers, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim) {
             DecoderLayers fused{std::move(layers), num_heads, num_kv_heads, head_dim};
             fused.share(at::get_num_threads());
             return fused;
           }),
           pybind11::arg("layers"), pybind11::arg("num_heads"), pybind11::arg("num_kv_heads"), pybind11::arg("head_dim"))
      .def_readonly("num_threads", &DecoderLayers::num_threads)
      .def("serial", &DecoderLayers::serial, "the same on one thread at a time, each kernel's threads its own (the bits of __call__)",
           pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("__call__", &DecoderLayers::run, "token embeddings, rotary table, slots, caches, block table, row limits, scale -> (output, residual)",
           pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("argmax_rows", &argmax_rows, "each bfloat16 row's first maximum, as torch's max(dim=-1).indices");
  m.def("add_rms_norm", &add_rms_norm, "residual += x in place, then rms_norm(residual), for bfloat16 rows");
  m.def("rotary_store_kv", &rotary_store_kv, "rotary on a fused QKV's queries and keys (each head normed first with q_norm, k_norm), K/V stored in a paged cache",
        pybind11::arg("qkv"), pybind11::arg("cos_sin"), pybind11::arg("slots"), pybind11::arg("cache"), pybind11::arg("num_heads"),
        pybind11::arg("q_norm") = pybind11::none(), pybind11::arg("k_norm") = pybind11::none(), pybind11::arg("eps") = 0.0);
  m.def("pack_int4_q8", &pack_int4_q8, "4-bit group-32 blocks (codes, float16-exact scales and minimums) in int4_q8's layout");
  m.def("int4_q8", &int4_q8, "bfloat16 rows rounded to 8 bits per group of 32 @ a 4-bit weight's transpose, integer products");
  m.def("pack_int4k_q8", &pack_int4k_q8, "GGUF Q4_K blocks (codes, 6-bit scales and minimums, float16-exact d and dmin) in int4k_q8's layout");
  m.def("int4k_q8", &int4k_q8, "bfloat16 rows rounded to 8 bits per group of 32 @ a Q4_K weight's transpose, integer products");
  m.def("pack_int5_q8", &pack_int5_q8, "5-bit group-32 blocks (GGUF Q5_0, Q5_1) in int5_q8's layout");
  m.def("int5_q8", &int5_q8, "bfloat16 rows rounded to 8 bits per group of 32 @ a 5-bit weight's transpose, integer products");
  m.def("pack_int5k_q8", &pack_int5k_q8, "GGUF Q5_K blocks (5-bit codes, 6-bit scales and minimums, float16-exact d and dmin) in int5k_q8's layout");
  m.def("int5k_q8", &int5k_q8, "bfloat16 rows rounded to 8 bits per group of 32 @ a Q5_K weight's transpose, integer products");
  m.def("pack_int6k_q8", &pack_int6k_q8, "GGUF Q6_K blocks (6-bit codes, 8-bit scales per 16, float16-exact d) in int6k_q8's layout");
  m.def("int6k_q8", &int6k_q8, "bfloat16 rows rounded to 8 bits per group of 32 @ a Q6_K weight's transpose, integer products");
  m.def("pack_int8_q8", &pack_int8_q8, "8-bit group-32 blocks (codes, float16-exact scales) in int8_q8's layout");
  m.def("int8_q8", &int8_q8, "bfloat16 rows rounded to 8 bits per group of 32 @ an 8-bit weight's transpose, integer products");
  m.def("pack_iq4xs_q8", &pack_iq4xs_q8, "GGUF IQ4_XS blocks (4-bit indices, signed 6-bit scales, float16-exact d) in iq4xs_q8's layout");
  m.def("iq4xs_q8", &iq4xs_q8, "bfloat16 rows rounded to 8 bits per group of 32 @ an IQ4_XS weight's transpose, integer products");
  m.def("pack_mxfp4_q8", &pack_mxfp4_q8, "GGUF MXFP4 blocks (4-bit e2m1 codes, 8-bit exponents) in mxfp4_q8's layout");
  m.def("mxfp4_q8", &mxfp4_q8, "bfloat16 rows rounded to 8 bits per group of 32 @ an MXFP4 weight's transpose, integer products");
#ifdef ZEROSERVE_AMX
  m.def("pack_greedy_head", &pack_greedy_head, "an output head's weight in greedy_head's AMX tile layout");
  m.def("greedy_head", &greedy_head, "each row's first argmax of bf16(hidden @ weight.T), logits never written (AMX)");
#endif
}
