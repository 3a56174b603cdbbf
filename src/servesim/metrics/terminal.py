"""The terminal report: what was simulated, the latency table, then what the run achieved.

Laid out from a report document (``{"summary", "run", "series"}``), so a
saved report prints the same as the run that wrote it. Three parts:

1. a header: the cluster (workers or P/D pools, engine, parallelism, block
   size, KV capacity, timing model), the router and the workload;
2. the latency table (N/A where no request gave a sample: a run whose
   requests were all rejected shows no latency rather than zeros);
3. the results: simulated duration (the makespan, distinct from the
   simulator's own wall time, shown last and dimmed), request counts,
   throughputs, goodput and SLA attainment, GPU-hours, prefix reuse; then a
   warning line for rejected or incomplete requests.

The layout is a list of lines of styled spans, written out as plain text,
with ANSI colours, or as HTML (:func:`render_text`, :func:`terminal_html`):
labels left of values wrapped at the width, and the latency table as wide
as its widest cells (a narrower terminal wraps its lines; no number is ever
split). Every run prints this, so it is built by hand: a layout library
took a run 25 ms to import and render.
"""

from __future__ import annotations

import html
from typing import Any

Span = tuple[str, str]
"""Text and its style: space-separated ``bold``, ``dim``, ``red``, or empty."""
Line = list[Span]

_ANSI = {"bold": "1", "dim": "2", "red": "31"}
_CSS = {"bold": "font-weight: bold", "dim": "opacity: 0.6", "red": "color: #800000"}
_ALERT = "bold red"

_LATENCY_ROWS = (
    ("Time to first token (ms)", "ttft_ms", "num_ttft_samples"),
    ("Time to second token (ms)", "ttst_ms", "num_tpot_samples"),
    ("Inter-token latency (ms)", "itl_ms", "num_tpot_samples"),
    ("End-to-end latency (ms)", "e2e_latency_ms", "num_e2e_latency_samples"),
    ("Output tokens/s per user", "output_token_throughput_per_user", "num_tpot_samples"),
)
"""(label, summary key stem, the sample count that says whether the row has data)."""
_COLUMNS = (("avg", "mean"), ("min", "min"), ("p50", "median"), ("p90", "p90"), ("p99", "p99"),
            ("max", "max"))  # fmt: skip


def _num(value: Any, digits: int = 2) -> str:
    return "N/A" if value is None else f"{value:,.{digits}f}"


def _cell(value: Any) -> str:
    """A latency cell: two decimals below 10,000, whole numbers above (the table stays narrow)."""
    if value is None:
        return "N/A"
    return f"{value:,.0f}" if abs(value) >= 10_000 else f"{value:,.2f}"


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "N/A"


def _pool_line(pool: dict[str, Any]) -> str:
    workers = pool["workers"]
    role = pool["role"]
    what = (
        _count(workers, "worker")
        if role == "aggregated"
        else f"{role} pool: {_count(workers, 'worker')}"
    )
    gpus = workers * pool["gpus_per_worker"]
    parallel = f"DP {pool['dp_size']} × TP {pool['tensor_parallel_size']} per worker"
    return f"{what} · {pool['backend']} · {_count(gpus, 'GPU')} ({parallel})"


def _per_pool(pools: list[dict[str, Any]], parts: list[str]) -> str:
    """One description for every pool when they agree, else each pool's, named."""
    if len(set(parts)) == 1:
        return parts[0]
    return "; ".join(f"{pool['role']}: {part}" for pool, part in zip(pools, parts, strict=True))


def _kv_line(pools: list[dict[str, Any]]) -> str:
    parts = []
    for pool in pools:
        text = (
            f"{pool['kv_capacity_tokens_per_rank']:,} tokens per rank "
            f"({pool['num_gpu_blocks']:,} blocks of {pool['block_size']})"
        )
        offload = [
            t for t, on in (("host", pool["host_offload"]), ("disk", pool["disk_offload"])) if on
        ]
        if offload:
            text += f" + {' and '.join(offload)} offload"
        parts.append(text)
    return _per_pool(pools, parts)


