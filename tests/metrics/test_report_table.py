"""The printed table: exact text on a tiny run and on a hand-made summary (golden strings).

``REFERENCE_*`` are what the reference (``dynamo.replay.reporting.format_report_table``,
Dynamo 1.6.1) prints for the same summaries; servesim prints the same text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servesim import EngineConfig, RunConfig, run
from servesim.cli import main
from servesim.metrics.report import render_table
from tests.support import write_trace

# Five requests on one worker (block size 64); the run behind the first pair of goldens.
ROWS = [
    (0, 1000, 10, [1, 2]),
    (1000, 3000, 5, [3, 4, 5, 6, 7, 8]),
    (2000, 200, 1, [9]),
    (3000, 500, 40, [10]),
    (3001, 2000, 20, [11, 12, 13, 14]),
]
WALL_MS = 1234.5  # the one non-deterministic number, fixed for the golden

REFERENCE_RUN_TABLE = """\
NVIDIA AIPerf | LLM Metrics
┏━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━┳━━━━━━━┳━━━━━━━━┳━━━━━━━━┳━━━━━━━━┳━━━━━━━━┳━━━━━━━┓
┃ Metric                                             ┃    avg ┃   min ┃    max ┃    p99 ┃    p90 ┃    p75 ┃   std ┃
┡━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━╇━━━━━━━━╇━━━━━━━━╇━━━━━━━━╇━━━━━━━━╇━━━━━━━┩
┃ Time to First Token (ms)                           ┃  43.84 ┃ 19.55 ┃  77.52 ┃  77.52 ┃  77.52 ┃  65.84 ┃ 23.37 ┃
┃ Time to Second Token (ms)                          ┃  17.97 ┃  5.79 ┃  54.32 ┃  54.32 ┃  54.32 ┃   5.89 ┃ 20.99 ┃
┃ Request Latency (ms)                               ┃ 136.37 ┃ 19.55 ┃ 299.62 ┃ 299.62 ┃ 299.62 ┃ 189.04 ┃ 97.97 ┃
┃ Inter Token Latency (ms)                           ┃   6.52 ┃  5.77 ┃  54.32 ┃   5.90 ┃   5.86 ┃   5.86 ┃  5.71 ┃
┃ Output Token Throughput Per User (tokens/sec/user) ┃ 169.29 ┃ 18.41 ┃ 173.41 ┃ 173.30 ┃ 173.30 ┃ 173.30 ┃ 18.09 ┃
┃ Output Token Throughput (tokens/sec)               ┃  23.03 ┃   N/A ┃    N/A ┃    N/A ┃    N/A ┃    N/A ┃   N/A ┃
┃ Request Throughput (requests/sec)                  ┃   1.52 ┃   N/A ┃    N/A ┃    N/A ┃    N/A ┃    N/A ┃   N/A ┃
┃ Request Count (requests)                           ┃   5.00 ┃   N/A ┃    N/A ┃    N/A ┃    N/A ┃    N/A ┃   N/A ┃
└━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┴━━━━━━━━┴━━━━━━━┴━━━━━━━━┴━━━━━━━━┴━━━━━━━━┴━━━━━━━━┴━━━━━━━┘
Wall Time (ms): 1,234.50
Prefix Cache Reused Ratio: 0.00
First Admission Prefix Cache Reused Ratio: 0.00\
"""


# Formatting corners: thousands separators, rounding, None, a missing distribution row
# (only TTFT has a mean_ key), a scalar count.
HAND_SUMMARY: dict[str, Any] = {
    "mean_ttft_ms": 12345.678,
    "min_ttft_ms": 0.004,
    "max_ttft_ms": 1234567.891,
    "p99_ttft_ms": 99.995,
    "p90_ttft_ms": 90.0,
    "p75_ttft_ms": None,
    "std_ttft_ms": 0.0,
    "output_throughput_tok_s": 1500.0,
    "request_throughput_rps": 2.5,
    "completed_requests": 1234,
    "wall_time_ms": 0.5,
    "prefix_cache_reused_ratio": 0.123456,
    "first_admission_prefix_cache_reused_ratio": 1.0,
}

REFERENCE_HAND_TABLE = """\
NVIDIA AIPerf | LLM Metrics
┏━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━┳━━━━━━┳━━━━━━━━━━━━━━┳━━━━━━━━┳━━━━━━━┳━━━━━┳━━━━━━┓
┃ Metric                               ┃       avg ┃  min ┃          max ┃    p99 ┃   p90 ┃ p75 ┃  std ┃
┡━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━╇━━━━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━╇━━━━━╇━━━━━━┩
┃ Time to First Token (ms)             ┃ 12,345.68 ┃ 0.00 ┃ 1,234,567.89 ┃ 100.00 ┃ 90.00 ┃ N/A ┃ 0.00 ┃
┃ Output Token Throughput (tokens/sec) ┃  1,500.00 ┃  N/A ┃          N/A ┃    N/A ┃   N/A ┃ N/A ┃  N/A ┃
┃ Request Throughput (requests/sec)    ┃      2.50 ┃  N/A ┃          N/A ┃    N/A ┃   N/A ┃ N/A ┃  N/A ┃
┃ Request Count (requests)             ┃  1,234.00 ┃  N/A ┃          N/A ┃    N/A ┃   N/A ┃ N/A ┃  N/A ┃
└━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┴━━━━━━━━━━━┴━━━━━━┴━━━━━━━━━━━━━━┴━━━━━━━━┴━━━━━━━┴━━━━━┴━━━━━━┘
Wall Time (ms): 0.50
Prefix Cache Reused Ratio: 0.12
First Admission Prefix Cache Reused Ratio: 1.00\
"""


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_trace(tmp_path_factory.mktemp("table") / "trace.jsonl", ROWS)


@pytest.fixture(scope="module")
def run_summary(trace: Path) -> dict[str, Any]:
    summary = dict(run(RunConfig(trace=trace, engine=EngineConfig(block_size=64))).summary)
    summary["wall_time_ms"] = WALL_MS
    return summary


def test_table_of_a_tiny_run(run_summary: dict[str, Any]) -> None:
    assert render_table(run_summary) == REFERENCE_RUN_TABLE


def test_table_formatting_corners() -> None:
    assert render_table(HAND_SUMMARY) == REFERENCE_HAND_TABLE


def test_cli_prints_the_table_then_where_the_report_went(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``servesim replay`` prints exactly the table of the summary it writes, then the report path."""
    report = tmp_path / "report.json"
    code = main(
        [
            "replay",
            str(trace),
            "--extra-engine-args",
            '{"block_size": 64}',
            "--report-json",
            str(report),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    wall = json.loads(report.read_text())["summary"]["wall_time_ms"]
    expected = REFERENCE_RUN_TABLE.replace(
        "Wall Time (ms): 1,234.50", f"Wall Time (ms): {wall:,.2f}"
    )
    assert out == f"{expected}\nSaved full report to: {report}\n"
