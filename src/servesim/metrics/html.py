"""The HTML report: one self-contained page (no network, no CDN) with the run's charts.

The page embeds plotly.js (read from the ``plotly`` wheel, MIT licence) and
one JSON block holding the report document and every chart's Plotly figure.
Every chart is computed from the report's ``series`` and ``summary``
(:mod:`servesim.metrics.series`); the same report gives the same page, byte
for byte.

Charts are made by :data:`CHARTS`, a list of builders, each returning the
figures of one section of the page (or none when the run has nothing for
it: transfers only in disaggregated runs). A later section (planner
decisions, a sweep's Pareto frontier) is one more builder.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from servesim.metrics.report import atomic_write
from servesim.metrics.terminal import terminal_html

Figure = dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Chart:
    """One chart of the page: its element id, title, and Plotly figure (``data``, ``layout``)."""

    id: str
    title: str
    figure: Figure
    caption: str = ""


ChartBuilder = Callable[[dict[str, Any]], list[Chart]]

_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf")  # fmt: skip


def _layout(x_title: str, y_title: str, **extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "xaxis": {"title": {"text": x_title}, "zeroline": False},
        "yaxis": {"title": {"text": y_title}, "zeroline": False, "rangemode": "tozero"},
        "margin": {"l": 70, "r": 20, "t": 10, "b": 50},
        "height": 340,
        "legend": {"orientation": "h", "y": -0.25},
        "hovermode": "closest",
    }
    layout.update(extra)
    return layout


def _cdf_trace(name: str, values: list[float], color: str) -> dict[str, Any]:
    return {
        "type": "scatter",
        "mode": "lines",
        "name": name,
        "x": values,
        "y": list(range(len(values))),
        "line": {"color": color, "shape": "hv"},
        "hovertemplate": "p%{y}: %{x:.2f} ms<extra>" + html.escape(name) + "</extra>",
    }


def _distribution_charts(doc: dict[str, Any]) -> list[Chart]:
    dists = doc["series"]["distributions"]
    out = []
    for key, title, color, samples in (
        ("ttft_ms", "Time to first token", _PALETTE[0], "num_ttft_samples"),
        ("itl_ms", "Inter-token latency (each request's mean)", _PALETTE[1], "num_tpot_samples"),
        ("e2e_latency_ms", "End-to-end latency", _PALETTE[2], "num_e2e_latency_samples"),
    ):
        values = dists[key]
        out.append(
            Chart(
                id=f"dist-{key.removesuffix('_ms').replace('_', '-')}",
                title=f"{title}: distribution",
                figure={
                    "data": [_cdf_trace(title, values, color)],
                    "layout": _layout("ms", "percentile of completed requests", showlegend=False),
                },
                caption=f"{doc['summary'].get(samples, 0):,} completed requests; "
                "percentile p is the latency p% of requests stay under.",
            )
        )
    return out


def _time_axis(doc: dict[str, Any]) -> list[float]:
    return [t / 1000.0 for t in doc["series"]["over_time"]["t_ms"]]


def _line(name: str, x: list[float], y: list[Any], color: str, **extra: Any) -> dict[str, Any]:
    trace = {
        "type": "scatter",
        "mode": "lines",
        "name": name,
        "x": x,
        "y": y,
        "line": {"color": color},
        "marker": {"color": color, "size": 4},
        "connectgaps": False,
    }
    trace.update(extra)
    return trace


def _over_time_charts(doc: dict[str, Any]) -> list[Chart]:
    ot = doc["series"]["over_time"]
    x = _time_axis(doc)
    latency = [
        # Markers too: a bucket with requests between two without shows as a point.
        _line("mean TTFT", x, ot["mean_ttft_ms"], _PALETTE[0], mode="lines+markers"),
        _line(
            "p90 TTFT",
            x,
            ot["p90_ttft_ms"],
            _PALETTE[0],
            mode="lines+markers",
            line={"color": _PALETTE[0], "dash": "dot"},
        ),
        _line("mean E2E", x, ot["mean_e2e_latency_ms"], _PALETTE[2], mode="lines+markers"),
        _line(
            "p90 E2E",
            x,
            ot["p90_e2e_latency_ms"],
            _PALETTE[2],
            mode="lines+markers",
            line={"color": _PALETTE[2], "dash": "dot"},
        ),
    ]
    throughput = [
        _line("output tokens/s", x, ot["output_throughput_tok_s"], _PALETTE[1]),
        _line("requests/s", x, ot["request_throughput_rps"], _PALETTE[4], yaxis="y2"),
    ]
    bucket = f"{ot['bucket_ms'] / 1000.0:,.3g} s buckets of simulated time"
    return [
        Chart(
            id="latency-over-time",
            title="Latency over time",
            figure={"data": latency, "layout": _layout("simulated time (s)", "ms")},
            caption=f"Requests by arrival bucket ({bucket}); gaps: no completed request arrived then.",
        ),
        Chart(
            id="throughput-over-time",
            title="Throughput over time",
            figure={
                "data": throughput,
                "layout": _layout(
                    "simulated time (s)",
                    "output tokens/s",
                    margin={"l": 70, "r": 70, "t": 10, "b": 50},  # room for the right axis
                    yaxis2={
                        "title": {"text": "requests/s"},
                        "overlaying": "y",
                        "side": "right",
                        "rangemode": "tozero",
                    },
                ),
            },
            caption=f"Tokens as emitted (each request's evenly between its first and last token), "
            f"requests as completed; {bucket}.",
        ),
    ]


def _rank_traces(pool: dict[str, Any], key: str, x: list[float], scale: float) -> list[Figure]:
    prefix = "" if pool["name"] == "aggregated" else f"{pool['name']} "
    series = pool[key]

    def scaled(values: list[Any]) -> list[Any]:
        return [None if v is None else round(v * scale, 4) for v in values]

    if not pool["per_rank"]:
        return [
            _line(
                f"{prefix}mean over {pool['num_ranks']:,} ranks",
                x,
                scaled(series["mean"]),
                _PALETTE[0],
            ),
            _line(f"{prefix}max over ranks", x, scaled(series["max"]), _PALETTE[3]),
        ]
    return [
        _line(f"{prefix}rank {i}", x, scaled(values), _PALETTE[i % len(_PALETTE)])
        for i, values in enumerate(series)
    ]


def _pool_charts(doc: dict[str, Any]) -> list[Chart]:
    x = _time_axis(doc)
    pools = doc["series"]["pools"]
    queued = [t for pool in pools for t in _rank_traces(pool, "queued_requests", x, 1.0)]
    running = [t for pool in pools for t in _rank_traces(pool, "running_requests", x, 1.0)]
    kv = [t for pool in pools for t in _rank_traces(pool, "kv_usage_ratio", x, 100.0)]
    return [
        Chart(
            id="queue-depth",
            title="Queue depth per worker",
            figure={"data": queued, "layout": _layout("simulated time (s)", "requests waiting")},
            caption="Requests routed to each rank (worker × dp_size + rank) and not yet admitted.",
        ),
        Chart(
            id="running-requests",
            title="Running requests per worker",
            figure={"data": running, "layout": _layout("simulated time (s)", "requests running")},
            caption="Requests admitted on each rank and not yet ended.",
        ),
        Chart(
            id="kv-usage",
            title="KV usage per worker",
            figure={
                "data": kv,
                "layout": _layout("simulated time (s)", "% of the rank's KV capacity"),
            },
            caption="Prompt plus emitted tokens of the requests each rank holds, over its KV "
            "capacity (cached blocks of ended requests not counted).",
        ),
    ]


def _reuse_charts(doc: dict[str, Any]) -> list[Chart]:
    ot = doc["series"]["over_time"]
    x = _time_axis(doc)
    over_time = _line(
        "reused share of input tokens",
        x,
        [
            None if v is None else round(v * 100.0, 4)
            for v in ot["first_admission_prefix_reuse_ratio"]
        ],
        _PALETTE[2],
        mode="lines+markers",
    )
    bars = []
    for i, pool in enumerate(p for p in doc["series"]["pools"] if p["name"] != "decode"):
        ratios = pool["prefix_reuse_ratio"]
        if isinstance(ratios, dict):  # a large pool: min, mean and max over its ranks
            names = [
                f"{pool['name']} {stat} over {ratios['ranks']:,} ranks"
                for stat in ("min", "mean", "max")
            ]
            values = [ratios.get(stat) for stat in ("min", "mean", "max")]
        else:
            names = [f"{pool['name'][0]}{r}" for r in range(len(ratios))]
            values = ratios
        bars.append(
            {
                "type": "bar",
                "name": f"{pool['name']} ranks",
                "x": names,
                "y": [None if v is None else round(v * 100.0, 4) for v in values],
                "marker": {"color": _PALETTE[(i + 2) % len(_PALETTE)]},
            }
        )
    return [
        Chart(
            id="prefix-reuse-over-time",
            title="Prefix reuse over time",
            figure={
                "data": [over_time],
                "layout": _layout("simulated time (s)", "% of input tokens", showlegend=False),
            },
            caption="Cached prompt tokens at first admission, over the prompt tokens of the "
            "requests first admitted in each bucket.",
        ),
        Chart(
            id="prefix-reuse-per-worker",
            title="Prefix reuse per worker",
            figure={"data": bars, "layout": _layout("rank", "% of input tokens", showlegend=False)},
            caption="Completed requests' cached prompt tokens at first admission, per rank.",
        ),
    ]


def _transfer_charts(doc: dict[str, Any]) -> list[Chart]:
    transfers = doc["series"].get("transfers")
    if transfers is None:
        return []
    return [
        Chart(
            id="pd-transfers",
            title="Prefill → decode handoff",
            figure={
                "data": [
                    _cdf_trace(
                        "KV transfer (destination reserved → activated)",
                        transfers["kv_transfer_ms"],
                        _PALETTE[0],
                    ),
                    _cdf_trace(
                        "handoff (prefill done → decode admitted)",
                        transfers["handoff_ms"],
                        _PALETTE[3],
                    ),
                ],
                "layout": _layout("ms", "percentile of completed requests"),
            },
            caption="Disaggregated run: each completed request's KV move and whole handoff.",
        )
    ]


CHARTS: list[ChartBuilder] = [
    _distribution_charts,
    _over_time_charts,
    _pool_charts,
    _reuse_charts,
    _transfer_charts,
]
"""The page's sections, in order; each builder returns its charts (or none)."""


