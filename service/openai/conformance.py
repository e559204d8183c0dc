"""How zeroserve answers each field of vLLM's OpenAI server: implemented with vLLM's meaning,
refused with a 400 that names it, or not applicable (and why).

Checked against `vllm_fields.json` (vLLM's own models, see vllm_snapshot.py) by
tests/service/openai/test_conformance.py; `python -m service.openai.conformance` writes the table
as Markdown (CONFORMANCE.md beside this file)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

IMPLEMENTED, REFUSED, NOT_APPLICABLE = "implemented", "refused", "not applicable"
SNAPSHOT_PATH = Path(__file__).with_name("vllm_fields.json")
MARKDOWN_PATH = Path(__file__).with_name("CONFORMANCE.md")


@dataclass(frozen=True)
class Row:
    """One vLLM field: what zeroserve does with it, and what shows it."""

    status: str
    note: str = ""
    # refused: a value the tests send to get the 400 (vLLM's default is always accepted)
    example: Any = None
    # implemented: the test ("tests/...py::test_name") that shows the behaviour
    test: str = ""
    # refused: values served all the same, besides vLLM's default
    accepted: tuple[Any, ...] = ()


def implemented(test: str, note: str = "") -> Row:
    return Row(IMPLEMENTED, note, test=test)


def refused(example: Any, note: str, accepted: tuple[Any, ...] = ()) -> Row:
    return Row(REFUSED, note, example=example, accepted=accepted)


def not_applicable(note: str) -> Row:
    return Row(NOT_APPLICABLE, note)


_SAMPLING = "tests/service/api/test_vllm_fields_inproc.py::test_sampling_fields_reach_the_engine"
_CHAT = "tests/service/api/test_chat_completions_inproc.py"
_COMPLETIONS = "tests/service/api/test_completions_inproc.py"
_VLLM = "tests/service/api/test_vllm_fields_inproc.py"
_TOKENIZE = "tests/service/api/test_tokenize.py"
_MULTIMODAL = "the served models read text only (no images, audio or video)"
_DISAGGREGATED = "disaggregated prefill/encoding (KV or encoder-cache transfer) is not supported"

# Fields chat and completions share, as vLLM declares them.
_COMMON: dict[str, Row] = {
    "model": implemented(f"{_VLLM}::test_model_names_a_served_model", "a served name; absent: the first"),
    "frequency_penalty": implemented(_SAMPLING),
    "logit_bias": implemented(_SAMPLING),
    "n": implemented(f"{_CHAT}::test_n_3_gives_three_indexed_choices_streamed_or_not"),
    "presence_penalty": implemented(_SAMPLING),
    "seed": implemented(_SAMPLING),
    "stop": implemented(f"{_CHAT}::test_a_stop_string_cuts_the_text_streamed_or_not"),
    "stream": implemented(f"{_CHAT}::test_a_stream_is_a_role_chunk_then_deltas_then_usage_then_done"),
    "stream_options": implemented(f"{_VLLM}::test_stream_options_need_stream"),
    "temperature": implemented(_SAMPLING),
    "top_p": implemented(_SAMPLING),
    "user": not_applicable("an end-user id for OpenAI's abuse monitoring: vLLM does not use it either"),
    "use_beam_search": refused(
        True,
        "beam search is not supported: each sequence is sampled on its own in the continuous batch "
        "(vLLM too runs it outside its engine, as one single-token request per beam and step); "
        "use n with sampling, or greedy decoding",
    ),
    "top_k": implemented(_SAMPLING),
    "min_p": implemented(_SAMPLING),
    "repetition_penalty": implemented(_SAMPLING),
    "watermarking": refused(True, "output watermarking is not supported"),
    "length_penalty": refused(2.0, "a beam-search setting, and beam search is not supported"),
    "stop_token_ids": implemented(f"{_CHAT}::test_eos_and_stop_token_ids_end_a_choice_with_stop"),
    "include_stop_str_in_output": implemented(f"{_COMPLETIONS}::test_stop_string_spanning_tokens_is_cut_streamed_or_not"),
    "ignore_eos": implemented(_SAMPLING),
    "min_tokens": implemented(_SAMPLING),
    "skip_special_tokens": implemented(f"{_VLLM}::test_skip_special_tokens_false_keeps_them_in_the_text"),
    "spaces_between_special_tokens": not_applicable(
        "only slow (Python) tokenizers put spaces between special tokens; the served tokenizers are "
        "fast ones, for which vLLM ignores it too"
    ),
    "truncate_prompt_tokens": implemented(f"{_VLLM}::test_truncate_prompt_tokens_keeps_the_prompts_end"),
    "truncation_side": implemented(f"{_VLLM}::test_truncation_side_right_keeps_the_prompts_start"),
    "prompt_logprobs": implemented(f"{_CHAT}::test_prompt_logprobs_cover_every_prompt_token"),
    "logprob_token_ids": refused([1, 2], "logprobs of chosen token ids are not supported: use top_logprobs"),
    "allowed_token_ids": refused([1, 2], "allowed_token_ids is not supported: use logit_bias"),
    "bad_words": refused(["bad"], "bad_words is not supported: use logit_bias"),
    "add_special_tokens": implemented(f"{_VLLM}::test_add_special_tokens_adds_the_bos_token"),
    "structured_outputs": implemented(
        f"{_VLLM}::test_structured_outputs_reach_the_engine_and_a_bad_one_is_a_400",
        "json, regex, choice, grammar (EBNF) or json_object, with xgrammar; JSON is compact (vLLM's disable_any_whitespace)",
    ),
    "priority": implemented(_SAMPLING),
    "request_id": implemented(f"{_VLLM}::test_request_id_names_the_response"),
    "session_id": not_applicable("vLLM hands it to KV connectors and routers, which zeroserve has not"),
    "return_tokens_as_token_ids": implemented(f"{_VLLM}::test_return_tokens_as_token_ids_names_tokens_by_id"),
    "return_token_ids": implemented(f"{_VLLM}::test_return_token_ids_gives_prompt_and_completion_ids"),
    "return_weight_versions": refused(True, "weights are not updated in place, so there are no versions"),
    "routed_experts_prompt_start": refused(1, "the served models are dense (no experts to route)"),
    "return_token_offsets": refused(True, "vLLM honours it only on its /render endpoints, which zeroserve has not"),
    "mm_payload": refused("none", _MULTIMODAL),
    "return_mm_kwargs": refused(True, _MULTIMODAL),
    "cache_salt": refused("salt", "prefix-cache salting is not supported yet"),
    "kv_transfer_params": refused({"do_remote_prefill": True}, _DISAGGREGATED),
    "ec_transfer_params": refused({"x": 1}, _DISAGGREGATED),
    "vllm_xargs": refused({"x": 1}, "no custom extensions read extra arguments"),
    "repetition_detection": refused({"max_pattern_size": 4}, "repetition detection is not supported"),
    "stream_interval": refused(4, "every step's tokens are streamed as they come"),
    "thinking_token_budget": refused(64, "reasoning is not supported yet (issue 19: the agents' API)"),
}

CHAT: dict[str, Row] = {
    **_COMMON,
    "messages": implemented(f"{_CHAT}::test_a_whole_response_has_openai_shape"),
    "logprobs": implemented(f"{_CHAT}::test_logprobs_with_top_logprobs_streamed_or_not"),
    "top_logprobs": implemented(f"{_CHAT}::test_logprobs_with_top_logprobs_streamed_or_not"),
    "max_tokens": implemented(_SAMPLING),
    "max_completion_tokens": implemented(f"{_CHAT}::test_max_tokens_default_to_what_the_context_leaves"),
    "response_format": implemented(f"{_VLLM}::test_structured_outputs_reach_the_engine_and_a_bad_one_is_a_400",
                                   "text, json_object, json_schema"),
    "tools": implemented(f"{_VLLM}::test_the_hermes_parser_splits_calls_from_content_streamed_or_not",
                         "rendered by the chat template; calls forced or parsed (see tool_choice)"),
    "tool_choice": implemented(
        f"{_VLLM}::test_forced_tool_calls_are_generated_under_their_schema_and_returned_as_calls",
        "required and a named function are forced under a JSON schema; auto is parsed with --tool-call-parser",
    ),
    "reasoning_effort": implemented(
        f"{_VLLM}::test_reasoning_effort_and_documents_reach_the_chat_template",
        "passed to the chat template, with enable_thinking, as vLLM does",
    ),
    "include_reasoning": implemented(f"{_VLLM}::test_a_reasoning_parser_splits_the_thinking_out_streamed_or_not",
                                     "false leaves the reasoning out (with --reasoning-parser)"),
    "parallel_tool_calls": implemented(
        f"{_VLLM}::test_forced_tool_calls_are_generated_under_their_schema_and_returned_as_calls",
        "false: a forced 'required' call is one call",
    ),
    "echo": implemented(f"{_VLLM}::test_chat_echo_prepends_the_last_assistant_message"),
    "add_generation_prompt": implemented(f"{_CHAT}::test_continue_final_message_extends_the_assistant_turn"),
    "continue_final_message": implemented(f"{_CHAT}::test_continue_final_message_extends_the_assistant_turn"),
    "documents": implemented(f"{_VLLM}::test_reasoning_effort_and_documents_reach_the_chat_template"),
    "chat_template": refused("{{ messages }}", "a request's own chat template is not run (vLLM too refuses it unless started with --trust-request-chat-template)"),
    "chat_template_kwargs": implemented(f"{_VLLM}::test_reasoning_effort_and_documents_reach_the_chat_template"),
    "media_io_kwargs": refused({"image": {}}, _MULTIMODAL),
    "mm_processor_kwargs": refused({"x": 1}, _MULTIMODAL),
    "return_prompt_text": implemented(f"{_VLLM}::test_return_prompt_text_gives_the_rendered_prompt"),
}

COMPLETIONS: dict[str, Row] = {
    **_COMMON,
    "prompt": implemented(f"{_COMPLETIONS}::test_prompt_forms_n_per_prompt_and_echo"),
    "echo": implemented(f"{_COMPLETIONS}::test_prompt_logprobs_and_echo_with_logprobs"),
    "logprobs": implemented(f"{_VLLM}::test_completions_logprobs_0_gives_the_sampled_token"),
    "max_tokens": implemented(_SAMPLING),
    "suffix": refused("tail", "insertion (fill-in-the-middle) is not supported"),
    "prompt_embeds": refused("AAAA", "prompts are text or token ids, not embeddings"),
    "response_format": implemented(f"{_VLLM}::test_structured_outputs_reach_the_engine_and_a_bad_one_is_a_400",
                                   "text, json_object, json_schema"),
}

STREAM_OPTIONS: dict[str, Row] = {
    "include_usage": implemented(f"{_VLLM}::test_include_usage_adds_a_last_usage_chunk"),
    "continuous_usage_stats": implemented(f"{_VLLM}::test_continuous_usage_stats_need_include_usage"),
}

TOKENIZE_COMPLETION: dict[str, Row] = {
    "model": implemented(f"{_TOKENIZE}::test_tokenize_then_detokenize_round_trips"),
    "prompt": implemented(f"{_TOKENIZE}::test_tokenize_then_detokenize_round_trips"),
    "add_special_tokens": implemented(f"{_TOKENIZE}::test_tokenize_without_special_tokens"),
    "return_token_strs": implemented(f"{_TOKENIZE}::test_return_token_strs_are_vocabulary_tokens"),
}

TOKENIZE_CHAT: dict[str, Row] = {
    "model": implemented(f"{_TOKENIZE}::test_tokenize_renders_chat_messages_with_the_template"),
    "messages": implemented(f"{_TOKENIZE}::test_tokenize_renders_chat_messages_with_the_template"),
    "add_generation_prompt": implemented(f"{_TOKENIZE}::test_tokenize_chat_follows_the_template_flags"),
    "return_token_strs": implemented(f"{_TOKENIZE}::test_return_token_strs_are_vocabulary_tokens"),
    "continue_final_message": implemented(f"{_TOKENIZE}::test_tokenize_chat_follows_the_template_flags"),
    "add_special_tokens": implemented(f"{_TOKENIZE}::test_tokenize_chat_follows_the_template_flags"),
    "chat_template": CHAT["chat_template"],
    "chat_template_kwargs": implemented(f"{_TOKENIZE}::test_tokenize_chat_follows_the_template_flags"),
    "response_format": not_applicable("only a generation is constrained; tokenizing renders the messages alone"),
    "media_io_kwargs": CHAT["media_io_kwargs"],
    "mm_processor_kwargs": CHAT["mm_processor_kwargs"],
    "tools": implemented(f"{_TOKENIZE}::test_tokenize_chat_renders_the_tools"),
}

DETOKENIZE: dict[str, Row] = {
    "model": implemented(f"{_TOKENIZE}::test_tokenize_then_detokenize_round_trips"),
    "tokens": implemented(f"{_TOKENIZE}::test_tokenize_then_detokenize_round_trips"),
}

# The request models, by the snapshot's names, with the minimal body that tests use.
REQUESTS: dict[str, tuple[dict[str, Row], dict[str, Any]]] = {
    "chat": (CHAT, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
    "completions": (COMPLETIONS, {"prompt": "Hi", "max_tokens": 2}),
    "tokenize_completion": (TOKENIZE_COMPLETION, {"prompt": "Hi"}),
    "tokenize_chat": (TOKENIZE_CHAT, {"messages": [{"role": "user", "content": "Hi"}]}),
    "detokenize": (DETOKENIZE, {"tokens": [1, 2]}),
    "stream_options": (STREAM_OPTIONS, {}),
}


def _response(implemented_fields: str, not_applicable_fields: dict[str, str]) -> dict[str, Row]:
    rows = {name: implemented(f"{_VLLM}::test_responses_carry_vllms_fields") for name in implemented_fields.split()}
    return rows | {name: not_applicable(note) for name, note in not_applicable_fields.items()}


_NO_TIER = "OpenAI's processing tiers; vLLM leaves it null too"
_NO_FINGERPRINT = "OpenAI's backend configuration id; vLLM leaves it null too"
_NO_METRICS = "vLLM's per-request timings (with --enable-per-request-metrics); zeroserve reports them in /metrics and the request log"
_NO_TRANSFER = _DISAGGREGATED
_NO_EXPERTS = "the served models are dense (no experts to route)"
_NO_VERSIONS = "weights are not updated in place, so there are no versions"

# Response fields vLLM fills for features zeroserve has not, by kind of body.
_WHOLE_NOT_APPLICABLE = {"service_tier": _NO_TIER, "system_fingerprint": _NO_FINGERPRINT, "kv_transfer_params": _NO_TRANSFER,
                         "ec_transfer_params": _NO_TRANSFER, "metrics": _NO_METRICS}
_CHUNK_NOT_APPLICABLE = {"system_fingerprint": _NO_FINGERPRINT, "metrics": _NO_METRICS, "kv_transfer_params": _NO_TRANSFER}
_CHOICE_NOT_APPLICABLE = {"routed_experts": _NO_EXPERTS, "weight_versions": _NO_VERSIONS}

RESPONSES: dict[str, dict[str, Row]] = {
    "chat_response": _response(
        "id object created model choices usage prompt_logprobs prompt_token_ids prompt_text", _WHOLE_NOT_APPLICABLE
    ),
    "chat_response_choice": _response("index message logprobs finish_reason stop_reason token_ids", _CHOICE_NOT_APPLICABLE),
    "chat_chunk": _response("id object created model choices usage prompt_token_ids prompt_text", _CHUNK_NOT_APPLICABLE),
    "chat_chunk_choice": _response(
        "index delta logprobs finish_reason stop_reason token_ids", {"weight_versions": _NO_VERSIONS}
    ),
    "completions_response": _response("id object created model choices usage", _WHOLE_NOT_APPLICABLE),
    "completions_response_choice": _response(
        "index text logprobs finish_reason stop_reason token_ids prompt_logprobs prompt_token_ids", _CHOICE_NOT_APPLICABLE
    ),
    "completions_chunk": _response("id object created model choices usage", _CHUNK_NOT_APPLICABLE),
    "completions_chunk_choice": _response(
        "index text logprobs finish_reason stop_reason prompt_token_ids token_ids", {"weight_versions": _NO_VERSIONS}
    ),
    "tokenize_response": _response("count max_model_len tokens token_strs", {}),
    "detokenize_response": _response("prompt", {}),
    "model_card": _response(
        "id object created owned_by root parent max_model_len permission", {}
    ),
    "usage": _response(
        "prompt_tokens total_tokens completion_tokens prompt_tokens_details",
        {"completion_tokens_details": "OpenAI's reasoning and prediction token counts; no reasoning runs here"},
    ),
}


_METRICS_MOVE = "tests/service/api/test_app_inproc.py::test_metrics_move_by_what_the_requests_did"
_METRICS_PARITY = "tests/service/api/test_app_inproc.py::test_metrics_have_every_vllm_family_with_its_type_labels_and_buckets"
_DROPPED = "tests/service/api/test_operations.py::test_closing_the_connections_of_streamed_and_whole_requests_aborts_them_all"
_ENGINE_TOTALS = "tests/service/observability/test_metrics.py::test_engine_totals_become_counters_by_their_deltas"
_NO_SERIES = "not exported (an empty family would say the feature is there): "

# vLLM's metric families (vllm:NAME), exported as zeroserve:NAME with the same type, labels and buckets.
METRICS: dict[str, Row] = {
    **{f"vllm:{name}": implemented(_METRICS_MOVE) for name in (
        "generation_tokens prompt_tokens prompt_tokens_by_source prompt_tokens_cached iteration_tokens_total "
        "request_success time_to_first_token_seconds inter_token_latency_seconds e2e_request_latency_seconds "
        "request_queue_time_seconds request_inference_time_seconds request_prefill_time_seconds "
        "request_decode_time_seconds request_time_per_output_token_seconds request_prompt_tokens "
        "request_generation_tokens request_params_n request_params_max_tokens request_prefill_kv_computed_tokens "
        "request_num_preemptions engine_sleep_state cache_config_info"
    ).split()},
    "vllm:num_requests_running": implemented(_DROPPED),
    "vllm:num_requests_waiting": implemented("tests/service/observability/test_metrics.py::test_gauges_follow_the_latest_scheduler_stats"),
    "vllm:num_requests_waiting_by_reason": implemented(_METRICS_PARITY, "every waiting request waits for capacity; none is deferred"),
    "vllm:kv_cache_usage_perc": implemented("tests/service/observability/test_metrics.py::test_gauges_follow_the_latest_scheduler_stats"),
    "vllm:prefix_cache_queries": implemented(_ENGINE_TOTALS),
    "vllm:prefix_cache_hits": implemented(_ENGINE_TOTALS),
    "vllm:num_preemptions": implemented(_ENGINE_TOTALS),
    "vllm:prompt_tokens_cached_by_source": implemented(_METRICS_PARITY, "the one cache tier is the engine's own (device)"),
    "vllm:request_max_num_generation_tokens": implemented(
        _METRICS_MOVE, "for n > 1, the first sample's count (vLLM: the most over the samples)"
    ),
    "vllm:admission_rejections": implemented("tests/service/api/test_app_inproc.py::test_past_the_queue_cap_requests_get_429",
                                             "max_num_queued_reqs: the 429s past --max-num-queued-requests"),
    "vllm:num_requests_kv_fetch_by_stage": not_applicable(_NO_SERIES + _DISAGGREGATED),
    "vllm:external_prefix_cache_queries": not_applicable(_NO_SERIES + "no external KV cache (KV connector)"),
    "vllm:external_prefix_cache_hits": not_applicable(_NO_SERIES + "no external KV cache (KV connector)"),
    "vllm:mm_cache_queries": not_applicable(_NO_SERIES + _MULTIMODAL),
    "vllm:mm_cache_hits": not_applicable(_NO_SERIES + _MULTIMODAL),
    "vllm:corrupted_requests": not_applicable(_NO_SERIES + "logits are not checked for NaNs (vLLM: only with VLLM_COMPUTE_NANS_IN_LOGITS)"),
    "vllm:watermark_requests": not_applicable(_NO_SERIES + "output watermarking is not supported"),
    "vllm:lora_requests_info": not_applicable(
        _NO_SERIES + "LoRA adapters are not served; for the inference gateway's endpoint picker, "
        "vllm:lora_requests_info says so (max_lora 0)"
    ),
    "vllm:kv_block_lifetime_seconds": not_applicable(_NO_SERIES + "KV block residency is not sampled (vLLM: --kv-cache-metrics)"),
    "vllm:kv_block_idle_before_evict_seconds": not_applicable(_NO_SERIES + "KV block residency is not sampled (vLLM: --kv-cache-metrics)"),
    "vllm:kv_block_reuse_gap_seconds": not_applicable(_NO_SERIES + "KV block residency is not sampled (vLLM: --kv-cache-metrics)"),
}


@functools.cache
def vllm_snapshot() -> dict[str, Any]:
    """vllm_fields.json: vLLM's models' fields (with defaults) and metric families."""
    return dict(json.loads(SNAPSHOT_PATH.read_text()))


def vllm_default(model: str, name: str) -> Any:
    """vLLM's default for a field (a dict for one that is computed or required)."""
    return vllm_snapshot()["models"][model][name]["default"]


