// Number, time and size formatting for the page. Pure functions, no DOM.

export function seconds(v) {
  if (v === null || v === undefined || !Number.isFinite(v)) return "—";
  const a = Math.abs(v);
  if (a === 0) return "0 s";
  if (a < 1e-3) return `${(v * 1e6).toFixed(0)} µs`;
  if (a < 1) return `${(v * 1e3).toFixed(a < 0.01 ? 2 : a < 0.1 ? 1 : 0)} ms`;
  if (a < 60) return `${v.toFixed(2)} s`;
  return duration(v);
}

export function duration(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return "—";
  s = Math.max(0, Math.floor(s));
  const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60), sec = s % 60;
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${m}m`;
  if (m) return `${m}m ${sec}s`;
  return `${sec}s`;
}

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];
export function bytes(v) {
  if (v === null || v === undefined || !Number.isFinite(v)) return "—";
  let i = 0;
  let x = Math.abs(v);
  while (x >= 1024 && i < UNITS.length - 1) { x /= 1024; i += 1; }
  const sign = v < 0 ? "-" : "";
  return `${sign}${x.toFixed(x >= 100 || i === 0 ? 0 : 1)} ${UNITS[i]}`;
}

export function percent(v) {
  if (v === null || v === undefined || !Number.isFinite(v)) return "—";
  return `${(v * 100).toFixed(v < 0.1 ? 1 : 0)}%`;
}

export function rate(v) {
  if (v === null || v === undefined || !Number.isFinite(v)) return "—";
  return `${number(v, 3)}/s`;
}

export function number(v, digits = 3) {
  if (v === null || v === undefined || !Number.isFinite(v)) return "—";
  if (v !== 0 && (Math.abs(v) < 1e-3 || Math.abs(v) >= 1e5)) return v.toExponential(2);
  return String(Number(v.toPrecision(digits)));
}

// Accepts epoch seconds, epoch milliseconds or an ISO string.
export function toDate(at) {
  if (at === null || at === undefined || at === "") return null;
  if (typeof at === "number") return new Date(at < 1e11 ? at * 1000 : at);
  const d = new Date(at);
  return Number.isNaN(d.getTime()) ? null : d;
}

export function clock(at) {
  const d = toDate(at);
  return d ? d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }) : "—";
}

export function when(at, now = Date.now()) {
  const d = toDate(at);
  if (!d) return "—";
  const ago = (now - d.getTime()) / 1000;
  const stamp = d.toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit" });
  if (ago < 0) return stamp;
  return `${stamp} (${duration(ago)} ago)`;
}
