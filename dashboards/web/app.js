// The built-in page: polls the service's JSON endpoints and draws what it gets.
// No framework, no build step; every URL is relative so the page works under any mount path.

import { drawLineChart } from "./chart.js";
import { renderExplanation, renderSummary, reportId } from "./drift.js";
import * as fmt from "./format.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const REFRESH_MS = Math.max(500, Number(params.get("refresh")) * 1000 || 5000);
const SATISFACTION_MS = 60000;  // a fit with a bootstrap: once a minute is news enough
const TOKEN_KEY = "infersight.token";
const state = { timeseries: null, overview: null, failures: 0, timer: null, driftId: null };

// Reads that return users' text (a drift report quotes prompts and answers) need the token:
// `withToken` sends the one remembered for this tab; a 401 is thrown with `status` set.
async function getJSON(path, withToken = false) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), 10000);
  const headers = { Accept: "application/json" };
  const token = withToken ? sessionStorage.getItem(TOKEN_KEY) : null;
  if (token) headers.Authorization = `Bearer ${token}`;
  try {
    const res = await fetch(path, { headers, signal: ctl.signal, cache: "no-store" });
    if (!res.ok) throw Object.assign(new Error(`${path} answered ${res.status}`), { status: res.status });
    return await res.json();
  } finally {
    clearTimeout(timer);
  }
}

// ---- header and lists --------------------------------------------------------------------------

function renderOverview(o) {
  $("model").textContent = o.model ?? "—";
  $("serving-version").textContent = o.serving_version ?? "none";
  const health = $("health");
  health.textContent = o.health ?? "unknown";
  health.className = `pill ${o.health === "ok" ? "pill-ok" : o.health === "degraded" ? "pill-warn" : "pill-unknown"}`;
  $("uptime").textContent = fmt.duration(o.uptime_s);
  renderAlerts(o.firing_alerts ?? []);
  renderDeploys(o.deploys ?? []);
  renderSLOs(o.slos ?? []);
  renderCosts(o.cost ?? [], o.cost_per_hour ?? null);
  renderRoutes(o.routing ?? null);
  renderSummary($("drift-summary"), o.drift ?? null);
  state.driftId = o.drift ? reportId(o.drift) ?? null : null;
  $("drift-open").hidden = !o.drift;
}

function renderAlerts(alerts) {
  const list = $("alerts");
  list.replaceChildren();
  $("alert-count").textContent = String(alerts.length);
  $("alert-count").classList.toggle("count-bad", alerts.length > 0);
  if (!alerts.length) {
    const li = document.createElement("li");
    li.className = "empty";
    li.textContent = "No alert is firing.";
    list.appendChild(li);
    return;
  }
  for (const a of alerts) {
    const li = document.createElement("li");
    li.className = `alert sev-${String(a.severity || "none").toLowerCase()}`;
    const title = document.createElement("strong");
    title.textContent = a.alertname;
    const sev = document.createElement("span");
    sev.className = "sev";
    sev.textContent = a.severity || "";
    const summary = document.createElement("p");
    summary.textContent = a.summary || "";
    const since = document.createElement("p");
    since.className = "muted";
    since.textContent = `firing since ${fmt.when(a.active_since)}`;
    li.append(title, sev, summary, since);
    if (a.diagnosis) {  // the slowdown checklist, most likely cause first
      const diag = document.createElement("p");
      diag.className = "diagnosis";
      diag.textContent = a.diagnosis;
      li.appendChild(diag);
    }
    list.appendChild(li);
  }
}

function renderDeploys(deploys) {
  const body = $("deploys").tBodies[0];
  body.replaceChildren();
  if (!deploys.length) {
    const tr = body.insertRow();
    const td = tr.insertCell();
    td.colSpan = 5;
    td.className = "empty";
    td.textContent = "No deploy recorded.";
    return;
  }
  for (const d of deploys) {
    const tr = body.insertRow();
    const outcome = String(d.outcome ?? "");
    for (const [text, cls] of [
      [fmt.when(d.at), ""],
      [d.from_version ?? "—", "mono"],
      [d.to_version ?? "—", "mono"],
      [outcome, `outcome outcome-${outcome.replace(/[^a-z_]/gi, "")}`],
      [d.reason ?? "", ""],
    ]) {
      const td = tr.insertCell();
      td.textContent = text;
      if (cls) td.className = cls;
    }
    if (d.detail) {  // why: refusal reason, post-deploy evidence
      const why = document.createElement("div");
      why.className = "muted";
      why.textContent = d.detail;
      tr.cells[4].appendChild(why);
    }
  }
}

