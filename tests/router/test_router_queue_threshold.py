"""The router queue's busy threshold at its boundary, against the reference (Dynamo 1.6.1).

One worker, KV router, ``router_queue_threshold`` 1.0 and a 512-token budget:
the worker is busy while its uncached prompt tokens in flight *exceed* 512.
X arrives at 0 ms, Y (100 tokens) at 1 ms, while X prefills.

- X of 512 tokens: exactly at the threshold, not busy: Y is routed at once
  and waits in the engine for X's pass to end (24.385704 ms).
- X of 513 tokens (two passes): busy: Y waits in the router queue until X's
  prefill completes at 40.902308 ms (39.902308 ms queued).

Every number is the reference's (``refcheck.py reference``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim import RunConfig, parse_engine_args, run
from servesim.config import parse_router_config
from tests.support import write_trace

# X's prompt -> (Y's router queue wait, Y's admission, first and last token)
REFERENCE = {
    512: (0.0, 24.385704, 48.176095000000004, 59.69301800000001),
    513: (39.902308000000005, 40.902308000000005, 64.692751, 76.209725),
}


@pytest.mark.parametrize("x_tokens", sorted(REFERENCE))
def test_a_worker_is_busy_only_above_the_threshold(tmp_path: Path, x_tokens: int) -> None:
    trace = write_trace(
        tmp_path / "trace.jsonl",
        [(0.0, x_tokens, 3, list(range(1, 10))), (1.0, 100, 3, [20, 21])],
    )
    report = run(
        RunConfig(
            trace=trace,
            trace_block_size=64,
            router_mode="kv_router",
            router=parse_router_config({"router_queue_threshold": 1.0}),
            engine=parse_engine_args({"block_size": 64, "max_num_batched_tokens": 512}),
        )
    )
    x, y = report.records
    assert x.queue_wait_ms == 0.0
    assert (y.queue_wait_ms, y.first_admit_ms, y.first_token_ms, y.last_token_ms) == (
        REFERENCE[x_tokens]
    )
    assert report.summary["router_queued_requests"] == int(x_tokens > 512)
