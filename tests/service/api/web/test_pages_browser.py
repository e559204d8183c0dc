"""The playground (/) and the dashboard (/dashboard) in headless Chromium, Debian's, driven by
Playwright, against a real `zeroserve serve` of the default model: what a user sees and does.
Every test fails if a page asks any origin but the gateway's, or logs an error (a CSP refusal is one).
Screenshots of both pages, desktop and phone width, go to build/screenshots/."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.model_files.model_registry import DEFAULT_MODEL
from tests.server_process import ServerProcess, running_server
from tests.service.api.web.browser import CHROMIUM, PHONE, CuttableProxy, Watched, screenshot

playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium package (.ci/run installs it)"),
]

# NOTE: its greedy answer wins by a clear margin at every token (see test_openai_sdk.py) and is plain text.
QUESTION = "What is the capital of Japan?"
# NOTE: 87 greedy tokens, ending with a stop: long enough that a browser short of CPU (the suite
# runs beside it) still renders the answer at several lengths on its way.
STREAMED_QUESTION = "Why is the sky blue? Answer in one short paragraph."
LONG_QUESTION = "Tell me a long story about a dragon who learns to read."
API_KEY = "sekrit-key"
ABORTED = 'finished_reason="abort"'


@pytest.fixture(scope="module")
def server(default_model_path: object) -> Iterator[ServerProcess]:
    with running_server(DEFAULT_MODEL, "--num-threads", "2") as server:
        yield server


def open_playground(page: Any) -> None:
    page.goto("/")
    expect(page.locator("#app")).to_be_visible()


def assistant(page: Any) -> Any:
    return page.locator(".message.assistant").last


def num_aborted(server: ServerProcess) -> float:
    text = httpx.get(f"{server.base_url}/metrics").text
    lines = [line for line in text.splitlines() if line.startswith("zeroserve:request_success_total") and ABORTED in line]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def greedy_answer(server: ServerProcess, question: str) -> dict[str, Any]:
    response = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=120, json={
        "model": DEFAULT_MODEL, "messages": [{"role": "user", "content": question}], "temperature": 0,
    })
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


# NOTE: records the answer's text at every change the page makes to it, in the page itself
# (an init script runs outside the page's CSP; polling from the test would miss fast tokens).
RECORD_ANSWER_TEXT = """
window.__answerTexts = [];
new MutationObserver(() => {
  const answers = document.querySelectorAll(".message.assistant .content");
  if (answers.length) window.__answerTexts.push(answers[answers.length - 1].innerText);
}).observe(document, { subtree: true, childList: true, characterData: true });
"""


def test_a_question_streams_in_token_by_token_and_ends_as_the_apis_greedy_answer(
    watched: Watched, server: ServerProcess
) -> None:
    # NOTE: asked twice, and the second answer kept: the page's request finds the question's blocks
    # cached, as the second does, and prefills only its tail. Where the load-time plan runs a
    # few tokens in another form than a whole prompt (int4 against packed or int8), that tail
    # can settle a near-tie another way than the first, uncached request did.
    greedy_answer(server, STREAMED_QUESTION)
    expected = greedy_answer(server, STREAMED_QUESTION)
    expected_text = expected["choices"][0]["message"]["content"]
    page = watched.page
    page.add_init_script(RECORD_ANSWER_TEXT)
    open_playground(page)
    # NOTE: the sampling fields start at the model's generation config (greedy for this model).
    assert page.locator("#temperature").input_value() == "0"
    page.locator("#prompt").fill(STREAMED_QUESTION)
    page.locator("#prompt").press("Enter")
    expect(assistant(page).locator("[data-stat=finish]")).to_have_text("stop", timeout=60_000)

    content = assistant(page).locator(".content")
    assert content.inner_text().strip() == expected_text.strip()
    texts = [text.strip() for text in page.evaluate("window.__answerTexts")]
    growing = list(dict.fromkeys(text for text in texts if text))
    assert len(growing) >= 3, growing
    assert all(expected_text.strip().startswith(text) for text in growing), growing
    assert [len(text) for text in growing] == sorted(len(text) for text in growing)

    # The answer's figures, and the conversation kept in the browser.
    stats = assistant(page).locator(".stats")
    assert stats.locator("[data-stat=tokens]").inner_text() == f"{expected['usage']['completion_tokens']} tokens"
    assert stats.locator("[data-stat=ttft]").inner_text().startswith("TTFT ")
    assert stats.locator("[data-stat=speed]").inner_text().endswith(" tok/s")
    kept = json.loads(page.evaluate("localStorage.getItem('zeroserve.conversations')"))
    assert [m["content"] for m in kept[0]["messages"]] == [STREAMED_QUESTION, expected_text]
    screenshot(page, "playground-desktop.png")

    # The logprobs view: a shaded span per token, its probability and alternatives on hover.
    stats.get_by_role("button", name="Probabilities").click()
    tokens = assistant(page).locator(".tokens span")
    expect(tokens).to_have_count(expected["usage"]["completion_tokens"])
    first = tokens.first
    assert 0.0 < float(first.get_attribute("data-probability") or "nan") <= 1.0
    assert "Top: " in (first.get_attribute("title") or "")

    # A reload finds the conversation where it was.
    page.reload()
    expect(assistant(page).locator(".tokens span")).to_have_count(expected["usage"]["completion_tokens"])
    page.set_viewport_size(PHONE)
    stats = assistant(page).locator(".stats")
    stats.get_by_role("button", name="Text").click()
    screenshot(page, "playground-phone.png")


def test_stop_aborts_the_request_at_the_gateway_by_button_or_escape(watched: Watched, server: ServerProcess) -> None:
    page = watched.page
    open_playground(page)
    # NOTE: each stop starts a new chat, so both send the same one-message prompt with a long greedy
    # answer; a second turn after a stopped answer may be answered in a few tokens.
    for index, stop in enumerate((lambda: page.locator("#stop").click(), lambda: page.keyboard.press("Escape"))):
        if index:
            page.locator("#new-chat").click()
            expect(page.locator(".message")).to_have_count(0)
        before = num_aborted(server)
        page.locator("#prompt").fill(LONG_QUESTION)
        page.locator("#send").click()
        answer = assistant(page)
        expect(answer.locator(".content")).not_to_have_text("", timeout=60_000)
        expect(page.locator("#stop")).to_be_enabled()
        stop()
        expect(answer.locator("[data-stat=finish]")).to_have_text("stopped", timeout=10_000)
        deadline = time.monotonic() + 10
        while num_aborted(server) < before + 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert num_aborted(server) == before + 1, f"stop {index}: no aborted request in /metrics"
        text = answer.locator(".content").inner_text()
        time.sleep(0.5)
        assert answer.locator(".content").inner_text() == text
        assert len(page.locator(".message.assistant").all()) == 1
    expect(page.locator("#conversation-list li")).to_have_count(2)


def test_the_sampling_settings_ride_on_the_request_and_are_kept(watched: Watched, server: ServerProcess) -> None:
    page = watched.page
    open_playground(page)
    page.locator("#temperature").fill("0.7")
    page.locator("#temperature").dispatch_event("change")
    page.locator("#seed").fill("1234")
    page.locator("#seed").dispatch_event("change")
    page.locator("#max_tokens").fill("12")
    page.locator("#max_tokens").dispatch_event("change")
    page.locator("#system").fill("You are a storyteller.")
    page.locator("#prompt").fill(LONG_QUESTION)
    with page.expect_request(lambda request: request.url.endswith("/v1/chat/completions")) as sent:
        page.locator("#prompt").press("Enter")
    body = json.loads(sent.value.post_data or "{}")
    assert body["temperature"] == 0.7 and body["seed"] == 1234 and body["max_tokens"] == 12
    assert body["messages"] == [
        {"role": "system", "content": "You are a storyteller."}, {"role": "user", "content": LONG_QUESTION}
    ]
    assert body["stream"] is True and body["model"] == DEFAULT_MODEL
    expect(assistant(page).locator("[data-stat=finish]")).to_have_text("length", timeout=60_000)
    assert assistant(page).locator("[data-stat=tokens]").inner_text() == "12 tokens"
    # NOTE: Shift+Enter adds a line; Enter alone would send.
    page.locator("#prompt").fill("")
    page.locator("#prompt").type("one")
    page.locator("#prompt").press("Shift+Enter")
    page.locator("#prompt").type("two")
    assert page.locator("#prompt").input_value() == "one\ntwo"
    assert len(page.locator(".message.user").all()) == 1
    page.reload()
    expect(page.locator("#app")).to_be_visible()
    assert page.locator("#temperature").input_value() == "0.7"
    page.get_by_role("button", name="Server defaults").click()
    assert page.locator("#temperature").input_value() == "0"
    assert page.locator("#seed").input_value() == ""


WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
}}}
CITY_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_the_json_schema_and_tools_boxes_constrain_the_answer(watched: Watched, server: ServerProcess) -> None:
    page = watched.page
    open_playground(page)
    page.locator("#agents summary").click()
    page.locator("#json-schema").fill("{not json")
    page.locator("#prompt").fill(QUESTION)
    page.locator("#prompt").press("Enter")
    expect(page.locator("#banner")).to_contain_text("JSON schema box is not valid JSON")
    assert page.locator(".message").count() == 0
    page.locator("#json-schema").fill(json.dumps(CITY_SCHEMA))
    with page.expect_request(lambda request: request.url.endswith("/v1/chat/completions")) as sent:
        page.locator("#prompt").press("Enter")
    assert json.loads(sent.value.post_data or "{}")["response_format"]["json_schema"]["schema"] == CITY_SCHEMA
    expect(assistant(page).locator("[data-stat=finish]")).to_have_text("stop", timeout=60_000)
    kept = json.loads(page.evaluate("localStorage.getItem('zeroserve.conversations')"))
    assert set(json.loads(kept[0]["messages"][-1]["content"])) == {"city"}

    page.locator("#json-schema").fill("")
    page.locator("#tools").fill(json.dumps([WEATHER_TOOL]))
    page.locator("#tool-choice").select_option("required")
    page.locator("#prompt").fill("What is the weather in Paris?")
    page.locator("#prompt").press("Enter")
    expect(assistant(page).locator("[data-stat=finish]")).to_have_text("tool_calls", timeout=60_000)
    call = assistant(page).locator(".tool-call").inner_text()
    name, arguments = call.split("(", 1)
    assert name == "get_weather" and set(json.loads(arguments.removesuffix(")"))) == {"city"}


# NOTE: long enough that all eight dashboard streams overlap on a loaded machine (at 192 tokens the first ones
# finished before the last were admitted, and the dashboard never saw eight running at once)
STREAM_TOKENS = 768


def _stream(server: ServerProcess) -> None:
    with httpx.stream("POST", f"{server.base_url}/v1/completions", timeout=180, json={
        "model": DEFAULT_MODEL, "prompt": "Once upon a time", "max_tokens": STREAM_TOKENS, "ignore_eos": True, "stream": True,
    }) as response:
        for _ in response.iter_lines():
            pass


def test_the_dashboard_shows_eight_streams_running_and_then_their_figures(
    watched: Watched, server: ServerProcess
) -> None:
    page = watched.page
    page.goto("/dashboard")
    expect(page.locator("#app")).to_be_visible()
    expect(page.locator("#num-running")).to_have_text("0")
    expect(page.locator("#engine-status")).to_have_text("serving")
    streams = [threading.Thread(target=_stream, args=(server,)) for _ in range(8)]
    for stream in streams:
        stream.start()
    try:
        expect(page.locator("#num-running")).to_have_text("8", timeout=60_000)
        expect(page.locator("tr[data-engine='0'] td").nth(1)).to_have_text("8")
        expect(page.locator("#generation-tokens-per-s")).not_to_have_text("0.0")
        time.sleep(2.5)  # NOTE: a few frames on the charts for the screenshot
        screenshot(page, "dashboard-desktop.png")
    finally:
        for stream in streams:
            stream.join()
    expect(page.locator("#num-running")).to_have_text("0", timeout=10_000)
    rows = page.locator("#recent-requests tr")
    expect(rows.first).to_be_visible()
    lengths = [row.locator("td").nth(2).inner_text() for row in rows.all()[:8]]
    assert lengths == ["length"] * 8
    assert all(row.locator("td").nth(6).inner_text() == str(STREAM_TOKENS) for row in rows.all()[:8])
    page.set_viewport_size(PHONE)
    screenshot(page, "dashboard-phone.png")


@pytest.fixture(scope="module")
def keyed_server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    # NOTE: it keeps streams too, where Stop must cancel the request rather than drop its connection.
    with running_server(tiny_model_dir, "--api-key", API_KEY, "--stream-retention", "60") as server:
        yield server


def test_with_an_api_key_the_pages_show_nothing_until_given_it(browser: Any, keyed_server: ServerProcess) -> None:
    base_url = keyed_server.base_url
    dashboard_stream = httpx.get(f"{base_url}/dashboard/events", timeout=10)
    assert dashboard_stream.status_code == 401 and dashboard_stream.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{base_url}/playground/settings").status_code == 401
    stranger = Watched(browser, base_url)
    stranger.page.goto("/dashboard")
    expect(stranger.page.locator("#key-dialog")).to_be_visible()
    assert stranger.page.locator("#app").is_hidden() and stranger.page.locator("#num-running").inner_text() == "–"
    stranger.check_and_close(expected_errors=lambda error: "401" in error)
    watched = Watched(browser, base_url)
    page = watched.page
    page.goto("/")
    dialog = page.locator("#key-dialog")
    expect(dialog).to_be_visible()
    assert page.locator("#app").is_hidden() and page.locator("#messages").inner_text() == ""
    page.locator("#api-key").fill("wrong")
    page.locator("#api-key").press("Enter")
    expect(dialog.locator(".key-message")).to_contain_text("refused")
    assert page.locator("#app").is_hidden()
    page.locator("#api-key").fill(API_KEY)
    page.locator("#api-key").press("Enter")
    expect(page.locator("#app")).to_be_visible()
    page.locator("#max_tokens").fill("8")
    page.locator("#prompt").fill("Hello")
    page.locator("#prompt").press("Enter")
    expect(assistant(page).locator("[data-stat=finish]")).to_have_text("length", timeout=60_000)
    # NOTE: where streams are kept, Stop cancels the request by its X-Request-Id.
    before = num_aborted(keyed_server)
    page.locator("#max_tokens").fill("1500")
    page.locator("#prompt").fill("Hello again")
    with page.expect_request(lambda request: request.method == "DELETE") as cancelled:
        page.locator("#prompt").press("Enter")
        expect(assistant(page).locator(".content")).not_to_have_text("", timeout=60_000)
        page.locator("#stop").click()
    assert cancelled.value.url.startswith(f"{base_url}/v1/streams/playground-")
    expect(assistant(page).locator("[data-stat=finish]")).to_have_text("stopped")
    deadline = time.monotonic() + 10
    while num_aborted(keyed_server) < before + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert num_aborted(keyed_server) == before + 1
    # NOTE: the key is kept in this browser: the dashboard's stream gets it too.
    page.goto("/dashboard")
    expect(page.locator("#app")).to_be_visible()
    expect(page.locator("#finished-totals")).to_contain_text("length 1")
    # NOTE: the two 401s the key prompt answered are the only errors the page logged.
    watched.check_and_close(expected_errors=lambda error: "401" in error)


def test_where_streams_are_kept_a_dropped_connection_resumes_the_answer_with_nothing_lost(
    browser: Any, keyed_server: ServerProcess
) -> None:
    proxy = CuttableProxy(keyed_server)
    watched = Watched(browser, proxy.base_url)
    watched.context.add_init_script(f"localStorage.setItem('zeroserve.apiKey', {json.dumps(API_KEY)})")
    page = watched.page
    open_playground(page)
    page.locator("#max_tokens").fill("1500")
    page.locator("#seed").fill("7")
    page.locator("#logprobs").uncheck()
    page.locator("#prompt").fill("Tell me a story.")
    with page.expect_request(lambda request: request.url.endswith("/v1/chat/completions")) as sent:
        page.locator("#prompt").press("Enter")
    request_id = sent.value.headers["x-request-id"]
    expect(assistant(page).locator(".content")).not_to_have_text("", timeout=60_000)
    proxy.cut()
    expect(page.locator("#banner")).to_contain_text("resuming the answer", timeout=10_000)
    expect(assistant(page).locator("[data-stat=finish]")).to_have_text("length", timeout=60_000)
    expect(page.locator("#banner")).to_be_hidden()
    # NOTE: the whole kept stream, as the server sent it: the page's answer is all of it, once.
    kept = httpx.get(f"{keyed_server.base_url}/v1/streams/{request_id}",
                     headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30)
    events = [line[len("data: "):] for line in kept.text.splitlines() if line.startswith("data: ")]
    chunks = [json.loads(event) for event in events if event != "[DONE]"]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    answer = json.loads(page.evaluate("localStorage.getItem('zeroserve.conversations')"))[0]["messages"][-1]
    assert answer["content"] == text and answer["stats"]["num_tokens"] == 1500
    # NOTE: the cut stream is the one error the page may log.
    watched.check_and_close(expected_errors=lambda error: "ERR_" in error or "network" in error)
    proxy.close()