function fillRows(table, rows, empty, columns) {
  const body = table.tBodies[0];
  body.replaceChildren();
  if (!rows.length) {
    const td = body.insertRow().insertCell();
    td.colSpan = columns;
    td.className = "empty";
    td.textContent = empty;
    return;
  }
  for (const cells of rows) {
    const tr = body.insertRow();
    for (const [text, cls] of cells) {
      const td = tr.insertCell();
      td.textContent = text;
      if (cls) td.className = cls;
    }
  }
}

function renderSLOs(slos) {
  fillRows($("slos"), slos.map((s) => {
    const left = s.error_budget_remaining;
    const cls = left < 0 ? "outcome outcome-refused" : left < 0.25 ? "budget-low" : "";
    const burn = s.burn_rates ? s.burn_rates["1h"] : null;
    return [
      [s.name, "mono"],
      [`${(s.objective * 100).toPrecision(4)}% ${s.kind}`, ""],
      [s.window, ""],
      [s.attainment === null ? "no requests" : `${(s.attainment * 100).toFixed(3)}%`, ""],
      [fmt.percent(left), cls],
      [burn === null || burn === undefined ? "—" : `${burn.toFixed(2)}x`, ""],
    ];
  }), "No SLO declared.", 6);
}

function renderCosts(costs, perHour) {
  const empty = perHour === null ? "No cost configured." : "No output tokens in the cost window yet.";
  fillRows($("costs"), costs.map((c) => [
    [c.model_version, "mono"],
    [c.path ?? "—", ""],
    [String(c.output_tokens), ""],
    [c.per_1k_output_tokens === null ? "—" : c.per_1k_output_tokens.toFixed(4), ""],
  ]), empty, 4);
}

function renderRoutes(routing) {
  const share = (v) => (v === null || v === undefined ? "—" : `${(v * 100).toFixed(2)}%`);
  fillRows($("routes"), (routing?.paths ?? []).map((p) => [
    [p.path, ""],
    [p.version, "mono"],
    [`${p.sla_ms} ms`, ""],
    [`${share(p.attainment["5m"])} / ${share(p.attainment["1h"])}`, ""],
    [p.p99_ms === null ? "—" : `${p.p99_ms.toFixed(1)} ms`, ""],
    [p.threshold_tokens === null ? p.breaker : `${p.breaker} (> ${p.threshold_tokens} tokens shed)`,
      p.breaker === "closed" ? "" : "bad"],
    [p.batch_cap === null ? "—" : String(p.batch_cap), ""],
    [Object.entries(p.requests).map(([r, n]) => `${r}: ${n}`).join(", ") || "—", ""],
  ]), "No SLA routing (routing: in the config).", 8);
}

// ---- charts ------------------------------------------------------------------------------------

function hasData(values) {
  return Array.isArray(values) && values.some((v) => v !== null && Number.isFinite(v));
}

