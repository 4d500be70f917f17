"""The HTML drift report: one self-contained page (inline CSS and SVG, no external assets) of a
`DriftReport` (_report.py): the verdict, every test, each field's explanation, relevance and
request lengths. Drawings are inline SVG: a scatter of the two windows and paired share bars.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from ._explain import FieldExplanation
from ._lengths import LengthDrift
from ._report import DriftReport, TestResult
from ._stat_tests import RelevanceSummary

__all__ = ["render_html", "scatter_svg", "share_bars_svg"]


REFERENCE_COLOUR = "#4c72b0"
CURRENT_COLOUR = "#dd8452"
NOVEL_COLOUR = "#c44e52"


def scatter_svg(
    reference: Sequence[tuple[float, float]],
    current: Sequence[tuple[float, float]],
    novel: Sequence[bool],
    *,
    width: int = 560,
    height: int = 420,
) -> str:
    pts = list(reference) + list(current)
    if not pts:
        return ""
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    pad = 16
    sx = (width - 2 * pad) / ((x1 - x0) or 1.0)
    sy = (height - 2 * pad) / ((y1 - y0) or 1.0)

    def xy(p: tuple[float, float]) -> tuple[float, float]:
        return pad + (p[0] - x0) * sx, height - pad - (p[1] - y0) * sy

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        'role="img" aria-label="2-D projection of both windows">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fafafa" stroke="#ddd"/>',
    ]
    for p in reference:
        x, y = xy(p)
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.6" fill="{REFERENCE_COLOUR}" fill-opacity="0.45"/>'
        )
    for p, is_novel in zip(current, novel, strict=False):
        x, y = xy(p)
        colour, r = (NOVEL_COLOUR, 4.0) if is_novel else (CURRENT_COLOUR, 2.8)
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{colour}" fill-opacity="0.8"/>')
    parts.append("</svg>")
    return "".join(parts)


def share_bars_svg(rows: Sequence[tuple[str, float, float, bool]], *, width: int = 760) -> str:
    """One row per (label, reference share, current share, significant)."""
    if not rows:
        return ""
    row_h, label_w, pad = 34, 360, 8
    bar_w = width - label_w - 2 * pad - 60
    top = max(max(r[1], r[2]) for r in rows) or 1.0
    height = row_h * len(rows) + pad
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        'role="img" aria-label="cluster shares, reference and current">'
    ]
    for i, (label, ref, cur, significant) in enumerate(rows):
        y = pad + i * row_h
        shown = label if len(label) <= 46 else label[:45] + "…"
        weight = "bold" if significant else "normal"
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 17}" text-anchor="end" font-size="12" font-weight="{weight}">'
            f"{escape(shown)}{' *' if significant else ''}</text>"
        )
        for j, (value, colour) in enumerate(((ref, REFERENCE_COLOUR), (cur, CURRENT_COLOUR))):
            w = bar_w * value / top
            yy = y + 3 + j * 13
            parts.append(f'<rect x="{label_w}" y="{yy}" width="{w:.1f}" height="11" fill="{colour}"/>')
            parts.append(
                f'<text x="{label_w + w + 4:.1f}" y="{yy + 10}" font-size="10">{100 * value:.1f}%</text>'
            )
    parts.append("</svg>")
    return "".join(parts)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1000px;color:#222;padding:0 1rem}
h1{margin-bottom:.2rem}h2{margin-top:2.2rem;border-bottom:1px solid #ddd;padding-bottom:.3rem}
.verdict{padding:1rem 1.2rem;border-radius:8px;font-size:1.25rem;margin:1rem 0}
.drift{background:#fde8e8;border:1px solid #c44e52}.nodrift{background:#e6f4ea;border:1px solid #3a923a}
table{border-collapse:collapse;width:100%;font-size:.9rem}td,th{border-bottom:1px solid #eee;padding:.35rem .5rem;text-align:left;vertical-align:top}
.num{text-align:right;font-variant-numeric:tabular-nums}.muted{color:#666;font-size:.85rem}
.key span{display:inline-block;width:.8rem;height:.8rem;border-radius:50%;margin:0 .3rem 0 1rem;vertical-align:middle}
ul.examples li{margin:.25rem 0}.yes{color:#c44e52;font-weight:bold}
"""


