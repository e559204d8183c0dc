"""The app's own routes in process, on a fake engine: health, version, models, metrics, API keys,
and what a client sees when the engine dies, is lost, runs past the timeout, or is full."""

from __future__ import annotations

import asyncio
import importlib.metadata
import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proto.engine_config import EngineConfig
from service.openai.conformance import METRICS, NOT_APPLICABLE, vllm_snapshot
from tests.service.api.fake_engine import MAX_MODEL_LEN, FakeEngineClient

if TYPE_CHECKING:
    from tests.service.conftest import Serve, StreamEvents

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "Hello there"}]
LONG = {"prompt": "Count:", "max_tokens": 1000, "ignore_eos": True}


def error_events(events: list[Any]) -> list[dict[str, Any]]:
    return [event["error"] for event in events if isinstance(event, dict) and "error" in event]


def finish_reasons(events: list[Any]) -> dict[int, str]:
    return {
        choice["index"]: choice["finish_reason"]
        for event in events if isinstance(event, dict) and "choices" in event
        for choice in event["choices"] if choice["finish_reason"] is not None
    }


async def test_health_pings_the_engine(api: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    response = await api.get("/health")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})
    assert engine.utility_calls == ["ping"]


async def test_version_names_the_package_and_the_engine_machine(api: httpx.AsyncClient) -> None:
    version = (await api.get("/version")).json()
    assert version == {
        "version": importlib.metadata.version("zeroserve"),
        "cpu": "fake CPU",
        "kernels": {"linears": "fake", "head": "fake", "attention": "fake"},
    }


async def test_models_lists_every_served_name(api: httpx.AsyncClient) -> None:
    models = (await api.get("/v1/models")).json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["fake", "fake-alias"]
    for model in models["data"]:
        assert model["object"] == "model" and model["owned_by"] == "zeroserve"
        assert model["root"] == "fake" and model["max_model_len"] == 2048
        assert abs(model["created"] - time.time()) < 60


async def test_unknown_route_is_an_openai_404(api: httpx.AsyncClient) -> None:
    response = await api.get("/v1/nothing-here")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found_error"


async def test_metrics_move_by_what_the_requests_did(api: httpx.AsyncClient) -> None:
    num_requests, max_tokens = 3, 5
    body = {"prompt": "Metrics test", "max_tokens": max_tokens, "ignore_eos": True}
    results = [(await api.post(COMPLETIONS, json=body)).json() for _ in range(num_requests)]
    response = await api.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            name = sample.name + (f"{{{sample.labels['finished_reason']}}}" if "finished_reason" in sample.labels else "")
            totals[name] = totals.get(name, 0.0) + sample.value
    assert totals["zeroserve:prompt_tokens_total"] == sum(r["usage"]["prompt_tokens"] for r in results)
    assert totals["zeroserve:generation_tokens_total"] == num_requests * max_tokens
    assert totals["zeroserve:request_success_total{length}"] == num_requests
    assert totals["zeroserve:time_to_first_token_seconds_count"] == num_requests
    assert totals["zeroserve:inter_token_latency_seconds_count"] == num_requests * (max_tokens - 1)
    assert totals["zeroserve:e2e_request_latency_seconds_count"] == num_requests
    assert totals["zeroserve:request_queue_time_seconds_count"] == num_requests
    for histogram in ("request_prompt_tokens", "request_generation_tokens", "request_params_n",
                      "request_params_max_tokens", "request_prefill_time_seconds", "request_decode_time_seconds",
                      "request_inference_time_seconds", "request_time_per_output_token_seconds",
                      "request_num_preemptions", "request_prefill_kv_computed_tokens"):
        assert totals[f"zeroserve:{histogram}_count"] == num_requests, histogram
    assert totals["zeroserve:request_generation_tokens_sum"] == num_requests * max_tokens
    assert totals["zeroserve:request_params_max_tokens_sum"] == num_requests * max_tokens
    assert totals["zeroserve:request_params_n_sum"] == num_requests
    assert totals["zeroserve:iteration_tokens_total_sum"] == totals["zeroserve:prompt_tokens_total"] + num_requests * max_tokens
    assert totals["zeroserve:prompt_tokens_by_source_total"] == totals["zeroserve:prompt_tokens_total"]
    assert totals["zeroserve:engine_sleep_state"] == 1 and totals["zeroserve:cache_config_info"] == 1