function renderCharts(ts) {
  const t = ts.t ?? [];
  const s = ts.series ?? {};
  const get = (k) => (Array.isArray(s[k]) ? s[k] : t.map(() => null));
  drawLineChart($("chart-latency"), {
    title: "Latency",
    t,
    format: fmt.seconds,
    series: [
      { name: "p50", values: get("latency_p50_s") },
      { name: "p95", values: get("latency_p95_s") },
      { name: "p99", values: get("latency_p99_s") },
      { name: "TTFT p95", values: get("ttft_p95_s") },
    ],
  });
  const gpu = hasData(s.gpu_sm_activity_ratio) || hasData(s.gpu_memory_used_bytes);
  $("no-gpu").hidden = gpu;
  $("chart-gpu-sm").hidden = !gpu;
  $("chart-gpu-mem").hidden = !gpu;
  if (gpu) {
    drawLineChart($("chart-gpu-sm"), {
      title: "GPU SM activity", t, format: fmt.percent, yMax: 1,
      series: [{ name: "SM activity", values: get("gpu_sm_activity_ratio") }],
    });
    drawLineChart($("chart-gpu-mem"), {
      title: "GPU memory used", t, format: fmt.bytes,
      series: [{ name: "memory used", values: get("gpu_memory_used_bytes") }],
    });
  }
  drawLineChart($("chart-rps"), {
    title: "Requests per second", t, format: fmt.rate,
    series: [
      { name: "requests/s", values: get("requests_per_s") },
      { name: "server errors/s", values: get("errors_per_s") },
      { name: "client errors/s (not errors)", values: get("client_errors_per_s") },
      { name: "hung up/s (not errors)", values: get("cancelled_per_s") },
    ],
  });
  drawLineChart($("chart-rss"), {
    title: "Process resident memory", t, format: fmt.bytes,
    series: [{ name: "RSS", values: get("process_rss_bytes") }],
  });
}

// ---- polling -----------------------------------------------------------------------------------

function renderSatisfaction(body) {
  fillRows($("satisfaction"), body.groups.filter((g) => g.metric === "e2e").map((g) => [
    [g.model_version, "mono"],
    [g.path ?? "—", ""],
    [String(g.n), ""],
    [fmt.percent(g.satisfaction), ""],
    [g.worth_sentence ?? "too few rated requests for a curve", ""],
  ]), "No feedback joined to a request yet (POST /api/v1/feedback).", 5);
}

async function refreshSatisfaction() {
  try {
    renderSatisfaction(await getJSON("api/v1/satisfaction"));
  } catch (err) {
    // the fit is a minute's news: the next round tries again
  }
  setTimeout(refreshSatisfaction, SATISFACTION_MS);
}

async function refresh() {
  const span = $("window").value;
  try {
    const [overview, ts] = await Promise.all([getJSON("api/v1/overview"), getJSON(`api/v1/timeseries?window=${span}`)]);
    state.overview = overview;
    state.timeseries = ts;
    renderOverview(overview);
    renderCharts(ts);
    state.failures = 0;
    $("connection").hidden = true;
    $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
  } catch (err) {
    state.failures += 1;
    const banner = $("connection");
    banner.textContent = `Cannot reach the infersight service (${err.message || err}). Showing the last data; retrying.`;
    banner.hidden = false;
  }
  const backoff = Math.min(60000, REFRESH_MS * 2 ** Math.min(state.failures, 4));
  state.timer = setTimeout(refresh, state.failures ? backoff : REFRESH_MS);
}

function restart() {
  clearTimeout(state.timer);
  refresh();
}

// ---- drift explanation --------------------------------------------------------------------------

async function openDrift() {
  const body = $("drift-body");
  const detail = $("drift-detail");
  detail.hidden = false;
  body.textContent = "Loading the report…";
  try {
    let id = state.driftId;
    if (id === null || id === undefined) {
      const list = await getJSON("api/v1/drift");
      id = reportId((list.reports ?? [])[0]);
    }
    if (id === null || id === undefined) throw new Error("no report id");
    renderExplanation(body, await getJSON(`api/v1/drift/${encodeURIComponent(id)}`, true));
    detail.dataset.reportId = String(id);
  } catch (err) {
    if (err.status === 401) {
      body.textContent = "The report quotes users' text: it needs the API token.";
      const refused = sessionStorage.getItem(TOKEN_KEY) !== null;
      sessionStorage.removeItem(TOKEN_KEY);
      askToken("drift", refused ? "The service refused the token (401). Enter it again." : "");
    } else {
      body.textContent = `Could not load the drift report: ${err.message || err}`;
    }
  }
  $("drift-open").setAttribute("aria-expanded", "true");
  $("drift-detail-title").focus();
  detail.scrollIntoView({ behavior: "smooth", block: "start" });
}

function closeDrift() {
  $("drift-detail").hidden = true;
  $("drift-open").setAttribute("aria-expanded", "false");
  $("drift-open").focus();
}

