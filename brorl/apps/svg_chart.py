"""Line charts as inline SVG, for ``brorl report``'s self-contained page.

Drawn here in a few dozen lines rather than by a plotting library or a JavaScript one from a CDN:
the page must open with no network and brorl's core installs no plotting stack. Each chart is an
HTML ``<figure>``: a title, the SVG (axes with rounded ticks, one polyline per series, a dot
where a series has a single point) and a legend with each series' last value.
"""

from __future__ import annotations

import math
from html import escape

# Colour-blind-safe (Okabe–Ito), in the order series are listed.
PALETTE = ["#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000"]
WIDTH, HEIGHT = 480, 220
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 10, 30  # margins: tick labels left and below

Points = list[tuple[float, float]]


def fmt(v: float) -> str:
    """A tick or legend number: short, without float noise (0.30000000000000004 → 0.3)."""
    if 10_000 <= abs(v) < 10_000_000:
        return f"{v:.0f}"  # tokens/s and counts: 12345, not 1.234e+04
    return f"{v:.4g}"


def nice_ticks(lo: float, hi: float, count: int = 5, enclose: bool = False) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) within [lo, hi], lo < hi; with
    ``enclose``, from the tick at or below ``lo`` to the one at or above ``hi``."""
    raw = (hi - lo) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    slack = step * 1e-9  # float error must not drop a tick that sits on lo or hi
    first = math.floor((lo + slack) / step) if enclose else math.ceil((lo - slack) / step)
    last = math.ceil((hi - slack) / step) if enclose else math.floor((hi + slack) / step)
    # 12 significant digits: 3 * 0.1 is 0.30000000000000004, and the tick must read 0.3
    return [float(f"{i * step:.12g}") for i in range(first, last + 1)]


def _span(values: list[float]) -> tuple[float, float]:
    """[lo, hi] of ``values`` with lo < hi (a constant series gets a band around it)."""
    lo, hi = min(values), max(values)
    if lo == hi:
        pad = abs(lo) * 0.1 or 1.0
        return lo - pad, hi + pad
    return lo, hi


def line_chart(title: str, series: dict[str, Points], note: str = "") -> str:
    """A ``<figure>`` with ``series`` (name → (step, value) points in step order) over steps;
    a chart with no point says so (``note``: why) instead of drawing empty axes."""
    series = {name: pts for name, pts in series.items() if pts}
    caption = f"<figcaption>{escape(title)}</figcaption>"
    if not series:
        text = escape(note or "no data in this run")
        return f'<figure class="chart empty">{caption}<p class="note">{text}</p></figure>'
    xs = [x for pts in series.values() for x, _ in pts]
    ys = [y for pts in series.values() for _, y in pts]
    x0, x1 = _span(xs)
    yticks = nice_ticks(*_span(ys), enclose=True)
    y0, y1 = yticks[0], yticks[-1]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return TOP + (y1 - y) / (y1 - y0) * plot_h

    parts = [
        f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">',
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" class="plot"/>',
    ]
    for t in yticks:
        y = py(t)
        parts.append(
            f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
        )
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" class="ytick">{fmt(t)}</text>')
    for t in nice_ticks(x0, x1, 6):
        x = px(t)
        parts.append(f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" class="xtick">{fmt(t)}</text>')
    parts.append(f'<text x="{LEFT + plot_w}" y="{HEIGHT - 2}" class="xlabel">step</text>')
    legend = []
    for i, (name, pts) in enumerate(series.items()):
        colour = PALETTE[i % len(PALETTE)]
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        label = escape(name)
        if len(pts) == 1:
            ((x, y),) = pts
            parts.append(
                f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{colour}">'
                f"<title>{label}</title></circle>"
            )
        else:
            parts.append(
                f'<polyline points="{coords}" stroke="{colour}" class="series">'
                f"<title>{label}</title></polyline>"
            )
        legend.append(
            f'<li><span class="swatch" style="background:{colour}"></span>{label} '
            f'<span class="last">{fmt(pts[-1][1])} at step {fmt(pts[-1][0])}</span></li>'
        )
    parts.append("</svg>")
    return (
        f'<figure class="chart">{caption}{"".join(parts)}'
        f'<ul class="legend">{"".join(legend)}</ul></figure>'
    )
