"""``overlap_score_credit_decay`` against the reference (Dynamo 1.6.1).

The KV router's overlap credit on a worker is scaled by
``1 / (1 + decay x excess / n)``: ``excess`` is the worker's uncached prompt
tokens in flight above the least loaded worker's, in blocks, and ``n`` the
new request's blocks, rounded up.

Two aggregated workers, block size 64 (trace blocks of 64), a token budget of
512 so that prompts prefill in chunks. At 0 ms Z0 (40 blocks, ids 1..40)
takes a worker at random and Z1 (33 other blocks) the other. Z0's first
chunk (its blocks 1..8) is cached by 24 ms. At 30 ms both are still
prefilling (Z0's worker carries 7 blocks more) when Y arrives: 769 tokens
(13 blocks rounded up), its first 8 blocks Z0's. Y's cost on Z0's worker is
72 + 12.02 + 12 - 8 x credit, on Z1's 66 + 12.02 + 12: Y goes to Z0's
worker when the credit exceeds 0.75.

- decay 1: credit 1 / (1 + 7/13) = 0.65, Y goes to Z1's worker (without
  the decay it would take Z0's);
- decay 0.6: credit 1 / (1 + 0.6 x 7/13) = 0.756, Y goes to Z0's worker and
  reuses 512 tokens (with ``n`` rounded down, 12, or the excess counted from
  0 instead of the least loaded worker, the credit falls below 0.75).

Every number is the reference's; Z0's worker is a random tie in the
reference, so workers are compared relative to Z0's and Z1's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim import RunConfig, parse_engine_args, run
from servesim.config import parse_router_config
from tests.support import write_trace

# decay -> (Z0 first/last token, Z1 first/last token, Y admitted/first/last, Y reused, Y's worker)
REFERENCE = {
    1.0: (
        (121.92852, 133.672088),
        (121.92852, 155.08429),
        (97.542816, 149.19593600000002, 160.863989),
        0,
        "Z1",
    ),
    0.6: (
        (121.92852, 154.143014),
        (115.017701, 126.715216),
        (121.92852, 148.231649, 159.922713),
        512,
        "Z0",
    ),
}


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("decay", sorted(REFERENCE))
def test_the_decayed_credit_decides_where_y_goes(tmp_path: Path, decay: float, seed: int) -> None:
    trace = write_trace(
        tmp_path / "trace.jsonl",
        [
            (0.0, 2560, 3, list(range(1, 41))),
            (0.0, 2112, 3, list(range(101, 134))),
            (30.0, 769, 3, [*range(1, 9), 200, 201, 202, 203, 204]),
        ],
    )
    report = run(
        RunConfig(
            trace=trace,
            trace_block_size=64,
            num_workers=2,
            router_mode="kv_router",
            router=parse_router_config({"overlap_score_credit_decay": decay}),
            engine=parse_engine_args({"block_size": 64, "max_num_batched_tokens": 512}),
            seed=seed,
        )
    )
    z0, z1, y = report.records
    want_z0, want_z1, want_y, reused, where = REFERENCE[decay]
    assert z0.worker != z1.worker
    assert (z0.first_token_ms, z0.last_token_ms) == want_z0
    assert (z1.first_token_ms, z1.last_token_ms) == want_z1
    assert (y.first_admit_ms, y.first_token_ms, y.last_token_ms) == want_y
    assert y.reused_input_tokens == reused
    assert y.worker == (z0.worker if where == "Z0" else z1.worker)
