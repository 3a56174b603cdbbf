"""The trace toolkit behind ``servesim trace stats`` and ``servesim trace convert``.

``stats`` describes a trace in any format servesim reads: requests and
sessions, input and output length percentiles, *reuse potential* (the share
of prompt tokens an unbounded prefix cache could serve: leading trace blocks
whose content some earlier request already had) and arrivals over time.

``convert`` writes Mooncake JSONL from

- any session format servesim reads (``mooncake``, ``mooncake-delta``,
  ``applied_compute_agentic``, a ``dynamo`` trace without agent tool calls):
  one row per request with its *whole* prompt; a prompt block's hash id
  stands for its content (equal prefix, equal id), a trailing part block
  gets an id of its own; later turns keep their think time as ``delay``;
- an Azure LLM inference trace CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``,
  the 2023/2024 Azure public dataset);
- a BurstGPT CSV (``Timestamp,Model,Request tokens,Response tokens,...``).

The CSV traces carry lengths only, so every request gets new hash ids (no
prefix sharing). CSV input is converted as it is read, row by row.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import IO, Any, cast

from servesim.errors import TraceError
from servesim.metrics.stats import describe
from servesim.workload.agentic import AgenticGraph
from servesim.workload.formats import CSV_FORMATS, TraceOptions, canonical_format, read_trace
from servesim.workload.mooncake import label, open_trace
from servesim.workload.request import RequestSpec, Session, TracePrompt

_BUCKETS = 10


def _block_ids(
    spec: RequestSpec, block_size: int, interner: dict[int, int], *, direct: bool
) -> list[int]:
    """Hash ids of the prompt in blocks of ``block_size`` tokens.

    ``direct``: every prompt of the trace is a trace prompt of this block size,
    so its own (dense) ids are kept, part blocks included. Otherwise one id
    per distinct content (chained) and a trailing part block a new id.
    """
    prompt = spec.prompt
    if direct:
        assert isinstance(prompt, TracePrompt)
        return list(prompt.tokens)
    full = prompt.length // block_size
    ids = [interner.setdefault(h, len(interner)) for h in prompt.sequence_hashes(block_size, full)]
    if prompt.length % block_size:
        ids.append(interner.setdefault(-1 - len(interner), len(interner)))
    return ids


def _requests(workload: list[Session] | AgenticGraph) -> Iterator[tuple[RequestSpec, float | None]]:
    """Each request with its arrival when the trace fixes it (first turns, graph roots)."""
    if isinstance(workload, AgenticGraph):
        for node in workload.nodes:
            yield node.spec, None if node.dependencies else node.not_before_ms
        return
    for session in workload:
        for k, spec in enumerate(session.turns):
            yield spec, session.start_ms if k == 0 else None


def trace_stats(paths: list[Path], options: TraceOptions, *, block_size: int = 0) -> dict[str, Any]:
    """Statistics of a trace (see the module docstring).

    Args:
        paths: the trace file(s).
        options: format and reading options (as for a replay).
        block_size: block size of the reuse estimate; 0 = the trace's own block size.

    Raises:
        ConfigError, TraceError: as reading the trace for a replay would.
    """
    workload = read_trace(paths, options)
    if isinstance(workload, AgenticGraph):
        tbs = workload.block_size
        sessions = len({n.spec.session_id for n in workload.nodes})
    else:
        tbs = _session_block_size(workload, options)
        sessions = len(workload)
    bs = block_size or tbs
    seen: set[int] = set()
    isl, osl, starts = [], [], []
    total_in = reusable = 0
    for spec, arrival in _requests(workload):
        isl.append(spec.input_length)
        osl.append(spec.output_length)
        if arrival is not None:
            starts.append(arrival)
        hashes = spec.prompt.sequence_hashes(bs, spec.input_length // bs)
        hit = 0
        while hit < len(hashes) and hashes[hit] in seen:
            hit += 1
        seen.update(hashes)
        total_in += spec.input_length
        reusable += hit * bs
    out: dict[str, Any] = {
        "trace": [label(p) for p in paths],
        "format": canonical_format(options.trace_format),
        "requests": len(isl),
        "sessions": sessions,
        "trace_block_size": tbs,
        "total_input_tokens": total_in,
        "total_output_tokens": sum(osl),
        "input_length": _lengths(isl),
        "output_length": _lengths(osl),
        "reuse_block_size": bs,
        "reuse_potential": reusable / total_in if total_in else 0.0,
        "arrivals": _arrivals(starts),
    }
    if isinstance(workload, AgenticGraph):
        out["plays"] = len(workload.plays)
    return out


def _session_block_size(sessions: list[Session], options: TraceOptions) -> int:
    for session in sessions:
        prompt = session.turns[0].prompt
        if isinstance(prompt, TracePrompt):
            return prompt.trace_block_size
    return options.trace_block_size or 512


def _lengths(values: list[int]) -> dict[str, float]:
    d = describe([float(v) for v in values])
    return {k: d[k] for k in ("mean", "min", "median", "p90", "p99", "max")}


def _arrivals(starts: list[float]) -> dict[str, Any]:
    """First arrivals (sessions' first turns, graph roots) over time, in ten equal windows."""
    if not starts:
        return {"timed_requests": 0}
    origin, end = min(starts), max(starts)
    span = end - origin
    counts = [0] * _BUCKETS
    for t in starts:
        i = min(int((t - origin) / span * _BUCKETS), _BUCKETS - 1) if span > 0 else 0
        counts[i] += 1
    width_s = span / _BUCKETS / 1000.0
    return {
        "timed_requests": len(starts),
        "span_ms": span,
        "mean_rate_rps": len(starts) / (span / 1000.0) if span > 0 else None,
        "window_ms": span / _BUCKETS,
        "rate_rps_by_window": [c / width_s if width_s > 0 else None for c in counts],
    }


def render_stats(stats: dict[str, Any]) -> str:
    """The stats as the terminal shows them."""
    lines = [
        f"trace            {', '.join(stats['trace'])} ({stats['format']})",
        f"requests         {stats['requests']:,} in {stats['sessions']:,} sessions"
        + (f", {stats['plays']:,} plays" if "plays" in stats else ""),
        f"tokens           {stats['total_input_tokens']:,} in, {stats['total_output_tokens']:,} out"
        f" (trace block size {stats['trace_block_size']})",
    ]
    for name in ("input_length", "output_length"):
        d = stats[name]
        lines.append(
            f"{name.replace('_', ' '):<17}"
            + "  ".join(f"{k} {d[k]:,.1f}" for k in ("mean", "min", "median", "p90", "p99", "max"))
        )
    lines.append(
        f"reuse potential  {stats['reuse_potential']:.4f} of prompt tokens "
        f"(unbounded cache, {stats['reuse_block_size']}-token blocks)"
    )
    a = stats["arrivals"]
    if a["timed_requests"] == 0:
        lines.append("arrivals         none timed (closed-loop trace)")
    else:
        rate = a["mean_rate_rps"]
        lines.append(
            f"arrivals         {a['timed_requests']:,} over {a['span_ms'] / 1000.0:,.3f} s"
            + (f", {rate:,.2f} req/s" if rate is not None else "")
        )
        if rate is not None:
            by = a["rate_rps_by_window"]
            lines.append(
                f"rate by window   ({a['window_ms'] / 1000.0:,.3f} s each) "
                + " ".join(f"{r:,.2f}" for r in by)
            )
    return "\n".join(lines)


# ----- convert -----


def convert_to_mooncake(paths: list[Path], source: str, options: TraceOptions) -> Iterator[str]:
    """Lines of Mooncake JSONL for ``paths`` (format ``source``: one servesim reads, or a CSV
    format), produced as the input is read (CSV row by row).

    Raises:
        ConfigError, TraceError: unreadable input, or a trace Mooncake cannot express
            (raised as the lines are consumed).
    """
    if source in CSV_FORMATS:
        if len(paths) != 1:
            raise TraceError(f"--from {source} takes exactly one file, got {len(paths)}")
        yield from _csv_lines(paths[0], source, options.trace_block_size or 512)
        return
    workload = read_trace(paths, TraceOptions(**{**_fields(options), "trace_format": source}))
    if isinstance(workload, AgenticGraph):
        raise TraceError(
            "an agentic trace cannot be written as Mooncake JSONL: Mooncake rows have no "
            "dependencies between requests (replay it with --trace-format "
            f"{canonical_format(source)} instead)"
        )
    yield from _session_lines(workload, _session_block_size(workload, options))


def _csv_lines(path: Path, source: str, tbs: int) -> Iterator[str]:
    rows = _azure_rows(path) if source == "azure" else _burstgpt_rows(path)
    next_id = 0
    empty = True
    for timestamp, isl, osl in rows:
        blocks = -(-isl // tbs)
        row = {
            "timestamp": timestamp,
            "input_length": isl,
            "output_length": osl,
            "hash_ids": list(range(next_id, next_id + blocks)),
        }
        next_id += blocks
        empty = False
        yield json.dumps(row, separators=(",", ":")) + "\n"
    if empty:
        raise TraceError(f"{label(path)}: no request rows to convert")


def _fields(options: TraceOptions) -> dict[str, Any]:
    return {
        "trace_format": options.trace_format,
        "trace_block_size": options.trace_block_size,
        "shared_prefix_ratio": options.shared_prefix_ratio,
        "num_prefix_groups": options.num_prefix_groups,
        "closed_loop": options.closed_loop,
    }


def _session_lines(sessions: list[Session], tbs: int) -> Iterator[str]:
    interner: dict[int, int] = {}
    named = any(s.turns[0].session_id is not None for s in sessions)
    direct = all(
        isinstance(t.prompt, TracePrompt) and t.prompt.trace_block_size == tbs
        for s in sessions
        for t in s.turns
    )
    for index, session in enumerate(sessions):
        for k, spec in enumerate(session.turns):
            row: dict[str, Any] = {}
            if named:
                row["session_id"] = spec.session_id or f"session_{index}"
            if k == 0 and session.start_ms is not None:
                row["timestamp"] = session.start_ms
            if k > 0:
                row["delay"] = spec.delay_ms
            if spec.request_id is not None:
                row["request_id"] = spec.request_id
            row["input_length"] = spec.input_length
            row["output_length"] = spec.output_length
            row["hash_ids"] = _block_ids(spec, tbs, interner, direct=direct)
            yield json.dumps(row, separators=(",", ":")) + "\n"


def _csv(path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    import csv  # (the trace tools read CSV; a replay never does)

    name = label(path)
    with open_trace(path) as handle:
        text = io.TextIOWrapper(cast(IO[bytes], handle), encoding="utf-8", newline="")
        reader = csv.DictReader(text)
        for row in reader:
            yield f"{name}:{reader.line_num}", row


def _column(row: dict[str, str], names: tuple[str, ...], where: str) -> str:
    for name in names:
        if name in row and row[name] is not None:
            return row[name].strip()
    raise TraceError(f"{where}: missing column {names[0]!r} (columns: {', '.join(row)})")


def _tokens(text: str, column: str, where: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{where}: {column} must be a token count, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or not value.is_integer():
        raise TraceError(f"{where}: {column} must be a non-negative integer, got {text!r}")
    return int(value)


def _azure_rows(path: Path) -> Iterator[tuple[float, int, int]]:
    """(ms since the first row, input, output) of each Azure trace row with a prompt."""
    origin: datetime | None = None
    for where, row in _csv(path):
        stamp = _column(row, ("TIMESTAMP", "timestamp"), where)
        try:
            # Seven fractional digits in the public files; datetime takes six.
            head, _, frac = stamp.partition(".")
            when = datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}" if frac else head)
        except ValueError:
            raise TraceError(f"{where}: TIMESTAMP must be a date and time, got {stamp!r}") from None
        isl = _tokens(_column(row, ("ContextTokens",), where), "ContextTokens", where)
        osl = _tokens(_column(row, ("GeneratedTokens",), where), "GeneratedTokens", where)
        if origin is None:
            origin = when
        at = (when - origin).total_seconds() * 1000.0
        if at < 0:
            raise TraceError(f"{where}: rows must be in time order ({stamp!r} is before the first)")
        if isl > 0:
            yield at, isl, osl


def _burstgpt_rows(path: Path) -> Iterator[tuple[float, int, int]]:
    """(ms since the first row, input, output) of each BurstGPT row with a prompt."""
    origin: float | None = None
    for where, row in _csv(path):
        text = _column(row, ("Timestamp",), where)
        try:
            seconds = float(text)
        except ValueError:
            raise TraceError(f"{where}: Timestamp must be seconds, got {text!r}") from None
        if not math.isfinite(seconds):
            raise TraceError(f"{where}: Timestamp must be finite, got {text!r}")
        isl = _tokens(_column(row, ("Request tokens",), where), "Request tokens", where)
        osl = _tokens(_column(row, ("Response tokens",), where), "Response tokens", where)
        if origin is None:
            origin = seconds
        if seconds < origin:
            raise TraceError(f"{where}: rows must be in time order ({text} is before the first)")
        if isl > 0:
            yield (seconds - origin) * 1000.0, isl, osl