def _timing_line(pools: list[dict[str, Any]]) -> str:
    parts = []
    for pool in pools:
        speed = ""
        if pool["speedup_ratio"] != 1.0 or pool["decode_speedup_ratio"] != 1.0:
            speed = f", speed-up ×{pool['speedup_ratio']:g} (decode ×{pool['speedup_ratio'] * pool['decode_speedup_ratio']:g})"
        parts.append(f"{pool['timing_model']}{speed}")
    return _per_pool(pools, parts)


def _workload_line(run: dict[str, Any], summary: dict[str, Any]) -> str:
    w = run["workload"]
    requests = _count(w["requests"], "request")
    if w["kind"] == "trace":
        text = f"trace {w['trace']}: {requests}"
        if w["sessions"] != w["requests"]:
            text += f" in {_count(w['sessions'], 'session')}"
        if w["arrival_speedup_ratio"] != 1.0:
            text += f", arrivals ×{w['arrival_speedup_ratio']:g} faster"
    else:
        text = f"synthetic: {requests} of {w['input_tokens']:,} → {w['output_tokens']:,} tokens"
        if w["turns_per_session"] > 1:
            text += f" in {_count(w['sessions'], 'session')}"
        if w["request_rate"] is not None:
            text += f", Poisson {w['request_rate']:g} req/s"
        elif w["arrival_interval_ms"] is not None:
            text += f", one every {w['arrival_interval_ms']:g} ms"
    if w["replay_concurrency"] is not None:
        text += f", closed loop of {w['replay_concurrency']} in flight"
    return text


def _router_line(run: dict[str, Any]) -> str:
    router = run["router"]
    text = str(router["mode"])
    if router["mode"] == "kv_router":
        if router["session_affinity"] != "disabled":
            text += f", session affinity {router['session_affinity']}"
        if router["kv_event_lag_ms"]:
            text += f", KV events {router['kv_event_lag_ms']:g} ms late"
    return text


def _header(run: dict[str, Any], summary: dict[str, Any], width: int) -> list[Line]:
    rows = [
        ("Cluster" if pool is run["pools"][0] else "", _pool_line(pool)) for pool in run["pools"]
    ]
    rows += [
        ("KV cache", _kv_line(run["pools"])),
        ("Router", _router_line(run)),
        ("Timing", _timing_line(run["pools"])),
        ("Workload", _workload_line(run, summary)),
    ]
    title = f"servesim {run['servesim_version']} · simulated serving run"
    return [[(title, "bold")], *_grid([((label, ""), [(text, "")]) for label, text in rows], width)]


