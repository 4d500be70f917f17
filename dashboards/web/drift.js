// Renders a drift report (DriftReport.to_json(), schema infersight.drift.report/1) and its
// summary. Every text from a report goes through textContent, never innerHTML: prompts are
// user input.

import { drawScatter } from "./scatter.js";
import { number, percent, when } from "./format.js";

export function h(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined && c !== false) node.append(c);
  return node;
}

export const reportId = (summary) => summary?.id ?? summary?.report_id ?? null;
const drifted = (r) => (typeof r?.drift === "boolean" ? r.drift : typeof r?.drifted === "boolean" ? r.drifted : null);
const FIELD_NAMES = { prompt: "Prompts", response: "Responses", relevance: "Relevance" };

function badge(value, yes = "Drift detected", no = "No drift") {
  if (value === true) return h("span", { class: "pill pill-bad", text: yes });
  if (value === false) return h("span", { class: "pill pill-ok", text: no });
  return h("span", { class: "pill pill-unknown", text: "Unknown" });
}

function facts(r) {
  const span = r.window && (r.window.since || r.window.until) ? `${when(r.window.since)} → ${when(r.window.until)}` : null;
  const ref = r.reference ? `${r.reference.name}${r.reference.version != null ? ` v${r.reference.version}` : ""}` : null;
  const rows = [
    ["Evaluated", when(r.created_at)],
    ["Model version", r.model_version],
    ["Reference", ref],
    ["Current window", span],
    ["p-value (adjusted)", number(r.p_value)],
    ["Alpha", number(r.threshold ?? r.alpha)],
    ["Effect size", number(r.score)],
    ["Deciding test", r.method],
    ["Correction", r.correction],
    ["Texts", r.n_reference != null ? `${r.n_reference} reference / ${r.n_current} current` : null],
    // what a quiet verdict rules out: reports stored before this field have none
    ["Smallest detectable new topic", r.detectable_share != null ? `${percent(r.detectable_share)} of the window (90% power)` : null],
  ];
  const dl = h("dl", { class: "kv" });
  for (const [k, v] of rows) if (v != null && v !== "—") dl.append(h("div", {}, h("dt", { text: k }), h("dd", { text: String(v) })));
  return dl;
}

function table(caption, headers, rows) {
  const t = h("table", {}, h("caption", { class: "visually-hidden", text: caption }));
  t.append(h("thead", {}, h("tr", {}, ...headers.map((x) => h("th", { scope: "col", text: x })))));
  const body = h("tbody");
  for (const cells of rows) body.append(h("tr", {}, ...cells.map((c) => (c instanceof Node ? h("td", {}, c) : h("td", { text: String(c ?? "—") })))));
  t.append(body);
  return h("div", { class: "table-wrap" }, t);
}

function verdictCell(v) {
  return h("span", { class: v ? "bad" : "", text: v === true ? "drift" : v === false ? "no drift" : "—" });
}

function fieldTable(fields) {
  return table(
    "Verdict per field",
    ["Field", "Verdict", "p (adjusted)", "Effect", "Novelty rate", "Detectable share"],
    fields.map((f) => [FIELD_NAMES[f.field] ?? f.field, verdictCell(f.drifted), number(f.p_value), number(f.score), percent(f.novelty_rate), percent(f.detectable_share)]),
  );
}

export function renderSummary(container, summary) {
  container.replaceChildren();
  if (!summary) {
    container.append(h("p", { class: "empty", text: "No drift report yet." }));
    return;
  }
  container.append(h("p", { class: "verdict" }, badge(drifted(summary))), facts(summary));
  if (Array.isArray(summary.fields) && summary.fields.length) container.append(fieldTable(summary.fields));
}

// ---- the explanation of one field -------------------------------------------------------------

function texts(items, label, valueOf, extra = null) {
  const list = h("ol", { class: "examples", "aria-label": label });
  for (const item of items.slice(0, 12)) {
    const text = typeof item === "string" ? item : item.text;
    const v = typeof item === "string" ? undefined : valueOf(item);
    list.append(h("li", {}, h("q", { text }), v !== undefined ? h("span", { class: "muted", text: ` ${v}` }) : null, extra ? extra(item) : null));
  }
  return list;
}

function shareBar(value, cls) {
  const bar = h("span", { class: `bar ${cls}` });
  bar.style.width = `${Math.max(0, Math.min(1, value ?? 0)) * 100}%`;
  return h("div", { class: "share" }, h("span", { class: "track" }, bar), h("span", { class: "share-num", text: percent(value) }));
}

