"""A decode rank whose passes take no time, emit nothing and go round in a cycle stalls,
and the replay ends at a clean dead end.

One request of 19 prompt tokens and 4 output tokens, speculative decoding with one
draft token, on a decode rank of 10 two-token blocks that runs one request at a time.
Its prompt's KV lands in all 10 blocks; admitted, it needs an 11th for its largest
burst, so it preempts itself; re-admitted, its prefix is cached (and a decode rank
prices no prompt recompute), so the pass took no time and the rank admits and
preempts it again, at the same instant, for ever. The 1.6.1 reference never returns
from this run (with more requests, seeds 538, 777, 927 and 1373 of the differential's
``disaggregated`` family, it stops with "effect-free zero-duration pass"); servesim
recursed until Python's stack ran out.

The cycle may also take two passes: one admits a request, the next preempts it
(``disaggregated`` seed 777, shrunk to 7 requests).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servesim.config import Role, parse_engine_args
from servesim.errors import SimulationError
from servesim.simulation import Report, RunConfig, run
from tests.support import write_trace

modes = pytest.mark.parametrize("exact_passes", [False, True], ids=["fast_forward", "exact"])


def replay(
    tmp_path: Path,
    rows: list[tuple[float, int, int, list[int]]],
    prefill: dict[str, Any],
    decode: dict[str, Any],
    *,
    prefill_workers: int = 1,
    **run_args: Any,
) -> Report:
    """``rows`` (arrival, prompt and output tokens, hash ids) on ``prefill_workers``
    prefill workers and one decode worker."""
    return run(
        RunConfig(
            trace=write_trace(tmp_path / "trace.jsonl", rows),
            trace_block_size=8,
            router_mode="round_robin",
            prefill_engine=parse_engine_args(prefill, role=Role.PREFILL),
            decode_engine=parse_engine_args(decode, role=Role.DECODE),
            num_prefill_workers=prefill_workers,
            num_decode_workers=1,
            **run_args,
        )
    )


ONE_REQUEST = [(0.0, 19, 4, [1, 2, 3])]
PREFILL = {"block_size": 2, "num_gpu_blocks": 64}
DECODE = {
    "block_size": 2,
    "num_gpu_blocks": 10,
    "max_num_seqs": 1,
    "aic_nextn": 1,
    "aic_nextn_accept_rates": "0.7",
}


@modes
def test_a_rank_that_preempts_what_it_admits_stalls_into_a_dead_end(
    tmp_path: Path, exact_passes: bool
) -> None:
    with pytest.raises(SimulationError, match=r"dead end at 16\.790 ms with 1 request\(s\)"):
        replay(tmp_path, ONE_REQUEST, PREFILL, DECODE, exact_passes=exact_passes)


def test_a_rank_that_fits_the_burst_decodes(tmp_path: Path) -> None:
    """With room for its bursts the same request decodes: the rule stalls only a repeating pass."""
    report = replay(tmp_path, ONE_REQUEST, PREFILL, {**DECODE, "num_gpu_blocks": 13})
    (record,) = report.records
    assert record.output_length == 4


SEED_777 = [
    (0.0, 38, 12, [1, 1, 0, 2, 2]),
    (7.393, 35, 2, [0, 2, 1, 1, 2]),
    (60.0, 15, 10, [1, 0]),
    (60.0, 33, 16, [1, 1, 1, 0, 1]),
    (80.0, 16, 5, [0, 0]),
    (100.0, 34, 9, [1, 2, 1, 1, 1]),
    (109.065, 19, 2, [2, 2, 1]),
]
LINK = {
    "kv_transfer_bandwidth": 1.0,
    "kv_transfer_bytes_per_token": 1_000_000,
    "kv_transfer_link_model": "independent",
}


@modes
def test_a_two_pass_cycle_stalls_too(tmp_path: Path, exact_passes: bool) -> None:
    """One pass admits a request and the next, at the same instant, preempts it."""
    prefill = {
        "block_size": 4,
        "num_gpu_blocks": 33,
        "max_num_seqs": 2,
        "max_num_batched_tokens": 8,
        "preemption_mode": "lifo",
        "aic_nextn": 1,
        "aic_nextn_accept_rates": "0.3",
        **LINK,
    }
    decode = {
        "block_size": 4,
        "num_gpu_blocks": 15,
        "max_num_batched_tokens": 16,
        "max_model_len": 57,
        "enable_prefix_caching": False,
        "aic_nextn": 1,
        "aic_nextn_accept_rates": "1.0",
        **LINK,
    }
    with pytest.raises(SimulationError, match=r"dead end at 871\.474 ms with 3 request\(s\)"):
        replay(
            tmp_path,
            SEED_777,
            prefill,
            decode,
            prefill_workers=2,
            replay_concurrency=6,
            exact_passes=exact_passes,
        )
