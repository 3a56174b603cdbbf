"""Disaggregated replay follows the reference's P/D rules, with its own numbers.

Every number here comes from a small scenario run on the reference (Dynamo
1.6.1's offline replay, ``refcheck.py reference``) with the same trace and
engine keys; servesim must give the same timeline to the nanosecond (1e-6 ms),
in fast-forward and pass-by-pass mode alike. Polynomial timing, block size
64; prompts of unique blocks unless a case shares some. With
``kv_transfer_bandwidth`` 10 GB/s and 131,072 bytes per token a 1,000-token
prompt moves in 13.1072 ms and 512 tokens in 6.710886 ms.

The rules:

- A decode rank grants its queued destination reservations one at a time:
  one try at each pass end of its worker, one after each command applied on
  it while the worker is idle (a reservation queued, an activation).
- ``destination_missing`` moves only the blocks the destination lacks: a
  prompt prefix resident on the decode rank is reused (yet the reference
  reports no reused decode tokens).
- Decode ``max_num_seqs`` holds back reservations while that many requests
  *run* on the rank; activated requests waiting for a slot do not count, so
  reservation, activation and the source's release never wait for admission.
  Activated requests are admitted in the order their reservations were
  queued; with reservations queued, only an activated request is admitted.
- DP ranks in both pools: round robin walks a pool's (worker, rank) pairs
  worker-major; the KV router balances over the same pairs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from servesim.cluster.runtime import Pool, Stage
from servesim.config import Role, parse_engine_args
from servesim.engine.request import EngineRequest
from servesim.metrics.collector import RequestRecord
from servesim.metrics.report import request_row
from servesim.simulation import RunConfig, run
from tests.support import HANDOFF_TIMELINE

BANDWIDTH = {"kv_transfer_bandwidth": 10.0, "kv_transfer_bytes_per_token": 131072}

Row = tuple[float, int, int] | tuple[float, int, int, list[int]]


def write_trace(path: Path, rows: Sequence[Row]) -> Path:
    """A Mooncake trace: (timestamp, input tokens, output tokens[, hash ids]); unique blocks by default."""
    next_id = 1000
    with path.open("w") as out:
        for row in rows:
            timestamp, input_length, output_length = row[:3]
            if len(row) == 4:
                ids = row[3]
            else:
                count = -(-input_length // 512)
                ids = list(range(next_id, next_id + count))
                next_id += count
            record = {
                "timestamp": timestamp,
                "input_length": input_length,
                "output_length": output_length,
                "hash_ids": ids,
            }
            out.write(json.dumps(record) + "\n")
    return path


def replay(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    rows: Sequence[Row],
    *,
    exact_passes: bool,
    prefill: dict[str, Any] | None = None,
    decode: dict[str, Any] | None = None,
    prefill_workers: int = 1,
    decode_workers: int = 1,
    router_mode: str = "round_robin",
) -> tuple[list[RequestRecord], dict[int, tuple[int, int]]]:
    """Replay the rows disaggregated; returns the records (arrival order) and each prefill's (worker, rank)."""
    prefill_placements: dict[int, tuple[int, int]] = {}
    submit = Pool.submit

    def recording_submit(
        pool: Pool, worker_id: int, rank: int, request: EngineRequest, now: float
    ) -> None:
        if pool.stage is Stage.PREFILL:
            prefill_placements[request.uid] = (worker_id, rank)
        submit(pool, worker_id, rank, request, now)

    monkeypatch.setattr(Pool, "submit", recording_submit)
    # The reference prices every transfer alone (no shared links).
    link = {"kv_transfer_link_model": "independent"}
    report = run(
        RunConfig(
            trace=write_trace(tmp_path / "trace.jsonl", rows),
            trace_block_size=512,
            router_mode=router_mode,
            prefill_engine=parse_engine_args(
                {"block_size": 64, **link, **(prefill or {})}, role=Role.PREFILL
            ),
            decode_engine=parse_engine_args({"block_size": 64, **(decode or {})}, role=Role.DECODE),
            num_prefill_workers=prefill_workers,
            num_decode_workers=decode_workers,
            exact_passes=exact_passes,
        )
    )
    return sorted(report.records, key=lambda r: r.uid), prefill_placements


