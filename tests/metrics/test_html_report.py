"""The HTML page's structure: every chart present with its data embedded, nothing fetched
from the network, the same page from a run and from its saved report.

Whether the charts render is the ``browser`` test's business
(``tests/browser/test_html_in_chromium.py``, run where Chromium is installed).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from servesim import EngineConfig, Report, Role, RunConfig, parse_engine_args, run
from servesim.cli import main
from servesim.metrics.html import SIMULATOR_SPEED_KEYS, charts, plotly_js
from tests.support import write_trace

ROWS = [
    (0, 1000, 10, [1, 2]),
    (100, 3000, 50, [3, 4, 5, 6, 7, 8]),
    (200, 1200, 30, [1, 2, 9]),
    (300, 9000, 5, list(range(20, 38))),
    (2000, 2000, 20, [11, 12, 13, 14]),
]
AGGREGATED_CHARTS = [
    "dist-ttft",
    "dist-itl",
    "dist-e2e-latency",
    "latency-over-time",
    "throughput-over-time",
    "queue-depth",
    "running-requests",
    "kv-usage",
    "prefix-reuse-over-time",
    "prefix-reuse-per-worker",
]


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_trace(tmp_path_factory.mktemp("html") / "trace.jsonl", ROWS)


@pytest.fixture(scope="module")
def aggregated(trace: Path) -> Report:
    return run(RunConfig(trace=trace, engine=EngineConfig(block_size=64, num_gpu_blocks=120)))


@pytest.fixture(scope="module")
def disaggregated(trace: Path) -> Report:
    keys = {"block_size": 64, "kv_transfer_bandwidth": 64, "kv_transfer_bytes_per_token": 131072}
    return run(
        RunConfig(
            trace=trace,
            prefill_engine=parse_engine_args(keys, role=Role.PREFILL),
            decode_engine=parse_engine_args(keys, role=Role.DECODE),
            num_decode_workers=2,
        )
    )


def _payload(page: str) -> dict[str, Any]:
    match = re.search(
        r'<script type="application/json" id="servesim-data">(.*?)</script>', page, re.S
    )
    assert match is not None
    payload: dict[str, Any] = json.loads(match.group(1))
    return payload


def _without_plotly(page: str) -> str:
    start = page.index('<script id="plotly-js">')
    end = page.index("</script>", start)
    assert page[start + len('<script id="plotly-js">') : end] == plotly_js()
    return page[:start] + page[end:]


@pytest.mark.parametrize(
    ("which", "expected"),
    [("aggregated", AGGREGATED_CHARTS), ("disaggregated", [*AGGREGATED_CHARTS, "pd-transfers"])],
)
def test_every_chart_is_on_the_page_with_its_data(
    which: str, expected: list[str], request: pytest.FixtureRequest
) -> None:
    report: Report = request.getfixturevalue(which)
    page = report.to_html()
    payload = _payload(page)
    assert [c["id"] for c in payload["charts"]] == expected
    assert [c.id for c in charts(report.document())] == expected
    for chart in payload["charts"]:
        assert page.count(f'<div id="{chart["id"]}" class="plot">') == 1
        traces = chart["figure"]["data"]
        assert traces, chart["id"]
        assert all(len(t["y"]) > 0 and any(v is not None for v in t["y"]) for t in traces), chart[
            "id"
        ]
    # The report itself is embedded (less the simulator's own speed), and the charts are
    # drawn from it.
    document = json.loads(report.to_json())
    for key in SIMULATOR_SPEED_KEYS:
        del document["summary"][key]
    assert payload["report"] == document
    dist = next(c for c in payload["charts"] if c["id"] == "dist-ttft")
    assert dist["figure"]["data"][0]["x"] == report.series["distributions"]["ttft_ms"]


def test_the_page_fetches_nothing(aggregated: Report) -> None:
    """plotly.js is inline; outside it, no URL and no attribute that would load a resource."""
    rest = _without_plotly(aggregated.to_html())
    assert "http://" not in rest and "https://" not in rest and "//cdn" not in rest
    assert not re.search(r"<(script|img|link|iframe)[^>]*\b(src|href)=", rest)
    assert rest.count("<script") == 2  # the data and the drawing code


def test_the_same_run_gives_the_same_page_byte_for_byte(trace: Path, aggregated: Report) -> None:
    again = run(RunConfig(trace=trace, engine=EngineConfig(block_size=64, num_gpu_blocks=120)))
    assert again.to_html() == aggregated.to_html()
    assert "wall time" not in again.to_html() and "wall time" in again.table()


def test_the_page_is_deterministic_and_the_same_from_a_saved_report(
    aggregated: Report, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "report.json"
    saved.write_text(aggregated.to_json())
    page = tmp_path / "page.html"
    assert main(["report", str(saved), "--html", str(page)]) == 0
    assert page.read_text() == aggregated.to_html() == aggregated.to_html()
    out = capsys.readouterr().out
    assert out.startswith("servesim ") and out.endswith(f"Saved HTML report to: {page}\n")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read the report: No such file or directory"),
        ("{not json", "not a report JSON file (invalid JSON at line 1)"),
        ('{"summary": {}}', "the report has no 'run' or 'series' section"),
        ("[1, 2]", "not a report JSON file (expected an object with summary, run, series)"),
    ],
)
def test_report_of_a_bad_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    path = tmp_path / "report.json"
    if content is not None:
        path.write_text(content)
    assert main(["report", str(path), "--html", str(tmp_path / "page.html")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1 and err.startswith(f"servesim: error: {path}: {message}")
    assert not (tmp_path / "page.html").exists()


def test_report_of_a_malformed_section_names_what_is_missing(
    aggregated: Report, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = json.loads(aggregated.to_json())
    del document["run"]["pools"]
    path = tmp_path / "report.json"
    path.write_text(json.dumps(document))
    assert main(["report", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"servesim: error: {path}: not a servesim report (missing or malformed 'pools')\n"
    )


def test_an_unwritable_html_path_is_refused_before_the_run(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["replay", str(trace), "--html", str(blocker / "page.html")]) == 2
    assert capsys.readouterr().err == (
        f"servesim: error: --html: cannot write {blocker / 'page.html'}: {blocker} is not a directory\n"
    )