async def test_metrics_have_every_vllm_family_with_its_type_labels_and_buckets(api: httpx.AsyncClient) -> None:
    await api.post(COMPLETIONS, json={"prompt": "Metrics test", "max_tokens": 3})
    families = {family.name: family for family in text_string_to_metric_families((await api.get("/metrics")).text)}
    snapshot = vllm_snapshot()
    missing, unexpected = [], []
    for vllm_name, vllm_family in snapshot["metrics"].items():
        family = families.get(vllm_name.replace("vllm:", "zeroserve:"))
        # NOTE: a family of a feature zeroserve has not (its conformance row: not applicable) is left out.
        if METRICS[vllm_name].status == NOT_APPLICABLE:
            if family is not None:
                unexpected.append(vllm_name)
            continue
        if family is None:
            missing.append(vllm_name)
            continue
        assert family.type == vllm_family["type"], vllm_name
        labels = {k for sample in family.samples for k in sample.labels} - {"le"}
        if family.samples and vllm_name != "vllm:cache_config_info":
            assert labels == set(vllm_family["labels"]), (vllm_name, labels)
        if family.type == "histogram" and family.samples:
            bounds = [float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"]
            expected = snapshot["buckets"][vllm_family["buckets"]]
            if vllm_family["buckets"] == "request_tokens":
                expected = [b for b in (m * 10**e for e in range(8) for m in (1, 2, 5)) if b <= MAX_MODEL_LEN]
            assert bounds[: len(expected)] == [float(b) for b in expected], vllm_name
    assert not missing, f"vLLM {snapshot['vllm_version']} families /metrics lacks: {missing}"
    assert not unexpected, f"families /metrics has that conformance.py calls not applicable: {unexpected}"


async def test_after_a_request_every_metric_family_has_a_series(api: httpx.AsyncClient) -> None:
    await api.post(COMPLETIONS, json={"prompt": "Metrics test", "max_tokens": 3})
    families = list(text_string_to_metric_families((await api.get("/metrics")).text))
    assert len(families) > 30
    assert [family.name for family in families if not family.samples] == []


async def test_metrics_names_keep_their_colons_whatever_the_scraper_accepts(api: httpx.AsyncClient) -> None:
    # NOTE: Prometheus 2's default Accept header, which prefers OpenMetrics.
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    response = await api.get("/metrics", headers={"Accept": accept})
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "\nzeroserve:prompt_tokens_total{" in response.text
    assert "zeroserve_" not in response.text


async def test_api_keys_guard_every_route_but_health_metrics_and_the_api_document(serve: Serve) -> None:
    async with serve(api_keys=("k1", "k2")) as client:
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200
        assert (await client.get("/openapi.json")).status_code == 200
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "k1"}, {"Authorization": "Bearer"}):
            for response in (
                await client.get("/v1/models", headers=headers),
                await client.get("/version", headers=headers),
                await client.post(COMPLETIONS, json={"prompt": "hi"}, headers=headers),
                await client.post("/tokenize", json={"prompt": "hi"}, headers=headers),
                await client.post("/v1/responses", json={"input": "hi"}, headers=headers),
            ):
                assert response.status_code == 401
                assert response.headers["WWW-Authenticate"] == "Bearer"
                error = response.json()["error"]
                assert set(error) == {"message", "type", "param", "code"}
                assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")
                assert error["message"].startswith("No API key" if not headers else "Incorrect API key")
        assert (await client.get("/v1/models", headers={"Authorization": "Bearer k2"})).status_code == 200
        body = {"prompt": "hi", "max_tokens": 2}
        assert (await client.post(COMPLETIONS, json=body, headers={"Authorization": "Bearer k1"})).status_code == 200
    async with serve(api_keys=("k1",), is_metrics_auth=True) as client:
        assert (await client.get("/metrics")).status_code == 401
        assert (await client.get("/metrics", headers={"Authorization": "Bearer k1"})).status_code == 200