def timeline(record: RequestRecord) -> list[float | None]:
    return [getattr(record, name) for name in HANDOFF_TIMELINE]


def assert_timelines(records: list[RequestRecord], expected: list[list[float]]) -> None:
    assert len(records) == len(expected)
    for record, want in zip(records, expected, strict=True):
        assert timeline(record) == pytest.approx(want, abs=1e-6), record.uid


modes = pytest.mark.parametrize("exact_passes", [False, True], ids=["fast_forward", "exact"])


# --------------------------------------------------------------------------- rule 5


@modes
def test_queued_reservations_are_granted_one_per_decode_pass_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exact_passes: bool
) -> None:
    """Three reservations queued behind a full decode rank get one pass end each.

    Decode ``max_num_seqs`` 3: a long request (200 tokens) and two of 40 tokens
    fill the rank; three more (10 tokens) are held on the prefill side from
    165.840730 and queue their reservations. When the two finish (pass end
    314.840651) one slot-holder remains, so the rank may reserve again, but
    only its queue head: the next two go at the next two pass ends (320.634194,
    326.427788) of the long request's decode, each transfer 13.1072 ms later
    (then activated at the pass end after it). The third activated request
    waits for a running slot until the first of the three finishes.
    """
    records, _ = replay(
        tmp_path,
        monkeypatch,
        [(0, 1000, 200), (0, 1000, 40), (0, 1000, 40)] + [(100, 1000, 10)] * 3,
        prefill=BANDWIDTH,
        decode={**BANDWIDTH, "max_num_seqs": 3},
        exact_passes=exact_passes,
    )
    first = [65.840730, 65.840730, 78.947930, 78.947930, 78.947930, 84.842243]
    assert_timelines(
        records,
        [
            [*first, 1244.011580],
            [*first, 314.840651],
            [*first, 314.840651],
            [165.840730, 314.840651, 332.221434, 332.221434, 332.221434, 338.066567, 391.141736],
            [165.840730, 320.634194, 338.066567, 338.066567, 338.066567, 343.963192, 397.039234],
            [165.840730, 326.427788, 343.963192, 391.141736, 343.963192, 397.039234, 449.654686],
        ],
    )


@modes
def test_an_activation_on_an_idle_decode_rank_grants_the_next_reservation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exact_passes: bool
) -> None:
    """Without a pass end in between, the next reservation waits for the activation command.

    A decode rank of 40 blocks holds two 1,000-token prompts (16 blocks each)
    and their outputs; the other two requests queue for blocks. When both
    running requests finish (419.807365) the rank reserves one, then idles:
    the second is reserved only when the first is activated (432.914565), a
    transfer later, although both fit at once.
    """
    records, _ = replay(
        tmp_path,
        monkeypatch,
        [(0, 1000, 10)] * 4,
        prefill=BANDWIDTH,
        decode={**BANDWIDTH, "num_gpu_blocks": 40},
        exact_passes=exact_passes,
    )
    first = [83.971162, 83.971162, 97.078362, 97.078362, 97.078362, 129.303225, 419.807365]
    assert_timelines(
        records,
        [
            first,
            first,
            [83.971162, 419.807365, 432.914565, 432.914565, 432.914565, 455.824609, 746.280937],
            [83.971162, 432.914565, 455.824609, 455.824609, 455.824609, 488.054856, 769.309845],
        ],
    )


# --------------------------------------------------------------------------- rule 6

SHARED_PREFIX_ROWS: list[Row] = [
    (0, 1024, 5, [1, 2]),
    (200, 1024, 5, [1, 2]),  # the whole prompt is resident on the decode rank
    (400, 1500, 5, [1, 2, 3]),  # 16 of its 24 blocks are resident
    (600, 1000, 5, [1, 4]),  # 8 of its 16 blocks are resident
]


