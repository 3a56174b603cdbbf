"""Host KV offload on prefill and decode workers, against the reference (Dynamo 1.6.1).

One prefill and one decode worker, round robin; block size 16 (trace blocks
of 16), 1 MB per block (62,500 bytes per token), fixed timing (10 ms a
prefill pass, 1 ms a decode pass); a host tier of 16 blocks copies at 1 GB/s
(a block a millisecond) unless a test says otherwise. The prompt's KV moves
to the decode worker at once. Every number is the reference's (each
scenario was run on it; its timelines are in the docstrings).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from servesim import RunConfig, parse_engine_args, run
from servesim.config import Role
from servesim.errors import ConfigError
from servesim.metrics.collector import RequestRecord
from tests.support import HANDOFF_TIMELINE, write_trace

BASE: dict[str, Any] = {
    "block_size": 16,
    "kv_cache_bytes_per_token": 62500,
    "timing_model": {"type": "fixed", "prefill_ms": 10, "decode_ms": 1},
}


def host(d2h: float = 1.0, h2d: float = 1.0) -> dict[str, Any]:
    return {"num_host_blocks": 16, "d2h_bandwidth_gbps": d2h, "h2d_bandwidth_gbps": h2d}


def replay(
    tmp_path: Path,
    rows: Sequence[tuple[float, int, int, Sequence[int]]],
    *,
    prefill: dict[str, Any],
    decode: dict[str, Any],
    exact_passes: bool = False,
) -> list[RequestRecord]:
    report = run(
        RunConfig(
            trace=write_trace(tmp_path / "trace.jsonl", rows),
            trace_block_size=16,
            prefill_engine=parse_engine_args({**BASE, **prefill}, role=Role.PREFILL),
            decode_engine=parse_engine_args({**BASE, **decode}, role=Role.DECODE),
            exact_passes=exact_passes,
        )
    )
    return sorted(report.records, key=lambda r: (r.arrival_time_ms, r.uid))


def timeline(record: RequestRecord) -> list[float | None]:
    """Prefill admitted, then source held, destination reserved and activated, decode
    admitted, source released, first and last token."""
    return [record.prefill_admit_ms, *(getattr(record, name) for name in HANDOFF_TIMELINE)]


modes = pytest.mark.parametrize("exact_passes", [False, True], ids=["fast_forward", "exact"])

A, C, B = (0.0, 64, 2, [1, 2, 3, 4]), (50.0, 64, 2, [5, 6, 7, 8]), (100.0, 64, 2, [1, 2, 3, 4])


@modes
def test_a_prefill_worker_loads_a_host_prefix_before_its_prefill_pass(
    tmp_path: Path, exact_passes: bool
) -> None:
    """Prefill worker of 6 GPU blocks: C's prefill evicts A's last two blocks, which A's
    store put on host (10 → 14 ms). B finds 2 blocks on the GPU and 2 on host, loads them
    (100 → 102 ms), then prefills: reuse 48 tokens, 32 from the GPU and 16 from host (the
    last prompt token is recomputed)."""
    *_, b = replay(
        tmp_path,
        [A, C, B],
        prefill={"num_gpu_blocks": 6, "native_host_offload": host()},
        decode={"num_gpu_blocks": 16},
        exact_passes=exact_passes,
    )
    assert timeline(b) == [102.0, 112.0, 112.0, 112.0, 112.0, 112.0, 113.0, 114.0]
    assert (
        b.reused_input_tokens,
        b.first_admission_reused_input_tokens - (b.first_admission_host_reused_input_tokens or 0),
        b.first_admission_host_reused_input_tokens,
    ) == (
        48,
        32,
        16,
    )


def test_the_first_admission_split_is_absent_without_a_prefill_host_tier(tmp_path: Path) -> None:
    """A host tier on the decode worker only: the request's first admission (on the prefill
    worker) had none, so its reuse is not split; reuse 32 from the prefill GPU."""
    *_, b = replay(
        tmp_path,
        [A, C, B],
        prefill={"num_gpu_blocks": 6},
        decode={"num_gpu_blocks": 16, "native_host_offload": host()},
    )
    assert (b.reused_input_tokens, b.first_admission_host_reused_input_tokens) == (32, None)
    assert (b.first_token_ms, b.last_token_ms) == (111.0, 112.0)


@pytest.mark.parametrize(
    ("d2h", "reserved"), [(None, 22.0), (0.5, 22.0), (0.25, 27.0), (0.125, 43.0)]
)
def test_a_destination_never_takes_blocks_a_host_store_is_still_reading(
    tmp_path: Path, d2h: float | None, reserved: float
) -> None:
    """Decode worker of 6 GPU blocks. A's first decode pass (10 → 11 ms) stores its 4
    prompt blocks to host, from 11 ms at the host tier's speed. When C's prefill ends at
    22 ms its reservation needs blocks that copy may still be reading: it is refused, and
    tried again when the copy completes (27 ms at 0.25 GB/s, 43 at 0.125; done by 22 at
    0.5 GB/s, or without a host tier)."""
    decode: dict[str, Any] = {"num_gpu_blocks": 6}
    if d2h is not None:
        decode["native_host_offload"] = host(d2h=d2h)
    _, c = replay(
        tmp_path,
        [A, (12.0, 64, 2, [5, 6, 7, 8])],
        prefill={"num_gpu_blocks": 16},
        decode=decode,
    )
    r = reserved
    assert timeline(c) == [12.0, 22.0, r, r, r, r, r + 1, r + 2]


@modes
@pytest.mark.parametrize(("h2d", "last_token"), [(1.0, 139.0), (0.25, 145.0)])
def test_a_request_preempted_on_a_decode_worker_reloads_its_prompt_from_host(
    tmp_path: Path, exact_passes: bool, h2d: float, last_token: float
) -> None:
    """Decode worker of 8 GPU blocks: A (2 blocks, 90 out) and C (2 blocks, 60 out) grow
    until C is preempted. C's first decode pass stored its prompt to host, so when A ends
    (100 ms) C loads its 2 blocks (2 ms at 1 GB/s, 8 at 0.25) and resumes, reusing them
    all instead of recomputing."""
    a, c = replay(
        tmp_path,
        [(0.0, 32, 90, [1, 2]), (1.0, 32, 60, [3, 4])],
        prefill={"num_gpu_blocks": 16},
        decode={"num_gpu_blocks": 8, "native_host_offload": host(h2d=h2d)},
        exact_passes=exact_passes,
    )
    assert a.last_token_ms == 100.0
    assert (c.first_token_ms, c.last_token_ms, c.decode_reused_input_tokens) == (
        21.0,
        last_token,
        32,
    )


def test_without_a_host_tier_the_preempted_request_recomputes(tmp_path: Path) -> None:
    """The same without a host tier: C is re-admitted at 100 ms, recomputes, ends at 137."""
    _, c = replay(
        tmp_path,
        [(0.0, 32, 90, [1, 2]), (1.0, 32, 60, [3, 4])],
        prefill={"num_gpu_blocks": 16},
        decode={"num_gpu_blocks": 8},
    )
    assert (c.last_token_ms, c.decode_reused_input_tokens) == (137.0, 0)


def test_a_request_whose_kv_arrived_goes_before_a_preempted_one(tmp_path: Path) -> None:
    """As above, plus F (1 block) at 50 ms: its KV arrives at 60 ms while C waits
    preempted, and F is admitted at once (C still reloads when A ends)."""
    _, c, f = replay(
        tmp_path,
        [(0.0, 32, 90, [1, 2]), (1.0, 32, 60, [3, 4]), (50.0, 16, 2, [7])],
        prefill={"num_gpu_blocks": 16},
        decode={"num_gpu_blocks": 8, "native_host_offload": host()},
    )
    assert timeline(f) == [50.0, 60.0, 60.0, 60.0, 60.0, 60.0, 61.0, 62.0]
    assert (c.last_token_ms, c.decode_reused_input_tokens) == (139.0, 32)


def test_a_store_refused_in_the_prefill_pass_is_lost(tmp_path: Path) -> None:
    """Prefill worker of 6 GPU blocks, host copies at 0.25 GB/s. A's store reads its GPU
    blocks 10 → 26 ms; C (11.5 ms) reuses them for its prompt, so its pass waits for the
    copy (26 → 36 ms) and its own store is refused in that pass: the prefill request ends
    there, and its prompt never reaches host. B (C's prompt again, 100 ms) finds 2 blocks
    on the GPU and nothing on host."""
    _, c, _, b = replay(
        tmp_path,
        [
            A,
            (11.5, 64, 2, [5, 6, 7, 8]),
            (60.0, 64, 2, [20, 21, 22, 23]),
            (100.0, 64, 2, [5, 6, 7, 8]),
        ],
        prefill={"num_gpu_blocks": 6, "native_host_offload": host(d2h=0.25)},
        decode={"num_gpu_blocks": 16},
    )
    assert timeline(c) == [11.5, 36.0, 36.0, 36.0, 36.0, 36.0, 37.0, 38.0]
    assert (
        b.prefill_admit_ms,
        b.reused_input_tokens,
        b.first_admission_host_reused_input_tokens,
    ) == (100.0, 32, 0)


def test_a_disk_tier_is_refused_on_prefill_and_decode_workers() -> None:
    """As the reference: g3_offload only under aggregated workers."""
    disk = {"scope": "worker_local", "num_g3_blocks": 64}
    for role in (Role.PREFILL, Role.DECODE):
        with pytest.raises(ConfigError, match="g3_offload is supported only for worker_type"):
            parse_engine_args(
                {**BASE, "native_host_offload": host(), "g3_offload": disk}, role=role
            )
