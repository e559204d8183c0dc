// What both pages share: the API key (asked once, kept in this browser), requests to this
// gateway only, and reading a server-sent-event stream from a fetch response.
"use strict";

const zs = (() => {
  const KEY_ITEM = "zeroserve.apiKey";

  function apiKey() {
    return localStorage.getItem(KEY_ITEM) || "";
  }

  function headers(extra) {
    const all = Object.assign({}, extra || {});
    const key = apiKey();
    if (key) all.Authorization = "Bearer " + key;
    return all;
  }

  // The dialog that asks for the key (made on first use).
  function keyDialog() {
    let dialog = document.getElementById("key-dialog");
    if (dialog) return dialog;
    dialog = element("dialog", { id: "key-dialog", "aria-labelledby": "key-title" });
    const form = element("form");
    const submit = element("button", { class: "primary", type: "submit" }, "Use this key");
    const buttons = element("p");
    buttons.append(submit);
    form.append(element("h2", { id: "key-title" }, "API key"), element("p", { class: "key-message" }),
      element("label", { for: "api-key" }, "Key"),
      element("input", { id: "api-key", type: "password", autocomplete: "off", required: "" }), buttons);
    dialog.append(form);
    document.body.append(dialog);
    return dialog;
  }

  // Asks for the key in the page's dialog; resolves once one is given.
  function askForKey(message) {
    const dialog = keyDialog();
    const form = dialog.querySelector("form");
    const input = dialog.querySelector("input");
    dialog.querySelector(".key-message").textContent = message;
    input.value = "";
    return new Promise((resolve) => {
      form.onsubmit = (event) => {
        event.preventDefault();
        if (!input.value.trim()) return;
        localStorage.setItem(KEY_ITEM, input.value.trim());
        dialog.close();
        resolve();
      };
      if (!dialog.open) dialog.showModal();
      input.focus();
    });
  }

  // A request to this gateway (a path, never another origin), with the key; a 401 asks for
  // the key and tries again.
  async function request(path, options) {
    if (!path.startsWith("/")) throw new Error("only this gateway's paths: " + path);
    for (;;) {
      const init = Object.assign({}, options || {});
      init.headers = headers(init.headers);
      const response = await fetch(path, init);
      if (response.status !== 401) return response;
      await askForKey(apiKey() ? "That key was refused. Enter the server's API key." :
        "This server needs its API key (--api-key).");
    }
  }

  // The error message of an OpenAI-shaped error response, or its status.
  async function errorOf(response) {
    try {
      const body = await response.json();
      if (body && body.error && body.error.message) return body.error.message;
    } catch (_) { /* not JSON */ }
    return "HTTP " + response.status;
  }

  // Calls onData(data, id) for each event's data and `id:` (null without one), until the stream
  // ends; a lost connection rejects (a TypeError).
  async function readEvents(response, onData) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const lines = block.split("\n");
        const data = lines.filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(line.startsWith("data: ") ? 6 : 5)).join("\n");
        const idLine = lines.find((line) => line.startsWith("id:"));
        if (data) onData(data, idLine === undefined ? null : parseInt(idLine.slice(3), 10));
      }
    }
  }

  function element(tag, attributes, text) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // Resolves after `ms`, or rejects with an AbortError when the signal aborts first.
  function sleep(ms, signal) {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(resolve, ms);
      if (signal) {
        signal.addEventListener("abort", () => {
          clearTimeout(timer);
          reject(new DOMException("Aborted", "AbortError"));
        }, { once: true });
      }
    });
  }

  return { apiKey, request, errorOf, readEvents, askForKey, element, sleep };
})();