@modes
def test_destination_missing_moves_only_the_blocks_the_decode_rank_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exact_passes: bool
) -> None:
    """The transfer is priced on the fresh blocks only; the reference still reports no decode reuse.

    The second request's prompt is all resident (its transfer is empty: it is
    activated as it is reserved); the third and fourth lack 8 blocks each,
    512 tokens, 6.710886 ms.
    """
    records, _ = replay(
        tmp_path,
        monkeypatch,
        SHARED_PREFIX_ROWS,
        prefill={**BANDWIDTH, "kv_transfer_timing_mode": "destination_missing"},
        decode=BANDWIDTH,
        exact_passes=exact_passes,
    )
    assert_timelines(
        records,
        [
            [32.490712, 32.490712, 45.912485, 45.912485, 45.912485, 51.705205, 74.876598],
            [217.474885, 217.474885, 217.474885, 217.474885, 217.474885, 223.267605, 246.438998],
            [423.824126, 423.824126, 430.535012, 430.535012, 430.535012, 436.352221, 459.621573],
            [624.011197, 624.011197, 630.722083, 630.722083, 630.722083, 636.513568, 659.680020],
        ],
    )
    assert [r.decode_reused_input_tokens for r in records] == [0, 0, 0, 0]
    assert [r.reused_input_tokens for r in records] == [
        0,
        960,
        1024,
        512,
    ]  # the prefill side's prefix hits


@modes
def test_full_prompt_moves_the_whole_prompt_even_when_resident(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exact_passes: bool
) -> None:
    """The same workload with ``full_prompt``: every transfer is the whole prompt (1,024 tokens: 13.421773 ms)."""
    records, _ = replay(
        tmp_path,
        monkeypatch,
        SHARED_PREFIX_ROWS,
        prefill=BANDWIDTH,
        decode=BANDWIDTH,
        exact_passes=exact_passes,
    )
    assert [r.destination_activated_ms for r in records] == pytest.approx(
        [45.912485, 230.896658, 443.484926, 637.118397], abs=1e-6
    )


# --------------------------------------------------------------------------- rule 7


@modes
def test_decode_max_num_seqs_does_not_hold_back_reservation_activation_or_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exact_passes: bool
) -> None:
    """Four requests on a decode rank that runs two: all four reserve, move and release at once.

    Nothing runs on the decode rank when they are held (83.971162), so all four
    are reserved then, activated and released a transfer later (97.078362);
    only their admission waits: the last two start when the first two finish.
    """
    records, _ = replay(
        tmp_path,
        monkeypatch,
        [(0, 1000, 10)] * 4,
        prefill=BANDWIDTH,
        decode={**BANDWIDTH, "max_num_seqs": 2},
        exact_passes=exact_passes,
    )
    handoff = [83.971162, 83.971162, 97.078362]
    assert_timelines(
        records,
        [
            [*handoff, 97.078362, 97.078362, 102.921284, 155.512212],
            [*handoff, 97.078362, 97.078362, 102.921284, 155.512212],
            [*handoff, 155.512212, 97.078362, 161.355134, 213.946062],
            [*handoff, 155.512212, 97.078362, 161.355134, 213.946062],
        ],
    )


@modes
def test_decode_max_num_seqs_holds_back_reservations_while_that_many_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exact_passes: bool
) -> None:
    """Two requests run on a rank of ``max_num_seqs`` 2: later ones keep their source until one finishes.

    Held from 148.552296, they reserve only when the running two finish
    (295.456591; the second at the first's activation, 308.563791), and
    release their sources a transfer after that.
    """
    records, _ = replay(
        tmp_path,
        monkeypatch,
        [(0, 1000, 40), (0, 1000, 40), (100, 1000, 10), (100, 1000, 10)],
        prefill=BANDWIDTH,
        decode={**BANDWIDTH, "max_num_seqs": 2},
        exact_passes=exact_passes,
    )
    first = [48.552296, 48.552296, 61.659496, 61.659496, 61.659496, 67.502418, 295.456591]
    assert_timelines(
        records,
        [
            first,
            first,
            [148.552296, 295.456591, 308.563791, 308.563791, 308.563791, 314.355276, 366.842094],
            [148.552296, 308.563791, 325.938399, 325.938399, 325.938399, 331.781476, 384.217783],
        ],
    )


