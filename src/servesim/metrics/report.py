"""Report files: the report JSON (summary, run, series) and the per-request JSONL."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from servesim.errors import ReportError
from servesim.metrics.collector import RequestRecord, latencies


def _uuid(uid: int) -> str:
    # Deterministic ids in the reference's synthetic format (1-based).
    return f"00000000-0000-0000-0000-{uid + 1:012x}"


def request_row(r: RequestRecord) -> dict[str, Any]:
    """One per-request JSONL record (reference field names)."""
    lat = latencies(r)
    row = {
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
    if r.first_host_reused is not None:
        # With a host tier: where the first admission's reused prefix came from.
        row["first_admission_g1_reused_input_tokens"] = r.first_reused - r.first_host_reused
        row["first_admission_host_reused_input_tokens"] = r.first_host_reused
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
    summary: dict[str, Any], *, run: dict[str, Any], series: dict[str, Any]
) -> dict[str, Any]:
    """The report file's content: the reference's ``summary``, then servesim's own sections,
    ``run`` (what was simulated) and ``series`` (what the HTML page plots)."""
    return {"summary": summary, "run": run, "series": series}


def document_json(document: dict[str, Any]) -> str:
    """A report document as the file holds it: indent 2, sorted keys, a final newline."""
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


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
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportError(
            f"{path}: not a report JSON file (invalid JSON at line {exc.lineno})"
        ) from None
    if not isinstance(document, dict):
        raise ReportError(
            f"{path}: not a report JSON file (expected an object with {', '.join(REPORT_SECTIONS)})"
        )
    missing = [k for k in REPORT_SECTIONS if not isinstance(document.get(k), dict)]
    if missing:
        raise ReportError(
            f"{path}: the report has no {' or '.join(repr(k) for k in missing)} section "
            "(written by an older servesim or another tool?); replay the run with --report-json again"
        )
    return document


def write_requests_jsonl(path: Path, records: list[RequestRecord]) -> None:
    """One line per request, by arrival then uid."""
    ordered = sorted(records, key=lambda r: (r.arrival_ms, r.uid))
    atomic_write(path, (json.dumps(request_row(r), sort_keys=True) + "\n" for r in ordered))
