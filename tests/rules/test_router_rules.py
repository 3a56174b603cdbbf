"""KV-router rules of the reference (Dynamo 1.6.1), each pinned by a small probe of it.

Expected values are the reference's per-request records for the same trace
(``refcheck.py reference SCENARIO OUT --requests OUT.jsonl``). The
reference breaks cost ties at random, so the first request's worker is
arbitrary: workers are compared relative to it, and each probe's outcome was
the same in every reference run (five or six runs each) and is checked here
under several seeds.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from servesim import RunConfig, parse_engine_args, run
from servesim.config import RouterConfig, parse_router_config
from servesim.router.kv_router import KvRouter, RouteRequest
from servesim.simulation import Report
from tests.support import write_trace

Row = tuple[int, int, int, list[int]]  # timestamp, input length, output length, hash ids


def _replay(tmp_path: Path, rows: list[Row], router: dict[str, object], seed: int) -> Report:
    trace = write_trace(tmp_path / "trace.jsonl", rows)
    return run(
        RunConfig(
            trace=trace,
            trace_block_size=512,
            num_workers=2,
            router_mode="kv_router",
            router=parse_router_config(router),
            engine=parse_engine_args({"block_size": 64}),
            seed=seed,
        )
    )


def _relative_workers(report: Report) -> list[int]:
    first = report.records[0].worker
    assert first is not None
    return [(r.worker or 0) ^ first for r in report.records]


def test_load_counts_complete_prompt_blocks() -> None:
    """A 1,000-token prompt with block 64 is 15 blocks in the decode term, not 16."""
    router = KvRouter(RouterConfig(), 1, 64, random.Random(0), indexer=None)
    request = RouteRequest(uid=0, isl=1000, blocks=16, hashes=[])
    prefill = 1000 / 64
    assert router.cost(request, 0, 0) == pytest.approx(prefill + 15)


@pytest.mark.parametrize("seed", range(8))
def test_a_partial_last_block_adds_no_load(tmp_path: Path, seed: int) -> None:
    """1,000 tokens (15 complete blocks) on one worker, 1,024 (16) on the other.

    A 64-token request at 300 ms, once both prefills are done, is cheaper next
    to the 1,000-token one (15 + 1 blocks against 16 + 1); counting the
    partial block would make it a tie, broken at random. The reference put it
    there in six of six runs; the next one balances onto the other worker.
    """
    rows: list[Row] = [
        (0, 1000, 200, [1, 2]),
        (1, 1024, 200, [3, 4]),
        (300, 64, 2, [5]),
        (301, 64, 2, [6]),
    ]
    report = _replay(tmp_path, rows, {}, seed)
    assert _relative_workers(report) == [0, 1, 0, 1]


@pytest.mark.parametrize("seed", range(3))
def test_a_queued_request_keeps_the_overlap_it_entered_with(tmp_path: Path, seed: int) -> None:
    """Two requests with the same 1,024-token prompt queue behind two long prefills.

    The first is released at 85.756 ms, when the 4,096-token prefill completes,
    and prefills on that worker; the second is released when that prefill
    completes (122.197 ms in the queue) and goes to the same worker, where its
    prompt is now cached (960 tokens reused). The router still prices it with
    the overlap it had when it entered the queue: none (a fresh look would
    see 16 blocks).
    """
    rows: list[Row] = [
        (0, 4096, 50, list(range(100, 108))),
        (0, 16384, 50, list(range(200, 232))),
        (1, 1024, 50, [1, 2]),
        (2, 1024, 50, [1, 2]),
    ]
    report = _replay(tmp_path, rows, {"router_queue_threshold": 0.1}, seed)
    assert _relative_workers(report) == [0, 1, 0, 0]
    second = report.records[3]
    assert second.queue_wait_ms == pytest.approx(122.197327, rel=1e-9)
    assert second.first_token_ms == pytest.approx(147.675, abs=5e-4)
    assert second.reused_input_tokens == 960
    assert (second.selected_overlap_blocks, second.best_available_overlap_blocks) == (0, 0)


ORDER_TRACE: list[Row] = [
    (5, 3376, 1, [1021, 1022, 1023, 1024, 1025, 1026, 1027]),
    (18, 3535, 2, [1014, 1015, 1016, 1017, 1018, 1019, 1020]),
    (20, 2795, 2, [1031, 1032, 1033, 1034, 1035, 1036]),
    (39, 1373, 2, [1011, 1012, 1013]),
    (44, 1852, 3, [1007, 1008, 1009, 1010]),
    (46, 1445, 1, [1028, 1029, 1030]),
    (54, 3437, 2, [1000, 1001, 1002, 1003, 1004, 1005, 1006]),
    (57, 1357, 1, [1011, 1012, 1013]),
]


@pytest.mark.parametrize("seed", range(3))
def test_pass_signals_and_their_queue_releases_go_in_pass_order(tmp_path: Path, seed: int) -> None:
    """Eight short requests on two workers behind a queue (threshold 0.2).

    Each request's signal at a pass end -- its prefill completing, or its
    end -- is handled in turn with the releases it triggers. Handling every
    prefill completion of the pass first would place the last two requests
    the other way round (their first tokens at 266.23 and 179.50 ms).
    """
    report = _replay(tmp_path, ORDER_TRACE, {"router_queue_threshold": 0.2}, seed)
    expected = [72.559, 88.4358, 134.787, 156.9892, 186.736, 156.9892, 236.4601, 230.4519]
    assert _relative_workers(report) == [0, 1, 0, 1, 0, 1, 1, 0]
    assert [r.first_token_ms for r in report.records] == pytest.approx(expected, abs=5e-5)
