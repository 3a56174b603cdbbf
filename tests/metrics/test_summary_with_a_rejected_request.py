"""Summary keys of a run with a rejected request, against the reference (Dynamo 1.6.1).

Two requests on one worker (block size 64, ``max_model_len`` 200): 100
tokens at 0 ms (5 out, done at 41.005092 ms) and 300 tokens at 10 ms, which
can never fit and is rejected. The reference counts the rejected request in
``num_requests`` only: throughputs, token totals and latency samples cover
completed requests over the last completion's time. Every number is the
reference's (``refcheck.py reference``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim import RunConfig, parse_engine_args, run
from tests.support import write_trace

REFERENCE = {
    "num_requests": 2,
    "completed_requests": 1,
    "total_input_tokens": 100,
    "total_output_tokens": 5,
    "num_ttft_samples": 1,
    "committed_prefill_tokens": 100,
    "duration_ms": 41.005092,
    "request_throughput_rps": 24.387215129281994,
    "input_throughput_tok_s": 2438.7215129281994,
    "output_throughput_tok_s": 121.93607564640996,
    "total_throughput_tok_s": 2560.6575885746092,
    "mean_ttft_ms": 18.023974000000003,
}


def test_a_rejected_request_counts_only_as_a_request(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "trace.jsonl", [(0, 100, 5, [1]), (10, 300, 5, [2])])
    report = run(
        RunConfig(trace=trace, engine=parse_engine_args({"block_size": 64, "max_model_len": 200}))
    )
    summary = report.summary
    assert summary["rejected_requests"] == 1
    for key, value in REFERENCE.items():
        assert summary[key] == pytest.approx(value, rel=1e-12), key
