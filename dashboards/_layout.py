"""Places panels on Grafana's 24-column grid and numbers them: rows of sections, left to right."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._panels import row

__all__ = ["GRID_COLUMNS", "Section", "lay_out"]

GRID_COLUMNS = 24


@dataclass(frozen=True)
class Section:
    """A titled row and the panels under it, in reading order (each carries its own w and h)."""

    title: str
    panels: Sequence[dict[str, Any]]


def lay_out(sections: Sequence[Section]) -> list[dict[str, Any]]:
    """Return new panel dicts with unique ids from 1 and non-overlapping gridPos.

    Panels wrap to the next line when the 24 columns are full; a line is as tall as
    its tallest panel. Each section starts with a row header on its own line.
    """
    out: list[dict[str, Any]] = []
    y = 0
    next_id = 1
    for section in sections:
        header = row(section.title)
        header["id"] = next_id
        header["gridPos"] = {"h": 1, "w": GRID_COLUMNS, "x": 0, "y": y}
        out.append(header)
        next_id += 1
        y += 1
        x = 0
        line_height = 0
        for template in section.panels:
            panel = dict(template)
            w = int(template["gridPos"]["w"])
            h = int(template["gridPos"]["h"])
            if not 0 < w <= GRID_COLUMNS:
                raise ValueError(f"panel {template.get('title')!r}: width {w} outside 1..{GRID_COLUMNS}")
            if x + w > GRID_COLUMNS:
                y += line_height
                x, line_height = 0, 0
            panel["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
            panel["id"] = next_id
            next_id += 1
            out.append(panel)
            x += w
            line_height = max(line_height, h)
        y += line_height
    return out
