"""Inline SVG drawings for the HTML report: a scatter of two windows and paired share bars."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

__all__ = ["scatter_svg", "share_bars_svg"]

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
