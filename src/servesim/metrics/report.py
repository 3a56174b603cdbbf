"""Report files: the report JSON (summary, run, series) and the per-request JSONL."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from servesim.errors import ReportError
from servesim.metrics.collector import RequestRecord

RECORD_FIELDS = (
    "uuid",
    "session_id",
    "turn_index",
    "arrival_time_ms",
    "first_admit_ms",
    "first_token_ms",
    "last_token_ms",
    "terminal_time_ms",
    "ttft_ms",
    "ttst_ms",
    "e2e_latency_ms",
    "itl_ms",
    "input_length",
    "requested_output_length",
    "output_length",
    "reused_input_tokens",
    "first_admission_reused_input_tokens",
    "prefill_worker_idx",
    "decode_worker_idx",
    "prefill_admit_ms",
    "source_held_ms",
    "destination_reserved_ms",
    "destination_activated_ms",
    "decode_admit_ms",
    "source_released_ms",
    "decode_reused_input_tokens",
    "selected_overlap_blocks",
    "best_available_overlap_blocks",
    "queue_wait_ms",
    "dp_rank",
    "terminal_status",
)
"""The per-request JSONL fields (the reference's), each a :class:`RequestRecord` attribute."""

HOST_TIER_FIELDS = (
    "first_admission_g1_reused_input_tokens",
    "first_admission_host_reused_input_tokens",
)
"""Added to a record when its rank has a host KV tier."""


def request_row(r: RequestRecord) -> dict[str, Any]:
    """One per-request JSONL record: each field the record's attribute of the same name.

    ``*_worker_idx`` are scheduler ids (worker x dp_size + rank), as the
    reference writes them; a request that never ended is ``"incomplete"``.
    """
    row = {name: getattr(r, name) for name in RECORD_FIELDS}
    status = r.terminal_status
    row["terminal_status"] = status.value if status is not None else "incomplete"
    if r.request_id is not None:
        row["request_id"] = r.request_id
    if r.play_id is not None:
        row["play_id"] = r.play_id
    if r.agentic is not None:
        row["agentic"] = r.agentic
        # An agentic request is dispatched when its dependencies release it: its arrival.
        row["dispatched_at_ms"] = r.arrival_time_ms
    host = r.first_admission_host_reused_input_tokens
    if host is not None:
        # With a host tier: where the first admission's reused prefix came from.
        row["first_admission_g1_reused_input_tokens"] = r.first_admission_reused_input_tokens - host
        row["first_admission_host_reused_input_tokens"] = host
    return row


def atomic_write(path: Path, chunks: Iterable[str]) -> None:
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


REPORT_SECTIONS = ("summary", "run", "series")
"""The report file's top-level keys (``docs/report.md``)."""


def report_document(
    summary: dict[str, Any],
    *,
    run: dict[str, Any],
    series: dict[str, Any],
    sections: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The report file's content: the reference's ``summary``, then servesim's own sections,
    ``run`` (what was simulated) and ``series`` (what the HTML page plots), and the run's
    other sections (``provenance``, ``telemetry``, ``lifecycle_transitions``)."""
    return {"summary": summary, "run": run, "series": series, **(sections or {})}


def document_json(document: dict[str, Any]) -> str:
    """A report document as the file holds it: indent 2, sorted keys, a final newline.

    Telemetry samples are written one a line: a long run has tens of
    thousands, which the indenting encoder (pure Python) takes seconds over.
    """
    telemetry = document.get("telemetry")
    if telemetry is None:
        return json.dumps(document, indent=2, sort_keys=True) + "\n"
    marked = {**document, "telemetry": {**telemetry, "samples": _SAMPLES}}
    head, tail = json.dumps(marked, indent=2, sort_keys=True).split(json.dumps(_SAMPLES))
    lines = ",\n".join("      " + json.dumps(s, sort_keys=True) for s in telemetry["samples"])
    return "".join([head, "[\n", lines, "\n    ]" if lines else "]", tail, "\n"])


# Where the samples go in a report's text (no report value is a string like it).
_SAMPLES = "\u0000telemetry samples\u0000"


def write_samples_jsonl(path: Path, samples: list[dict[str, Any]]) -> None:
    """Telemetry samples, one a line (``--telemetry-jsonl``)."""
    atomic_write(path, (json.dumps(s, sort_keys=True) + "\n" for s in samples))


def write_report_json(path: Path, document: dict[str, Any]) -> None:
    """Write a report document (:func:`report_document`) whole, with sorted keys."""
    atomic_write(path, [document_json(document)])


def read_report_json(path: Path) -> dict[str, Any]:
    """Read a report file written by ``servesim replay --report-json``.

    Raises:
        ReportError: the file is missing, not JSON, or lacks a section the
            renderers need (a report of an older servesim has no ``run`` and
            ``series``: replay the run again).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ReportError(f"{path}: cannot read the report: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ReportError(f"{path}: not a report JSON file (not UTF-8 text)") from None
    return parse_report_json(text, source=str(path))


def parse_report_json(text: str, *, source: str) -> dict[str, Any]:
    """A report document from its JSON text; ``source`` names it in errors.

    Raises:
        ReportError: not JSON, not an object, or a section missing.
    """
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportError(
            f"{source}: not a report JSON file (invalid JSON at line {exc.lineno})"
        ) from None
    if not isinstance(document, dict):
        raise ReportError(
            f"{source}: not a report JSON file (expected an object with {', '.join(REPORT_SECTIONS)})"
        )
    missing = [k for k in REPORT_SECTIONS if not isinstance(document.get(k), dict)]
    if missing:
        raise ReportError(
            f"{source}: the report has no {' or '.join(repr(k) for k in missing)} section "
            "(written by an older servesim or another tool?); replay the run with --report-json again"
        )
    return document


def write_lines(path: Path, lines: Iterable[str]) -> None:
    """Write ``lines`` to ``path`` as they come, whole or not at all (see :func:`atomic_write`)."""
    atomic_write(path, lines)


def write_requests_jsonl(path: Path, records: list[RequestRecord]) -> None:
    """One line per request, by arrival then uid."""
    ordered = sorted(records, key=lambda r: (r.arrival_time_ms, r.uid))
    atomic_write(path, (json.dumps(request_row(r), sort_keys=True) + "\n" for r in ordered))


def read_requests_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The per-request records a ``--per-request-jsonl`` file holds, one dict per line."""
    with Path(path).open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