def charts(document: dict[str, Any]) -> list[Chart]:
    """Every chart the page of ``document`` shows, in page order."""
    return [chart for build in CHARTS for chart in build(document)]


@cache
def plotly_js() -> str:
    """plotly.js, as the ``plotly`` wheel ships it (minified)."""
    return (resources.files("plotly") / "package_data" / "plotly.min.js").read_text(
        encoding="utf-8"
    )


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.1rem; margin: 0 0 .3rem 0; }
pre.terminal { font-family: ui-monospace, monospace; font-size: 12px; background: #fafafa;
  border: 1px solid #ddd; padding: .8rem; overflow-x: auto; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 1rem; }
.chart { border: 1px solid #ddd; border-radius: 6px; padding: .6rem; }
.caption { color: #555; font-size: .85rem; margin: .3rem 0 0 0; }
"""

_SCRIPT = """
(function () {
  var doc = JSON.parse(document.getElementById("servesim-data").textContent);
  doc.charts.forEach(function (chart) {
    var el = document.getElementById(chart.id);
    Plotly.newPlot(el, chart.figure.data, chart.figure.layout,
                   {displaylogo: false, responsive: true}).then(function () {
      el.setAttribute("data-rendered", "true");
    });
  });
})();
"""


def _json_for_script(value: Any) -> str:
    # Inside <script>, "</" could close the element early: JSON allows "\\/" for "/".
    return json.dumps(value, sort_keys=True, separators=(",", ":")).replace("</", "<\\/")


SIMULATOR_SPEED_KEYS = ("wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s")
"""Summary keys that measure the simulator, not the run: left off the page, so the same
inputs and seed give the same page, byte for byte."""


def render_html(document: dict[str, Any]) -> str:
    """The page of a report document (``{"summary", "run", "series"}``)."""
    summary = {k: v for k, v in document["summary"].items() if k not in SIMULATOR_SPEED_KEYS}
    document = {**document, "summary": summary}
    page_charts = charts(document)
    payload = {
        "report": document,
        "charts": [{"id": c.id, "figure": c.figure} for c in page_charts],
    }
    sections = "\n".join(
        f'<div class="chart"><h2>{html.escape(c.title)}</h2><div id="{c.id}" class="plot"></div>'
        f'<p class="caption">{html.escape(c.caption)}</p></div>'
        for c in page_charts
    )
    title = f"servesim report · {document['run']['workload'].get('trace', 'synthetic workload')}"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n"
        f'<script id="plotly-js">{plotly_js()}</script>\n</head>\n<body>\n'
        f"<h1>{html.escape(title)}</h1>\n{terminal_html(document)}\n"
        f'<div class="grid">\n{sections}\n</div>\n'
        f'<script type="application/json" id="servesim-data">{_json_for_script(payload)}</script>\n'
        f"<script>{_SCRIPT}</script>\n</body>\n</html>\n"
    )


def write_html(path: Path, document: dict[str, Any]) -> None:
    """Write the page of ``document`` whole (see :func:`render_html`)."""
    atomic_write(path, [render_html(document)])