def _num(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "–"
    if value != 0 and (abs(value) < 10 ** -(digits - 1) or abs(value) >= 1e5):
        return f"{value:.{digits - 1}e}"
    return f"{value:.{digits}f}"


def render_html(report: DriftReport, *, title: str = "infersight drift report") -> str:
    c = report.context
    verdict = "Drift detected" if report.drifted else "No drift detected"
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        f"<p class='muted'>{escape(c.created_at)}"
        + (f" · model version {escape(c.model_version)}" if c.model_version else "")
        + (f" · reference {escape(c.reference_name)} v{c.reference_version}" if c.reference_name else "")
        + (f" · embeddings: {escape(c.embedder)}" if c.embedder else "")
        + "</p>",
        f"<div class='verdict {'drift' if report.drifted else 'nodrift'}'><strong>{verdict}</strong> — "
        f"p = {_num(report.p_value)} (Holm-adjusted, α = {report.threshold:g}), effect {_num(report.score)} "
        f"by {escape(report.method)}; {report.n_reference} reference vs {report.n_current} current texts.</div>",
        _detectable(report.detectable_share),
        "<h2>Tests</h2>",
        _tests_table(report.tests),
        f"<p class='muted'>Drift is declared for a test when its Holm-adjusted p-value (over all "
        f"{len(report.tests)} tests, {escape(report.correction)}) is below α and its effect size is at least "
        "the floor.</p>",
    ]
    for expl in report.explanations:
        parts.append(_field_section(expl))
    if report.relevance is not None:
        parts.append("<h2>Prompt-response relevance</h2>")
        parts.append(_relevance_table(report.relevance.reference, report.relevance.current))
    if report.lengths is not None:
        parts.append(_lengths_section(report.lengths))
    parts.append("</body></html>")
    return "\n".join(parts)


def _detectable(share: float | None) -> str:
    if share is None:
        return ""
    return (
        f"<p>This window detects, with 90% power, a new topic at <strong>{100 * share:.1f}%</strong> of its "
        "texts or more (texts farther from the reference than its own texts are from one another); a quiet verdict "
        "rules out such a topic at that share, not a smaller one.</p>"
    )


def _tests_table(tests: tuple[TestResult, ...]) -> str:
    rows = [
        "<table><tr><th>field</th><th>test</th><th>method</th><th class='num'>effect</th>"
        "<th class='num'>floor</th><th class='num'>p</th><th class='num'>p (Holm)</th><th>drift</th></tr>"
    ]
    for t in tests:
        rows.append(
            f"<tr><td>{escape(t.field)}</td><td>{escape(t.test)}</td><td>{escape(t.method)}</td>"
            f"<td class='num'>{_num(t.score)}</td><td class='num'>{_num(t.effect_floor)}</td>"
            f"<td class='num'>{_num(t.p_value)}</td><td class='num'>{_num(t.p_adjusted)}</td>"
            f"<td>{'<span class=yes>yes</span>' if t.drifted else 'no'}</td></tr>"
        )
    rows.append("</table>")
    return "".join(rows)


def _field_section(e: FieldExplanation) -> str:
    p = e.projection
    n = e.novelty
    out = [
        f"<h2>{escape(e.field.capitalize())}s</h2>",
        "<h3>Both windows in two dimensions</h3>",
        f"<p class='key muted'>PCA of the reference ({100 * sum(p.explained_variance):.0f}% of its variance)"
        f"<span style='background:{REFERENCE_COLOUR}'></span>reference<span style='background:{CURRENT_COLOUR}'>"
        f"</span>current<span style='background:{NOVEL_COLOUR}'></span>current, new</p>",
        scatter_svg(p.reference, p.current, p.current_novel),
        "<h3>What appeared</h3>",
        f"<p>Novelty rate: <strong>{100 * n.rate:.1f}%</strong> of current texts are farther from every "
        f"reference text than the reference's own {100 * (1 - n.quantile):.0f}% tail "
        f"(distance {n.tail_distance:.3f}); the reference itself: {100 * n.reference_rate:.1f}%.</p>",
        _list(
            [
                f"{escape(x.text)} <span class='muted'>(distance {x.distance:.3f}; nearest reference: "
                f"“{escape(x.nearest_reference)}”)</span>"
                for x in n.examples
            ]
        ),
        "<p>Current texts most typical of the current window and not of the reference (highest witness):</p>",
        _list([f"{escape(x.text)} <span class='muted'>({x.value:+.4f})</span>" for x in e.appeared]),
        "<h3>What disappeared</h3>",
        "<p>Reference texts most under-represented now (lowest witness):</p>",
        _list([f"{escape(x.text)} <span class='muted'>({x.value:+.4f})</span>" for x in e.disappeared]),
        "<h3>Reference clusters, share in each window</h3>",
        "<p class='muted'>Bold with * : the share changed significantly (Fisher's exact test, Holm across "
        "clusters). The first row collects current texts beyond the novelty tail.</p>",
        share_bars_svg([(s.label, s.reference_share, s.current_share, s.significant) for s in e.clusters]),
        "<table><tr><th>cluster</th><th class='num'>reference</th><th class='num'>current</th>"
        "<th class='num'>p (Holm)</th><th>current examples</th></tr>",
    ]
    for s in e.clusters:
        out.append(
            f"<tr><td>{escape(s.label)}</td><td class='num'>{100 * s.reference_share:.1f}%</td>"
            f"<td class='num'>{100 * s.current_share:.1f}%</td><td class='num'>{_num(s.p_adjusted)}</td>"
            f"<td>{'<br>'.join(escape(t) for t in s.current_examples)}</td></tr>"
        )
    out.append("</table>")
    return "\n".join(out)