def _latency_table(summary: dict[str, Any]) -> list[Line]:
    """The latency rows under a heavy-ruled head: the label column left-aligned, the
    statistics right-aligned, each column as wide as its widest cell."""
    rows = [["Latency", *(label for label, _ in _COLUMNS)]]
    for label, key, samples in _LATENCY_ROWS:
        if f"mean_{key}" not in summary:
            continue
        have = summary.get(samples, 0) > 0
        rows.append(
            [
                label,
                *(_cell(summary.get(f"{stat}_{key}")) if have else "N/A" for _, stat in _COLUMNS),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]

    def rule(left: str, fill: str, cross: str, right: str) -> Line:
        return [(left + cross.join(fill * (w + 2) for w in widths) + right, "")]

    def cells(row: list[str], bar: str, style: str) -> Line:
        line: Line = [(bar, "")]
        for i, (text, w) in enumerate(zip(row, widths, strict=True)):
            line += [(" " + (text.ljust(w) if i == 0 else text.rjust(w)) + " ", style), (bar, "")]
        return line

    return [
        rule("┏", "━", "┳", "┓"),
        cells(rows[0], "┃", "bold"),
        rule("┡", "━", "╇", "┩"),
        *(cells(row, "│", "") for row in rows[1:]),
        rule("└", "─", "┴", "┘"),
    ]


def _results(
    summary: dict[str, Any], run: dict[str, Any], planner: dict[str, Any] | None, width: int
) -> list[Line]:
    s = summary
    duration = f"{s['duration_ms'] / 1000.0:,.2f} s simulated (first arrival to last completion)"
    if run.get("time_limited") and run.get("max_sim_time_ms") is not None:
        duration += f"; the run stopped at its limit, {run['max_sim_time_ms'] / 1000.0:,.2f} s"
    rows: list[tuple[Span, Line]] = [
        (("Duration", ""), [(duration, "")]),
        (("Requests", ""), _requests_text(s, run)),
        (
            ("Throughput", ""),
            [
                (
                    f"{_num(s['request_throughput_rps'])} req/s · output "
                    f"{_num(s['output_throughput_tok_s'], 1)} tok/s · input "
                    f"{_num(s['input_throughput_tok_s'], 1)} tok/s",
                    "",
                )
            ],
        ),
    ]
    if "goodput_completed_requests" in s:
        rows.append((("Goodput", ""), [(_goodput_text(s, run), "")]))
    rows.append((("GPU-hours", ""), [(_gpu_text(s), "")]))
    if planner is not None:
        rows.append((("Planner", ""), [(_planner_text(planner), "")]))
    reuse = (
        f"{_pct(s['prefix_cache_reused_ratio'], 1.0)} of input tokens served from cache "
        f"({_pct(s['first_admission_prefix_cache_reused_ratio'], 1.0)} at first admission)"
    )
    rows.append((("Prefix reuse", ""), [(reuse, "")]))
    if s.get("router_queued_requests"):
        queue = (
            f"{_count(s['router_queued_requests'], 'request')} waited, "
            f"mean {_num(s['mean_router_queue_wait_ms'])} ms, max {_num(s['max_router_queue_wait_ms'])} ms"
        )
        rows.append((("Router queue", ""), [(queue, "")]))
    if "wall_time_ms" in s:  # not on the HTML page, which stays the same run after run
        wall = (
            f"wall time {s['wall_time_ms'] / 1000.0:,.2f} s (the simulator's own run time, not "
            f"the served duration) · {_num(s['processed_tokens_per_s'], 0)} tokens simulated per second"
        )
        rows.append((("Simulator", "dim"), [(wall, "dim")]))
    return _grid(rows, width)


def _requests_text(s: dict[str, Any], run: dict[str, Any]) -> Line:
    line: Line = [(f"{s['num_requests']:,} arrived · {s['completed_requests']:,} completed", "")]
    for key, word in (("rejected_requests", "rejected"), ("incomplete_requests", "incomplete")):
        n = s.get(key, 0)
        line += [(" · ", ""), (f"{n:,} {word}", _ALERT if n else "")]
    unreleased = run["workload"]["requests"] - s["num_requests"]
    if unreleased > 0:
        line += [(" · ", ""), (f"{unreleased:,} never arrived (time limit)", _ALERT)]
    return line


def _goodput_text(s: dict[str, Any], run: dict[str, Any]) -> str:
    bounds = run.get("sla", {})
    names = {"ttft_ms": "TTFT", "itl_ms": "ITL", "e2e_ms": "E2E"}
    sla = ", ".join(f"{names[k]} ≤ {v:g} ms" for k, v in bounds.items() if k in names)
    good = s["goodput_completed_requests"]
    return (
        f"{good:,} of {s['completed_requests']:,} completed met the SLA ({sla}): "
        f"{_pct(good, s['completed_requests'])} attainment, {_pct(good, s['num_requests'])} of all "
        f"arrived · {_num(s['goodput_request_throughput_rps'])} req/s · "
        f"{_num(s['goodput_output_throughput_tok_s'], 1)} output tok/s"
    )


def _gpu_text(s: dict[str, Any]) -> str:
    parts = []
    disaggregated = bool(s["prefill_worker_seconds"])
    for pool in ("prefill", "decode"):
        gpus = s[f"{pool}_gpus_per_worker"]
        seconds = s[f"{pool}_worker_seconds"]
        if gpus and seconds:
            name = f"{pool}: " if disaggregated else ""
            parts.append(f"{name}{seconds:,.1f} worker-seconds × {_count(gpus, 'GPU')} per worker")
    return f"{s['gpu_hours']:,.4f}" + (f" ({'; '.join(parts)})" if parts else "")


def _planner_text(planner: dict[str, Any]) -> str:
    meta = planner["metadata"]
    events = planner["scaling_events"]
    ups = sum(1 for e in events if e["reason"] == "scale_up")
    return (
        f"{meta.get('optimization_target', '?')} target ({meta['mode']}): "
        f"{_count(planner['total_ticks'], 'tick')}, {_count(ups, 'scale-up')}, "
        f"{_count(len(events) - ups, 'scale-down')}"
    )


def _warnings(summary: dict[str, Any], run: dict[str, Any]) -> list[str]:
    out = []
    arrived = summary["num_requests"]
    rejected = summary.get("rejected_requests", 0)
    incomplete = summary.get("incomplete_requests", 0)
    if rejected:
        out.append(
            f"! {rejected:,} of {_count(arrived, 'request')} {'was' if rejected == 1 else 'were'} "
            "rejected: a prompt that can never fit in a worker's KV cache is dropped (more "
            "num_gpu_blocks, or shorter requests, avoid it). Latencies and throughputs above "
            "count completed requests only."
        )
    if incomplete:
        why = (
            "the run stopped at its simulated time limit (--max-sim-time-seconds) first"
            if run.get("time_limited")
            else "they never ended"
        )
        out.append(
            f"! {incomplete:,} of {_count(arrived, 'request')} "
            f"{'is' if incomplete == 1 else 'are'} incomplete: {why}."
        )
    if arrived and not summary["completed_requests"]:
        out.append("! No request completed: there is no latency to report.")
    return out


def report_lines(document: dict[str, Any], width: int = 100) -> list[Line]:
    """The report laid out ``width`` columns wide, line by line (a document that lacks a
    key it needs raises KeyError)."""
    summary, run = document["summary"], document["run"]
    lines = _header(run, summary, width)
    lines.append([])
    lines += _latency_table(summary)
    lines += _results(summary, run, document.get("planner"), width)
    for warning in _warnings(summary, run):
        lines += [[(warning[start:end], _ALERT)] for start, end in _wrap(warning, width)]
    return lines


def render_text(document: dict[str, Any], *, width: int = 100, color: bool = False) -> str:
    """The report as text ``width`` columns wide (with ANSI colours when ``color``)."""

    def span(text: str, style: str) -> str:
        if not (color and style):
            return text
        codes = ";".join(_ANSI[name] for name in style.split())
        return f"\x1b[{codes}m{text}\x1b[0m"

    return "\n".join(
        "".join(span(text, style) for text, style in line) for line in report_lines(document, width)
    )


def terminal_html(document: dict[str, Any], *, width: int = 110) -> str:
    """The report as a ``<pre class="terminal">`` block, its styles inline."""

    def span(text: str, style: str) -> str:
        escaped = html.escape(text)
        if not style:
            return escaped
        css = "; ".join(_CSS[name] for name in style.split())
        return f'<span style="{css}">{escaped}</span>'

    body = "\n".join(
        "".join(span(text, style) for text, style in line) for line in report_lines(document, width)
    )
    return f'<pre class="terminal">{body}</pre>'


def _grid(rows: list[tuple[Span, Line]], width: int) -> list[Line]:
    """Labels (bold) in a column as wide as the longest, two spaces, then each value wrapped
    at ``width`` under its first line."""
    indent = max(len(label) for (label, _), _ in rows) + 2
    lines: list[Line] = []
    for (label, label_style), value in rows:
        head: Span = (label.ljust(indent), f"bold {label_style}".strip())
        for k, part in enumerate(_wrap_spans(value, width - indent)):
            lines.append([head if k == 0 else (" " * indent, ""), *part])
    return lines


def _wrap(text: str, width: int) -> list[tuple[int, int]]:
    """Where ``text`` breaks into lines of at most ``width``: at the last space that fits
    (dropped), or inside a longer word. Each line as (start, end) offsets."""
    lines = []
    start, n = 0, len(text)
    while n - start > width:
        space = text.rfind(" ", start, start + width + 1)
        if space > start:
            lines.append((start, space))
            start = space + 1
        else:
            lines.append((start, start + width))
            start += width
    lines.append((start, n))
    return lines


def _wrap_spans(line: Line, width: int) -> list[Line]:
    """A line's text broken as :func:`_wrap` breaks it, each piece keeping its spans' styles."""
    text = "".join(part for part, _ in line)
    out: list[Line] = []
    for start, end in _wrap(text, width):
        piece: Line = []
        offset = 0
        for part, style in line:
            lo, hi = max(start, offset), min(end, offset + len(part))
            if lo < hi:
                piece.append((part[lo - offset : hi - offset], style))
            offset += len(part)
        out.append(piece)
    return out
