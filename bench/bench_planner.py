#!/usr/bin/env python3
"""Planner benchmark: fixed fleets beside the planner's targets on a traffic step.

**Input.** The Mooncake conversation trace (12,031 requests over 59 minutes,
about 3.4 requests/s; ``../shared/data/mooncake/conversation_trace.jsonl``,
from github.com/kvcache-ai/Mooncake ``FAST25-release/traces``, Copyright (c)
Moonshot AI and the Mooncake authors, Apache-2.0) with its arrival rate
stepped up 4x for ten minutes and back. The transformation
(:func:`step_trace`) is a time warp of the arrival clock, nothing else: an
arrival at ``t`` moves to

    t                              for t < 10 min
    10 min + (t - 10 min) / 4      for 10 min <= t < 50 min   (4x: 40 minutes in 10)
    t - 30 min                     for t >= 50 min            (the rate back as it was)

Every request, its lengths and its prefix-block ids are kept, in order; the
stepped trace lasts 29 minutes (10 at the base rate, 10 at 4x, 9 at the base
rate again). It is written next to the reports (``--out``), byte for byte
the same on every run.

**Runs.** Aggregated vLLM workers (the default polynomial timing, block size
64) behind round robin, with the same SLA (TTFT <= 2 s, ITL <= 50 ms):

- ``fixed-small``: 4 workers throughout (enough for the base rate);
- ``fixed-large``: 8 workers throughout (enough for the peak);
- ``throughput``, ``latency``, ``load``: the reference's planner targets,
  from 4 workers, at most 8 GPUs, each new worker starting for 30 s
  (``load``: scale up at 70 % KV utilisation, down at 30 %);
- ``sla``: servesim's own target (``docs/planner.md``) for the same TTFT and
  ITL, deciding every 30 s on a moving average of the last 2 windows.

For each: SLA attainment (good / completed requests), p99 TTFT, GPU-hours;
a markdown table for the README and a figure (``docs/planner_step.svg``):
paid workers over time, and the p90 TTFT of the requests arriving in each
30-second window.

    python bench/bench_planner.py                      # all runs, about 3 minutes
    python bench/bench_planner.py --runs fixed-small sla --no-figure
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servesim import RunConfig, parse_engine_args, run
from servesim.cluster.planner import planner_config
from servesim.metrics.collector import latencies
from servesim.simulation import Report, Sla

REPO_ROOT = Path(__file__).resolve().parent.parent
MOONCAKE = REPO_ROOT.parent / "shared" / "data" / "mooncake" / "conversation_trace.jsonl"
FIGURE = REPO_ROOT / "docs" / "planner_step.svg"

STEP_START_MS = 10 * 60_000.0
STEP_LENGTH_MS = 10 * 60_000.0
STEP_FACTOR = 4.0
TTFT_MS, ITL_MS = 2000.0, 50.0
SMALL, LARGE = 4, 8
STARTUP_S = 30.0
WINDOW_MS = 30_000.0


def step_trace(source: Path, target: Path) -> None:
    """Write ``source`` with its arrival rate stepped up for ten minutes (see the module doc)."""
    lines = []
    for line in source.read_text().splitlines():
        row = json.loads(line)
        t = float(row["timestamp"])
        if t >= STEP_START_MS:
            squeezed = STEP_LENGTH_MS * STEP_FACTOR
            if t < STEP_START_MS + squeezed:
                t = STEP_START_MS + (t - STEP_START_MS) / STEP_FACTOR
            else:
                t -= squeezed - STEP_LENGTH_MS
        row["timestamp"] = round(t, 3)
        lines.append(json.dumps(row))
    target.write_text("\n".join(lines) + "\n")


@dataclass(frozen=True)
class Variant:
    """One run: a name, the fleet it starts with, and its planner keys (None: a fixed fleet)."""

    name: str
    workers: int
    planner: dict[str, Any] | None


BUDGET = {"mode": "agg", "max_gpu_budget": LARGE, "min_endpoint": 1}
VARIANTS = [
    Variant("fixed-small", SMALL, None),
    Variant("fixed-large", LARGE, None),
    Variant("throughput", SMALL, {**BUDGET, "optimization_target": "throughput"}),
    Variant("latency", SMALL, {**BUDGET, "optimization_target": "latency"}),
    Variant(
        "load",
        SMALL,
        {
            **BUDGET,
            "optimization_target": "load",
            "decode_scale_up_kv_rate": 70,
            "decode_scale_down_kv_rate": 30,
        },
    ),
    Variant(
        "sla",
        SMALL,
        {
            **BUDGET,
            "optimization_target": "sla",
            "ttft_ms": TTFT_MS,
            "itl_ms": ITL_MS,
            "throughput_adjustment_interval_seconds": 30,
            "load_predictor": "moving_average",
            "load_predictor_window": 2,
        },
    ),
]


def replay(variant: Variant, trace: Path) -> tuple[Report, float]:
    """Run one variant; the report and the wall seconds it took."""
    config = RunConfig(
        trace=trace,
        trace_block_size=512,
        num_workers=variant.workers,
        engine=parse_engine_args({"block_size": 64, "startup_time": STARTUP_S}),
        sla=Sla(ttft_ms=TTFT_MS, itl_ms=ITL_MS),
        planner=None if variant.planner is None else planner_config(variant.planner),
    )
    started = time.perf_counter()
    report = run(config)
    return report, time.perf_counter() - started


def workers_over_time(report: Report, initial: int) -> list[tuple[float, int]]:
    """(time ms, paid workers: starting, active or draining) at every change."""
    points = [(0.0, initial)]
    for t in report.sections.get("lifecycle_transitions", []):
        delta = 1 if t["prior_state"] is None else -1 if t["state"] == "removed" else 0
        if delta:
            points.append((t["at_ms"], points[-1][1] + delta))
    points.append((report.summary["duration_ms"], points[-1][1]))
    return points


def ttft_by_window(report: Report) -> list[tuple[float, float]]:
    """(window middle ms, p90 TTFT s) of the requests arriving in each 30-second window."""
    windows: dict[int, list[float]] = {}
    for record in report.records:
        ttft = latencies(record).ttft
        if ttft is not None:
            windows.setdefault(int(record.arrival_time_ms // WINDOW_MS), []).append(ttft)
    out = []
    for index in sorted(windows):
        values = sorted(windows[index])
        out.append(((index + 0.5) * WINDOW_MS, values[round((len(values) - 1) * 0.9)] / 1000.0))
    return out


def row(variant: Variant, report: Report, wall_s: float) -> dict[str, Any]:
    """The table's figures for one run."""
    s = report.summary
    events = report.sections.get("planner", {}).get("scaling_events", [])
    return {
        "run": variant.name,
        "attainment": s["goodput_completed_requests"] / s["completed_requests"],
        "p99_ttft_s": s["p99_ttft_ms"] / 1000.0,
        "gpu_hours": s["gpu_hours"],
        "scaling_events": len(events),
        "wall_s": wall_s,
    }


