"""At one instant, a finished transfer's handoff settles before a new arrival is routed.

The runtime settles an instant in a fixed order: pass ends, then the flow's
own work (KV transfers due, and the handoff actions they unlock), then
arrivals. The reference (Dynamo 1.6.1) does the same, as this probe shows.

Disaggregated, KV router, two prefill workers, one decode worker, block size
64 (trace blocks of 64), 10 GB/s and 131,072 bytes per token, independent
transfers; ``decode_active_request_weight`` 10, so a prefill worker with a
request still in flight costs 10 more. X (8 blocks) is prefilled by
24.385704 ms; its transfer ends at 31.0965904 ms, and activation, source
release and the end of X's handoff follow at that instant. Y arrives at
exactly 31.0965904 ms and shares X's first three blocks. With X's handoff
settled first, X's prefill worker costs 5 prefill blocks (8 less 3 cached) +
8, the other worker 8 + 8: Y goes where X went and reuses 192 tokens. Routed
before X's handoff ends, Y would pay the in-flight weight there and go to
the other worker (no reuse, 3 ms later). Every number is the reference's;
X's worker is a random tie in the reference, so only "the same worker as X"
is compared, under several seeds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim import RunConfig, parse_engine_args, run
from servesim.config import Role, parse_router_config
from tests.support import write_trace

TRANSFER_END = 31.0965904


@pytest.mark.parametrize("seed", range(3))
def test_an_arrival_at_a_transfer_end_sees_that_handoff_finished(tmp_path: Path, seed: int) -> None:
    trace = write_trace(
        tmp_path / "trace.jsonl",
        [
            (0.0, 512, 3, [1, 2, 3, 4, 5, 6, 7, 8]),
            (TRANSFER_END, 512, 3, [1, 2, 3, 9, 10, 11, 12, 13]),
        ],
    )
    transfer = {"kv_transfer_bandwidth": 10.0, "kv_transfer_link_model": "independent"}
    report = run(
        RunConfig(
            trace=trace,
            trace_block_size=64,
            router_mode="kv_router",
            router=parse_router_config({"decode_active_request_weight": 10.0}),
            prefill_engine=parse_engine_args(
                {"block_size": 64, "kv_transfer_bytes_per_token": 131072, **transfer},
                role=Role.PREFILL,
            ),
            decode_engine=parse_engine_args({"block_size": 64, **transfer}, role=Role.DECODE),
            num_prefill_workers=2,
            seed=seed,
        )
    )
    x, y = sorted(report.records, key=lambda r: r.uid)
    assert x.destination_activated_ms == TRANSFER_END
    assert x.source_released_ms == TRANSFER_END
    assert y.arrival_time_ms == TRANSFER_END
    assert y.prefill_worker == x.prefill_worker
    assert y.reused_input_tokens == 192
    assert (y.source_held_ms, y.first_token_ms, y.last_token_ms) == (
        52.4998214,
        64.9770738,
        76.5099598,
    )
