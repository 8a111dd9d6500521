"""Fleetwatch's one chart renderer: bar charts as inline SVG in the culprit palette
(analysis/palette.py), drawn the same in the UI's pages, the weekly report's HTML, its email and
its PDF. Pure: no Django, no script.

Why no chart library: the report's PDF (WeasyPrint) and its email run no script, so a browser
library (Chart.js, which the overview used to load) cannot draw them, and the page and the PDF
then drew with two stacks in two palettes; the server-side libraries (matplotlib, pygal) bring
a dependency tree bigger than the two chart shapes Fleetwatch draws (columns stacked by culprit
class, and bars per class). Every text put in a chart is escaped."""

from __future__ import annotations

from html import escape

from analysis.classify import CULPRITS
from analysis.palette import CULPRIT_COLOURS


def _colour(culprit: str) -> str:
    return CULPRIT_COLOURS.get(culprit, CULPRIT_COLOURS["unknown"])


def _svg(width: int, height: int, aria: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(aria)}" class="chart">'
    )


def stacked_columns(
    labels: list[str],
    series: dict[str, list[int]],
    *,
    aria: str,
    empty: str = "No incidents in this period.",
    width: int = 640,
    height: int = 220,
) -> str:
    """One column per label, stacked by culprit class in the vocabulary's order, its total
    above it; each segment says its class and count on hover (``<title>``)."""
    totals = [sum(counts[i] for counts in series.values()) for i in range(len(labels))]
    peak = max(totals, default=0)
    if not peak:
        return f'<p class="empty">{escape(empty)}</p>'
    left, bottom, top = 36, 30, 14
    plot_h = height - bottom - top
    slot = (width - left) / len(labels)
    order = [c for c in CULPRITS if c in series] + sorted(set(series) - set(CULPRITS))
    shown = [c for c in order if any(series[c])]
    key, key_h = _legend(shown, y=height + 4, width=width) if len(shown) > 1 else ("", 0)
    parts = [
        _svg(width, height + key_h, aria),
        f'<line x1="{left}" y1="{top + plot_h}" x2="{width}" y2="{top + plot_h}" stroke="#444"/>',
        f'<text x="{left - 6}" y="{top + 10}" text-anchor="end" font-size="11">{peak}</text>',
        f'<text x="{left - 6}" y="{top + plot_h}" text-anchor="end" font-size="11">0</text>',
    ]
    for i, label in enumerate(labels):
        x = left + i * slot + slot * 0.15
        y = top + plot_h
        for culprit in order:
            n = series[culprit][i]
            if not n:
                continue
            h = plot_h * n / peak
            y -= h
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{slot * 0.7:.1f}" height="{h:.1f}" '
                f'fill="{_colour(culprit)}" data-culprit="{escape(culprit)}">'
                f"<title>{escape(label)} · {escape(culprit)}: {n}</title></rect>"
            )
        parts.append(
            f'<text x="{x + slot * 0.35:.1f}" y="{height - 10}" text-anchor="middle" '
            f'font-size="11">{escape(label)}</text>'
            f'<text x="{x + slot * 0.35:.1f}" y="{y - 3:.1f}" text-anchor="middle" '
            f'font-size="10">{totals[i] or ""}</text>'
        )
    parts.append(key)
    parts.append("</svg>")
    return "".join(parts)


def _legend(culprits: list[str], *, y: float, width: int) -> tuple[str, int]:
    """Swatches naming the classes drawn, in drawing order (bottom segment first), wrapped into
    as many rows as they need; returns the SVG and its height."""
    parts, x, row = [], 36.0, 0
    for culprit in culprits:
        span = 14 + 6.5 * len(culprit) + 16
        if x + span > width and x > 36:
            x, row = 36.0, row + 1
        top = y + row * 18
        parts.append(
            f'<rect x="{x:.0f}" y="{top:.0f}" width="10" height="10" fill="{_colour(culprit)}"/>'
            f'<text x="{x + 14:.0f}" y="{top + 9:.0f}" font-size="11">{escape(culprit)}</text>'
        )
        x += span
    return "".join(parts), (row + 1) * 18 + 4


def bars_by_culprit(
    counts: dict[str, int], *, aria: str, empty: str = "No incidents.", width: int = 640
) -> str:
    """One bar per culprit class with incidents, longest first, its count at its end."""
    rows = [(c, n) for c, n in sorted(counts.items(), key=lambda x: -x[1]) if n]
    if not rows:
        return f'<p class="empty">{escape(empty)}</p>'
    bar_h, label_w = 22, 170
    height = bar_h * len(rows) + 10
    peak = max(n for _, n in rows)
    parts = [_svg(width, height, aria)]
    for i, (culprit, n) in enumerate(rows):
        y = 5 + i * bar_h
        w = (width - label_w - 50) * n / peak
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end" font-size="12">'
            f"{escape(culprit)}</text>"
            f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{bar_h - 6}" '
            f'fill="{_colour(culprit)}" data-culprit="{escape(culprit)}"/>'
            f'<text x="{label_w + w + 5:.1f}" y="{y + 15}" font-size="12">{n}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
