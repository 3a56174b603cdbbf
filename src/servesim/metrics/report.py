"""Report outputs: the JSON summary, per-request JSONL and the AIPerf-style table."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from servesim.metrics.collector import RequestRecord, latencies


def _uuid(uid: int) -> str:
    # Deterministic ids in the reference's synthetic format (1-based).
    return f"00000000-0000-0000-0000-{uid + 1:012x}"


def request_row(r: RequestRecord) -> dict[str, Any]:
    """One per-request JSONL record (reference field names)."""
    lat = latencies(r)
    row: dict[str, Any] = {
        "uuid": _uuid(r.uid),
        "session_id": r.session_id,
        "turn_index": r.turn_index,
        "arrival_time_ms": r.arrival_ms,
        "first_admit_ms": r.first_admit_ms,
        "first_token_ms": r.first_token_ms,
        "last_token_ms": r.last_token_ms,
        "terminal_time_ms": r.terminal_ms,
        "ttft_ms": lat.ttft,
        "ttst_ms": lat.ttst,
        "e2e_latency_ms": lat.e2e,
        "itl_ms": lat.tpot,
        "input_length": r.input_length,
        "requested_output_length": r.requested_output,
        "output_length": r.num_tokens,
        "reused_input_tokens": r.reused,
        "first_admission_reused_input_tokens": r.first_reused,
        # Scheduler ids (worker x dp_size + rank), as the reference writes them.
        "prefill_worker_idx": r.prefill_scheduler,
        "decode_worker_idx": r.scheduler,
        "prefill_admit_ms": r.prefill_admit_ms,
        "source_held_ms": r.source_held_ms,
        "destination_reserved_ms": r.destination_reserved_ms,
        "destination_activated_ms": r.destination_activated_ms,
        "decode_admit_ms": r.decode_admit_ms,
        "source_released_ms": r.source_released_ms,
        "decode_reused_input_tokens": r.decode_reused,
        "selected_overlap_blocks": r.overlap_blocks,
        "best_available_overlap_blocks": r.best_overlap_blocks,
        "queue_wait_ms": r.queue_wait_ms,
        "dp_rank": r.dp_rank,
        "terminal_status": r.terminal.value if r.terminal is not None else "incomplete",
    }
    if r.request_id is not None:
        row["request_id"] = r.request_id
    if r.play_id is not None:
        row["play_id"] = r.play_id
    if r.agentic is not None:
        row["agentic"] = r.agentic
        # An agentic request is dispatched when its dependencies release it: its arrival.
        row["dispatched_at_ms"] = r.arrival_ms
    if r.first_host_reused is not None:
        # With a host tier: where the first admission's reused prefix came from.
        row["first_admission_g1_reused_input_tokens"] = r.first_reused - r.first_host_reused
        row["first_admission_host_reused_input_tokens"] = r.first_host_reused
    return row


def _atomic_write(path: Path, chunks: Iterable[str]) -> None:
    """Write a file whole or not at all (no partial report is ever left behind).

    A path that exists and is not a regular file (``/dev/stdout``, a pipe) is
    written in place. Raises OSError when the path cannot be written.
    """
    if path.exists() and not path.is_file():
        with path.open("w", encoding="utf-8") as handle:
            handle.writelines(chunks)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.writelines(chunks)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as an ordinary new file (mkstemp makes it private)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_lines(path: Path, lines: Iterable[str]) -> None:
    """Write ``lines`` to ``path`` as they come, whole or not at all (see :func:`_atomic_write`)."""
    _atomic_write(path, lines)


def write_report_json(path: Path, summary: dict[str, Any]) -> None:
    """``{"summary": {...}}`` with sorted keys."""
    _atomic_write(path, [json.dumps({"summary": summary}, indent=2, sort_keys=True), "\n"])


def write_requests_jsonl(path: Path, records: list[RequestRecord]) -> None:
    """One line per request, by arrival then uid."""
    ordered = sorted(records, key=lambda r: (r.arrival_ms, r.uid))
    _atomic_write(path, (json.dumps(request_row(r), sort_keys=True) + "\n" for r in ordered))


_ROWS = (
    ("Time to First Token (ms)", "ttft_ms"),
    ("Time to Second Token (ms)", "ttst_ms"),
    ("Request Latency (ms)", "e2e_latency_ms"),
    ("Inter Token Latency (ms)", "itl_ms"),
    ("Output Token Throughput Per User (tokens/sec/user)", "output_token_throughput_per_user"),
)
_SCALARS = (
    ("Output Token Throughput (tokens/sec)", "output_throughput_tok_s"),
    ("Request Throughput (requests/sec)", "request_throughput_rps"),
    ("Request Count (requests)", "completed_requests"),
)
_COLUMNS = ("avg", "min", "max", "p99", "p90", "p75", "std")
_STATS = ("mean", "min", "max", "p99", "p90", "p75", "std")


def _fmt(value: Any) -> str:
    # As the reference prints them: two decimals, counts included.
    return "N/A" if value is None else f"{value:,.2f}"


def render_table(summary: dict[str, Any]) -> str:
    """The AIPerf-style box table of the main metrics, in the reference's text."""
    rows: list[list[str]] = []
    for label, key in _ROWS:
        if f"mean_{key}" in summary:
            rows.append([label, *(_fmt(summary.get(f"{s}_{key}")) for s in _STATS)])
    for label, key in _SCALARS:
        rows.append([label, _fmt(summary.get(key)), *(["N/A"] * 6)])
    header = ["Metric", *_COLUMNS]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(left: str, mid: str, right: str, fill: str) -> str:
        return left + mid.join(fill * (w + 2) for w in widths) + right

    def cells(values: list[str], border: str) -> str:
        parts = [f" {values[0]:<{widths[0]}} "] + [
            f" {v:>{w}} " for v, w in zip(values[1:], widths[1:], strict=True)
        ]
        return border + border.join(parts) + border

    out = [
        "NVIDIA AIPerf | LLM Metrics",
        line("┏", "┳", "┓", "━"),
        cells(header, "┃"),
        line("┡", "╇", "┩", "━"),
    ]
    out += [cells(r, "┃") for r in rows]
    out.append(line("└", "┴", "┘", "━"))
    out.append(f"Wall Time (ms): {summary['wall_time_ms']:,.2f}")
    out.append(f"Prefix Cache Reused Ratio: {summary['prefix_cache_reused_ratio']:.2f}")
    out.append(
        f"First Admission Prefix Cache Reused Ratio: {summary['first_admission_prefix_cache_reused_ratio']:.2f}"
    )
    return "\n".join(out)