@modes
def test_activated_requests_are_admitted_in_reservation_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exact_passes: bool
) -> None:
    """A request reserved earlier goes first, though a later one's shorter transfer activated it first.

    Decode ``max_num_seqs`` 1. The 8,000-token prompt is reserved at 164.912870
    and moves for 104.9 ms; the 500- and 2,000-token ones are reserved at
    222.004133, and the short one runs at once. The 2,000-token one is activated
    at 251.621035, before the long one (274.685161), yet when the slot frees
    (805.387387) the long one is admitted first.
    """
    records, _ = replay(
        tmp_path,
        monkeypatch,
        [(0, 8000, 10), (0.1, 500, 100), (0.2, 2000, 10)],
        prefill={**BANDWIDTH, "max_num_batched_tokens": 16384},
        decode={**BANDWIDTH, "max_num_seqs": 1},
        exact_passes=exact_passes,
    )
    assert_timelines(
        records,
        [
            [164.912870, 164.912870, 274.685161, 805.387387, 274.685161, 811.537952, 866.895341],
            [222.004133, 222.004133, 228.557733, 228.557733, 228.557733, 234.323481, 805.387387],
            [222.004133, 222.004133, 251.621035, 866.895341, 251.621035, 872.738263, 925.326878],
        ],
    )


@modes
def test_a_preempted_decode_request_keeps_its_place_ahead_of_an_activated_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exact_passes: bool
) -> None:
    """With no reservation queued, the decode rank admits in FIFO order: a preempted request first.

    Two 1,000-token requests of 600 output tokens outgrow a decode rank of 40
    blocks: one is preempted and waits for blocks. The third request's
    reservation waits for blocks too (9451.457399); once activated, it still
    waits behind the preempted request, and both start when the other
    long request finishes (18338.960370).
    """
    records, _ = replay(
        tmp_path,
        monkeypatch,
        [(0, 1000, 600), (0, 1000, 600), (2500, 500, 50)],
        prefill=BANDWIDTH,
        decode={**BANDWIDTH, "num_gpu_blocks": 40},
        exact_passes=exact_passes,
    )
    # The reference rounds each pass duration to the ns; over ~3,000 passes the sum differs by ~1 ns.
    first = [48.552296, 48.552296, 61.659496, 61.659496, 61.659496, 93.884359]
    third = [2524.198390, 9451.457399, 9477.789469, 18338.960370, 9477.789469, 18369.817063]
    expected = [[*first, 18338.960370], [*first, 27482.986108], [*third, 19898.573290]]
    for record, want in zip(records, expected, strict=True):
        assert timeline(record) == pytest.approx(want, abs=1e-5)


# --------------------------------------------------------------------------- rule 8

DP_ROWS: list[Row] = [(i, 500, 5) for i in range(12)]


@modes
def test_round_robin_walks_each_pools_ranks_worker_major(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exact_passes: bool
) -> None:
    """Two prefill workers and three decode workers, two DP ranks each; 12 requests 1 ms apart.

    Prefills go worker 0 rank 0, worker 0 rank 1, worker 1 rank 0, worker 1
    rank 1, ... in arrival order. Destinations follow the same walk over the
    six decode ranks in the order the reservations are routed: a prefill
    worker's group pass ends with its rank 0's requests, then rank 1's.
    """
    records, prefill_at = replay(
        tmp_path,
        monkeypatch,
        DP_ROWS,
        prefill={"dp_size": 2},
        decode={"dp_size": 2},
        prefill_workers=2,
        decode_workers=3,
        exact_passes=exact_passes,
    )
    assert [prefill_at[r.uid] for r in records] == [(0, 0), (0, 1), (1, 0), (1, 1)] * 3
    assert [(r.worker, r.dp_rank) for r in records] == [
        (0, 0), (2, 0), (0, 1), (1, 1), (1, 0), (2, 1),
        (0, 1), (2, 0), (1, 1), (0, 0), (1, 0), (2, 1),
    ]  # fmt: skip
    assert [r.first_token_ms for r in records] == pytest.approx(
        [
            29.964138, 70.187966, 35.729938, 75.979502, 70.187966, 70.187966,
            75.953766, 75.979502, 70.187966, 70.187966, 75.979502, 75.979502,
        ],
        abs=1e-6,
    )  # fmt: skip


