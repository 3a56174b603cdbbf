"""A trace block size that is not a multiple of the engine block size, against the reference.

With ``trace_block_size`` 100 and ``block_size`` 64, an engine block can
straddle two hash ids: tokens 64..127 are 36 tokens of the first id and 28 of
the second. Such a block matches only a prompt with both ids in that order.
Reused tokens per request and TTFTs are the reference's (Dynamo 1.6.1, one
worker) on the same trace.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim import EngineConfig, RunConfig, run
from tests.support import write_trace

ROWS = [
    (0, 300, 2, [1, 2, 3]),
    (1000, 300, 2, [1, 2, 4]),  # ids 1, 2 shared: tokens 0..199, three whole engine blocks
    (2000, 150, 2, [1, 5]),  # id 1 shared: tokens 0..99, one whole engine block
    (3000, 300, 2, [1, 2, 3]),  # all of request 0: its four full blocks
    (4000, 200, 2, [6, 2]),  # id 2 again, after another id: nothing
    (5000, 350, 2, [1, 2, 3, 7]),  # request 0's 300 tokens, four full blocks
    (6000, 200, 2, [1, 8]),  # block 1 holds tokens of ids 1 and 8: only block 0 matches
    (7000, 250, 2, [1, 2, 3]),  # recompute rule: (250 - 1) // 64 = 3 blocks
    (8000, 256, 2, [1, 2, 3]),  # fully cached 4 blocks, the last recomputed: 3
    (9000, 129, 2, [1, 2]),  # block 1 straddles ids 1 and 2, both request 0's: 2 blocks
]
# (reused input tokens, TTFT ms) of each request in the reference.
REFERENCE = [
    (0, 21.094341999999997),
    (192, 18.146142000000054),
    (64, 17.810310000000072),
    (256, 17.170305999999982),
    (0, 19.554947999999968),
    (256, 17.9323830000003),
    (64, 18.574155000000246),
    (192, 17.383475999999973),
    (192, 17.47488499999963),
    (128, 16.51660400000037),
]
REFERENCE_REUSED_RATIO = 0.5519507186858317  # 1,344 of 2,435 input tokens


@pytest.mark.parametrize("exact_passes", [False, True])
def test_reused_tokens_with_trace_blocks_of_100_and_engine_blocks_of_64(
    tmp_path: Path, exact_passes: bool
) -> None:
    trace = write_trace(tmp_path / "trace.jsonl", ROWS)
    report = run(
        RunConfig(
            trace=trace,
            trace_block_size=100,
            engine=EngineConfig(block_size=64),
            exact_passes=exact_passes,
        )
    )
    records = sorted(report.records, key=lambda r: r.arrival_time_ms)
    assert [r.reused_input_tokens for r in records] == [reused for reused, _ in REFERENCE]
    assert [r.first_admission_reused_input_tokens for r in records] == [
        reused for reused, _ in REFERENCE
    ]
    for record, (_, ttft) in zip(records, REFERENCE, strict=True):
        assert record.first_token_ms is not None
        assert record.first_token_ms - record.arrival_time_ms == pytest.approx(ttft, abs=1e-6)
    assert report.summary["total_input_tokens"] == 2435
    assert report.summary["prefix_cache_reused_ratio"] == REFERENCE_REUSED_RATIO
