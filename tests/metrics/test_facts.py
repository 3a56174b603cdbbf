"""A record's facts reach the summary's columns under their own names."""

from __future__ import annotations

import math

import pytest

from servesim.metrics.collector import FACT_FIELDS, RequestRecord, Terminal, facts_of


def _record(uid: int) -> RequestRecord:
    return RequestRecord(uid, 0.0, 0, 0, None, None)


def test_each_fact_lands_in_its_own_column() -> None:
    # Distinct values in every fact field: a field the row builder leaves out, repeats
    # or puts in another's place shows up in some column.
    record = _record(7)
    for index, name in enumerate(FACT_FIELDS):
        setattr(record, name, 1000 + index)
    record.terminal_status = Terminal.REJECTED
    facts = facts_of([record])
    assert {name: facts[name].tolist() for name in FACT_FIELDS} == {
        name: [1000.0 + index] for index, name in enumerate(FACT_FIELDS)
    }
    assert facts.terminal.tolist() == [float(list(Terminal).index(Terminal.REJECTED))]
    assert facts.ended(Terminal.REJECTED).tolist() == [True]


# The facts a request may never get (the others are numbers from its arrival on).
OPTIONAL = [name for name in FACT_FIELDS if getattr(_record(0), name) is None]


def test_six_facts_are_known_from_the_arrival_on() -> None:
    assert set(FACT_FIELDS) - set(OPTIONAL) == {
        "arrival_time_ms",
        "queue_wait_ms",
        "input_length",
        "output_length",
        "reused_input_tokens",
        "first_admission_reused_input_tokens",
    }


@pytest.mark.parametrize("name", OPTIONAL)
def test_a_fact_not_known_is_nan(name: str) -> None:
    known = _record(4)
    setattr(known, name, 2.5)
    facts = facts_of([_record(3), known])
    assert math.isnan(facts[name][0]) and facts[name][1] == 2.5
    assert facts.terminal.tolist() == [-1.0, -1.0]  # neither ended
