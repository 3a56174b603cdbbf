"""Trace formats: one reader per ``--trace-format``, all behind :func:`read_trace`.

Each reader turns its files into either sessions (turns that run one after
another, released by :class:`~servesim.workload.admission.AdmissionQueue`) or
an agentic graph (released by :class:`~servesim.workload.agentic.AgenticQueue`).
The formats and their rules are those of the reference (Dynamo 1.6.1):

=========================  ============================================  =====================
format                     reader                                        yields
=========================  ============================================  =====================
mooncake                   :mod:`servesim.workload.mooncake`             sessions
mooncake-delta             :mod:`servesim.workload.delta`                sessions
applied_compute_agentic    :mod:`servesim.workload.delta`                sessions (closed loop)
agentic_mooncake           :mod:`servesim.workload.agentic_mooncake`     graph
dynamo                     :mod:`servesim.workload.dynamo_trace`         sessions or graph
=========================  ============================================  =====================
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from servesim.errors import ConfigError
from servesim.workload.mooncake import read_mooncake
from servesim.workload.request import Session

if TYPE_CHECKING:
    from servesim.workload.agentic import AgenticGraph

FORMATS = ("mooncake", "mooncake-delta", "applied_compute_agentic", "agentic_mooncake", "dynamo")
"""The trace formats servesim reads, the default first."""

CSV_FORMATS = ("azure", "burstgpt")
"""Public trace CSVs ``servesim trace convert`` reads (besides servesim's own formats)."""

ALIASES = {"mooncake_delta": "mooncake-delta", "agentic-mooncake": "agentic_mooncake"}
"""Other spellings the reference accepts."""

DEFAULT_TRACE_BLOCK_SIZE = 512
"""Tokens per hash id when neither the flag nor the trace says."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceOptions:
    """How to read a trace (the ``--trace-*`` flags and the run's loop)."""

    trace_format: str = "mooncake"
    trace_block_size: int | None = None
    shared_prefix_ratio: float = 0.0
    num_prefix_groups: int = 0
    closed_loop: bool = False


def canonical_format(name: str) -> str:
    """The format's canonical name.

    Raises:
        ConfigError: an unknown format.
    """
    name = ALIASES.get(name, name)
    if name not in FORMATS:
        raise ConfigError(f"unknown trace format '{name}'; expected one of {', '.join(FORMATS)}")
    return name


def read_trace(paths: list[Path], options: TraceOptions) -> list[Session] | AgenticGraph:
    """Read the trace files in their format.

    Raises:
        ConfigError: a format that does not take this many files or this loop.
        TraceError: the first problem in the files, naming file and line.
    """
    fmt = canonical_format(options.trace_format)
    if fmt != "dynamo" and len(paths) != 1:
        raise ConfigError(f"--trace-format={fmt} requires exactly one trace file, got {len(paths)}")
    if not paths:
        raise ConfigError("--trace-format=dynamo requires at least one trace file")
    tbs = options.trace_block_size
    mooncake_tbs = DEFAULT_TRACE_BLOCK_SIZE if tbs is None else tbs
    # The other formats' readers load when their format is read: most runs read a
    # Mooncake trace or none, and those modules cost 1.3% of a one-request run.
    if fmt == "mooncake":
        return read_mooncake(
            paths[0], trace_block_size=mooncake_tbs, need_timestamps=not options.closed_loop
        )
    if fmt == "mooncake-delta":
        from servesim.workload.delta import read_mooncake_delta

        return read_mooncake_delta(
            paths[0], trace_block_size=mooncake_tbs, need_timestamps=not options.closed_loop
        )
    if fmt == "applied_compute_agentic":
        if not options.closed_loop:
            raise ConfigError(
                "--trace-format=applied_compute_agentic requires --replay-concurrency because "
                "the source traces do not include first-turn timestamps"
            )
        from servesim.workload.delta import read_applied_compute

        return read_applied_compute(
            paths[0],
            trace_block_size=mooncake_tbs,
            shared_prefix_ratio=options.shared_prefix_ratio,
            num_prefix_groups=options.num_prefix_groups,
        )
    if fmt == "agentic_mooncake":
        from servesim.workload.agentic_mooncake import read_agentic_mooncake

        return read_agentic_mooncake(paths[0])
    from servesim.workload.dynamo_trace import dynamo_graph, dynamo_sessions, read_dynamo

    trace = read_dynamo(paths, trace_block_size=tbs)
    return dynamo_graph(trace) if trace.agentic else dynamo_sessions(trace)
