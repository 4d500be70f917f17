// A small SVG scatter plot of the drift report's 2-D projection: reference, current, novel.

const SVG = "http://www.w3.org/2000/svg";
const HEIGHT = 240;

function el(name, attrs, parent) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  parent.appendChild(node);
  return node;
}

export function drawScatter(container, projection) {
  container.replaceChildren();
  const width = Math.max(container.clientWidth || 0, 260);
  const ref = projection.reference ?? [];
  const cur = projection.current ?? [];
  const novel = projection.current_novel ?? [];
  const all = [...ref, ...cur];
  const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  const [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  const pad = 12;
  const sx = (v) => pad + ((v - x0) / (x1 - x0 || 1)) * (width - 2 * pad);
  const sy = (v) => HEIGHT - pad - ((v - y0) / (y1 - y0 || 1)) * (HEIGHT - 2 * pad);
  const nNovel = novel.filter(Boolean).length;
  const svg = el("svg", { width, height: HEIGHT, viewBox: `0 0 ${width} ${HEIGHT}`, role: "img", class: "scatter-svg",
    "aria-label": `Projection: ${ref.length} reference texts, ${cur.length} current texts of which ${nNovel} novel` }, container);
  const layer = (cls) => el("g", { class: cls }, svg);
  const gr = layer("pts-ref"), gc = layer("pts-cur"), gn = layer("pts-novel");
  for (const p of ref) el("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.5 }, gr);
  cur.forEach((p, i) => el("circle", { cx: sx(p[0]), cy: sy(p[1]), r: novel[i] ? 3.5 : 2.5 }, novel[i] ? gn : gc));
  const legend = document.createElement("ul");
  legend.className = "legend";
  for (const [cls, name] of [["ref", `reference (${ref.length})`], ["cur", `current (${cur.length - nNovel})`], ["novel", `novel (${nNovel})`]]) {
    const li = document.createElement("li");
    const dot = document.createElement("span");
    dot.className = `dot dot-${cls}`;
    const label = document.createElement("span");
    label.textContent = name;
    li.append(dot, label);
    legend.appendChild(li);
  }
  container.appendChild(legend);
}