@modes
def test_round_robin_with_three_prefill_ranks_per_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exact_passes: bool
) -> None:
    """Prefill workers of three ranks and decode workers of two: the same worker-major walk."""
    records, prefill_at = replay(
        tmp_path,
        monkeypatch,
        DP_ROWS,
        prefill={"dp_size": 3},
        decode={"dp_size": 2},
        prefill_workers=2,
        decode_workers=2,
        exact_passes=exact_passes,
    )
    assert [prefill_at[r.uid] for r in records] == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2),
    ] * 2  # fmt: skip
    assert [(r.worker, r.dp_rank) for r in records] == [
        (0, 0), (1, 1), (0, 1), (0, 1), (0, 0), (1, 0),
        (1, 0), (0, 0), (1, 0), (1, 1), (0, 1), (1, 1),
    ]  # fmt: skip
    assert [r.source_held_ms for r in records] == pytest.approx(
        [
            24.198390, 56.304249, 56.304249, 27.198390, 59.304249, 59.304249,
            56.304249, 56.304249, 56.304249, 59.304249, 59.304249, 59.304249,
        ],
        abs=1e-6,
    )  # fmt: skip
    assert [r.last_token_ms for r in records] == pytest.approx(
        [
            53.027646, 85.365908, 87.726110, 58.793600, 93.492064, 91.157804,
            85.365908, 87.726110, 85.365908, 91.157804, 93.492064, 91.157804,
        ],
        abs=1e-6,
    )  # fmt: skip


def test_the_kv_router_balances_over_every_rank_of_both_pools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four requests at once on two workers of two ranks: one on each rank, in both pools.

    The reference breaks cost ties at random; over its runs the four go to four
    different prefill ranks and four different decode ranks every time, and
    each is prefilled alone in 32.105859 ms.
    """
    records, prefill_at = replay(
        tmp_path,
        monkeypatch,
        [(0, 1000, 50)] * 4,
        prefill={"dp_size": 2},
        decode={"dp_size": 2},
        prefill_workers=2,
        decode_workers=2,
        router_mode="kv_router",
        exact_passes=False,
    )
    assert sorted(prefill_at.values()) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert sorted((r.worker, r.dp_rank) for r in records) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r.source_held_ms for r in records] == pytest.approx([32.105859] * 4, abs=1e-6)


def test_request_rows_name_both_pools_schedulers_as_the_reference_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``prefill_worker_idx`` and ``decode_worker_idx`` are scheduler ids: worker x dp_size + rank.

    Two prefill and two decode workers with two ranks each, four 500-token
    requests 1 ms apart: the reference wrote (0, 0), (1, 2), (2, 1), (3, 3).
    """
    rows: list[Row] = [(float(i), 500, 3) for i in range(4)]
    records, _ = replay(
        tmp_path,
        monkeypatch,
        rows,
        prefill={"dp_size": 2},
        decode={"dp_size": 2},
        prefill_workers=2,
        decode_workers=2,
        exact_passes=False,
    )
    ids = [
        (request_row(r)["prefill_worker_idx"], request_row(r)["decode_worker_idx"]) for r in records
    ]
    assert ids == [(0, 0), (1, 2), (2, 1), (3, 3)]
