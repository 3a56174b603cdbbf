"""KV transfer links: narrative known-answer tests, then Hypothesis invariants.

Times are ms; work is ms at the source's bandwidth; the sending link carries
1 work unit per ms, a receiving link ``receive_capacity``.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.cluster.links import LinkModel, TransferLinks

SHARED = LinkModel.SHARED
INDEPENDENT = LinkModel.INDEPENDENT


def make_links(mode: LinkModel = SHARED, receive_capacity: float = 1.0) -> TransferLinks:
    return TransferLinks(mode, receive_capacity)


# ---- known answers -----------------------------------------------------------


def test_lone_transfer_takes_its_standalone_delay() -> None:
    """A transfer alone on its links finishes at now + work."""
    links = make_links()
    links.submit(0, source=0, destination=0, work_ms=7.5, now=2.0)
    assert links.next_completion_ms() == 9.5
    assert links.advance(9.0) == []
    assert links.work_done(0) == 7.0
    assert links.advance(9.5) == [0]
    assert links.work_done(0) == 7.5
    assert links.active == 0
    assert links.next_completion_ms() == math.inf


def test_lone_transfer_is_the_same_in_both_models() -> None:
    """With one job there is nothing to share: both models give the same time."""
    for mode in (SHARED, INDEPENDENT):
        links = make_links(mode, receive_capacity=math.inf)
        links.submit(0, 0, 0, 4.0, now=1.0)
        assert links.next_completion_ms() == 5.0


def test_two_transfers_from_one_prefill_rank_each_take_twice_as_long() -> None:
    """The sending link is split equally between two decode ranks."""
    links = make_links()
    links.submit(0, source=0, destination=0, work_ms=10.0, now=0.0)
    links.submit(1, source=0, destination=1, work_ms=10.0, now=0.0)
    assert links._rates() == {0: 0.5, 1: 0.5}
    assert links.advance(19.0) == []
    assert links.advance(20.0) == [0, 1]


def test_prefill_and_decode_rank_zero_are_different_links() -> None:
    """Prefill 0 -> decode 1 and prefill 1 -> decode 0 share no link."""
    links = make_links()
    links.submit(0, source=0, destination=1, work_ms=10.0, now=0.0)
    links.submit(1, source=1, destination=0, work_ms=10.0, now=0.0)
    assert links._rates() == {0: 1.0, 1: 1.0}
    assert links.advance(10.0) == [0, 1]


def test_slower_receiving_link_bounds_the_rate() -> None:
    """At half the source's bandwidth a lone transfer takes twice its work."""
    links = make_links(receive_capacity=0.5)
    links.submit(0, 0, 0, 10.0, now=3.0)
    assert links.next_completion_ms() == 23.0
    assert links.advance(23.0) == [0]


def test_transfer_joining_halfway_shares_the_rest() -> None:
    """A alone for 5 ms, then A and B at 0.5 each until A ends at 15; B alone ends at 20."""
    links = make_links()
    links.submit(0, source=0, destination=0, work_ms=10.0, now=0.0)
    links.submit(1, source=0, destination=1, work_ms=10.0, now=5.0)
    assert links.work_done(0) == 5.0
    assert links.next_completion_ms() == 15.0
    assert links.advance(15.0) == [0]
    assert links.work_done(1) == 5.0
    assert links.next_completion_ms() == 20.0
    assert links.advance(20.0) == [1]


def test_cancellation_returns_the_share_to_the_others() -> None:
    """A and B at 0.5 to t=4 (2 done each); B cancelled; A's 8 left at rate 1 end at 12."""
    links = make_links()
    links.submit(0, source=0, destination=0, work_ms=10.0, now=0.0)
    links.submit(1, source=0, destination=1, work_ms=10.0, now=0.0)
    assert links.cancel(1, now=4.0)
    assert links.work_done(1) == 2.0
    assert links.work_done(0) == 2.0
    assert links.active == 1
    assert links.next_completion_ms() == 12.0
    assert links.advance(12.0) == [0]


def test_receiving_link_is_the_shared_bottleneck() -> None:
    """Two prefill ranks into one decode rank at capacity 0.5: 0.25 each, both end at 40."""
    links = make_links(receive_capacity=0.5)
    links.submit(0, source=0, destination=0, work_ms=10.0, now=0.0)
    links.submit(1, source=1, destination=0, work_ms=10.0, now=0.0)
    assert links._rates() == {0: 0.25, 1: 0.25}
    assert links.advance(40.0) == [0, 1]


