"""The terminal report: what was simulated, the latency table, then what the run achieved.

Built with ``rich`` from a report document (``{"summary", "run", "series"}``),
so a saved report prints the same as the run that wrote it. Three parts:

1. a header: the cluster (workers or P/D pools, engine, parallelism, block
   size, KV capacity, timing model), the router and the workload;
2. the latency table (N/A where no request gave a sample: a run whose
   requests were all rejected shows no latency rather than zeros);
3. the results: simulated duration (the makespan, distinct from the
   simulator's own wall time, shown last and dimmed), request counts,
   throughputs, goodput and SLA attainment, GPU-hours, prefix reuse; then a
   warning line for rejected or incomplete requests.
"""

from __future__ import annotations

import io
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

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


def _header(run: dict[str, Any], summary: dict[str, Any]) -> RenderableType:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for pool in run["pools"]:
        grid.add_row("Cluster" if pool is run["pools"][0] else "", _pool_line(pool))
    grid.add_row("KV cache", _kv_line(run["pools"]))
    grid.add_row("Router", _router_line(run))
    grid.add_row("Timing", _timing_line(run["pools"]))
    grid.add_row("Workload", _workload_line(run, summary))
    title = Text(f"servesim {run['servesim_version']} · simulated serving run", style="bold")
    return Group(title, grid)


def _latency_table(summary: dict[str, Any]) -> Table:
    table = Table(box=box.HEAVY_HEAD, title=None, show_edge=True, pad_edge=True)
    table.add_column("Latency", justify="left", no_wrap=True)
    for label, _ in _COLUMNS:
        table.add_column(label, justify="right", overflow="fold")
    for label, key, samples in _LATENCY_ROWS:
        if f"mean_{key}" not in summary:
            continue
        have = summary.get(samples, 0) > 0
        table.add_row(
            label, *(_cell(summary.get(f"{stat}_{key}")) if have else "N/A" for _, stat in _COLUMNS)
        )
    return table


def _results(
    summary: dict[str, Any], run: dict[str, Any], planner: dict[str, Any] | None
) -> RenderableType:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    s = summary
    duration = f"{s['duration_ms'] / 1000.0:,.2f} s simulated (first arrival to last completion)"
    if run.get("time_limited") and run.get("max_sim_time_ms") is not None:
        duration += f"; the run stopped at its limit, {run['max_sim_time_ms'] / 1000.0:,.2f} s"
    grid.add_row("Duration", duration)
    grid.add_row("Requests", _requests_text(s, run))
    grid.add_row(
        "Throughput",
        f"{_num(s['request_throughput_rps'])} req/s · output {_num(s['output_throughput_tok_s'], 1)} "
        f"tok/s · input {_num(s['input_throughput_tok_s'], 1)} tok/s",
    )
    if "goodput_completed_requests" in s:
        grid.add_row("Goodput", _goodput_text(s, run))
    grid.add_row("GPU-hours", _gpu_text(s))
    if planner is not None:
        grid.add_row("Planner", _planner_text(planner))
    grid.add_row(
        "Prefix reuse",
        f"{_pct(s['prefix_cache_reused_ratio'], 1.0)} of input tokens served from cache "
        f"({_pct(s['first_admission_prefix_cache_reused_ratio'], 1.0)} at first admission)",
    )
    if s.get("router_queued_requests"):
        grid.add_row(
            "Router queue",
            f"{_count(s['router_queued_requests'], 'request')} waited, "
            f"mean {_num(s['mean_router_queue_wait_ms'])} ms, max {_num(s['max_router_queue_wait_ms'])} ms",
        )
    if "wall_time_ms" in s:  # not on the HTML page, which stays the same run after run
        grid.add_row(
            Text("Simulator", style="dim"),
            Text(
                f"wall time {s['wall_time_ms'] / 1000.0:,.2f} s (the simulator's own run time, not "
                f"the served duration) · {_num(s['processed_tokens_per_s'], 0)} tokens simulated per second",
                style="dim",
            ),
        )
    return grid


def _requests_text(s: dict[str, Any], run: dict[str, Any]) -> Text:
    text = Text(f"{s['num_requests']:,} arrived · {s['completed_requests']:,} completed")
    for key, word in (("rejected_requests", "rejected"), ("incomplete_requests", "incomplete")):
        n = s.get(key, 0)
        text.append(" · ")
        text.append(f"{n:,} {word}", style="bold red" if n else "")
    unreleased = run["workload"]["requests"] - s["num_requests"]
    if unreleased > 0:
        text.append(f" · {unreleased:,} never arrived (time limit)", style="bold red")
    return text


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


def _warnings(summary: dict[str, Any], run: dict[str, Any]) -> list[Text]:
    out = []
    arrived = summary["num_requests"]
    rejected = summary.get("rejected_requests", 0)
    incomplete = summary.get("incomplete_requests", 0)
    if rejected:
        out.append(
            Text(
                f"! {rejected:,} of {_count(arrived, 'request')} {'was' if rejected == 1 else 'were'} "
                "rejected: a prompt that can never fit in a worker's KV cache is dropped (more "
                "num_gpu_blocks, or shorter requests, avoid it). Latencies and throughputs above "
                "count completed requests only.",
                style="bold red",
            )
        )
    if incomplete:
        why = (
            "the run stopped at its simulated time limit (--max-sim-time-seconds) first"
            if run.get("time_limited")
            else "they never ended"
        )
        out.append(
            Text(
                f"! {incomplete:,} of {_count(arrived, 'request')} "
                f"{'is' if incomplete == 1 else 'are'} incomplete: {why}.",
                style="bold red",
            )
        )
    if arrived and not summary["completed_requests"]:
        out.append(Text("! No request completed: there is no latency to report.", style="bold red"))
    return out


def renderables(document: dict[str, Any]) -> list[RenderableType]:
    """The report's parts, in print order."""
    summary, run = document["summary"], document["run"]
    parts: list[RenderableType] = [
        _header(run, summary),
        Text(""),
        _latency_table(summary),
        _results(summary, run, document.get("planner")),
    ]
    parts += _warnings(summary, run)
    return parts


def print_report(document: dict[str, Any], console: Console) -> None:
    """Print the report on ``console``."""
    for part in renderables(document):
        console.print(part)


def render_text(document: dict[str, Any], *, width: int = 100, color: bool = False) -> str:
    """The report as text ``width`` columns wide (with ANSI colours when ``color``)."""
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=width,
        force_terminal=color,
        color_system="standard" if color else None,
        highlight=False,
        emoji=False,
        legacy_windows=False,
        soft_wrap=False,
    )
    print_report(document, console)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())
