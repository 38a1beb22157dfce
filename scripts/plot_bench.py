#!/usr/bin/env python3
"""Plots sluice-bench matrix results: throughput and p99 latency against concurrency, per store.

Owns docs/bench/throughput.svg (or whatever OUTPUT is given). Reads the JSON lines written by
`sluice-bench matrix` (one run per line) and keeps the concurrency sweep (1 descriptor, 10 000
keys; with several rounds, the median ones marked `selected`). The SVG is written by hand: no plotting library is needed.

usage: scripts/plot_bench.py [INPUT.jsonl] [OUTPUT.svg]
       (defaults: docs/bench/latest.jsonl, docs/bench/throughput.svg)
"""

import json
import math
import sys
from html import escape

COLORS = {"null": "#7f7f7f", "memory": "#1f77b4", "redis": "#d62728", "redis-cluster": "#9467bd",
          "target": "#2ca02c"}
ORDER = ["null", "memory", "redis", "redis-cluster", "target"]

WIDTH, HEIGHT = 990, 450
PANEL_W, PANEL_H = 380, 280
MARGIN_L, MARGIN_T = 80, 70
GAP = 110


def load(path):
    runs = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                runs.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{number}: not JSON: {e}")
    return runs


def sweep(runs):
    """{store: [(concurrency, rps, p99_ms)]} of the 1-descriptor, 10 000-key runs."""
    series = {}
    for r in runs:
        if r.get("group", "sweep") != "sweep" or r.get("selected") is False:
            continue
        if r.get("descriptors") != 1 or r.get("keys") != 10000:
            continue
        point = (r["concurrency"], r["rps"], r["latency_us"]["p99"] / 1000.0)
        series.setdefault(r["store"], []).append(point)
    for points in series.values():
        points.sort()
    return series


def nice_max(value):
    """A round axis maximum at or above value."""
    if value <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(value))
    for step in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if step * exp >= value:
            return step * exp
    return 10 * exp


def fmt(value):
    if value >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def panel(out, x0, y0, title, ylabel, series, index, levels):
    """One line chart; index picks the value from each point; x is log-spaced concurrency."""
    ymax = nice_max(max((p[index] for pts in series.values() for p in pts), default=1.0))
    lo, hi = math.log2(min(levels)), math.log2(max(levels))

    def x_of(c):
        if hi == lo:
            return x0 + PANEL_W / 2
        return x0 + (math.log2(c) - lo) / (hi - lo) * PANEL_W

    def y_of(v):
        return y0 + PANEL_H - v / ymax * PANEL_H

    out.append(f'<text x="{x0 + PANEL_W / 2}" y="{y0 - 16}" class="title">{escape(title)}</text>')
    for i in range(6):
        v = ymax * i / 5
        y = y_of(v)
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + PANEL_W}" y2="{y:.1f}" class="grid"/>')
        out.append(f'<text x="{x0 - 8}" y="{y + 4:.1f}" class="ytick">{fmt(round(v, 3))}</text>')
    for c in levels:
        x = x_of(c)
        out.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + PANEL_H}" class="grid"/>')
        out.append(f'<text x="{x:.1f}" y="{y0 + PANEL_H + 18}" class="xtick">{c}</text>')
    out.append(f'<rect x="{x0}" y="{y0}" width="{PANEL_W}" height="{PANEL_H}" class="frame"/>')
    out.append(
        f'<text x="{x0 + PANEL_W / 2}" y="{y0 + PANEL_H + 36}" class="label">'
        "concurrency (requests in flight, log scale)</text>"
    )
    cy = y0 + PANEL_H / 2
    out.append(
        f'<text x="{x0 - 58}" y="{cy}" class="label" '
        f'transform="rotate(-90 {x0 - 58} {cy})">{escape(ylabel)}</text>'
    )
    for store in sorted(series, key=lambda s: ORDER.index(s) if s in ORDER else 99):
        color = COLORS.get(store, "#9467bd")
        pts = " ".join(f"{x_of(p[0]):.1f},{y_of(p[index]):.1f}" for p in series[store])
        out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"/>')
        for point in series[store]:
            c, v = point[0], point[index]
            out.append(
                f'<circle cx="{x_of(c):.1f}" cy="{y_of(v):.1f}" r="3.5" fill="{color}">'
                f"<title>{escape(store)} c={c}: {v:.3f}</title></circle>"
            )


def render(series, source):
    levels = sorted({p[0] for pts in series.values() for p in pts})
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif">',
        "<style>"
        ".title{font-size:15px;font-weight:bold;text-anchor:middle}"
        ".label{font-size:12px;text-anchor:middle;fill:#333}"
        ".xtick{font-size:11px;text-anchor:middle;fill:#333}"
        ".ytick{font-size:11px;text-anchor:end;fill:#333}"
        ".grid{stroke:#e5e5e5;stroke-width:1}"
        ".frame{fill:none;stroke:#999;stroke-width:1}"
        ".legend{font-size:12px}"
        "</style>",
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="22" class="title">Sluice ShouldRateLimit: closed-loop gRPC, '
        f"1 descriptor, 10 000 keys ({escape(source)})</text>",
    ]
    if not levels:
        out.append(f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" class="label">no sweep runs</text>')
    else:
        panel(out, MARGIN_L, MARGIN_T, "Throughput", "requests/s", series, 1, levels)
        panel(out, MARGIN_L + PANEL_W + GAP, MARGIN_T, "p99 latency", "p99 (ms)", series, 2,
              levels)
        x = MARGIN_L
        for store in sorted(series, key=lambda s: ORDER.index(s) if s in ORDER else 99):
            color = COLORS.get(store, "#9467bd")
            y = HEIGHT - 12
            out.append(f'<rect x="{x}" y="{y - 10}" width="14" height="10" fill="{color}"/>')
            out.append(f'<text x="{x + 20}" y="{y}" class="legend">{escape(store)}</text>')
            x += 110
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv):
    if len(argv) > 3 or any(a in ("-h", "--help") for a in argv[1:]):
        print(__doc__.strip())
        return 0 if len(argv) <= 3 else 2
    source = argv[1] if len(argv) > 1 else "docs/bench/latest.jsonl"
    target = argv[2] if len(argv) > 2 else "docs/bench/throughput.svg"
    try:
        runs = load(source)
    except OSError as e:
        sys.exit(f"cannot read {source}: {e.strerror}")
    series = sweep(runs)
    with open(target, "w", encoding="utf-8") as f:
        f.write(render(series, source.rsplit("/", 1)[-1]))
    print(f"wrote {target} ({sum(len(p) for p in series.values())} points)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
