"""The HTML report: one self-contained page (inline CSS and SVG, no external assets)."""

from __future__ import annotations

from html import escape

from ._explanation import FieldExplanation
from ._lengths import LengthDrift
from ._relevance import RelevanceSummary
from ._results import DriftReport, TestResult
from ._svg import CURRENT_COLOUR, NOVEL_COLOUR, REFERENCE_COLOUR, scatter_svg, share_bars_svg

__all__ = ["render_html"]

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
