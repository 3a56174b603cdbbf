"""Two cached copies of one block: which one a prefix hit takes, against the reference (Dynamo 1.6.1).

A block gets a second copy when a request recomputes a block another request
holds (here: two identical prompts arriving together; the second reuses two
blocks of the first and, by the recompute rule, computes the third again).
The reference keeps a hash's copies in the order they were cached and a
prefix hit always takes the *first* one: it is "active" only if that copy is
referenced, and an inactive first copy is pinned out of the LRU even when a
later copy is in use. servesim does the same (it used to prefer a referenced
copy, which kept more evictable blocks and admitted more).

The probe: block size 64, trace blocks of 64, 10 GPU blocks. A and B have the
same three-block prompt (A: 2 tokens out, B: 100) at 0 ms; C (8 blocks, the
same first three, 2 tokens out) at 100 ms. A finishes at 49.37 ms and leaves
its copy of block 3 inactive, first in line; B holds the second copy. C is
admitted at 108.787288 ms reusing 192 tokens. In the reference it pinned A's
inactive copy, so its first decode step finds no block and C (the newest) is
preempted, to be re-admitted only when B finishes (2,271.75 ms). Before, servesim's
C took B's copy, evicted A's for its decode block and finished at 184.13 ms.
"""

from __future__ import annotations

from pathlib import Path

from servesim import RunConfig, parse_engine_args, run
from servesim.engine.kv.block_pool import BlockPool
from tests.support import write_trace


def _probe(tmp_path: Path) -> list[tuple[float | None, float | None, int, float | None]]:
    trace = write_trace(
        tmp_path / "trace.jsonl",
        [
            (0.0, 192, 2, [1, 2, 3]),
            (0.0, 192, 100, [1, 2, 3]),
            (100.0, 512, 2, [1, 2, 3, 4, 5, 6, 7, 8]),
        ],
    )
    report = run(
        RunConfig(
            trace=trace,
            trace_block_size=64,
            engine=parse_engine_args({"block_size": 64, "num_gpu_blocks": 10}),
        )
    )
    return [
        (r.first_token_ms, r.last_token_ms, r.reused_input_tokens, r.first_admit_ms)
        for r in report.records
    ]


def test_what_servesim_and_the_reference_agree_on(tmp_path: Path) -> None:
    """A's timeline, B reusing A's first two blocks, C's admission and first token."""
    a, b, c = _probe(tmp_path)
    assert a == (20.415971000000003, 49.367576, 0, 0.0)
    assert b[0] == 20.415971000000003 and b[2:] == (128, 0.0)
    assert c[0] == 150.116645 and c[3] == 108.787288


def test_a_prefix_hit_pins_the_first_copy_as_the_reference_does(tmp_path: Path) -> None:
    """The reference: C is preempted after its first token and re-admitted when B ends."""
    _, b, c = _probe(tmp_path)
    assert b[1] == 2271.7476109999993
    assert c == (150.116645, 2321.7168739999993, 448, 108.787288)


def test_the_block_pool_takes_the_first_copy() -> None:
    """Block 0 (first copy of hash 7) is inactive, block 1 (second copy) is held: C gets block 0."""
    pool = BlockPool(3)
    a: list[int] = []
    b: list[int] = []
    pool.allocate(a, [], 1)
    pool.allocate(b, [], 1)
    pool.cache(a, [7], 0, 1)
    pool.cache(b, [7], 0, 1)
    pool.release(a)
    assert pool.lru_order() == [0]
    assert pool.match_prefix([7], 1) == (1, 0)  # the first copy is not referenced
    c: list[int] = []
    assert pool.allocate(c, [7], 0)
    assert c == [0]
    assert pool.lru_order() == []
    pool.check([b, c])
