// The dashboard: pages over the admin API, kept live by one /api/events stream. Every text from the
// server goes in with textContent (never as HTML).
(() => {
  "use strict";

  const { api, ApiError } = window.SwitchyardApi;
  const { LineGraph, formatBytes } = window.SwitchyardChart;
  const $ = (id) => document.getElementById(id);

  // the Library page's words for where a model came from (as in the desktop window)
  const FROM = {
    models_dir: "Models folder",
    hf_cache: "Hugging Face cache",
    download: "Downloaded",
    import_copy: "Imported (copy)",
    import_link: "Imported (link)",
    starter: "Starter model",
    alias: "Another name",
  };
  const APPS = { ollama: "Ollama", lmstudio: "LM Studio", jan: "Jan", gpt4all: "GPT4All", folder: "Shared folder" };
  const STATES = { ready: "Ready", starting: "Loading", stopping: "Unloading", stopped: "Unloaded", failed: "Failed" };

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  function button(label, onClick, name) {
    const b = el("button", label);
    b.type = "button";
    if (name) b.dataset.action = name;
    b.addEventListener("click", async () => {
      b.disabled = true;
      try {
        await onClick();
      } catch (err) {
        showError(err);
      } finally {
        b.disabled = false;
      }
    });
    return b;
  }

  function row(cells) {
    const tr = document.createElement("tr");
    for (const c of cells) {
      if (c instanceof Node) tr.appendChild(c);
      else tr.appendChild(el("td", c));
    }
    return tr;
  }

  function cell(child, cls) {
    const td = el("td", undefined, cls);
    for (const c of [].concat(child)) td.appendChild(c instanceof Node ? c : document.createTextNode(c));
    return td;
  }

  function fill(tableId, rows, emptyId) {
    const body = $(tableId).tBodies[0];
    body.replaceChildren(...rows);
    if (emptyId) $(emptyId).hidden = rows.length > 0;
  }

  function showError(err) {
    if (err instanceof ApiError && err.status === 401) {
      askForKey(err.message);
      return;
    }
    const box = $("error");
    box.textContent = err instanceof Error ? err.message : String(err);
    box.hidden = false;
  }

  function clearError() {
    $("error").hidden = true;
  }

  // ---- the key --------------------------------------------------------------------------------------
  function askForKey(why) {
    $("keygate").hidden = false;
    $("pages").hidden = true;
    $("keygate-why").textContent = why;
    $("keyinput").focus();
  }

  $("keyform").addEventListener("submit", (ev) => {
    ev.preventDefault();
    api.setKey($("keyinput").value.trim());
    $("keyinput").value = "";
    $("keygate").hidden = true;
    $("pages").hidden = false;
    start();
  });

  // ---- pages ----------------------------------------------------------------------------------------
  const pages = {
    models: loadModels,
    lanes: loadLanes,
    downloads: loadDownloads,
    jobs: loadJobs,
    hardware: loadHardware,
    chat: loadChatModels,
    peers: loadPeers,
    settings: loadSettings,
  };
  let current = "models";

  for (const b of document.querySelectorAll("#tabs button")) {
    b.addEventListener("click", () => show(b.dataset.page));
  }

  function show(page) {
    current = page;
    for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b.dataset.page === page);
    for (const s of document.querySelectorAll(".page")) s.hidden = s.id !== "page-" + page;
    refresh(page);
  }

  async function refresh(page) {
    try {
      await pages[page]();
      clearError();
    } catch (err) {
      showError(err);
    }
  }

  // ---- library --------------------------------------------------------------------------------------
  const fits = new Map(); // model id -> the fit's summary (explain), asked once per model and page load

  function fromText(m) {
    if (m.owner) return APPS[m.owner.app] + (m.owner.app === "folder" ? "" : " (" + m.owner.name + ")");
    if (m.origin && m.origin.repo) return m.origin.repo;
    return FROM[m.source] || m.source;
  }

  async function loadModels() {
    const doc = await api.get("/api/library");
    const rows = doc.models.map((m) => {
      const status = m.status === "ok" ? el("span", "Ready to load", "ok") : el("span", m.problem || m.status, "bad");
      const fit = el("span", fits.get(m.id) || "", "muted");
      fit.dataset.fit = m.id;
      const actions = [];
      if (m.status === "ok") {
        actions.push(button("Load", async () => {
          await api.post("/api/models/" + encodeURIComponent(m.id) + "/load");
          show("lanes");
        }, "load"));
      }
      actions.push(button("Explain", () => explain(m.id), "explain"));
      const tr = row([cell(m.id, "id"), m.format, m.kind, cell(formatBytes(m.size), "num"), fromText(m),
        cell(fit), cell(status), cell(actions, "actions")]);
      tr.dataset.model = m.id;
      return tr;
    });
    fill("models-table", rows);
    for (const m of doc.models) {
      if (m.status === "ok" && !fits.has(m.id)) fitOf(m.id);
    }
  }

  async function fitOf(id) {
    try {
      const e = await api.get("/api/models/" + encodeURIComponent(id) + "/explain");
      const text = e.fit ? (e.fit.fits ? "" : "Does not fit: ") + e.fit.summary : e.fit_problem || "";
      fits.set(id, text);
      const span = document.querySelector('[data-fit="' + CSS.escape(id) + '"]');
      if (span) span.textContent = text;
    } catch (err) {
      fits.set(id, "Could not explain: " + err.message);
      const span = document.querySelector('[data-fit="' + CSS.escape(id) + '"]');
      if (span) span.textContent = fits.get(id);
    }
  }

  async function explain(id) {
    const e = await api.get("/api/models/" + encodeURIComponent(id) + "/explain");
    $("explain").hidden = false;
    $("explain-title").textContent = id;
    $("explain-fit").textContent = e.fit ? e.fit.summary : e.fit_problem || e.problem || "";
    $("explain-reasons").replaceChildren(...(e.decision ? e.decision.reasons : []).map((r) => el("li", r)));
    const turned = (e.decision ? e.decision.rejections : []).map((r) => el("li", r.lane + ": " + r.message));
    $("explain-turned").hidden = turned.length === 0;
    $("explain-rejections").replaceChildren(...turned);
  }

  $("models-rescan").addEventListener("click", () => refresh("models"));

  // ---- lanes ----------------------------------------------------------------------------------------
  async function loadLanes() {
    const doc = await api.get("/api/lanes");
    const rows = doc.lanes.map((l) => {
      const state = el("span", STATES[l.state] || l.state, l.state === "failed" ? "bad" : l.state === "ready" ? "ok" : "");
      const actions = [
        button("Logs", () => logs(l.id), "logs"),
        button("Unload", async () => {
          await api.post("/api/models/" + encodeURIComponent(l.model) + "/unload");
          await loadLanes();
        }, "unload"),
      ];
      const tr = row([cell(l.model, "id"), l.engine || "-", cell(state), l.port || "-", cell(actions, "actions")]);
      tr.dataset.lane = l.id;
      tr.dataset.state = l.state;
      return tr;
    });
    fill("lanes-table", rows, "lanes-empty");
  }

  async function logs(id) {
    const doc = await api.get("/api/lanes/" + encodeURIComponent(id) + "/logs?lines=200");
    $("logs").hidden = false;
    $("logs-title").textContent = "Log of " + id;
    $("logs-text").textContent = doc.lines.join("\n");
  }

  // ---- downloads ------------------------------------------------------------------------------------
  async function loadDownloads() {
    const doc = await api.get("/api/downloads");
    const rows = doc.downloads.map((d) => {
      const bar = el("progress");
      bar.max = d.bytes_total || 1;
      bar.value = d.bytes_done || 0;
      const done = formatBytes(d.bytes_done) + " of " + formatBytes(d.bytes_total);
      const rate = d.state === "running" && d.rate_bps ? ", " + formatBytes(d.rate_bps) + "/s" : "";
      const path = "/api/downloads/" + encodeURIComponent(d.id);
      const actions = [];
      if (d.state === "running" || d.state === "queued") actions.push(button("Pause", () => api.post(path + "/pause").then(loadDownloads), "pause"));
      if (d.state === "paused" || d.state === "failed") actions.push(button("Resume", () => api.post(path + "/resume").then(loadDownloads), "resume"));
      actions.push(button("Cancel", () => api.call("DELETE", path).then(loadDownloads), "cancel"));
      const state = el("span", d.error ? d.state + ": " + d.error : d.state, d.error ? "bad" : "");
      const tr = row([cell(d.repo + (d.selector ? ":" + d.selector : ""), "id"), cell([bar, " " + done + rate]),
        cell(state), cell(actions, "actions")]);
      tr.dataset.download = d.id;
      tr.dataset.state = d.state;
      return tr;
    });
    fill("downloads-table", rows, "downloads-empty");
  }

  $("download-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      await api.post("/api/downloads", { repo: $("download-repo").value.trim() });
      $("download-repo").value = "";
      await loadDownloads();
      clearError();
    } catch (err) {
      showError(err);
    }
  });

  // ---- jobs -----------------------------------------------------------------------------------------
  async function loadJobs() {
    const doc = await api.get("/api/jobs");
    const rows = doc.jobs.map((j) => {
      const step = j.steps.length ? j.steps[j.steps.length - 1] : null;
      const stepText = step ? step.name + (step.total ? " " + Math.round((100 * step.done) / step.total) + "%" : "") : "-";
      const actions = [];
      if (j.state === "running" || j.state === "queued") {
        actions.push(button("Cancel", () => api.call("DELETE", "/api/jobs/" + encodeURIComponent(j.id)).then(loadJobs), "cancel"));
      }
      const state = el("span", j.error ? j.state + ": " + j.error : j.state, j.error ? "bad" : "");
      const tr = row([cell(j.title, "id"), j.kind, stepText, cell(state), cell(actions, "actions")]);
      tr.dataset.job = j.id;
      return tr;
    });
    fill("jobs-table", rows, "jobs-empty");
  }

  // ---- hardware -------------------------------------------------------------------------------------
  const cpuGraph = new LineGraph($("cpu-graph"), { max: 100, unit: "%" });
  const ramGraph = new LineGraph($("ram-graph"), { max: 1, unit: "bytes", color: "#1f7a3f" });

  async function loadHardware() {
    const hw = await api.get("/api/hardware");
    const facts = [
      ["CPU", (hw.cpu && hw.cpu.model_name) || "unknown"],
      ["Cores", hw.cpu ? hw.cpu.usable_cores || hw.cpu.logical_cores || "unknown" : "unknown"],
      ["Memory", formatBytes(hw.memory && hw.memory.effective_total)],
      ["GPUs", hw.gpus && hw.gpus.length ? hw.gpus.map((g) => g.name + " " + formatBytes(g.memory_total)).join(", ") : "none found"],
    ];
    $("hardware-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", k), el("dd", v)]));
    cpuGraph.draw();
    ramGraph.draw();
  }

  function onSample(s) {
    if (typeof s.cpu_percent === "number") {
      cpuGraph.push(s.cpu_percent);
      $("cpu-now").textContent = Math.round(s.cpu_percent) + "%";
    }
    if (typeof s.ram_used === "number") {
      ramGraph.max = s.ram_total || ramGraph.max;
      ramGraph.push(s.ram_used);
      $("ram-now").textContent = formatBytes(s.ram_used) + " of " + formatBytes(s.ram_total);
    }
  }

  // ---- chat -----------------------------------------------------------------------------------------
  async function loadChatModels() {
    const doc = await api.get("/api/library");
    const chosen = $("chat-model").value;
    const options = doc.models.filter((m) => m.status === "ok" && m.kind === "chat").map((m) => {
      const o = el("option", m.id);
      o.value = m.id;
      return o;
    });
    $("chat-model").replaceChildren(...options);
    if (chosen) $("chat-model").value = chosen;
  }

  const chatHistory = [];
  $("chat-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const text = $("chat-input").value.trim();
    if (!text) return;
    $("chat-input").value = "";
    chatHistory.push({ role: "user", content: text });
    $("chat-log").appendChild(message("You", text, "user"));
    const answer = message($("chat-model").value, "", "assistant");
    const body = answer.querySelector(".text");
    $("chat-log").appendChild(answer);
    $("chat-send").disabled = true;
    let said = "";
    try {
      await api.stream("/v1/chat/completions", {
        method: "POST",
        body: { model: $("chat-model").value, messages: chatHistory, stream: true },
        onEvent: (kind, data) => {
          if (kind === "comment") {
            if (!said) body.textContent = data; // the server's loading progress, until the first words
            return;
          }
          if (data === "[DONE]") return;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message);
          const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
          if (delta && delta.content) {
            said += delta.content;
            body.textContent = said;
          }
        },
      });
      chatHistory.push({ role: "assistant", content: said });
      answer.dataset.done = "true";
      clearError();
    } catch (err) {
      chatHistory.pop();
      answer.remove();
      showError(err);
    } finally {
      $("chat-send").disabled = false;
    }
  });

  function message(who, text, cls) {
    const m = el("div", undefined, "msg " + cls);
    m.appendChild(el("span", who, "who"));
    m.appendChild(el("span", text, "text"));
    return m;
  }

  // ---- peers and settings ---------------------------------------------------------------------------
  async function loadPeers() {
    const doc = await api.get("/api/remotes");
    fill("peers-table", doc.remotes.map((r) => row([r.name, r.url, r.state || "-", (r.seen || []).map((m) => m.id).join(", ") || "-"])), "peers-empty");
  }

  async function loadSettings() {
    const doc = await api.get("/api/settings");
    const values = doc.settings || doc;
    const keys = Object.keys(values).sort();
    fill("settings-table", keys.map((k) => row([k, JSON.stringify(values[k])])));
    const chosen = $("settings-key").value;
    $("settings-key").replaceChildren(...keys.map((k) => Object.assign(el("option", k), { value: k })));
    if (chosen) $("settings-key").value = chosen;
  }

  $("settings-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const value = JSON.parse($("settings-value").value);
      const change = await api.call("PUT", "/api/settings", { [$("settings-key").value]: value });
      const later = Object.keys((change && change.needs_server_restart) || {});
      $("settings-result").textContent = later.length ? "Saved; takes effect when the server restarts: " + later.join(", ") : "Saved and applied.";
      await loadSettings();
      clearError();
    } catch (err) {
      showError(err instanceof SyntaxError ? new Error("The value must be JSON, e.g. 4, true or \"text\"") : err);
    }
  });

  // ---- live updates ---------------------------------------------------------------------------------
  let streaming = null;
  const pending = new Set();

  function soon(page) {
    if (page !== current || pending.has(page)) return;
    pending.add(page);
    setTimeout(() => {
      pending.delete(page);
      refresh(page);
    }, 300);
  }

  async function follow() {
    if (streaming) streaming.abort();
    streaming = new AbortController();
    try {
      await api.stream("/api/events", {
        signal: streaming.signal,
        onEvent: (kind, data) => {
          if (kind === "comment") return;
          $("live").textContent = "live";
          if (kind === "hardware.sample") onSample(JSON.parse(data));
          else if (kind.startsWith("lane.")) soon("lanes");
          else if (kind.startsWith("download.")) soon("downloads");
          else if (kind.startsWith("job.")) soon("jobs");
          else if (kind.startsWith("library.") || kind.startsWith("model.")) soon("models");
        },
      });
    } catch (err) {
      if (err.name === "AbortError") return;
      $("live").textContent = "offline";
      if (err instanceof ApiError && err.status === 401) return;
    }
    $("live").textContent = "offline";
    setTimeout(follow, 3000);
  }

  async function start() {
    try {
      await api.get("/api/version");
      await api.get("/api/library");
    } catch (err) {
      showError(err);
      return;
    }
    clearError();
    show(current);
    follow();
  }

  start();
})();
