"""The admission check credits only *active* cached blocks (the spec's vLLM rule).

A waiting request is admitted when the blocks of its whole known sequence,
less those of its cached prefix that running requests already hold, fit the
blocks not held by anyone. Cached blocks sitting in the LRU (inactive) are
reused on admission, but they are no credit: reusing them takes them out of
the evictable pool just as fresh blocks would. The reference (Dynamo 1.6.1)
does the same (the second test, its numbers).
"""

from __future__ import annotations

from pathlib import Path

from servesim import RunConfig, parse_engine_args, run
from servesim.config import EngineConfig
from servesim.engine.request import EngineRequest, Status
from servesim.engine.timing import PolynomialTiming
from servesim.engine.vllm import VllmScheduler
from servesim.workload.request import BlockContentCache, TracePrompt
from tests.support import write_trace

_CACHE = BlockContentCache()


def _request(uid: int, tokens: list[int], length: int, max_output: int) -> EngineRequest:
    """Token ``tokens[i]`` repeated over positions 4i..4i+3 (trace block size 4)."""
    return EngineRequest(uid, TracePrompt(tuple(tokens), 4, length, _CACHE), max_output)


def test_an_inactive_cached_prefix_is_no_credit_at_admission() -> None:
    """8 blocks of 4. P (3 blocks) finishes and leaves them cached; D decodes on 2 blocks.

    R (7 blocks, P's 3 first) needs 7 of the 6 blocks D does not hold: it
    waits, and D is not preempted for it. Crediting the 3 inactive cached
    blocks would admit R (4 <= 6) and then preempt D to find the blocks.
    """
    config = EngineConfig(block_size=4, num_gpu_blocks=8)
    scheduler = VllmScheduler(config, PolynomialTiming(config.total_kv_tokens, 1.0, 1.0))
    p, d = _request(0, [1, 2, 3], 12, 1), _request(1, [9], 4, 10)
    scheduler.submit(p)
    scheduler.submit(d)
    first = scheduler.execute_pass(0.0)
    assert [r.uid for r in first.finished] == [0]
    assert scheduler.pool.num_inactive == 3

    r = _request(2, [1, 2, 3, 4, 5, 6, 7], 28, 1)
    scheduler.submit(r)
    second = scheduler.execute_pass(first.end_ms)
    assert second.admitted == [] and second.preempted == []
    assert scheduler.running == [d] and list(scheduler.waiting) == [r]
    assert r.status is Status.WAITING
    assert (scheduler.pool.num_active, scheduler.pool.num_inactive) == (2, 3)


def test_the_reference_holds_the_request_back_until_the_running_one_ends(tmp_path: Path) -> None:
    """The same story with blocks of 64 (trace blocks of 64), against the reference.

    P (3 blocks, 1 token) and D (1 block, 10 tokens) at 0 ms; R (7 blocks,
    P's 3 first) at 20 ms waits until D ends at 133.370946 ms, then reuses
    P's 192 tokens.
    """
    trace = write_trace(
        tmp_path / "trace.jsonl",
        [(0.0, 192, 1, [1, 2, 3]), (0.0, 64, 10, [9]), (20.0, 448, 1, [1, 2, 3, 4, 5, 6, 7])],
    )
    report = run(
        RunConfig(
            trace=trace,
            trace_block_size=64,
            engine=parse_engine_args({"block_size": 64, "num_gpu_blocks": 8}),
        )
    )
    got = [
        (r.first_admit_ms, r.first_token_ms, r.last_token_ms, r.reused_input_tokens)
        for r in report.records
    ]
    assert got == [
        (0.0, 20.415971000000003, 20.415971000000003, 0),
        (0.0, 20.415971000000003, 133.370946, 0),
        (133.370946, 153.78691700000002, 153.78691700000002, 192),
    ]