def refused_fields(model: str, given: dict[str, Any]) -> list[tuple[str, Row]]:
    """The refused fields `given` sets to something other than vLLM's default (and None)."""
    rows, _ = REQUESTS[model]
    return [
        (name, row) for name, row in rows.items()
        if row.status == REFUSED and name in given
        and given[name] is not None and given[name] != vllm_default(model, name) and given[name] not in row.accepted
    ]


def unknown_fields(model: str, given: dict[str, Any]) -> list[str]:
    """The fields of `given` that vLLM's model does not have (a misspelt one among them), in order."""
    known = vllm_snapshot()["models"][model]
    return sorted(name for name in given if name not in known)


def markdown() -> str:
    """The whole table, one section per model."""
    snapshot = vllm_snapshot()
    lines = [
        f"# zeroserve and vLLM {snapshot['vllm_version']}'s OpenAI server, field by field",
        "",
        "Generated by `python -m service.openai.conformance` from `service/openai/conformance.py`;",
        "every field of vLLM's request and response models is one of: **implemented** (vLLM's meaning),",
        "**refused** (a 400 that names it, for any value but vLLM's default) or **not applicable**.",
    ]
    tables = {name: rows for name, (rows, _) in REQUESTS.items()} | RESPONSES
    for model, rows in tables.items():
        lines += ["", f"## {model} (vLLM `{snapshot_class(model)}`)", "", "| field | status | note |", "|---|---|---|"]
        for name, row in rows.items():
            lines.append(f"| `{name}` | {row.status} | {row.note.replace('|', '/')} |")
    lines += ["", "## metrics (`/metrics`: vLLM's `vllm:NAME` is `zeroserve:NAME`)", "", "| family | status | note |", "|---|---|---|"]
    for name, row in METRICS.items():
        lines.append(f"| `{name}` | {row.status} | {row.note.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def snapshot_class(model: str) -> str:
    from service.openai.vllm_snapshot import MODELS

    return MODELS[model]


if __name__ == "__main__":
    MARKDOWN_PATH.write_text(markdown())
    print(MARKDOWN_PATH)
