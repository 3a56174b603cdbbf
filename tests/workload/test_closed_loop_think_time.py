"""Closed loop ignores the arrival speed-up, think times included, against the reference (Dynamo 1.6.1).

Two sessions of two turns each (100 in / 2 out, block size 64): "s" with a
100 ms think time before its second turn, "t" with 40 ms. Replayed with
``replay_concurrency`` 1 and ``arrival_speedup_ratio`` 2: one session at a
time, each turn released when the previous one completes plus its *full*
think time (the speed-up only scales open-loop timestamps and delays).
Every number is the reference's (``refcheck.py reference``).
"""

from __future__ import annotations

import json
from pathlib import Path

from servesim import RunConfig, parse_engine_args, run

ROWS = [
    {"timestamp": 0, "session_id": "s", "input_length": 100, "output_length": 2, "hash_ids": [1]},
    {"session_id": "s", "delay": 100, "input_length": 100, "output_length": 2, "hash_ids": [2]},
    {"timestamp": 5, "session_id": "t", "input_length": 100, "output_length": 2, "hash_ids": [3]},
    {"session_id": "t", "delay": 40, "input_length": 100, "output_length": 2, "hash_ids": [4]},
]

# (session, turn, arrival, first token, last token)
REFERENCE = [
    ("s", 0, 0.0, 18.023974000000003, 23.769176),
    ("s", 1, 123.769176, 141.79315, 147.538352),
    ("t", 0, 147.538352, 165.562326, 171.30752800000002),
    ("t", 1, 211.30752800000002, 229.33150200000003, 235.07670400000003),
]


def test_think_times_are_not_sped_up_in_closed_loop(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    report = run(
        RunConfig(
            trace=trace,
            replay_concurrency=1,
            arrival_speedup_ratio=2.0,
            engine=parse_engine_args({"block_size": 64}),
        )
    )
    got = [
        (r.session_id, r.turn_index, r.arrival_time_ms, r.first_token_ms, r.last_token_ms)
        for r in report.records
    ]
    assert got == REFERENCE
