// Renders a drift report summary and its explanation (DriftReport.to_json()) with DOM nodes only:
// every text from the report goes through textContent, never innerHTML (prompts are user input).

import { number, percent, when } from "./format.js";

function h(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

const first = (obj, ...keys) => {
  for (const k of keys) if (obj && obj[k] !== undefined && obj[k] !== null) return obj[k];
  return undefined;
};

export function reportId(summary) {
  return first(summary, "id", "report_id");
}

export function verdict(report) {
  const v = first(report, "drift", "drifted", "detected");
  if (typeof v === "boolean") return v;
  const nested = report && typeof report.verdict === "object" ? verdict(report.verdict) : undefined;
  if (typeof nested === "boolean") return nested;
  if (typeof report?.verdict === "string") return /drift/i.test(report.verdict) && !/no/i.test(report.verdict);
  return undefined;
}

function badge(drifted) {
  if (drifted === true) return h("span", { class: "pill pill-bad", text: "Drift detected" });
  if (drifted === false) return h("span", { class: "pill pill-ok", text: "No drift" });
  return h("span", { class: "pill pill-unknown", text: "Unknown" });
}

function facts(report) {
  const rows = [
    ["When", when(first(report, "created_at", "at", "finished_at", "evaluated_at"))],
    ["Field", first(report, "field")],
    ["Model version", first(report, "model_version")],
    ["p-value", number(first(report, "p_value"))],
    ["Effect size", number(first(report, "score", "effect_size"))],
    ["Threshold", number(first(report, "threshold", "alpha"))],
    ["Method", first(report, "method")],
    ["Windows", report.n_reference !== undefined ? `${report.n_reference} reference / ${report.n_current ?? "?"} current` : undefined],
  ];
  const dl = h("dl", { class: "kv" });
  for (const [k, v] of rows) {
    if (v === undefined || v === null || v === "—") continue;
    dl.append(h("div", {}, h("dt", { text: k }), h("dd", { text: String(v) })));
  }
  return dl;
}

export function renderSummary(container, summary) {
  container.replaceChildren();
  if (!summary) {
    container.append(h("p", { class: "empty", text: "No drift report yet." }));
    return;
  }
  container.append(h("p", { class: "verdict" }, badge(verdict(summary))), facts(summary));
}

// ---- explanation -----------------------------------------------------------------------------------

const textOf = (item) =>
  typeof item === "string" ? item : first(item, "text", "prompt", "example", "utterance", "response") ?? JSON.stringify(item);
const scoreOf = (item) => (typeof item === "object" ? first(item, "witness", "value", "score", "distance") : undefined);

function examples(items, label) {
  const list = h("ol", { class: "examples", "aria-label": label });
  for (const item of items.slice(0, 20)) {
    const s = scoreOf(item);
    list.append(h("li", {}, h("q", { text: textOf(item) }), s !== undefined ? h("span", { class: "muted", text: ` ${number(s)}` }) : null));
  }
  return list;
}

function witnessTitle(key) {
  if (/top|high|max|appear|over|gain/i.test(key)) return "Appeared: current texts most unlike the reference (highest witness)";
  if (/bottom|low|min|disappear|under|loss/i.test(key)) return "Disappeared: current texts most like what the reference had more of (lowest witness)";
  return humanize(key);
}

function shareBar(value, cls) {
  const v = typeof value === "number" ? value : null;
  const wrap = h("div", { class: "share" });
  const bar = h("span", { class: `bar ${cls}` });
  bar.style.width = `${Math.max(0, Math.min(1, v ?? 0)) * 100}%`;
  wrap.append(bar, h("span", { class: "share-num", text: percent(v) }));
  return wrap;
}

function clusterTable(clusters) {
  const table = h("table", { class: "clusters" });
  table.append(h("caption", { class: "visually-hidden", text: "Reference clusters and their share in each window" }));
  table.append(h("thead", {}, h("tr", {},
    h("th", { scope: "col", text: "Cluster (example texts)" }),
    h("th", { scope: "col", text: "Reference" }),
    h("th", { scope: "col", text: "Current" }),
    h("th", { scope: "col", text: "Significance" }))));
  const body = h("tbody");
  for (const c of clusters) {
    const ex = first(c, "examples", "texts", "example_texts") ?? [];
    const label = first(c, "label", "name", "id", "cluster");
    const cell = h("td", {}, label !== undefined ? h("strong", { text: `#${label} ` }) : null);
    for (const e of (Array.isArray(ex) ? ex : [ex]).slice(0, 3)) cell.append(h("q", { class: "ex", text: textOf(e) }));
    const p = first(c, "p_value", "adjusted_p_value", "q_value");
    const sig = first(c, "significant", "drifted");
    const sigText = `${sig === true ? "significant" : sig === false ? "not significant" : ""}${p !== undefined ? ` (p ${number(p)})` : ""}`.trim();
    body.append(h("tr", {}, cell,
      h("td", {}, shareBar(first(c, "reference_share", "share_reference", "ref_share"), "ref")),
      h("td", {}, shareBar(first(c, "current_share", "share_current", "cur_share"), "cur")),
      h("td", { class: sig === true ? "bad" : "", text: sigText || "—" })));
  }
  table.append(body);
  return h("div", { class: "table-wrap" }, table);
}

function humanize(key) {
  const s = key.replace(/_/g, " ");
  return s.charAt(0).toUpperCase() + s.slice(1);
}

function generic(value, depth = 0) {
  if (value === null || value === undefined) return h("span", { class: "muted", text: "—" });
  if (typeof value === "number") return h("span", { text: number(value) });
  if (typeof value !== "object") return h("span", { text: String(value) });
  if (Array.isArray(value)) {
    if (value.every((v) => typeof v !== "object" || v === null || textOf(v) !== JSON.stringify(v))) return examples(value, "examples");
    return h("pre", { class: "json", text: JSON.stringify(value, null, 2).slice(0, 4000) });
  }
  if (depth > 2) return h("pre", { class: "json", text: JSON.stringify(value, null, 2).slice(0, 4000) });
  const dl = h("dl", { class: "kv" });
  for (const [k, v] of Object.entries(value)) dl.append(h("div", {}, h("dt", { text: humanize(k) }), h("dd", {}, generic(v, depth + 1))));
  return dl;
}

function section(title, ...content) {
  return h("section", { class: "explain" }, h("h3", { text: title }), ...content);
}

function testsTable(tests) {
  const table = h("table", {});
  table.append(h("thead", {}, h("tr", {}, ...["Test", "Field", "p-value", "Statistic", "Verdict"].map((t) => h("th", { scope: "col", text: t })))));
  const body = h("tbody");
  for (const t of tests) {
    const v = verdict(t);
    body.append(h("tr", {},
      h("td", { text: String(first(t, "name", "test", "method") ?? "—") }),
      h("td", { text: String(first(t, "field") ?? "—") }),
      h("td", { text: number(first(t, "p_value")) }),
      h("td", { text: number(first(t, "score", "statistic", "effect_size")) }),
      h("td", { class: v ? "bad" : "", text: v === true ? "drift" : v === false ? "no drift" : "—" })));
  }
  table.append(body);
  return h("div", { class: "table-wrap" }, table);
}

export function renderExplanation(container, report) {
  container.replaceChildren();
  container.append(h("p", { class: "verdict" }, badge(verdict(report))), facts(report));
  const tests = first(report, "tests", "results");
  if (Array.isArray(tests) && tests.length) container.append(section("Tests", testsTable(tests)));
  const explanation = first(report, "explanation", "explain") ?? {};
  const seen = new Set();
  const entries = Object.entries(explanation);
  for (const [k, v] of entries) {
    if (/witness/i.test(k) && Array.isArray(v)) {
      container.append(section(witnessTitle(k), examples(v, witnessTitle(k))));
      seen.add(k);
    } else if (/witness/i.test(k) && v && typeof v === "object") {
      for (const [sub, items] of Object.entries(v)) if (Array.isArray(items)) container.append(section(witnessTitle(sub), examples(items, witnessTitle(sub))));
      seen.add(k);
    }
  }
  for (const [k, v] of entries) {
    if (/cluster/i.test(k) && Array.isArray(v)) {
      container.append(section("Clusters of the reference: share in each window", clusterTable(v)));
      seen.add(k);
    }
  }
  const novelty = entries.filter(([k]) => /novel/i.test(k));
  if (novelty.length) {
    const parts = [];
    for (const [k, v] of novelty) {
      seen.add(k);
      if (typeof v === "number") parts.push(h("p", { text: `${humanize(k)}: ${percent(v)}` }));
      else if (Array.isArray(v)) parts.push(examples(v, "Novel texts"));
      else if (v && typeof v === "object") {
        const r = first(v, "rate", "novelty_rate");
        if (r !== undefined) parts.push(h("p", { text: `Novelty rate: ${percent(r)}` }));
        const ex = first(v, "examples", "texts");
        if (Array.isArray(ex)) parts.push(examples(ex, "Novel texts"));
      }
    }
    container.append(section("Novelty: texts farther from every reference text than the reference's own tail", ...parts));
  }
  const rest = entries.filter(([k]) => !seen.has(k));
  if (rest.length) container.append(section("More", generic(Object.fromEntries(rest))));
  if (!entries.length) container.append(h("p", { class: "empty", text: "This report carries no explanation." }));
}