function clusterTable(clusters) {
  return table(
    "Reference clusters and their share in each window",
    ["Cluster", "Reference", "Current", "Change", "p (Holm)"],
    clusters.map((c) => {
      const cell = h("div", {}, h("strong", { text: c.cluster === -1 ? "New" : `#${c.cluster}` }), h("span", { class: "cluster-label", text: ` ${c.label}` }));
      const ex = (c.current_examples?.length ? c.current_examples : c.reference_examples) ?? [];
      for (const e of ex.slice(0, 3)) cell.append(h("q", { class: "ex", text: e }));
      const change = h("span", { class: c.significant ? "bad" : "", text: `${c.change >= 0 ? "+" : ""}${(c.change * 100).toFixed(1)} pt` });
      const p = h("span", { class: c.significant ? "bad" : "", text: `${number(c.p_adjusted)}${c.significant ? " significant" : ""}` });
      return [cell, shareBar(c.reference_share, "ref"), shareBar(c.current_share, "cur"), change, p];
    }),
  );
}

function section(title, ...content) {
  return h("section", { class: "explain" }, h("h4", { text: title }), ...content);
}

function fieldExplanation(e) {
  const name = FIELD_NAMES[e.field] ?? e.field;
  const box = h("section", { class: "field-explain", "aria-label": `${name}: explanation` }, h("h3", { text: name }));
  const witness = (x) => `witness ${number(x.value)}`;
  const cols = h("div", { class: "two-col" });
  if (e.appeared?.length) cols.append(section("Appeared: current texts most unlike the reference", texts(e.appeared, "Appeared", witness)));
  if (e.disappeared?.length) cols.append(section("Disappeared: reference texts the current window lacks", texts(e.disappeared, "Disappeared", witness)));
  box.append(cols);
  if (e.clusters?.length) box.append(section("Clusters of the reference: share in each window (largest increase first)", clusterTable(e.clusters)));
  const n = e.novelty;
  if (n) {
    const head = h("p", { text: `${percent(n.rate)} of current texts (${n.count}) are farther from every reference text than the reference's own ${percent(1 - n.quantile)} tail (held-out reference: ${percent(n.reference_rate)}).` });
    const nearest = (x) => h("span", { class: "nearest", text: `nearest reference: “${x.nearest_reference}”` });
    box.append(section("Novelty", head, n.examples?.length ? texts(n.examples, "Novel texts", (x) => `distance ${number(x.distance)}`, nearest) : null));
  }
  if (e.projection?.reference?.length) {
    const plot = h("div", { class: "scatter" });
    box.append(section(`Both windows in 2-D (${e.projection.method})`, plot));
    requestAnimationFrame(() => drawScatter(plot, e.projection));
  }
  if (e.typical?.length) {
    const more = h("details", {}, h("summary", { text: "Typical current texts (lowest witness)" }), texts(e.typical, "Typical", witness));
    box.append(more);
  }
  return box;
}

function relevanceSection(rel) {
  const row = (name, s) => [name, s.n, number(s.mean), number(s.p05), number(s.p50), number(s.p95)];
  return section("Prompt–response relevance (cosine)",
    table("Relevance in each window", ["Window", "Requests", "Mean", "p5", "Median", "p95"],
      [row("Reference", rel.reference), row("Current", rel.current)]));
}

export function renderExplanation(container, report) {
  container.replaceChildren();
  container.append(h("p", { class: "verdict" }, badge(drifted(report))), facts(report));
  if (Array.isArray(report.fields) && report.fields.length) container.append(section("Verdict per field", fieldTable(report.fields)));
  if (Array.isArray(report.tests) && report.tests.length) {
    container.append(section("Tests (Holm-corrected together)", table("Tests", ["Field", "Test", "Method", "Effect (floor)", "p", "p (Holm)", "Verdict"],
      report.tests.map((t) => [FIELD_NAMES[t.field] ?? t.field, t.test, t.method, `${number(t.score)} (${number(t.effect_floor)})`, number(t.p_value), number(t.p_adjusted), verdictCell(t.drifted)]))));
  }
  const explanations = Object.values(report.explanation ?? {}).filter((e) => e && typeof e === "object");
  for (const e of explanations) container.append(fieldExplanation(e));
  if (report.relevance?.reference && report.relevance?.current) container.append(relevanceSection(report.relevance));
  if (!explanations.length) container.append(h("p", { class: "empty", text: "This report carries no explanation." }));
}