def test_job_bottlenecked_elsewhere_leaves_its_share_to_the_other() -> None:
    """Max-min, not equal split: the job alone on decode 0 takes what decode 1 leaves.

    Prefill 0 sends A -> decode 0 and B -> decode 1; prefill 1 sends C and D ->
    decode 1. Decode 1 fills first at 1/3 (B, C, D); A then has the rest of
    prefill 0's link: 2/3, not 1/2. A (work 2) ends at 3; B, C, D (work 3) have
    2 left then, keep 1/3 each and end together at 9.
    """
    links = make_links()
    links.submit(0, source=0, destination=0, work_ms=2.0, now=0.0)
    links.submit(1, source=0, destination=1, work_ms=3.0, now=0.0)
    links.submit(2, source=1, destination=1, work_ms=3.0, now=0.0)
    links.submit(3, source=1, destination=1, work_ms=3.0, now=0.0)
    rates = links._rates()
    assert rates[0] == pytest.approx(2 / 3)
    assert [rates[i] for i in (1, 2, 3)] == pytest.approx([1 / 3] * 3)
    assert links.next_completion_ms() == pytest.approx(3.0)
    assert links.advance(links.next_completion_ms()) == [0]
    assert links.next_completion_ms() == pytest.approx(9.0)
    assert links.advance(9.5) == [1, 2, 3]
    links._check_invariants()


def test_independent_links_do_not_share() -> None:
    """Eight transfers from one prefill rank each take exactly their work."""
    links = make_links(INDEPENDENT)
    for job in range(8):
        links.submit(job, source=0, destination=job % 2, work_ms=10.0, now=0.0)
    assert links.next_completion_ms() == 10.0
    assert links.advance(10.0) == list(range(8))


def test_independent_links_ignore_a_slow_receiver() -> None:
    """Independent jobs run at the source's rate: the reference prices a transfer by it alone."""
    links = make_links(INDEPENDENT, receive_capacity=0.25)
    links.submit(0, 0, 0, 1.0, now=0.0)
    links.submit(1, 0, 0, 1.0, now=0.0)
    assert links.next_completion_ms() == 1.0
    assert links.advance(1.0) == [0, 1]


def test_simultaneous_completions_come_in_job_id_order() -> None:
    """Jobs ending at one instant are reported by id, whatever the submit order."""
    links = make_links(INDEPENDENT)
    for job in (7, 3, 5):
        links.submit(job, source=job, destination=job, work_ms=4.0, now=0.0)
    assert links.advance(4.0) == [3, 5, 7]


def test_completions_are_ordered_by_time_before_id() -> None:
    """An advance spanning several completions reports them in time order."""
    links = make_links()
    links.submit(9, source=0, destination=0, work_ms=1.0, now=0.0)
    links.submit(1, source=1, destination=1, work_ms=3.0, now=0.0)
    links.submit(4, source=2, destination=2, work_ms=1.0, now=0.0)
    assert links.advance(100.0) == [4, 9, 1]


def test_cancel_of_unknown_or_finished_job_returns_false() -> None:
    """Only an in-flight job can be cancelled, and only once."""
    links = make_links()
    assert not links.cancel(0, now=0.0)
    links.submit(0, 0, 0, 1.0, now=0.0)
    links.submit(1, 0, 0, 5.0, now=0.0)
    assert links.advance(2.0) == [0]
    assert not links.cancel(0, now=2.0)
    assert links.cancel(1, now=3.0)
    assert not links.cancel(1, now=3.0)


def test_job_finishing_as_it_is_cancelled_is_reported_complete() -> None:
    """Cancel advances first: a job due exactly now completes, and advance reports it."""
    links = make_links()
    links.submit(0, 0, 0, 2.0, now=0.0)
    assert not links.cancel(0, now=2.0)
    assert links.work_done(0) == 2.0
    assert links.advance(2.0) == [0]
    assert links.advance(3.0) == []


def test_completions_found_by_submit_are_reported_by_the_next_advance() -> None:
    """A submit past earlier completions holds them for advance, still in time order."""
    links = make_links()
    links.submit(0, 0, 0, 1.0, now=0.0)
    links.submit(1, 1, 1, 2.0, now=0.0)
    links.submit(2, 0, 0, 1.0, now=5.0)
    assert links.active == 1
    assert links.advance(6.0) == [0, 1, 2]


def test_misuse_is_rejected() -> None:
    """Duplicate ids and unknown jobs raise; bad work and backwards time are asserts."""
    links = make_links()
    links.submit(0, 0, 0, 1.0, now=1.0)
    with pytest.raises(ValueError, match="already submitted"):
        links.submit(0, 0, 0, 1.0, now=1.0)
    with pytest.raises(ValueError, match="unknown transfer job 5"):
        links.work_done(5)
    with pytest.raises(AssertionError, match="work"):
        links.submit(1, 0, 0, 0.0, now=1.0)
    with pytest.raises(AssertionError, match="backwards"):
        links.advance(0.5)
    with pytest.raises(ValueError, match="receive capacity"):
        TransferLinks(SHARED, receive_capacity=0.0)


# ---- invariants over random sequences (Hypothesis) -----------------------------

quarters = st.integers(0, 24).map(lambda q: q / 4)
Op = tuple[str, int, int, float, float]
"""(kind, job or source, destination, work, time step before it)."""

operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("submit"),
            st.integers(0, 2),
            st.integers(0, 2),
            st.integers(1, 48).map(lambda q: q / 4),
            quarters,
        ),
        st.tuples(st.just("cancel"), st.integers(0, 20), st.just(0), st.just(0.0), quarters),
        st.tuples(st.just("advance"), st.just(0), st.just(0), st.just(0.0), quarters),
    ),
    max_size=40,
)
modes = st.sampled_from([SHARED, INDEPENDENT])
receive_capacities = st.sampled_from([0.25, 0.5, 1.0, 1.5, 3.0, math.inf])


class Recorder:
    """Drives a TransferLinks and records what the test can see of it."""

    def __init__(self, mode: LinkModel, receive_capacity: float) -> None:
        self.links = TransferLinks(mode, receive_capacity)
        self.mode = mode
        self.receive_capacity = receive_capacity
        self.now = 0.0
        self.jobs: dict[int, tuple[int, int, float]] = {}  # id -> (source, destination, work)
        self.completed: list[int] = []
        self.cancelled: list[int] = []

    def apply(self, op: Op) -> None:
        """Run one operation, then check the per-step properties."""
        kind, first, destination, work, dt = op
        before = {job: self.links.work_done(job) for job in self.jobs}
        self.now += dt
        if kind == "submit":
            job = len(self.jobs)
            self.links.submit(job, first, destination, work, self.now)
            self.jobs[job] = (first, destination, work)
        elif kind == "cancel":
            if self.links.cancel(first, self.now):
                self.cancelled.append(first)
        else:
            self.completed += self.links.advance(self.now)
        self.check(before, dt)

    def check(self, before: dict[int, float], dt: float) -> None:
        """Shared links within capacity (rates and service); no job ends twice; time moves on.

        Independent jobs are not capacity-bound; each is served at most at the
        sending rate 1, whatever the receiver's capacity.
        """
        self.links._check_invariants()
        assert self.links.next_completion_ms() >= self.now
        ended = self.completed + self.cancelled
        assert len(set(ended)) == len(ended), "a job ended twice"
        served = {job: self.links.work_done(job) - done for job, done in before.items()}
        if self.mode is SHARED:
            self.check_loads(self.links._rates(), 1.0, 0.0)
            self.check_loads(served, dt, 1e-9)
        else:
            assert all(amount <= dt * (1 + 1e-9) + 1e-9 for amount in served.values())

    def check_loads(self, amounts: dict[int, float], scale: float, slack: float) -> None:
        """Per link, the jobs' summed ``amounts`` stay within capacity x ``scale``."""
        loads: dict[tuple[str, int], float] = {}
        for job, amount in amounts.items():
            source, destination, _ = self.jobs[job]
            for link in (("send", source), ("receive", destination)):
                loads[link] = loads.get(link, 0.0) + amount
        for (end, _), load in loads.items():
            capacity = 1.0 if end == "send" else self.receive_capacity
            if math.isinf(capacity):
                continue
            assert load <= capacity * scale * (1 + 1e-9) + slack, f"{end} link over capacity"


@settings(max_examples=300, deadline=None)
@given(modes, receive_capacities, operations)
def test_random_sequences_keep_the_invariants(
    mode: LinkModel, receive_capacity: float, ops: list[Op]
) -> None:
    """Exactly-once ends, bytes moved = bytes charged, capacity respected, monotone time."""
    recorder = Recorder(mode, receive_capacity)
    for op in ops:
        recorder.apply(op)
    recorder.apply(("advance", 0, 0, 0.0, 1e6))  # drain: far beyond any total work / slowest rate
    links = recorder.links
    assert links.active == 0
    completed, cancelled = set(recorder.completed), set(recorder.cancelled)
    assert len(completed) == len(recorder.completed), "a job was reported twice"
    assert completed.isdisjoint(cancelled)
    assert completed | cancelled == set(recorder.jobs)
    for job in completed:
        work = recorder.jobs[job][2]
        assert links.work_done(job) == pytest.approx(work, rel=1e-9)
    for job in cancelled:
        assert 0 <= links.work_done(job) < recorder.jobs[job][2]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(1, 40).map(lambda q: q / 4)),
        min_size=1,
        max_size=8,
    ),
    receive_capacities,
)
def test_shared_links_never_beat_independent_ones(
    batch: list[tuple[int, int, float]], receive_capacity: float
) -> None:
    """Sharing only delays the batch, and never idles a link while it could be used.

    Max-min fairness is work-conserving: some link is always full, so the
    total service rate is at least min(1, receive capacity) and a batch ends
    by total work / min(1, receive capacity).
    """
    ends: dict[LinkModel, float] = {}
    for mode in (SHARED, INDEPENDENT):
        links = TransferLinks(mode, receive_capacity)
        for job, (source, destination, work) in enumerate(batch):
            links.submit(job, source, destination, work, now=0.0)
        last = 0.0
        while links.active:
            last = links.next_completion_ms()
            links.advance(last)
        ends[mode] = last
    assert ends[SHARED] >= ends[INDEPENDENT] * (1 - 1e-12)
    total = sum(work for _, _, work in batch)
    assert ends[SHARED] <= total / min(1.0, receive_capacity) * (1 + 1e-9)