// ---- actions: rollback and snapshot (bearer token) ---------------------------------------------

const ACTIONS = {
  rollback: {
    label: "roll back",
    path: "api/v1/models/rollback",
    explain: () => `Roll back from ${state.overview?.serving_version ?? "the serving version"} to the previous good version.`,
  },
  drift: {
    label: "read the drift report",
    explain: () => "The drift report quotes users' prompts and answers, so reading it needs the API token.",
  },
  snapshot: {
    label: "take a snapshot",
    path: "api/v1/snapshots",
    explain: () => "Record an inference snapshot: recent requests, metrics and the serving version.",
    body: { reason: "taken from the web page" },
  },
};

function showResult(ok, title, detail) {
  const box = $("action-result");
  box.replaceChildren();
  box.className = `toast ${ok ? "toast-ok" : "toast-bad"}`;
  const strong = document.createElement("strong");
  strong.textContent = title;
  const p = document.createElement("p");
  p.textContent = detail;
  const close = document.createElement("button");
  close.type = "button";
  close.className = "btn btn-quiet";
  close.textContent = "Dismiss";
  close.addEventListener("click", () => { box.hidden = true; });
  box.append(strong, p, close);
  box.hidden = false;
}

function describe(body) {
  if (body === null || typeof body !== "object") return String(body ?? "");
  const err = body.error;
  if (err && typeof err === "object" && err.message) return err.field ? `${err.message} (field: ${err.field})` : err.message;
  const detail = body.detail ?? err ?? body.message;
  if (detail !== undefined) return typeof detail === "string" ? detail : JSON.stringify(detail);
  return Object.entries(body)
    .filter(([, v]) => v === null || typeof v !== "object")
    .map(([k, v]) => `${k.replace(/_/g, " ")}: ${v}`)
    .join(" · ");
}

let pending = null;

function askToken(kind, error = "") {
  pending = kind;
  const action = ACTIONS[kind];
  $("token-action").textContent = action.label;
  $("token-explain").textContent = action.explain();
  $("token-input").value = sessionStorage.getItem(TOKEN_KEY) ?? "";
  $("token-error").textContent = error;
  $("token-error").hidden = !error;
  const dialog = $("token-dialog");
  if (!dialog.open) dialog.showModal();
  $("token-input").focus();
}

async function perform(kind, token) {
  const action = ACTIONS[kind];
  const button = $(`${kind}-button`);
  button.disabled = true;
  try {
    const res = await fetch(action.path, {
      method: "POST",
      headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json", Accept: "application/json" },
      body: JSON.stringify(action.body ?? {}),
    });
    let body = null;
    try { body = await res.json(); } catch { body = await res.text().catch(() => ""); }
    if (res.status === 401 || res.status === 403) {
      sessionStorage.removeItem(TOKEN_KEY);
      askToken(kind, `The service refused the token (${res.status}). Enter it again.`);
      return;
    }
    showResult(res.ok, res.ok ? `Done: ${action.label}` : `Failed to ${action.label} (${res.status})`, describe(body));
    if (res.ok) restart();
  } catch (err) {
    showResult(false, `Failed to ${action.label}`, String(err.message || err));
  } finally {
    button.disabled = false;
  }
}

function wire() {
  $("rollback-button").addEventListener("click", () => askToken("rollback"));
  $("snapshot-button").addEventListener("click", () => askToken("snapshot"));
  $("token-cancel").addEventListener("click", () => $("token-dialog").close());
  $("token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const token = $("token-input").value.trim();
    if (!token) {
      $("token-error").textContent = "A token is required.";
      $("token-error").hidden = false;
      return;
    }
    sessionStorage.setItem(TOKEN_KEY, token);
    $("token-dialog").close();
    if (pending === "drift") openDrift();
    else perform(pending, token);
  });
  $("drift-open").addEventListener("click", openDrift);
  $("drift-close").addEventListener("click", closeDrift);
  $("window").addEventListener("change", restart);
  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => state.timeseries && renderCharts(state.timeseries), 150);
  });
}

wire();
refresh();
refreshSatisfaction();
