"""When a prefill pass's blocks become visible to the KV router, against the reference (Dynamo 1.6.1).

Two aggregated workers, KV router (default config), block size 64 and trace
blocks of 64. At 0 ms, Z0 (10 blocks, ids 1..10) and Z1 (8 other blocks)
arrive: Z0 takes a worker at random, Z1 the other (cheaper). Z0's prefill
pass runs 0 → 26.391263 ms; Z1's 0 → 24.385704 ms. Y (ids 1, 2, 3 and two
blocks of its own, 257 tokens) arrives later.

- Y at 30 ms, after Z0's pass has ended: both simulators see Z0's three
  blocks cached on its worker, and Y goes there reusing 192 tokens.
- Y at 20 ms, while Z0's pass is in flight: the reference does not see Z0's
  blocks yet (best overlap 0, also at 26.391263 ms, an instant before the
  pass ends; at 26.5 ms it sees them): the blocks of a pass become visible
  to the router at its *end* (the spec says its start for vLLM; the
  reference wins). Y goes to Z1's worker (the costs: 12.02 + 12 there
  against 14.02 + 11 on Z0's).

Every number is the reference's; its random tie for Z0 is why workers are
compared relative to Z0's and Z1's, under several seeds.

Removed events show the same timing. One worker, block size 16 (trace
blocks of 16), 10 GPU blocks: P (4 blocks, ids 1..4, one token out) finishes
at 17.72 ms and leaves its blocks cached; D (1 block, 100 out) decodes alone
and, once the free blocks are gone, evicts P's blocks tail first: block 4 in
the pass 1,703.031386 → 1,732.054493 ms, block 3 in the pass from
2,183.254505 ms. Y (ids 1..5) asks the router for its overlap:

- at 1,703.031386 ms, the very instant that pass starts, both simulators
  still see 4 blocks (the arrival is settled before the pass starts; decode
  fast-forward must not apply the pass's eviction early);
- at 1,730 ms, inside the pass, both still see 4 (the Removed event shows
  at the pass end);
- at 1,800 ms both see 3.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim import RunConfig, parse_engine_args, run
from servesim.config import parse_router_config
from servesim.simulation import Report
from tests.support import write_trace


def _replay(tmp_path: Path, y_arrival: float, seed: int) -> Report:
    trace = write_trace(
        tmp_path / "trace.jsonl",
        [
            (0.0, 640, 3, list(range(1, 11))),
            (0.0, 512, 3, list(range(20, 28))),
            (y_arrival, 257, 3, [1, 2, 3, 100, 101]),
        ],
    )
    return run(
        RunConfig(
            trace=trace,
            trace_block_size=64,
            num_workers=2,
            router_mode="kv_router",
            router=parse_router_config({}),
            engine=parse_engine_args({"block_size": 64}),
            seed=seed,
        )
    )


@pytest.mark.parametrize("seed", range(3))
def test_blocks_of_an_ended_pass_draw_the_next_request(tmp_path: Path, seed: int) -> None:
    """Y at 30 ms goes to Z0's worker, reusing 192 tokens (3 blocks)."""
    z0, z1, y = _replay(tmp_path, 30.0, seed).records
    assert z1.worker != z0.worker
    assert (z0.first_token_ms, z1.first_token_ms) == (26.391263000000002, 24.385704)
    assert y.worker == z0.worker
    assert (y.selected_overlap_blocks, y.best_available_overlap_blocks, y.reused_input_tokens) == (
        3,
        3,
        192,
    )
    assert (y.first_token_ms, y.last_token_ms) == (55.42745, 66.934076)


@pytest.mark.parametrize("seed", range(3))
def test_blocks_of_a_pass_in_flight_are_not_yet_visible(tmp_path: Path, seed: int) -> None:
    """Y at 20 ms sees no cached block anywhere and goes to Z1's worker (the reference)."""
    _, z1, y = _replay(tmp_path, 20.0, seed).records
    assert y.best_available_overlap_blocks == 0
    assert y.worker == z1.worker
    assert y.reused_input_tokens == 0
    assert (y.first_token_ms, y.last_token_ms) == (50.58349200000001, 62.116581000000004)


def _evicting(tmp_path: Path, y_arrival: float, exact_passes: bool) -> Report:
    trace = write_trace(
        tmp_path / "trace.jsonl",
        [
            (0.0, 64, 1, [1, 2, 3, 4]),
            (0.0, 16, 100, [9]),
            (y_arrival, 80, 2, [1, 2, 3, 4, 5]),
        ],
    )
    return run(
        RunConfig(
            trace=trace,
            trace_block_size=16,
            router_mode="kv_router",
            router=parse_router_config({}),
            engine=parse_engine_args({"block_size": 16, "num_gpu_blocks": 10}),
            exact_passes=exact_passes,
        )
    )


EVICTING_PASS_START = 1703.031386


@pytest.mark.parametrize("exact_passes", [False, True], ids=["fast_forward", "exact"])
@pytest.mark.parametrize(
    ("y_arrival", "overlap"), [(EVICTING_PASS_START, 4), (1730.0, 4), (1800.0, 3)]
)
def test_an_eviction_is_seen_once_its_pass_has_ended(
    tmp_path: Path, exact_passes: bool, y_arrival: float, overlap: int
) -> None:
    """Y at the evicting pass's start and inside it sees P's 4 blocks, after the pass 3."""
    p, d, y = _evicting(tmp_path, y_arrival, exact_passes).records
    assert (p.first_token_ms, d.last_token_ms) == (17.718790000000002, 2276.717653)
    assert (y.selected_overlap_blocks, y.best_available_overlap_blocks) == (overlap, overlap)
    assert (y.first_admit_ms, y.first_token_ms, y.last_token_ms, y.reused_input_tokens) == (
        2276.717653,
        2293.948848,
        2320.43453,
        32,
    )
