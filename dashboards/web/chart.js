// A small SVG line chart: time on x, one or more series on y, gaps where values are null.

const SVG = "http://www.w3.org/2000/svg";
const PALETTE = ["#2563eb", "#d97706", "#dc2626", "#059669", "#7c3aed", "#0891b2"];
const HEIGHT = 170;
const M = { left: 58, right: 12, top: 10, bottom: 24 };

function el(name, attrs = {}, parent = null) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (parent) parent.appendChild(node);
  return node;
}

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function lastValue(values) {
  for (let i = values.length - 1; i >= 0; i -= 1) if (values[i] !== null && Number.isFinite(values[i])) return values[i];
  return null;
}

// spec: {title, t: [epoch s], series: [{name, values}], format: v => string, yMax?: number, empty?: string}
export function drawLineChart(container, spec) {
  container.replaceChildren();
  const width = Math.max(container.clientWidth || 0, 260);
  const t = spec.t || [];
  const series = (spec.series || []).map((s, i) => ({ ...s, color: s.color || PALETTE[i % PALETTE.length] }));
  const finite = series.flatMap((s) => s.values.filter((v) => v !== null && Number.isFinite(v)));
  const svg = el("svg", { width, height: HEIGHT, viewBox: `0 0 ${width} ${HEIGHT}`, role: "img", class: "chart-svg" });
  const summary = series.map((s) => `${s.name} ${spec.format(lastValue(s.values))}`).join(", ");
  svg.setAttribute("aria-label", `${spec.title}: ${finite.length ? `latest ${summary}` : "no data"}`);
  el("title", {}, svg).textContent = spec.title;
  container.appendChild(svg);

  const plotW = width - M.left - M.right;
  const plotH = HEIGHT - M.top - M.bottom;
  const yMax = spec.yMax ?? niceMax(Math.max(...finite, 0) * 1.05);
  const t0 = t.length ? t[0] : 0;
  const t1 = t.length > 1 ? t[t.length - 1] : t0 + 1;
  const x = (ti) => M.left + ((ti - t0) / (t1 - t0 || 1)) * plotW;
  const y = (v) => M.top + plotH - (Math.min(v, yMax) / yMax) * plotH;

  const axes = el("g", { class: "axes" }, svg);
  for (let i = 0; i <= 4; i += 1) {
    const v = (yMax * i) / 4;
    el("line", { x1: M.left, x2: width - M.right, y1: y(v), y2: y(v), class: "gridline" }, axes);
    const label = el("text", { x: M.left - 6, y: y(v) + 4, "text-anchor": "end", class: "tick" }, axes);
    label.textContent = spec.format(v);
  }
  if (t.length > 1) {
    const ticks = Math.min(5, Math.max(2, Math.floor(plotW / 110)));
    for (let i = 0; i <= ticks; i += 1) {
      const ti = t0 + ((t1 - t0) * i) / ticks;
      const anchor = i === 0 ? "start" : i === ticks ? "end" : "middle";
      const label = el("text", { x: x(ti), y: HEIGHT - 6, "text-anchor": anchor, class: "tick" }, axes);
      const opts = t1 - t0 < 600 ? { hour: "2-digit", minute: "2-digit", second: "2-digit" } : { hour: "2-digit", minute: "2-digit" };
      label.textContent = new Date(ti * 1000).toLocaleTimeString([], opts);
    }
  }

  if (!finite.length) {
    const msg = el("text", { x: M.left + plotW / 2, y: M.top + plotH / 2, "text-anchor": "middle", class: "no-data" }, svg);
    msg.textContent = spec.empty || "No data in this window";
  }

  for (const s of series) {
    let d = "";
    let points = 0;
    let pen = false;
    s.values.forEach((v, i) => {
      if (v === null || !Number.isFinite(v) || i >= t.length) { pen = false; return; }
      d += `${pen ? "L" : "M"}${x(t[i]).toFixed(1)},${y(v).toFixed(1)} `;
      pen = true;
      points += 1;
    });
    if (!points) continue;
    el("path", { d: d.trim(), class: "series", stroke: s.color, "data-series": s.name, "data-points": points }, svg);
    s.values.forEach((v, i) => {  // isolated points would be invisible as a path: mark them
      const prev = s.values[i - 1], next = s.values[i + 1];
      if (v !== null && Number.isFinite(v) && (prev == null) && (next == null)) {
        el("circle", { cx: x(t[i]), cy: y(v), r: 2.5, fill: s.color }, svg);
      }
    });
  }

  const legend = document.createElement("ul");
  legend.className = "legend";
  for (const s of series) {
    const li = document.createElement("li");
    const sw = document.createElement("span");
    sw.className = "swatch";
    sw.style.background = s.color;
    const name = document.createElement("span");
    name.textContent = s.name;
    const value = document.createElement("strong");
    value.textContent = spec.format(lastValue(s.values));
    li.append(sw, name, value);
    legend.appendChild(li);
  }
  container.appendChild(legend);
  if (t.length > 1 && finite.length) addHover(container, svg, { t, series, x, format: spec.format, top: M.top, bottom: M.top + plotH });
}

function addHover(container, svg, ctx) {
  const cursor = el("line", { y1: ctx.top, y2: ctx.bottom, class: "cursor", visibility: "hidden" }, svg);
  const tip = document.createElement("div");
  tip.className = "tip";
  tip.hidden = true;
  container.appendChild(tip);
  svg.addEventListener("mousemove", (ev) => {
    const box = svg.getBoundingClientRect();
    const px = ev.clientX - box.left;
    let best = 0;
    for (let i = 1; i < ctx.t.length; i += 1) if (Math.abs(ctx.x(ctx.t[i]) - px) < Math.abs(ctx.x(ctx.t[best]) - px)) best = i;
    const cx = ctx.x(ctx.t[best]);
    cursor.setAttribute("x1", cx);
    cursor.setAttribute("x2", cx);
    cursor.setAttribute("visibility", "visible");
    tip.replaceChildren();
    const head = document.createElement("div");
    head.textContent = new Date(ctx.t[best] * 1000).toLocaleTimeString();
    tip.appendChild(head);
    for (const s of ctx.series) {
      const row = document.createElement("div");
      row.textContent = `${s.name}: ${ctx.format(s.values[best] ?? null)}`;
      tip.appendChild(row);
    }
    tip.hidden = false;
    tip.style.left = `${Math.min(cx + 10, box.width - 150)}px`;
  });
  svg.addEventListener("mouseleave", () => { cursor.setAttribute("visibility", "hidden"); tip.hidden = true; });
}