async def test_an_engine_dying_mid_stream_ends_it_with_an_error_and_health_turns_503(
    api: httpx.AsyncClient, engine: FakeEngineClient, stream_events: StreamEvents
) -> None:
    engine.die_after(3)
    events = await stream_events(api, COMPLETIONS, LONG)
    texts = [e["choices"][0]["text"] for e in events if "choices" in e]
    assert len(texts) == 3 and "".join(texts) == engine.output_text(3)
    assert events[-1] == "[DONE]"
    assert [(e["type"], e["code"]) for e in error_events(events)] == [("server_error", None)]
    assert error_events(events) == [events[-2]["error"]]
    health = await api.get("/health")
    assert (health.status_code, health.json()) == (503, {"status": "dead"})
    for path, body in ((COMPLETIONS, {"prompt": "hi", "max_tokens": 1}), (CHAT, {"messages": MESSAGES})):
        after = await api.post(path, json=body)
        assert after.status_code == 503
        assert after.json()["error"]["code"] == "engine_dead"


async def test_an_engine_dying_under_a_whole_response_is_a_503(api: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    engine.die_after(2)
    response = await api.post(CHAT, json={"messages": MESSAGES, "max_tokens": 1000, "ignore_eos": True})
    assert response.status_code == 503
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == ("server_error", "engine_dead")


async def test_a_lost_engines_streams_resume_as_if_nothing_happened(
    api: httpx.AsyncClient, engine: FakeEngineClient, stream_events: StreamEvents
) -> None:
    # NOTE: two choices with logprobs, a stop string reached after the loss, usage at the end.
    body = {
        "messages": MESSAGES, "max_tokens": 30, "n": 2, "logprobs": True, "top_logprobs": 2, "stop": [" lazy"],
        "stream_options": {"include_usage": True},
    }
    undisturbed = await stream_events(api, CHAT, body)
    engine.lose_requests_after(3)
    resumed = await stream_events(api, CHAT, body)
    assert engine.requests[-1].resumed_token_ids == engine.output_ids(3)
    assert engine.requests[-2].resumed_token_ids == engine.output_ids(3)
    for events in (undisturbed, resumed):
        assert events[-1] == "[DONE]" and not error_events(events)
        assert finish_reasons(events) == {0: "stop", 1: "stop"}
    assert streamed_choices(resumed) == streamed_choices(undisturbed)
    assert streamed_choices(resumed)[0][0] == engine.output_text(8).removesuffix(" lazy")
    assert resumed[-2]["usage"] == undisturbed[-2]["usage"]


async def test_a_request_in_two_failing_engine_steps_is_failed_not_retried_again(
    api: httpx.AsyncClient, engine: FakeEngineClient, stream_events: StreamEvents
) -> None:
    # NOTE: its engine fails in a step with it after 3 steps; resumed, its new engine does too.
    engine.lose_requests_after(3, is_fatal_step=True, num_times=2)
    events = await stream_events(api, COMPLETIONS, {"prompt": "Crash me", "max_tokens": 50, "ignore_eos": True})
    [error] = error_events(events)
    assert engine.requests[0].request_id in error["message"] and "failed twice" in error["message"]
    assert events[-1] == "[DONE]" and len(engine.requests) == 2
    assert engine.requests[1].resumed_token_ids == engine.output_ids(3)
    ok = await api.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 3, "ignore_eos": True})
    assert ok.json()["choices"][0]["text"] == engine.output_text(3)


