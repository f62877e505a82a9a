// The dashboard's only way to the server: same-origin fetches with the key from this tab's session
// storage as a header (never in a URL), JSON bodies for every change, and an SSE reader over fetch
// (EventSource cannot send a header).
(() => {
  "use strict";

  const KEY_SLOT = "switchyard.key";

  class ApiError extends Error {
    constructor(status, message, code) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  const api = {
    key() {
      return sessionStorage.getItem(KEY_SLOT);
    },
    setKey(key) {
      sessionStorage.setItem(KEY_SLOT, key);
    },
    forgetKey() {
      sessionStorage.removeItem(KEY_SLOT);
    },
    headers(json) {
      const h = {};
      const key = api.key();
      if (key) h["Authorization"] = "Bearer " + key;
      if (json) h["Content-Type"] = "application/json";
      return h;
    },
    async call(method, path, body) {
      const init = {
        method,
        headers: api.headers(method !== "GET"),
        mode: "same-origin",
        credentials: "omit",
        cache: "no-store",
      };
      // every change is a JSON request (never a form post a foreign page could forge)
      if (method !== "GET") init.body = JSON.stringify(body === undefined ? {} : body);
      const resp = await fetch(path, init);
      const text = await resp.text();
      let doc = null;
      try {
        doc = text ? JSON.parse(text) : null;
      } catch (_) {
        doc = null;
      }
      if (!resp.ok) {
        const err = doc && doc.error;
        const message = (err && (err.message || err)) || text || resp.statusText;
        throw new ApiError(resp.status, String(message), err && err.code);
      }
      return doc;
    },
    get(path) {
      return api.call("GET", path);
    },
    post(path, body) {
      return api.call("POST", path, body);
    },
    // Read a server-sent-event stream: onEvent(kind, data) for each event; resolves when it ends.
    async stream(path, { method = "GET", body, onEvent, signal }) {
      const init = { method, headers: api.headers(method !== "GET"), mode: "same-origin", credentials: "omit",
        signal };
      if (method !== "GET") init.body = JSON.stringify(body);
      const resp = await fetch(path, init);
      if (!resp.ok) {
        let message = resp.statusText;
        try {
          const doc = await resp.json();
          message = (doc.error && (doc.error.message || doc.error)) || message;
        } catch (_) { /* not JSON */ }
        throw new ApiError(resp.status, String(message));
      }
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          let kind = "message";
          const data = [];
          for (const line of block.split("\n")) {
            if (line.startsWith("event:")) kind = line.slice(6).trim();
            else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
            else if (line.startsWith(":")) onEvent("comment", line.slice(1).trim());
          }
          if (data.length) onEvent(kind, data.join("\n"));
        }
      }
    },
  };

  window.SwitchyardApi = { api, ApiError };
})();
