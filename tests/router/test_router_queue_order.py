"""Which queued request the router releases first, against the reference (Dynamo 1.6.1).

One worker, KV router, ``router_queue_threshold`` 1.0, a 512-token budget,
block size 64 (trace blocks of 64). X (4,096 tokens, 64 blocks) arrives at
0 ms and prefills in eight chunks until 195.085632 ms; its first chunk (its
blocks 1..8) is cached by 24.39 ms. While X's 4,096 uncached tokens keep the
worker busy, B arrives at 30 ms and A at 31 ms: both wait in the router
queue. When X's prefill completes, the queue releases one of them; its own
uncached prompt (over 512 tokens) makes the worker busy again, and the other
waits for that prefill to complete (249.8 or 272.3 ms).

- ``wspt``: shortest uncached prompt first. B has 1,024 uncached tokens; A
  has 1,152 tokens of which X's first 8 blocks (512) are cached on the worker:
  640 uncached, so A goes first (by prompt length alone, or with the cached
  blocks counted as 8 tokens, B would).
- ``fcfs`` with priorities: a positive priority moves a request ahead; a
  negative one does not move it back (priorities below 0 count as 0).

Every number is the reference's (``refcheck.py reference``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servesim import RunConfig, parse_engine_args, run
from servesim.config import parse_router_config
from servesim.simulation import Report

X = (0.0, 4096, list(range(1, 65)))
B_BLOCKS = list(range(201, 217))


def _replay(
    tmp_path: Path, rows: list[tuple[float, int, list[int], int]], router: dict[str, object]
) -> Report:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "".join(
            json.dumps(
                {
                    "timestamp": t,
                    "input_length": tokens,
                    "output_length": 3,
                    "hash_ids": ids,
                    "priority": priority,
                }
            )
            + "\n"
            for t, tokens, ids, priority in rows
        )
    )
    return run(
        RunConfig(
            trace=trace,
            trace_block_size=64,
            router_mode="kv_router",
            router=parse_router_config({"router_queue_threshold": 1.0, **router}),
            engine=parse_engine_args({"block_size": 64, "max_num_batched_tokens": 512}),
        )
    )


def _waits(report: Report) -> list[tuple[float, float | None, float | None, int]]:
    return [
        (r.queue_wait_ms, r.first_token_ms, r.last_token_ms, r.reused_input_tokens)
        for r in report.records
    ]


def test_wspt_releases_the_request_with_the_fewest_uncached_tokens(tmp_path: Path) -> None:
    """A (640 uncached tokens) before B (1,024), although B came first and A is longer."""
    a_blocks = [*range(1, 9), *range(301, 311)]
    report = _replay(
        tmp_path,
        [(*X, 0), (30.0, 1024, B_BLOCKS, 0), (31.0, 1152, a_blocks, 0)],
        {"router_queue_policy": "wspt"},
    )
    _, b, a = report.records
    assert a.best_available_overlap_blocks == 8
    assert b.best_available_overlap_blocks == 0
    assert _waits(report) == [
        (0.0, 195.085632, 249.824132, 0),
        (219.824132, 326.694866, 338.28046, 0),
        (164.085632, 249.824132, 310.163077, 512),
    ]
    assert (a.first_admit_ms, b.first_admit_ms) == (195.085632, 249.824132)


@pytest.mark.parametrize(("b_priority", "a_priority"), [(-5, 0), (0, 5)])
def test_fcfs_priorities_only_move_requests_ahead(
    tmp_path: Path, b_priority: int, a_priority: int
) -> None:
    """B (30 ms) before A (31 ms) unless A has a positive priority; B's -5 does not demote it."""
    report = _replay(
        tmp_path,
        [
            (*X, 0),
            (30.0, 1024, B_BLOCKS, b_priority),
            (31.0, 1024, list(range(301, 317)), a_priority),
        ],
        {},
    )
    first = (195.085632, 272.25892, 332.584692)
    second = (349.116481, 360.70207500000004)
    waits = _waits(report)
    assert waits[0] == (0.0, 195.085632, 255.727131, 0)
    if a_priority > 0:
        assert waits[1:] == [(242.25892, *second, 0), (164.085632, *first[1:], 0)]
    else:
        assert waits[1:] == [(165.085632, *first[1:], 0), (241.25892, *second, 0)]
