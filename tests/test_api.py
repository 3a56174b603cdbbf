"""The Python API: str or Path, the report's round trips, records named as the JSONL keys,
every config type at the top level."""

from __future__ import annotations

import dataclasses
import json
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

import servesim
from servesim import (
    EngineConfig,
    Report,
    RequestRecord,
    RunConfig,
    Sla,
    Terminal,
    TimingModelConfig,
    run,
)
from servesim.metrics.report import HOST_TIER_FIELDS, RECORD_FIELDS, read_requests_jsonl
from tests.support import write_trace

ROWS = [
    (0, 1000, 10, [1, 2]),
    (1000, 3000, 5, [3, 4, 5, 6, 7, 8]),
    (2000, 200, 1, [9]),
    (3000, 9000, 40, list(range(10, 28))),
]
# The simulator's own speed: the only summary keys two identical runs may disagree on.
WALL_KEYS = ("wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s")


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_trace(tmp_path_factory.mktemp("api") / "trace.jsonl", ROWS)


@pytest.fixture(scope="module")
def report(trace: Path) -> Report:
    engine = EngineConfig(block_size=64, num_gpu_blocks=100)
    return run(RunConfig(trace=str(trace), engine=engine, sla=Sla(ttft_ms=100.0)))


def _steady(document: dict[str, Any]) -> dict[str, Any]:
    summary = {k: v for k, v in document["summary"].items() if k not in WALL_KEYS}
    return {**document, "summary": summary}


def test_every_config_type_and_the_version_are_at_the_top_level() -> None:
    for name in (
        "RunConfig",
        "SyntheticWorkload",
        "EngineConfig",
        "RouterConfig",
        "TimingModelConfig",
        "SglangConfig",
        "HostOffloadConfig",
        "DiskOffloadConfig",
        "Sla",
        "Role",
        "Backend",
        "sweep",
        "search",
        "Table",
        "SweepResult",
        "SearchResult",
        "Candidate",
        "NoFeasibleConfiguration",
    ):
        assert name in servesim.__all__ and hasattr(servesim, name), name
    assert servesim.__version__ == version("servesim")


def test_a_trace_given_as_str_or_path_gives_the_same_run(trace: Path, report: Report) -> None:
    engine = EngineConfig(block_size=64, num_gpu_blocks=100)
    from_path = run(RunConfig(trace=trace, engine=engine, sla=Sla(ttft_ms=100.0)))
    assert _steady(from_path.document()) == _steady(report.document())
    assert RunConfig(trace=str(trace)).trace == trace
    assert TimingModelConfig(type="interpolated", path=Path("p.npz")).path == "p.npz"


def test_to_json_is_the_saved_file_and_round_trips(report: Report, tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    report.save(json_path=str(path))
    text = report.to_json()
    assert path.read_text() == text
    assert sorted(json.loads(text)) == ["provenance", "run", "series", "summary"]
    again = Report.from_json(text)
    assert again.to_json() == text
    assert again.table() == report.table()
    assert again.to_html() == report.to_html()
    assert again.records == [] and again.time_limited is False


def test_table_says_what_the_summary_says(report: Report) -> None:
    table = report.table()
    s = report.summary
    assert f"{s['num_requests']} arrived · {s['completed_requests']} completed" in table
    assert "1 rejected" in table and s["rejected_requests"] == 1
    assert table.startswith(f"servesim {servesim.__version__} · simulated serving run\n")


def test_record_attributes_are_the_jsonl_keys(report: Report, tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    report.save(jsonl_path=path)
    rows = read_requests_jsonl(path)
    assert len(rows) == len(report.records) == 4
    by_uuid = {r.uuid: r for r in report.records}
    for row in rows:
        assert tuple(sorted(row)) == tuple(sorted(RECORD_FIELDS))
        record = by_uuid[row["uuid"]]
        for key, value in row.items():
            attribute = getattr(record, key)
            if key == "terminal_status":
                assert isinstance(attribute, Terminal) and attribute.value == value
            else:
                assert attribute == value, key
    assert {row["terminal_status"] for row in rows} == {"completed", "rejected"}


def test_every_record_field_is_an_attribute_and_host_fields_are_documented() -> None:
    record = RequestRecord(0, 0.0, 10, 2, None, None)
    for name in RECORD_FIELDS:
        assert hasattr(record, name), name
    assert HOST_TIER_FIELDS[1] in RequestRecord.__slots__


def test_save_writes_the_page_from_str_paths(report: Report, tmp_path: Path) -> None:
    page = tmp_path / "sub" / "page.html"
    report.save(html_path=str(page))
    assert page.read_text() == report.to_html()


def test_report_is_a_frozen_value(report: Report) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.summary = {}  # type: ignore[misc]
