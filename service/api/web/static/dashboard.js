// The dashboard: the engines' figures from GET /dashboard/events (the same figures as /metrics),
// about once a second, as numbers, two-minute charts and tables; on a multi-model server, of the
// model picked.
"use strict";

(() => {
  const HISTORY_LENGTH = 120;
  const MIN_SPAN = 10;
  const SVG = "http://www.w3.org/2000/svg";
  const $ = (id) => document.getElementById(id);
  const history = [];
  const STATUS_TEXT = {
    ok: "serving", recovering: "an engine is restarting", dead: "no engine (dead)",
    waiting_for_engine: "waiting for an engine to join", unloaded: "not loaded (loads on its first request)",
    loading: "loading", failed: "failed to load",
  };
  let chosenModel = ""; // "" : the server's choice (its first loaded model)
  let shownModel = null; // the model the frames are of
  let connection = null; // aborts the stream read now
  let isPickerAsked = false;

  function banner(text, isError) {
    const node = $("banner");
    node.textContent = text;
    node.classList.toggle("error", !!isError);
    node.hidden = !text;
  }

  const percent = (value) => (value === null || value === undefined ? "–" : (value * 100).toFixed(1) + "%");
  const rate = (value) => value.toFixed(1);
  const seconds = (value) => (value === null || value === undefined ? "–" : value.toFixed(2) + " s");

  // A chart of the history's series (each a function of a frame), scaled to their largest value.
  function drawChart(id, series, minimumMax, unit) {
    const figure = $(id);
    let svg = figure.querySelector("svg");
    if (!svg) {
      svg = document.createElementNS(SVG, "svg");
      svg.setAttribute("preserveAspectRatio", "none");
      svg.setAttribute("role", "img");
      svg.setAttribute("aria-label", figure.querySelector("figcaption").textContent);
      figure.prepend(svg);
    }
    // NOTE: the x axis spans the history so far (at least MIN_SPAN frames), up to two minutes.
    const span = Math.max(history.length, MIN_SPAN);
    svg.setAttribute("viewBox", `0 0 ${span - 1} 100`);
    let max = minimumMax;
    for (const frame of history) for (const [value] of series) max = Math.max(max, value(frame) || 0);
    const children = [];
    for (const y of [25, 50, 75]) {
      const line = document.createElementNS(SVG, "line");
      line.setAttribute("class", "grid");
      line.setAttribute("x1", "0");
      line.setAttribute("x2", String(span - 1));
      line.setAttribute("y1", String(y));
      line.setAttribute("y2", String(y));
      children.push(line);
    }
    const offset = span - history.length;
    for (const [value, color] of series) {
      const points = history.map((frame, index) =>
        `${offset + index},${(100 - ((value(frame) || 0) / max) * 98).toFixed(2)}`);
      const line = document.createElementNS(SVG, "polyline");
      line.setAttribute("points", points.join(" "));
      line.setAttribute("class", color);
      children.push(line);
    }
    svg.replaceChildren(...children);
    figure.querySelector(".max").textContent = `max ${Number.isInteger(max) ? max : max.toFixed(1)}${unit}`;
  }

  function cell(text) {
    return zs.element("td", {}, text);
  }

  function show(frame) {
    if (frame.model && frame.model !== shownModel) {
      shownModel = frame.model;
      $("model").value = frame.model;
    }
    history.push(frame);
    if (history.length > HISTORY_LENGTH) history.shift();
    $("num-running").textContent = String(frame.num_running_reqs);
    $("num-waiting").textContent = String(frame.num_waiting_reqs);
    $("kv-cache-usage").textContent = percent(frame.kv_cache_usage);
    $("prefix-cache-hit-rate").textContent = percent(frame.prefix_cache_hit_rate_total);
    $("generation-tokens-per-s").textContent = rate(frame.generation_tokens_per_s);
    $("prompt-tokens-per-s").textContent = rate(frame.prompt_tokens_per_s);
    $("updated").textContent = "updated " + new Date(frame.time * 1000).toLocaleTimeString();
    const status = $("engine-status");
    status.textContent = STATUS_TEXT[frame.engine_status] || frame.engine_status;
    status.dataset.status = frame.engine_status;
    drawChart("chart-requests", [[(f) => f.num_running_reqs, "s1"], [(f) => f.num_waiting_reqs, "s2"]], 4, "");
    drawChart("chart-tokens", [[(f) => f.generation_tokens_per_s, "s1"], [(f) => f.prompt_tokens_per_s, "s2"]], 10, " tok/s");
    drawChart("chart-cache", [[(f) => f.kv_cache_usage * 100, "s1"],
      [(f) => (f.prefix_cache_hit_rate || 0) * 100, "s3"]], 100, "%");
    $("engines").replaceChildren(...frame.engines.map((engine) => {
      const row = zs.element("tr", { "data-engine": engine.engine });
      row.append(cell(engine.engine), cell(String(engine.num_running_reqs)), cell(String(engine.num_waiting_reqs)),
        cell(percent(engine.kv_cache_usage)), cell(rate(engine.generation_tokens_per_s)),
        cell(rate(engine.prompt_tokens_per_s)));
      return row;
    }));
    $("recent-requests").replaceChildren(...frame.recent_requests.map((request) => {
      const row = zs.element("tr");
      row.append(cell(request.request_id), cell(String(request.engine)), cell(request.finish_reason),
        cell(seconds(request.ttft_s)),
        cell(request.tokens_per_s === null ? "–" : rate(request.tokens_per_s) + " tok/s"),
        cell(String(request.num_prompt_tokens)), cell(String(request.num_generation_tokens)), cell(seconds(request.e2e_s)));
      return row;
    }));
    const finished = Object.entries(frame.num_finished).filter(([, count]) => count > 0)
      .map(([reason, count]) => `${reason} ${count}`);
    $("finished-totals").textContent = "Finished since start: " + (finished.join(", ") || "none") +
      ` · preemptions ${frame.num_preemptions}`;
  }

  // The picker of a multi-model server's models (their ids, not aliases); hidden with one.
  async function loadPicker() {
    isPickerAsked = true;
    let cards = [];
    try {
      const response = await zs.request("/v1/models");
      if (response.ok) cards = (await response.json()).data;
    } catch (_) { /* no picker */ }
    const ids = cards.filter((card) => card.id === card.root).map((card) => card.id);
    if (ids.length < 2) return;
    $("model").replaceChildren(...ids.map((id) => zs.element("option", { value: id }, id)));
    if (shownModel) $("model").value = shownModel;
    $("model").hidden = false;
  }

  function chooseModel() {
    chosenModel = $("model").value;
    history.length = 0;
    if (connection) connection.abort();
  }

  async function follow() {
    for (;;) {
      connection = new AbortController();
      const signal = connection.signal;
      try {
        const query = chosenModel ? "?model=" + encodeURIComponent(chosenModel) : "";
        const response = await zs.request("/dashboard/events" + query, { headers: { Accept: "text/event-stream" }, signal });
        if (response.ok) {
          banner("");
          $("app").hidden = false;
          if (!isPickerAsked) loadPicker();
          await zs.readEvents(response, (data) => show(JSON.parse(data)));
          banner("The stream ended (the server is restarting or shutting down); reconnecting…");
        } else if (response.status === 503) {
          banner("The model is loading…");
        } else {
          banner(await zs.errorOf(response), true);
          return;
        }
      } catch (error) {
        // NOTE: another model was picked: its stream at once.
        if (error.name === "AbortError") continue;
        banner("Lost the server (" + (error.message || error) + "); reconnecting…", true);
      }
      try {
        await zs.sleep(1000, signal);
      } catch (_) { /* another model was picked */ }
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("model").addEventListener("change", chooseModel);
    follow();
  });
})();
