"""How a session's later turns get their think time, against the reference (Dynamo 1.6.1).

One session of seven turns (100 in / 2 out each, block size 64). A turn is
released when the previous one completes plus its delay: its own ``delay``
when it has one (even beside a timestamp), otherwise its timestamp less the
latest timestamp seen earlier in the session (a turn without a timestamp
does not move that mark). Every number is the reference's.
"""

from __future__ import annotations

import json
from pathlib import Path

from servesim import RunConfig, parse_engine_args, run

# (timestamp, delay) per turn, and the think time the reference applied before it.
TURNS: list[tuple[float | None, float | None]] = [
    (0, None),
    (50, None),  # 50 - 0
    (80, None),  # 80 - 50, not 80 - 0
    (None, 7),  # its delay
    (300, None),  # 300 - 80: the turn before had no timestamp
    (1000, 3),  # its delay wins over 1000 - 300
    (1010, None),  # 1010 - 1000
]

# (arrival, first token, last token) per turn
REFERENCE = [
    (0.0, 18.023974000000003, 23.769176),
    (73.769176, 91.79315, 97.538352),
    (127.538352, 145.562326, 151.30752800000002),
    (158.30752800000002, 176.33150200000003, 182.07670400000003),
    (402.07670400000006, 420.1006780000001, 425.8458800000001),
    (428.8458800000001, 446.8698540000001, 452.6150560000001),
    (462.6150560000001, 480.6390300000001, 486.3842320000001),
]


def test_think_time_is_the_delay_or_the_gap_to_the_last_timestamp(tmp_path: Path) -> None:
    rows = []
    for k, (timestamp, delay) in enumerate(TURNS):
        row: dict[str, object] = {
            "session_id": "s",
            "input_length": 100,
            "output_length": 2,
            "hash_ids": [k + 1],
        }
        if timestamp is not None:
            row["timestamp"] = timestamp
        if delay is not None:
            row["delay"] = delay
        rows.append(row)
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    report = run(RunConfig(trace=trace, engine=parse_engine_args({"block_size": 64})))
    assert [
        (r.arrival_time_ms, r.first_token_ms, r.last_token_ms) for r in report.records
    ] == REFERENCE
    assert [r.turn_index for r in report.records] == list(range(7))
