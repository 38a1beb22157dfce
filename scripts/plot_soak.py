#!/usr/bin/env python3
"""Soak figures: a Markdown table by minute, and a plot of RSS and p99 second by second.

Reads what scripts/soak.sh writes under docs/soak/: <store>-seconds.jsonl (sluice-bench
--per-second: answered calls, errors and latency of each second) and <store>-rss.txt (unix second,
the server's RSS in KiB, Redis's used_memory in bytes for the redis store). Owns
docs/soak/soak.svg, which is written by hand: no plotting library is needed.

usage: scripts/plot_soak.py --table STORE     print STORE's table by minute
       scripts/plot_soak.py [OUTPUT.svg]      plot every store that has data (default
                                              docs/soak/soak.svg)
"""

import json
import os
import statistics
import sys
from html import escape

DIR = "docs/soak"
STORES = ["memory", "redis"]
COLORS = {"memory": "#1f77b4", "redis": "#d62728"}


def load(store):
    seconds_path = os.path.join(DIR, f"{store}-seconds.jsonl")
    rss_path = os.path.join(DIR, f"{store}-rss.txt")
    if not (os.path.exists(seconds_path) and os.path.exists(rss_path)):
        return None
    with open(seconds_path, encoding="utf-8") as f:
        seconds = [json.loads(line) for line in f if line.strip()]
    rss = {}
    with open(rss_path, encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2:
                rss[int(parts[0])] = (int(parts[1]), int(parts[2]) if len(parts) > 2 else None)
    return seconds, rss


def table(store):
    data = load(store)
    if data is None:
        sys.exit(f"no soak data for {store} under {DIR}")
    seconds, rss = data
    redis = store == "redis"
    head = f"| {store} minute | req/s | errors | p50 µs (median of seconds) | p99 µs (median / worst second) | max µs | server RSS MiB (min–max)"
    print(head + (" | Redis used_memory MiB (min–max) |" if redis else " |"))
    print("|--:|--:|--:|--:|--:|--:|--:|" + ("--:|" if redis else ""))
    for minute in range(0, (len(seconds) + 59) // 60):
        part = seconds[minute * 60:(minute + 1) * 60]
        answered = sum(s["answered"] for s in part)
        errors = sum(s["errors"] for s in part)
        p50 = statistics.median(s["latency_us"]["p50"] for s in part)
        p99s = [s["latency_us"]["p99"] for s in part]
        worst = max(s["latency_us"]["max"] for s in part)
        times = {s["unix_time"] for s in part}
        window = [rss[t] for t in sorted(times) if t in rss]
        server = [kib / 1024 for kib, _ in window]
        line = (f"| {minute + 1} | {answered / len(part):.0f} | {errors} | {p50:.0f} "
                f"| {statistics.median(p99s):.0f} / {max(p99s)} | {worst} "
                f"| {span(server)} |")
        if redis:
            used = [b / 2**20 for _, b in window if b is not None]
            line += f" {span(used)} |"
        print(line)


def span(values):
    if not values:
        return "–"
    return f"{min(values):.1f}–{max(values):.1f}"


def polyline(points, x_max, y_max, x0, y0, w, h, color, dash=""):
    coords = " ".join(
        f"{x0 + w * x / x_max:.1f},{y0 + h - h * min(y, y_max) / y_max:.1f}" for x, y in points)
    dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
    return f'<polyline fill="none" stroke="{color}" stroke-width="1.2"{dash_attr} points="{coords}"/>'


def panel(title, y_label, series, x0, y0, w, h):
    """series: list of (label, color, dash, [(minutes, value)])."""
    out = [f'<text x="{x0 + w / 2}" y="{y0 - 12}" text-anchor="middle" font-size="14">{escape(title)}</text>']
    x_max = max((p[-1][0] for *_, p in series if p), default=1) or 1
    y_max = max((v for *_, p in series for _, v in p), default=1) * 1.15 or 1
    out.append(f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#999"/>')
    for i in range(5):
        y = y0 + h - h * i / 4
        out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{y_max * i / 4:.1f}</text>')
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + w}" y2="{y:.1f}" stroke="#eee"/>')
    for m in range(0, int(x_max) + 1, max(1, int(x_max) // 10)):
        x = x0 + w * m / x_max
        out.append(f'<text x="{x:.1f}" y="{y0 + h + 16}" text-anchor="middle" font-size="11">{m}</text>')
    out.append(f'<text x="{x0 + w / 2}" y="{y0 + h + 34}" text-anchor="middle" font-size="12">minutes</text>')
    out.append(f'<text x="{x0 - 50}" y="{y0 + h / 2}" text-anchor="middle" font-size="12" '
               f'transform="rotate(-90 {x0 - 50} {y0 + h / 2})">{escape(y_label)}</text>')
    for n, (label, color, dash, points) in enumerate(series):
        if points:
            out.append(polyline(points, x_max, y_max, x0, y0, w, h, color, dash))
        ly = y0 + 14 + 16 * n
        out.append(f'<line x1="{x0 + 10}" y1="{ly - 4}" x2="{x0 + 30}" y2="{ly - 4}" stroke="{color}" stroke-dasharray="{dash}"/>')
        out.append(f'<text x="{x0 + 35}" y="{ly}" font-size="11">{escape(label)}</text>')
    return out


def plot(output):
    memory_series, latency_series = [], []
    for store in STORES:
        data = load(store)
        if data is None:
            continue
        seconds, rss = data
        t0 = seconds[0]["unix_time"] - 1 if seconds else 0
        color = COLORS[store]
        memory_series.append((f"{store}: server RSS", color, "",
                              [((t - t0) / 60, kib / 1024) for t, (kib, _) in sorted(rss.items()) if t >= t0]))
        if store == "redis":
            memory_series.append(("redis: Redis used_memory", color, "4 3",
                                  [((t - t0) / 60, b / 2**20) for t, (_, b) in sorted(rss.items())
                                   if t >= t0 and b is not None]))
        latency_series.append((f"{store}: p99 of each second", color, "",
                               [((s["unix_time"] - t0) / 60, s["latency_us"]["p99"] / 1000) for s in seconds]))
    if not memory_series:
        sys.exit(f"no soak data under {DIR}")
    width, height = 1000, 420
    body = panel("Memory, sampled each second", "MiB", memory_series, 90, 50, 360, 300)
    body += panel("Latency, p99 of each second", "ms", latency_series, 590, 50, 360, 300)
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>'
           + "".join(body) + "</svg>\n")
    with open(output, "w", encoding="utf-8") as f:
        f.write(svg)
    print(f"wrote {output}")


def main(argv):
    if len(argv) == 2 and argv[0] == "--table":
        table(argv[1])
    elif len(argv) <= 1:
        plot(argv[0] if argv else os.path.join(DIR, "soak.svg"))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
