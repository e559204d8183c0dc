// The playground: chat with a served model (picked, where there are several), streamed, with its sampling
// settings, each answer's figures and its tokens' probabilities. Conversations stay in this browser.
"use strict";

(() => {
  const SAMPLING_FIELDS = [
    "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
    "max_tokens", "seed",
  ];
  const INTEGER_FIELDS = new Set(["top_k", "max_tokens", "seed"]);
  const CONVERSATIONS_ITEM = "zeroserve.conversations";
  const CURRENT_ITEM = "zeroserve.currentConversation";
  const SETTINGS_ITEM = "zeroserve.settings";
  const NUM_TOP_LOGPROBS = 5;
  const MAX_RESUME_TRIES = 30;
  // What a multi-model server's model is now, beside the picker.
  const MODEL_STATUS_TEXT = {
    loaded: "loaded", loading: "loading…", unloaded: "unloaded: loads on first request", failed: "failed to load",
  };

  const $ = (id) => document.getElementById(id);
  let server = null; // GET /playground/settings (of the chosen model, on a multi-model server)
  let conversations = [];
  let currentId = null;
  let running = null; // { controller, answer } while an answer streams
  const views = new WeakMap(); // message -> its element

  // Settings.

  function settingsFromFields() {
    const values = {};
    for (const name of SAMPLING_FIELDS) values[name] = $(name).value;
    values.stop = $("stop-strings").value;
    values.system = $("system").value;
    values.logprobs = $("logprobs").checked;
    values.json_schema = $("json-schema").value;
    values.tools = $("tools").value;
    values.tool_choice = $("tool-choice").value;
    values.model = $("model").value;
    return values;
  }

  function fillFields(values) {
    const defaults = server.defaults;
    for (const name of SAMPLING_FIELDS) $(name).value = fieldText(name in values ? values[name] : defaults[name]);
    $("stop-strings").value = values.stop || "";
    $("system").value = values.system || "";
    $("logprobs").checked = values.logprobs !== false;
    $("json-schema").value = values.json_schema || "";
    $("tools").value = values.tools || "";
    $("tool-choice").value = values.tool_choice || "auto";
    if (values.json_schema || values.tools) $("agents").open = true;
    if (values.model && server.models.includes(values.model)) $("model").value = values.model;
  }

  function fieldText(value) {
    return value === null || value === undefined ? "" : String(value);
  }

  function saveSettings() {
    localStorage.setItem(SETTINGS_ITEM, JSON.stringify(settingsFromFields()));
  }

  // A settings box's JSON, or an error naming the box.
  function parsedBox(id, what) {
    const text = $(id).value.trim();
    if (!text) return undefined;
    try {
      return JSON.parse(text);
    } catch (error) {
      throw new Error(`The ${what} box is not valid JSON: ${error.message}`);
    }
  }

  // The chat request's body: the conversation so far and every setting given a value; throws
  // when a JSON box does not parse.
  function requestBody(messages) {
    const settings = settingsFromFields();
    const body = {
      model: settings.model,
      messages: [],
      stream: true,
      stream_options: { include_usage: true },
    };
    if (settings.system.trim()) body.messages.push({ role: "system", content: settings.system });
    for (const message of messages) body.messages.push({ role: message.role, content: historyText(message) });
    for (const name of SAMPLING_FIELDS) {
      const text = settings[name].trim();
      if (text === "") continue;
      body[name] = INTEGER_FIELDS.has(name) ? parseInt(text, 10) : parseFloat(text);
    }
    const stop = settings.stop.split("\n").filter((line) => line !== "");
    if (stop.length) body.stop = stop;
    if (settings.logprobs) {
      body.logprobs = true;
      body.top_logprobs = NUM_TOP_LOGPROBS;
    }
    const schema = parsedBox("json-schema", "JSON schema");
    if (schema !== undefined) body.response_format = { type: "json_schema", json_schema: { name: "answer", schema } };
    const tools = parsedBox("tools", "tools");
    if (tools !== undefined) {
      body.tools = tools;
      body.tool_choice = settings.tool_choice;
    }
    return body;
  }

  // What a message says, as the next request's history has it: an answer's tool calls as their JSON.
  function historyText(message) {
    const calls = (message.tool_calls || []).map((call) => ({ name: call.name, arguments: call.arguments }));
    return calls.length ? [message.content, JSON.stringify(calls)].filter((text) => text).join("\n") : message.content;
  }

  // Conversations.

  function loadConversations() {
    try {
      conversations = JSON.parse(localStorage.getItem(CONVERSATIONS_ITEM) || "[]");
    } catch (_) {
      conversations = [];
    }
    currentId = localStorage.getItem(CURRENT_ITEM);
    if (!conversations.some((c) => c.id === currentId)) newConversation();
  }

  function saveConversations() {
    localStorage.setItem(CONVERSATIONS_ITEM, JSON.stringify(conversations));
    localStorage.setItem(CURRENT_ITEM, currentId);
  }

  function current() {
    return conversations.find((c) => c.id === currentId);
  }

  function newConversation() {
    const existing = conversations.find((c) => c.messages.length === 0);
    if (existing) {
      currentId = existing.id;
    } else {
      const conversation = { id: String(Date.now()) + Math.random().toString(16).slice(2, 6), title: "New chat", messages: [] };
      conversations.unshift(conversation);
      currentId = conversation.id;
    }
    saveConversations();
  }

  function renderConversationList() {
    const list = $("conversation-list");
    list.replaceChildren();
    for (const conversation of conversations) {
      const item = zs.element("li", conversation.id === currentId ? { class: "current" } : {});
      const open = zs.element("button", { class: "open", type: "button", title: conversation.title }, conversation.title);
      open.addEventListener("click", () => {
        if (running) return;
        currentId = conversation.id;
        saveConversations();
        renderAll();
      });
      const remove = zs.element("button", { type: "button", "aria-label": "Delete " + conversation.title }, "×");
      remove.addEventListener("click", () => {
        if (running && conversation.id === currentId) return;
        conversations = conversations.filter((c) => c !== conversation);
        if (conversation.id === currentId || !conversations.length) {
          currentId = null;
          newConversation();
        }
        saveConversations();
        renderAll();
      });
      item.append(open, remove);
      list.append(item);
    }
  }

  // Messages.

  function markdown(text) {
    return DOMPurify.sanitize(marked.parse(text, { gfm: true, breaks: true }));
  }

  function percent(logprob) {
    return (Math.exp(logprob) * 100).toFixed(1) + "%";
  }

  function tokensView(tokens) {
    const view = zs.element("div", { class: "tokens" });
    for (const token of tokens) {
      const probability = Math.exp(token.logprob);
      const span = zs.element("span", {}, token.token);
      // NOTE: the less likely the token was, the stronger its shade.
      span.style.backgroundColor = `hsla(${Math.round(probability * 120)}, 80%, 50%, ${(0.15 + 0.55 * (1 - probability)).toFixed(2)})`;
      const alternatives = token.top.map(([text, logprob]) => `${JSON.stringify(text)} ${percent(logprob)}`);
      span.title = `${JSON.stringify(token.token)}: ${percent(token.logprob)}` +
        (alternatives.length ? "\nTop: " + alternatives.join(", ") : "");
      span.dataset.probability = probability.toFixed(4);
      view.append(span);
    }
    return view;
  }

  function statsLine(message) {
    const stats = message.stats || {};
    const line = zs.element("div", { class: "stats" });
    const parts = [];
    if (stats.ttft_s !== undefined) parts.push(["ttft", `TTFT ${stats.ttft_s.toFixed(2)} s`]);
    if (stats.tokens_per_s !== undefined) parts.push(["speed", `${stats.tokens_per_s.toFixed(1)} tok/s`]);
    if (stats.num_tokens !== undefined) parts.push(["tokens", `${stats.num_tokens} tokens`]);
    if (stats.finish_reason) parts.push(["finish", stats.finish_reason]);
    for (const [name, text] of parts) line.append(zs.element("span", { "data-stat": name }, text));
    if (message.tokens && message.tokens.length && !isStreaming(message)) {
      const toggle = zs.element("button", { type: "button", "aria-pressed": String(!!message.showTokens) },
        message.showTokens ? "Text" : "Probabilities");
      toggle.addEventListener("click", () => {
        message.showTokens = !message.showTokens;
        saveConversations();
        renderMessage(message);
      });
      line.append(toggle);
    }
    return line;
  }

  function isStreaming(message) {
    return running !== null && running.answer === message;
  }

  function renderMessage(message) {
    let view = views.get(message);
    if (!view) {
      view = zs.element("article", { class: "message " + message.role });
      views.set(message, view);
    }
    const content = zs.element("div", { class: "content" });
    if (message.role === "user") {
      content.textContent = message.content;
    } else if (message.showTokens && message.tokens) {
      content.append(tokensView(message.tokens));
    } else {
      content.innerHTML = markdown(message.content);
    }
    for (const call of message.tool_calls || []) {
      const block = zs.element("pre", { class: "tool-call" });
      block.append(zs.element("code", {}, `${call.name}(${call.arguments})`));
      content.append(block);
    }
    const children = [zs.element("div", { class: "role" }, message.role === "user" ? "You" : "Assistant"), content];
    if (message.error) children.push(zs.element("div", { class: "error", role: "alert" }, message.error));
    if (message.role === "assistant") children.push(statsLine(message));
    view.replaceChildren(...children);
    view.classList.toggle("streaming", isStreaming(message));
    return view;
  }

  function renderMessages() {
    const box = $("messages");
    box.replaceChildren(...current().messages.map(renderMessage));
    box.scrollTop = box.scrollHeight;
  }

  function renderAll() {
    renderConversationList();
    renderMessages();
  }

  let isRenderPending = false;
  function renderSoon(message) {
    if (isRenderPending) return;
    isRenderPending = true;
    requestAnimationFrame(() => {
      isRenderPending = false;
      const box = $("messages");
      const isAtBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
      renderMessage(message);
      if (isAtBottom) box.scrollTop = box.scrollHeight;
    });
  }

  // Sending and stopping.

  async function send() {
    const text = $("prompt").value;
    if (!text.trim() || running) return;
    const conversation = current();
    const question = { role: "user", content: text };
    let body;
    try {
      body = requestBody([...conversation.messages, question]);
    } catch (error) {
      banner(error.message, true);
      return;
    }
    banner("");
    conversation.messages.push(question);
    if (conversation.title === "New chat") conversation.title = text.trim().slice(0, 60);
    const answer = { role: "assistant", content: "", tokens: [], tool_calls: [], stats: {} };
    conversation.messages.push(answer);
    $("prompt").value = "";
    // NOTE: named, so that Stop can cancel it where the server keeps streams (--stream-retention).
    const requestId = "playground-" + Date.now().toString(36) + Math.random().toString(36).slice(2, 10);
    running = { controller: new AbortController(), answer, requestId };
    setRunning(true);
    // NOTE: a multi-model server loads a model on its first request, which waits meanwhile.
    if (server.statuses && server.statuses[body.model] === "unloaded") showModelStatus("loading");
    saveConversations();
    renderAll();
    const startedAt = performance.now();
    let firstTokenAt = null;
    let numChunks = 0;
    try {
      const response = await zs.request("/v1/chat/completions", {
        method: "POST", headers: { "Content-Type": "application/json", "X-Request-Id": requestId },
        body: JSON.stringify(body),
        signal: running.controller.signal,
      });
      if (!response.ok) {
        answer.error = await zs.errorOf(response);
      } else {
        await readResuming(response, running.requestId, running.controller.signal, (data) => {
          if (data === "[DONE]") return;
          const chunk = JSON.parse(data);
          if (chunk.error) {
            answer.error = chunk.error.message;
            return;
          }
          if (chunk.usage) answer.stats.num_tokens = chunk.usage.completion_tokens;
          for (const choice of chunk.choices || []) {
            const delta = choice.delta || {};
            if (delta.content) {
              if (firstTokenAt === null) firstTokenAt = performance.now();
              answer.content += delta.content;
              numChunks += 1;
            }
            for (const call of delta.tool_calls || []) {
              if (firstTokenAt === null) firstTokenAt = performance.now();
              const kept = answer.tool_calls[call.index] || (answer.tool_calls[call.index] = { name: "", arguments: "" });
              if (call.function && call.function.name) kept.name += call.function.name;
              if (call.function && call.function.arguments) kept.arguments += call.function.arguments;
              numChunks += 1;
            }
            const logprobs = choice.logprobs && choice.logprobs.content;
            for (const entry of logprobs || []) {
              answer.tokens.push({
                token: entry.token, logprob: entry.logprob,
                top: (entry.top_logprobs || []).map((top) => [top.token, top.logprob]),
              });
            }
            if (choice.finish_reason) answer.stats.finish_reason = choice.finish_reason;
          }
          renderSoon(answer);
        });
      }
    } catch (error) {
      banner("");
      if (error.name === "AbortError") {
        answer.stats.finish_reason = "stopped";
      } else {
        answer.error = String(error);
      }
    }
    const endedAt = performance.now();
    if (answer.stats.num_tokens === undefined && firstTokenAt !== null) {
      answer.stats.num_tokens = answer.tokens.length || numChunks;
    }
    if (firstTokenAt !== null) {
      answer.stats.ttft_s = (firstTokenAt - startedAt) / 1000;
      const decodeS = (endedAt - firstTokenAt) / 1000;
      if (answer.stats.num_tokens > 1 && decodeS > 0) answer.stats.tokens_per_s = (answer.stats.num_tokens - 1) / decodeS;
    }
    running = null;
    setRunning(false);
    saveConversations();
    renderMessage(answer);
    $("prompt").focus();
    if (server.statuses) refreshModel();
  }

  // Reads the answer's events; where the server keeps streams, a lost connection is resumed
  // after the last event read (GET /v1/streams/{id} with Last-Event-ID), so nothing is lost.
  async function readResuming(response, requestId, signal, onData) {
    let lastEventId = null;
    for (;;) {
      try {
        await zs.readEvents(response, (data, id) => {
          if (id !== null) lastEventId = id;
          onData(data);
        });
        return;
      } catch (error) {
        if (error.name === "AbortError" || !server.is_stream_kept || lastEventId === null) throw error;
        response = await resumed(requestId, lastEventId, signal);
      }
    }
  }

  async function resumed(requestId, lastEventId, signal) {
    for (let attempt = 1; attempt <= MAX_RESUME_TRIES; attempt++) {
      banner(`The connection was lost; resuming the answer (try ${attempt})…`);
      await zs.sleep(1000, signal);
      try {
        const response = await zs.request("/v1/streams/" + encodeURIComponent(requestId), {
          headers: { "Last-Event-ID": String(lastEventId) }, signal,
        });
        if (!response.ok) throw new Error(await zs.errorOf(response));
        banner("");
        return response;
      } catch (error) {
        // NOTE: a TypeError is a network failure: try again; anything else ends the answer.
        if (!(error instanceof TypeError)) throw error;
      }
    }
    throw new Error("The server could not be reached to resume the answer.");
  }

  function stop() {
    // NOTE: closing the response aborts the request at the gateway, which frees its place in the
    // batch; a server that keeps streams would let it generate on, so it is told to cancel it.
    if (!running) return;
    running.controller.abort();
    if (server.is_stream_kept) {
      zs.request("/v1/streams/" + encodeURIComponent(running.requestId), { method: "DELETE" }).catch(() => {});
    }
  }

  function setRunning(isRunning) {
    $("send").disabled = isRunning;
    $("stop").disabled = !isRunning;
    $("model").disabled = isRunning || server.models.length < 2;
  }

  // The model (several on a multi-model server: each with its own defaults, length and status).

  // Reads the chosen model's settings; a sampling field left at the last model's default takes the new one's.
  async function chooseModel() {
    const model = $("model").value;
    const values = settingsFromFields();
    const before = server.defaults;
    let chosen;
    try {
      chosen = await loadServerSettings(model);
    } catch (error) {
      banner(String(error.message || error), true);
      return;
    }
    if ($("model").value !== model) return; // NOTE: another was chosen meanwhile; its answer counts.
    server = chosen;
    for (const name of SAMPLING_FIELDS) if (values[name] === fieldText(before[name])) delete values[name];
    fillFields(values);
    showModel();
    saveSettings();
  }

  // Reads the chosen model's status (and length, known once loaded) again, keeping the fields.
  async function refreshModel() {
    const model = $("model").value;
    try {
      const fresh = await loadServerSettings(model);
      if ($("model").value === model) server = fresh;
    } catch (_) { /* the page keeps what it showed */ }
    showModel();
  }

  function showModel() {
    const bound = server.max_model_len;
    $("max_tokens").placeholder = bound ? `auto (at most ${bound})` : "auto";
    if (bound) $("max_tokens").max = String(bound);
    else $("max_tokens").removeAttribute("max");
    showModelStatus(server.statuses ? server.statuses[$("model").value] : "");
  }

  function showModelStatus(status) {
    const node = $("model-status");
    node.textContent = status ? MODEL_STATUS_TEXT[status] || status : "";
    node.dataset.status = status || "";
  }

  // Start.

  function banner(text, isError) {
    const node = $("banner");
    node.textContent = text;
    node.classList.toggle("error", !!isError);
    node.hidden = !text;
  }

  async function loadServerSettings(model) {
    const path = "/playground/settings" + (model ? "?model=" + encodeURIComponent(model) : "");
    for (;;) {
      const response = await zs.request(path);
      if (response.ok) return response.json();
      if (response.status !== 503) throw new Error(await zs.errorOf(response));
      banner("The model is loading…");
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
  }

  function bindControls() {
    $("composer").addEventListener("submit", (event) => {
      event.preventDefault();
      send();
    });
    $("prompt").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        send();
      }
    });
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape" && running) {
        event.preventDefault();
        stop();
      }
    });
    $("stop").addEventListener("click", stop);
    $("new-chat").addEventListener("click", () => {
      if (running) return;
      newConversation();
      renderAll();
      $("prompt").focus();
    });
    for (const id of [...SAMPLING_FIELDS, "stop-strings", "system", "logprobs", "model", "json-schema", "tools", "tool-choice"]) {
      $(id).addEventListener("change", saveSettings);
    }
    $("model").addEventListener("change", chooseModel);
    $("reset-settings").addEventListener("click", () => {
      fillFields({
        model: $("model").value, system: $("system").value, json_schema: $("json-schema").value,
        tools: $("tools").value, tool_choice: $("tool-choice").value,
      });
      saveSettings();
    });
    for (const [button, className] of [["toggle-conversations", "show-conversations"], ["toggle-settings", "show-settings"]]) {
      $(button).addEventListener("click", () => {
        const isShown = $("app").classList.toggle(className);
        $(button).setAttribute("aria-expanded", String(isShown));
      });
    }
  }

  async function start() {
    try {
      server = await loadServerSettings();
    } catch (error) {
      banner(String(error.message || error), true);
      return;
    }
    banner("");
    $("model").replaceChildren(...server.models.map((name) => zs.element("option", { value: name }, name)));
    let saved = {};
    try {
      saved = JSON.parse(localStorage.getItem(SETTINGS_ITEM) || "{}");
    } catch (_) { /* start from the server's defaults */ }
    if (server.statuses && server.models.includes(saved.model) && saved.model !== server.model) {
      try {
        server = await loadServerSettings(saved.model);
      } catch (_) { /* the first model's settings do */ }
    }
    fillFields(saved);
    showModel();
    loadConversations();
    bindControls();
    setRunning(false);
    $("app").hidden = false;
    renderAll();
    $("prompt").focus();
  }

  document.addEventListener("DOMContentLoaded", start);
})();