def table(rows: list[dict[str, Any]]) -> str:
    """The README's markdown table."""
    lines = [
        "| run | SLA attainment | p99 TTFT | GPU-hours | scaling events | wall |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['run']} | {r['attainment']:.1%} | {r['p99_ttft_s']:,.1f} s "
        f"| {r['gpu_hours']:.2f} | {r['scaling_events']} | {r['wall_s']:.0f} s |"
        for r in rows
    ]
    return "\n".join(lines)


# ----- the figure (hand-written SVG: no plotting library needed) -----

COLOURS = {
    "fixed-small": "#9e9e9e",
    "fixed-large": "#424242",
    "throughput": "#1f77b4",
    "latency": "#d62728",
    "load": "#2ca02c",
    "sla": "#9467bd",
}


def figure(series: dict[str, tuple[list[tuple[float, int]], list[tuple[float, float]]]]) -> str:
    """Two panels over the run's minutes: paid workers (steps), p90 TTFT per window (log)."""
    import math

    width, height, left, right, top, gap, panel = 760, 520, 60, 130, 30, 50, 190
    end_min = max(points[-1][0] for points, _ in series.values()) / 60_000.0
    most_workers = max(n for points, _ in series.values() for _, n in points)
    ttfts = [v for _, windows in series.values() for _, v in windows if v > 0]
    lo, hi = math.floor(math.log10(min(ttfts))), math.ceil(math.log10(max(ttfts)))
    plot_w = width - left - right

    def x(ms: float) -> float:
        return left + plot_w * (ms / 60_000.0) / end_min

    def y_workers(n: float) -> float:
        return top + panel * (1 - n / (most_workers + 1))

    def y_ttft(v: float) -> float:
        base = top + panel + gap
        return base + panel * (1 - (math.log10(max(v, 10**lo)) - lo) / (hi - lo))

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    step = (STEP_START_MS, STEP_START_MS + STEP_LENGTH_MS)
    for base in (top, top + panel + gap):
        out.append(
            f'<rect x="{x(step[0]):.1f}" y="{base}" width="{x(step[1]) - x(step[0]):.1f}" '
            f'height="{panel}" fill="#fff3e0"/>'
        )
        out.append(
            f'<rect x="{left}" y="{base}" width="{plot_w}" height="{panel}" fill="none" '
            'stroke="#000"/>'
        )
    out.append(f'<text x="{x(step[0]) + 4:.1f}" y="{top + 12}" fill="#e65100">arrivals x4</text>')
    out += [
        f'<text x="{left - 6}" y="{y_workers(n) + 4:.1f}" text-anchor="end">{n}</text>'
        for n in range(0, most_workers + 1, 2)
    ]
    for e in range(lo, hi + 1):
        label = f"{10**e:g} s"
        out.append(
            f'<text x="{left - 6}" y="{y_ttft(10**e) + 4:.1f}" text-anchor="end">{label}</text>'
        )
        out.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y_ttft(10**e):.1f}" '
            f'y2="{y_ttft(10**e):.1f}" stroke="#eee"/>'
        )
    sla_y = y_ttft(TTFT_MS / 1000.0)
    out.append(
        f'<line x1="{left}" x2="{left + plot_w}" y1="{sla_y:.1f}" y2="{sla_y:.1f}" '
        'stroke="#000" stroke-dasharray="4 3"/>'
    )
    out.append(
        f'<text x="{left + plot_w - 4}" y="{sla_y - 4:.1f}" text-anchor="end">TTFT SLA</text>'
    )
    for minute in range(0, int(end_min) + 1, 5):
        px = x(minute * 60_000.0)
        out.append(
            f'<text x="{px:.1f}" y="{top + 2 * panel + gap + 16}" text-anchor="middle">{minute}</text>'
        )
    out.append(
        f'<text x="{left + plot_w / 2}" y="{height - 8}" text-anchor="middle">minutes</text>'
    )
    out.append(f'<text x="{left}" y="{top - 10}">paid workers (starting, active, draining)</text>')
    out.append(
        f'<text x="{left}" y="{top + panel + gap - 10}">p90 TTFT of the requests arriving '
        "in each 30 s window</text>"
    )
    for i, (name, (points, windows)) in enumerate(series.items()):
        colour = COLOURS.get(name, "#000")
        path = []
        for j, (at, n) in enumerate(points):
            if j:
                path.append(f"{x(at):.1f},{y_workers(points[j - 1][1]):.1f}")
            path.append(f"{x(at):.1f},{y_workers(n):.1f}")
        out.append(
            f'<polyline points="{" ".join(path)}" fill="none" stroke="{colour}" stroke-width="1.5"/>'
        )
        line = " ".join(f"{x(at):.1f},{y_ttft(v):.1f}" for at, v in windows)
        out.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        ly = top + 14 + 16 * i
        out.append(
            f'<line x1="{width - right + 12}" x2="{width - right + 32}" y1="{ly - 4}" '
            f'y2="{ly - 4}" stroke="{colour}" stroke-width="2"/>'
        )
        out.append(f'<text x="{width - right + 36}" y="{ly}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> int:
    """Run the variants, print the table, write the figure."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trace", type=Path, default=MOONCAKE, help="the Mooncake trace to step")
    parser.add_argument("--runs", nargs="*", default=[v.name for v in VARIANTS])
    parser.add_argument("--out", type=Path, default=None, help="where the stepped trace goes")
    parser.add_argument("--figure", type=Path, default=FIGURE)
    parser.add_argument("--no-figure", action="store_true")
    args = parser.parse_args()
    if not args.trace.exists():
        parser.error(f"no trace at {args.trace} (the team's ../shared/data)")
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_planner_"))
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "mooncake_conversation_step4x.jsonl"
    step_trace(args.trace, trace)
    rows, series = [], {}
    for variant in VARIANTS:
        if variant.name not in args.runs:
            continue
        report, wall = replay(variant, trace)
        rows.append(row(variant, report, wall))
        series[variant.name] = (workers_over_time(report, variant.workers), ttft_by_window(report))
        print(json.dumps(rows[-1]), flush=True)
    print(table(rows))
    if not args.no_figure:
        args.figure.write_text(figure(series))
        print(f"figure: {args.figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
