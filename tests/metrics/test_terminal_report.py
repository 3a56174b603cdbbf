"""The terminal report: exact text of small runs with rejections, with every request
rejected, and cut by a time limit (goldens), and what the CLI prints.

Only the simulator's wall time (and the simulation speed derived from it) is
not deterministic; each golden fixes both.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servesim import EngineConfig, Report, RunConfig, Sla, run
from servesim.cli import main
from servesim.metrics.terminal import render_text, terminal_html
from tests.support import write_trace

# Five requests on one worker (block size 64); the second's 3,000-token prompt needs 47 blocks.
ROWS = [
    (0, 1000, 10, [1, 2]),
    (1000, 3000, 5, [3, 4, 5, 6, 7, 8]),
    (2000, 200, 1, [9]),
    (3000, 500, 40, [10]),
    (3001, 2000, 20, [11, 12, 13, 14]),
]

ONE_REJECTED = """\
servesim 0.1.0 · simulated serving run
Cluster   1 worker · vllm · 1 GPU (DP 1 × TP 1 per worker)
KV cache  2,560 tokens per rank (40 blocks of 64)
Router    round_robin
Timing    polynomial (the reference's default fit)
Workload  trace TRACE: 5 requests

┏━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━┳━━━━━━━┳━━━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━┓
┃ Latency                   ┃    avg ┃   min ┃    p50 ┃      p90 ┃      p99 ┃      max ┃
┡━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━╇━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━┩
│ Time to first token (ms)  │  40.73 │ 19.55 │  32.11 │    87.07 │    87.07 │    87.07 │
│ Time to second token (ms) │  40.25 │ 22.92 │  33.94 │    63.88 │    63.88 │    63.88 │
│ Inter-token latency (ms)  │  31.99 │ 15.53 │  22.99 │    33.95 │    63.88 │   474.30 │
│ End-to-end latency (ms)   │ 576.58 │ 19.55 │ 886.84 │ 1,161.04 │ 1,161.04 │ 1,161.04 │
│ Output tokens/s per user  │  44.60 │  2.11 │  43.51 │    63.88 │    64.26 │    64.39 │
└───────────────────────────┴────────┴───────┴────────┴──────────┴──────────┴──────────┘
Duration      4.16 s simulated (first arrival to last completion)
Requests      5 arrived · 4 completed · 1 rejected · 0 incomplete
Throughput    0.96 req/s · output 17.1 tok/s · input 889.0 tok/s
Goodput       3 of 4 completed met the SLA (TTFT ≤ 50 ms): 75.0% attainment, 60.0% of all arrived ·
              0.72 req/s · 12.3 output tok/s
GPU-hours     0.0012 (4.2 worker-seconds × 1 GPU per worker)
Prefix reuse  53.6% of input tokens served from cache (0.0% at first admission)
Simulator     wall time 1.23 s (the simulator's own run time, not the served duration) · 5,678
              tokens simulated per second
! 1 of 5 requests was rejected: a prompt that can never fit in a worker's KV cache is dropped (more
num_gpu_blocks, or shorter requests, avoid it). Latencies and throughputs above count completed
requests only.
"""

ALL_REJECTED = """\
servesim 0.1.0 · simulated serving run
Cluster   1 worker · vllm · 1 GPU (DP 1 × TP 1 per worker)
KV cache  128 tokens per rank (2 blocks of 64)
Router    round_robin
Timing    polynomial (the reference's default fit)
Workload  trace TRACE: 5 requests

┏━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━┳━━━━━┳━━━━━┳━━━━━┳━━━━━┳━━━━━┓
┃ Latency                   ┃ avg ┃ min ┃ p50 ┃ p90 ┃ p99 ┃ max ┃
┡━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━╇━━━━━╇━━━━━╇━━━━━╇━━━━━╇━━━━━┩
│ Time to first token (ms)  │ N/A │ N/A │ N/A │ N/A │ N/A │ N/A │
│ Time to second token (ms) │ N/A │ N/A │ N/A │ N/A │ N/A │ N/A │
│ Inter-token latency (ms)  │ N/A │ N/A │ N/A │ N/A │ N/A │ N/A │
│ End-to-end latency (ms)   │ N/A │ N/A │ N/A │ N/A │ N/A │ N/A │
│ Output tokens/s per user  │ N/A │ N/A │ N/A │ N/A │ N/A │ N/A │
└───────────────────────────┴─────┴─────┴─────┴─────┴─────┴─────┘
Duration      0.00 s simulated (first arrival to last completion)
Requests      5 arrived · 0 completed · 5 rejected · 0 incomplete
Throughput    0.00 req/s · output 0.0 tok/s · input 0.0 tok/s
GPU-hours     0.0008 (3.0 worker-seconds × 1 GPU per worker)
Prefix reuse  0.0% of input tokens served from cache (0.0% at first admission)
Simulator     wall time 1.23 s (the simulator's own run time, not the served duration) · 5,678
              tokens simulated per second
! 5 of 5 requests were rejected: a prompt that can never fit in a worker's KV cache is dropped (more
num_gpu_blocks, or shorter requests, avoid it). Latencies and throughputs above count completed
requests only.
! No request completed: there is no latency to report.
"""

TIME_LIMITED = """\
servesim 0.1.0 · simulated serving run
Cluster   1 worker · vllm · 1 GPU (DP 1 × TP 1 per worker)
KV cache  64,000 tokens per rank (1,000 blocks of 64)
Router    round_robin
Timing    polynomial (the reference's default fit)
Workload  trace TRACE: 5 requests

┏━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━┳━━━━━━━━┳━━━━━━━━┳━━━━━━━━┳━━━━━━━━┳━━━━━━━━┓
┃ Latency                   ┃    avg ┃    min ┃    p50 ┃    p90 ┃    p99 ┃    max ┃
┡━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━━╇━━━━━━━━╇━━━━━━━━╇━━━━━━━━╇━━━━━━━━┩
│ Time to first token (ms)  │  32.11 │  32.11 │  32.11 │  32.11 │  32.11 │  32.11 │
│ Time to second token (ms) │   6.58 │   6.58 │   6.58 │   6.58 │   6.58 │   6.58 │
│ Inter-token latency (ms)  │   6.58 │   6.58 │   6.59 │   6.59 │   6.59 │   6.59 │
│ End-to-end latency (ms)   │  91.34 │  91.34 │  91.34 │  91.34 │  91.34 │  91.34 │
│ Output tokens/s per user  │ 151.93 │ 151.86 │ 151.87 │ 151.87 │ 151.87 │ 152.01 │
└───────────────────────────┴────────┴────────┴────────┴────────┴────────┴────────┘
Duration      0.09 s simulated (first arrival to last completion); the run stopped at its limit,
              1.05 s
Requests      2 arrived · 1 completed · 0 rejected · 1 incomplete · 3 never arrived (time limit)
Throughput    10.95 req/s · output 109.5 tok/s · input 10,947.9 tok/s
GPU-hours     0.0003 (1.0 worker-seconds × 1 GPU per worker)
Prefix reuse  0.0% of input tokens served from cache (0.0% at first admission)
Simulator     wall time 1.23 s (the simulator's own run time, not the served duration) · 5,678
              tokens simulated per second
! 1 of 2 requests is incomplete: the run stopped at its simulated time limit
(--max-sim-time-seconds) first.
"""


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_trace(tmp_path_factory.mktemp("table") / "trace.jsonl", ROWS)


def _text(report: Report, trace: Path) -> str:
    report.summary["wall_time_ms"] = 1234.5
    report.summary["processed_tokens_per_s"] = 5678.0
    return report.table().replace(str(trace), "TRACE") + "\n"


def _replay(trace: Path, blocks: int, **kwargs: object) -> Report:
    engine = EngineConfig(block_size=64, num_gpu_blocks=blocks)
    return run(RunConfig(trace=trace, engine=engine, **kwargs))  # type: ignore[arg-type]


def test_a_rejected_request_is_counted_and_said_plainly(trace: Path) -> None:
    report = _replay(trace, 40, sla=Sla(ttft_ms=50.0))
    assert report.summary["rejected_requests"] == 1
    assert _text(report, trace) == ONE_REJECTED


def test_every_request_rejected_shows_no_latency_rather_than_zeros(trace: Path) -> None:
    report = _replay(trace, 2)
    assert report.summary["completed_requests"] == 0
    assert report.summary["mean_ttft_ms"] == 0.0  # the reference's summary value ...
    assert _text(report, trace) == ALL_REJECTED  # ... shown as N/A


def test_a_time_limit_shows_incomplete_and_unreleased_requests(trace: Path) -> None:
    report = _replay(trace, 1000, max_sim_time_ms=1050.0)
    assert report.time_limited
    assert _text(report, trace) == TIME_LIMITED


def test_colours_highlight_non_zero_rejections_only(trace: Path) -> None:
    coloured = _replay(trace, 40).table(color=True)
    red = "\x1b[1;31m"
    assert f"{red}1 rejected" in coloured
    assert f"{red}0 incomplete" not in coloured and "0 incomplete" in coloured


def test_the_cli_prints_the_report_exits_0_with_rejections_and_says_where_files_went(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report.json"
    page = tmp_path / "page.html"
    args = ["replay", str(trace), "--extra-engine-args", '{"block_size": 64, "num_gpu_blocks": 40}']
    code = main([*args, "--report-json", str(report), "--html", str(page)])
    assert code == 0
    out = capsys.readouterr().out
    # Exactly the saved report's text, 100 columns wide as stdout is not a terminal.
    printed = render_text(json.loads(report.read_text()), width=100)
    assert out == f"{printed}\nSaved full report to: {report}\nSaved HTML report to: {page}\n"
    assert "1 of 5 requests was rejected" in out
    assert page.stat().st_size > 1_000_000  # plotly.js is in it


def test_quiet_prints_nothing(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(trace), "--quiet"]) == 0
    assert capsys.readouterr() == ("", "")


def test_a_narrow_width_wraps_the_text_but_never_splits_a_number(trace: Path) -> None:
    report = _replay(trace, 40, sla=Sla(ttft_ms=50.0))
    wide, narrow = report.table(width=100).splitlines(), report.table(width=60).splitlines()
    ruled = "┏┃┡│└"
    # The table keeps its natural width (88 columns here): a terminal wraps its lines.
    assert [line for line in narrow if line[:1] in ruled] == [
        line for line in wide if line[:1] in ruled
    ]
    text = [line for line in narrow if line[:1] not in ruled]
    assert max(len(line) for line in text) == 60
    # A value wraps under its first line, the label column kept.
    assert "Goodput       3 of 4 completed met the SLA (TTFT ≤ 50 ms):" in text
    assert "              75.0% attainment, 60.0% of all arrived · 0.72" in text


def test_the_html_block_escapes_the_text_and_keeps_the_styles(trace: Path) -> None:
    document = _replay(trace, 40).document()
    block = terminal_html(document, width=110)
    assert block.startswith('<pre class="terminal"><span style="font-weight: bold">servesim ')
    assert block.endswith("</pre>")
    assert "polynomial (the reference&#x27;s default fit)" in block
    assert '<span style="font-weight: bold">Requests      </span>' in block
    assert '<span style="font-weight: bold; color: #800000">1 rejected</span>' in block
    assert block.count("\n") == len(render_text(document, width=110).splitlines()) - 1