def _list(items: list[str]) -> str:
    if not items:
        return "<p class='muted'>none</p>"
    return "<ul class='examples'>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>"


def _relevance_table(ref: RelevanceSummary, cur: RelevanceSummary) -> str:
    rows = [
        "<table><tr><th></th><th class='num'>n</th><th class='num'>mean</th><th class='num'>p05</th>"
        "<th class='num'>median</th><th class='num'>p95</th></tr>"
    ]
    for name, s in (("reference", ref), ("current", cur)):
        rows.append(
            f"<tr><td>{name}</td><td class='num'>{s.n}</td><td class='num'>{_num(s.mean, 3)}</td>"
            f"<td class='num'>{_num(s.p05, 3)}</td><td class='num'>{_num(s.p50, 3)}</td>"
            f"<td class='num'>{_num(s.p95, 3)}</td></tr>"
        )
    rows.append("</table>")
    return "".join(rows)


def _lengths_section(r: LengthDrift) -> str:
    verdict = "Length drift detected" if r.drifted else "No length drift detected"
    out = [
        "<h2>Request lengths</h2>",
        f"<div class='verdict {'drift' if r.drifted else 'nodrift'}'><strong>{verdict}</strong> — "
        f"p = {_num(r.p_value)} ({escape(r.correction)}, α = {r.alpha:g})"
        + (f", decided by {escape(r.decided_by)}" if r.decided_by else "")
        + f"; lengths in {escape(r.counted_by)}. This verdict is separate from the one above.</div>",
        "<table><tr><th>field</th><th>window</th><th class='num'>n</th><th class='num'>mean</th>"
        "<th class='num'>median</th><th class='num'>p95</th><th class='num'>max</th></tr>",
    ]
    for s in r.summaries:
        out.append(
            f"<tr><td>{escape(s.field)}</td><td>{escape(s.window)}</td><td class='num'>{s.n}</td>"
            f"<td class='num'>{_num(s.mean, 1)}</td><td class='num'>{_num(s.p50, 1)}</td>"
            f"<td class='num'>{_num(s.p95, 1)}</td><td class='num'>{'–' if s.max is None else s.max}</td></tr>"
        )
    out.append(
        "</table><table><tr><th>field</th><th>test</th><th class='num'>statistic</th><th class='num'>effect</th>"
        "<th class='num'>p</th><th class='num'>p (Holm)</th><th>drift</th></tr>"
    )
    for t in r.tests:
        what = (
            f"{t.statistic:.0f} longer than {t.tail_tokens} (null share {_num(t.null_share, 3)})"
            if t.test == "length_tail"
            else f"KS {t.statistic:.3f}"
        )
        out.append(
            f"<tr><td>{escape(t.field)}</td><td>{escape(t.test)}</td><td class='num'>{escape(what)}</td>"
            f"<td class='num'>{_num(t.score)}</td><td class='num'>{_num(t.p_value)}</td>"
            f"<td class='num'>{_num(t.p_adjusted)}</td>"
            f"<td>{'<span class=yes>yes</span>' if t.drifted else 'no'}</td></tr>"
        )
    out.append("</table>")
    out.append(
        f"<p class='muted'>length_tail counts current requests longer than the reference's {100 * (1 - r.tail):g}th "
        f"percentile against a share bounded for {100 * r.confidence:g}% of references; length_ks is the "
        "Kolmogorov-Smirnov distance beyond the reference's own DKW band.</p>"
    )
    out.extend(f"<p class='muted'>{escape(n)}</p>" for n in r.notes)
    return "\n".join(out)