def streamed_choices(events: list[Any]) -> dict[int, tuple[str, list[str]]]:
    """Each choice's streamed content and its logprobs' tokens, concatenated."""
    choices: dict[int, tuple[str, list[str]]] = {}
    for event in events:
        for choice in event.get("choices", []) if isinstance(event, dict) else []:
            text, tokens = choices.get(choice["index"], ("", []))
            logprobs = choice.get("logprobs") or {"content": []}
            choices[choice["index"]] = (
                text + (choice["delta"].get("content") or ""), tokens + [t["token"] for t in logprobs["content"]]
            )
    return choices


async def test_a_lost_engine_that_no_engine_replaces_ends_its_streams_and_the_gateway_serves_on(
    api: httpx.AsyncClient, engine: FakeEngineClient, stream_events: StreamEvents
) -> None:
    engine.lose_requests_after(2, can_resume=False)
    events = await stream_events(api, CHAT, {"messages": MESSAGES, "max_tokens": 1000, "ignore_eos": True, "n": 2})
    assert events[-1] == "[DONE]" and len(error_events(events)) == 1
    assert (await api.get("/health")).status_code == 200
    response = await api.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 3, "ignore_eos": True})
    assert response.json()["choices"][0]["text"] == engine.output_text(3)


async def test_past_the_request_timeout_requests_are_aborted_with_408(
    serve: Serve, engine: FakeEngineClient, stream_events: StreamEvents
) -> None:
    # NOTE: a long request takes 10 s of steps, a short one 0.03 s: the 1 s timeout parts them however
    # busy the machine is.
    engine.seconds_per_step = 0.01
    async with serve(request_timeout_s=1.0) as client:
        response = await client.post(COMPLETIONS, json=LONG)
        assert response.status_code == 408
        error = response.json()["error"]
        assert (error["type"], error["code"]) == ("timeout_error", "request_timeout")
        assert response.headers["x-should-retry"] == "false"
        assert engine.aborted_ids == [engine.requests[0].request_id]
        body = {"messages": MESSAGES, "max_tokens": 1000, "ignore_eos": True, "n": 2}
        events = await stream_events(client, CHAT, body)
        assert finish_reasons(events) == {0: "abort", 1: "abort"}
        assert (events[-2]["error"]["type"], events[-2]["error"]["code"]) == ("timeout_error", "request_timeout")
        assert events[-1] == "[DONE]"
        assert sorted(engine.aborted_ids[1:]) == sorted(r.request_id for r in engine.requests[1:])
        ok = await client.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 3})
        assert ok.status_code == 200


async def test_past_the_queue_cap_requests_get_429(serve: Serve, engine: FakeEngineClient) -> None:
    engine.seconds_per_step = 0.01
    async with serve(engine=EngineConfig(max_num_seqs=1), max_num_queued_requests=0) as client:
        running = asyncio.create_task(client.post(COMPLETIONS, json={**LONG, "max_tokens": 50}))
        while not engine.running_ids:
            await asyncio.sleep(0.01)
        refused = await client.post(CHAT, json={"messages": MESSAGES})
        assert refused.status_code == 429
        assert refused.headers["Retry-After"] == "1"
        assert set(refused.json()["error"]) == {"message", "type", "param", "code"}
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        metrics = (await client.get("/metrics")).text
        assert 'zeroserve:admission_rejections_total{model_name="fake",reason="max_num_queued_reqs"} 1.0' in metrics
        assert (await client.get("/health")).status_code == 200
        assert (await running).status_code == 200
        assert (await client.post(CHAT, json={"messages": MESSAGES, "max_tokens": 1})).status_code == 200


@pytest.mark.parametrize("path", ["/health", "/v1/models"])
async def test_a_head_past_the_cap_gets_431(api: httpx.AsyncClient, path: str) -> None:
    response = await api.get(path, headers={"X-Padding": "x" * 20_000})
    assert response.status_code == 431
    assert response.json()["error"]["code"] == "request_header_fields_too_large"
