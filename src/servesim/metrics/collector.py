"""Per-request facts recorded during a run; every metric is derived from them afterwards."""

from __future__ import annotations

import math
import struct
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

import numpy as np

from servesim.metrics.stats import GapSketch


class Terminal(Enum):
    """How a request ended; ``None`` on a record means it never did (incomplete)."""

    COMPLETED = "completed"
    REJECTED = "rejected"
    # A disaggregated request whose prompt can never fit a decode rank: the reference's
    # destination reservation fails (an engine command error), not a rejection.
    FAILED = "failed"


class RequestRecord:
    """What happened to one request, in virtual ms.

    Every per-request JSONL field is an attribute of the same name (the
    latencies and ``uuid`` are computed properties; ``terminal_status`` is a
    :class:`Terminal`, or None for a request that never ended, which the
    JSONL writes as ``"incomplete"``). ``uid`` (the arrival ordinal),
    ``worker``, ``prefill_worker`` and ``second_token_ms`` are servesim's
    own. ``docs/report.md`` defines each field.
    """

    __slots__ = (
        "agentic",
        "arrival_time_ms",
        "best_available_overlap_blocks",
        "decode_admit_ms",
        "decode_reused_input_tokens",
        "decode_worker_idx",
        "destination_activated_ms",
        "destination_reserved_ms",
        "dp_rank",
        "first_admission_host_reused_input_tokens",
        "first_admission_reused_input_tokens",
        "first_admit_ms",
        "first_token_ms",
        "input_length",
        "last_token_ms",
        "output_length",
        "play_id",
        "prefill_admit_ms",
        "prefill_worker",
        "prefill_worker_idx",
        "queue_wait_ms",
        "request_id",
        "requested_output_length",
        "reused_input_tokens",
        "second_token_ms",
        "selected_overlap_blocks",
        "session_id",
        "source_held_ms",
        "source_released_ms",
        "terminal_status",
        "terminal_time_ms",
        "turn_index",
        "uid",
        "worker",
    )

    def __init__(
        self,
        uid: int,
        arrival_ms: float,
        input_length: int,
        requested_output: int,
        session_id: str | None,
        turn_index: int | None,
        request_id: str | None = None,
        play_id: str | None = None,
        agentic: dict[str, str] | None = None,
    ) -> None:
        self.uid = uid
        # Its place in an agentic graph (see RequestSpec.agentic).
        self.agentic = agentic
        # The trace's own request id and the agentic play (trajectory), when it names them.
        self.request_id = request_id
        self.play_id = play_id
        self.arrival_time_ms = arrival_ms
        self.input_length = input_length
        self.requested_output_length = requested_output
        self.session_id = session_id
        self.turn_index = turn_index
        self.worker: int | None = None
        self.dp_rank: int | None = None
        # The (worker, rank) pair as one id, worker x dp_size + rank (the reference's scheduler id).
        self.decode_worker_idx: int | None = None
        self.first_admit_ms: float | None = None
        self.first_admission_reused_input_tokens = 0
        # Of those, the tokens loaded from a host tier (None: no host tier).
        self.first_admission_host_reused_input_tokens: int | None = None
        self.reused_input_tokens = 0
        self.first_token_ms: float | None = None
        self.second_token_ms: float | None = None
        self.last_token_ms: float | None = None
        self.output_length = 0
        self.terminal_status: Terminal | None = None
        self.terminal_time_ms: float | None = None
        # Disaggregated runs: the handoff's timeline (``worker`` is then the decode worker).
        self.prefill_worker: int | None = None
        self.prefill_worker_idx: int | None = None
        self.prefill_admit_ms: float | None = None
        self.source_held_ms: float | None = None
        self.destination_reserved_ms: float | None = None
        self.destination_activated_ms: float | None = None
        self.decode_admit_ms: float | None = None
        self.source_released_ms: float | None = None
        self.decode_reused_input_tokens: int | None = None
        # Routing facts: cached blocks on the chosen target, the best any target had, router queue wait.
        self.selected_overlap_blocks: int | None = None
        self.best_available_overlap_blocks: int | None = None
        self.queue_wait_ms = 0.0

    @property
    def uuid(self) -> str:
        """The request's id in the reference's synthetic format (its 1-based arrival ordinal)."""
        return f"00000000-0000-0000-0000-{self.uid + 1:012x}"

    @property
    def ttft_ms(self) -> float | None:
        """Time to first token (None: no token)."""
        return latencies(self).ttft

    @property
    def ttst_ms(self) -> float | None:
        """Time from the first token to the second (None: fewer than two tokens)."""
        return latencies(self).ttst

    @property
    def e2e_latency_ms(self) -> float | None:
        """Arrival to last token (None: no token)."""
        return latencies(self).e2e

    @property
    def itl_ms(self) -> float | None:
        """Mean inter-token latency, first to last token over ``output_length - 1``."""
        return latencies(self).tpot


@dataclass(frozen=True, slots=True)
class Latencies:
    """A request's latencies (ms), by the reference's definitions; None where it has too few tokens."""

    ttft: float | None = None
    e2e: float | None = None
    ttst: float | None = None
    tpot: float | None = None


def latencies(r: RequestRecord) -> Latencies:
    """TTFT and E2E from its first and last tokens; TTST and TPOT once it has two."""
    if r.first_token_ms is None or r.last_token_ms is None:
        return Latencies()
    ttft = max(0.0, r.first_token_ms - r.arrival_time_ms)
    e2e = max(0.0, r.last_token_ms - r.arrival_time_ms)
    if r.output_length < 2:
        return Latencies(ttft=ttft, e2e=e2e)
    assert r.second_token_ms is not None
    ttst = max(0.0, r.second_token_ms - r.first_token_ms)
    tpot = max(0.0, r.last_token_ms - r.first_token_ms) / (r.output_length - 1)
    return Latencies(ttft=ttft, e2e=e2e, ttst=ttst, tpot=tpot)


_TERMINALS = list(Terminal)

FACT_FIELDS = (
    "arrival_time_ms",
    "queue_wait_ms",
    "first_admit_ms",
    "first_token_ms",
    "second_token_ms",
    "last_token_ms",
    "terminal_time_ms",
    "input_length",
    "output_length",
    "reused_input_tokens",
    "first_admission_reused_input_tokens",
    "decode_reused_input_tokens",
    "decode_worker_idx",
    "prefill_worker_idx",
    "prefill_admit_ms",
    "source_held_ms",
    "source_released_ms",
    "destination_reserved_ms",
    "destination_activated_ms",
    "decode_admit_ms",
)
"""The record attributes the summary and the series are computed from."""

_WIDTH = len(FACT_FIELDS) + 2  # then the terminal code and the uid
_pack_row = struct.Struct(f"{_WIDTH}d").pack


def _row(r: RequestRecord) -> bytes:
    """A record's facts as one row of doubles (NaN: None; terminal: -1 or its index), packed.

    Field by field in :data:`FACT_FIELDS`' order (a test holds the two together),
    since this runs once a request: an ``attrgetter`` and ``array.fromlist`` (which
    parses each item) cost two and a half times as much.
    """
    nan, terminal = math.nan, r.terminal_status
    return _pack_row(
        r.arrival_time_ms,
        r.queue_wait_ms,
        nan if (first_admit := r.first_admit_ms) is None else first_admit,
        nan if (first_token := r.first_token_ms) is None else first_token,
        nan if (second_token := r.second_token_ms) is None else second_token,
        nan if (last_token := r.last_token_ms) is None else last_token,
        nan if (terminal_time := r.terminal_time_ms) is None else terminal_time,
        r.input_length,
        r.output_length,
        r.reused_input_tokens,
        r.first_admission_reused_input_tokens,
        nan if (decode_reused := r.decode_reused_input_tokens) is None else decode_reused,
        nan if (decode_worker := r.decode_worker_idx) is None else decode_worker,
        nan if (prefill_worker := r.prefill_worker_idx) is None else prefill_worker,
        nan if (prefill_admit := r.prefill_admit_ms) is None else prefill_admit,
        nan if (source_held := r.source_held_ms) is None else source_held,
        nan if (source_released := r.source_released_ms) is None else source_released,
        nan if (reserved := r.destination_reserved_ms) is None else reserved,
        nan if (activated := r.destination_activated_ms) is None else activated,
        nan if (decode_admit := r.decode_admit_ms) is None else decode_admit,
        -1 if terminal is None else _TERMINALS.index(terminal),
        r.uid,
    )


def facts_of(records: Iterable[RequestRecord], sealed: array[float] | None = None) -> Facts:
    """The facts of ``records`` (and of the ``sealed`` rows of others), in uid order."""
    rows = array("d") if sealed is None else array("d", sealed)
    for record in records:
        rows.frombytes(_row(record))
    table = np.frombuffer(rows, dtype=np.float64).reshape(-1, _WIDTH)
    return Facts(table[np.argsort(table[:, -1], kind="stable")])


class Facts:
    """Every request's facts as columns of doubles in uid (arrival) order; NaN is None.

    ``facts["first_token_ms"]`` is a column of :data:`FACT_FIELDS`; token
    counts are exact (below 2^53). ``terminal`` holds each request's
    :class:`Terminal` index (-1: it never ended).
    """

    __slots__ = ("_columns", "terminal")

    def __init__(self, table: np.ndarray) -> None:
        self._columns: dict[str, np.ndarray] = dict(zip(FACT_FIELDS, table.T, strict=False))
        self.terminal: np.ndarray = table[:, len(FACT_FIELDS)]

    def __getitem__(self, name: str) -> np.ndarray:
        column: np.ndarray = self._columns[name]
        return column

    def __len__(self) -> int:
        return len(self.terminal)

    def ended(self, terminal: Terminal) -> np.ndarray:
        """Mask of the requests that ended so."""
        mask: np.ndarray = self.terminal == _TERMINALS.index(terminal)
        return mask

    @property
    def completed(self) -> np.ndarray:
        """Mask of the requests that completed after an admission (the summary's completed)."""
        mask: np.ndarray = self.ended(Terminal.COMPLETED) & ~np.isnan(self["first_admit_ms"])
        return mask


_GAP_CHUNK = 1 << 16


class TokenGaps:
    """Every token gap of a run in the order the loop reports it, folded into the
    ITL and per-user sketches in chunks of exactly :data:`_GAP_CHUNK` gaps.

    A gap is a single one (a stepped pass's, ``count`` requests apart) or one
    of a fast-forwarded window's, whose token times are kept as they are and
    turned into gaps many at a time (numpy's per-call cost would dominate one
    window's few hundred values). The sketches' moments depend on how gaps
    are batched; batching by position in this one sequence makes them depend
    on the gaps alone: a window split in two by a planner tick, with the pass
    at the split stepped, folds exactly as the whole window.
    """

    __slots__ = (
        "_carry",
        "_single_counts",
        "_singles",
        "_window_tokens",
        "_windows",
        "itl",
        "per_user",
    )

    def __init__(self) -> None:
        self.itl = GapSketch()
        self.per_user = GapSketch()
        self._singles: list[float] = []
        self._single_counts: list[int] = []
        # (single gaps before it, prev_end, count, token times), in order.
        self._windows: list[tuple[int, float, int, np.ndarray]] = []
        self._window_tokens = 0
        # Gaps and weights past the last whole chunk.
        self._carry = (np.empty(0), np.empty(0))

    def add(self, gap: float, count: int) -> None:
        """``count`` requests each got a token ``gap`` ms after their previous one."""
        self._singles.append(gap)
        self._single_counts.append(count)
        if len(self._singles) + self._window_tokens >= _GAP_CHUNK:
            self._fold(whole_chunks=True)

    def add_window(self, prev_end: float, count: int, times: np.ndarray) -> None:
        """``count`` requests, whose previous token was at ``prev_end``, each got one at each of ``times``."""
        self._windows.append((len(self._singles), prev_end, count, times))
        self._window_tokens += len(times)
        if len(self._singles) + self._window_tokens >= _GAP_CHUNK:
            self._fold(whole_chunks=True)

    def fold(self) -> None:
        """Fold every gap so far into the sketches."""
        self._fold(whole_chunks=False)

    def _fold(self, *, whole_chunks: bool) -> None:
        carried_gaps, carried_weights = self._carry
        new_gaps, new_weights = self._ordered()
        gaps = np.concatenate((carried_gaps, new_gaps))
        weights = np.concatenate((carried_weights, new_weights))
        end = len(gaps) - len(gaps) % _GAP_CHUNK if whole_chunks else len(gaps)
        for start in range(0, end, _GAP_CHUNK):
            chunk = slice(start, min(start + _GAP_CHUNK, end))
            self._fold_chunk(gaps[chunk], weights[chunk])
        self._carry = (gaps[end:], weights[end:])

    def _fold_chunk(self, gaps: np.ndarray, weights: np.ndarray) -> None:
        self.itl.add_many(gaps, weight=weights)
        positive = gaps > 0.0
        if positive.all():
            self.per_user.add_many(1000.0 / gaps, weight=weights)
        else:
            self.per_user.add_many(1000.0 / gaps[positive], weight=weights[positive])

    def _ordered(self) -> tuple[np.ndarray, np.ndarray]:
        """The gaps and weights buffered since the last fold, in order; the buffers emptied."""
        singles = np.array(self._singles, dtype=np.float64)
        single_counts = np.array(self._single_counts, dtype=np.float64)
        windows = self._windows
        self._singles, self._single_counts, self._windows = [], [], []
        self._window_tokens = 0
        if not windows:
            return singles, single_counts
        befores, prev_ends, counts, window_times = zip(*windows, strict=True)
        times = np.concatenate(window_times)
        lengths = [len(t) for t in window_times]
        # Each time less its predecessor: the time before it, or its window's prev_end.
        window_gaps = np.empty_like(times)
        np.subtract(times[1:], times[:-1], out=window_gaps[1:])
        starts = np.cumsum([0, *lengths[:-1]])
        window_gaps[starts] = times[starts] - np.array(prev_ends)
        window_weights = np.repeat(np.array(counts, dtype=np.float64), lengths)
        if not len(singles):
            return window_gaps, window_weights
        # A window's k-th gap goes after the single gaps reported before it and k gaps of windows.
        in_window = np.zeros(len(singles) + len(times), dtype=bool)
        in_window[np.repeat(befores, lengths) + np.arange(len(times))] = True
        gaps = np.empty(len(in_window))
        weights = np.empty(len(in_window))
        gaps[in_window], gaps[~in_window] = window_gaps, singles
        weights[in_window], weights[~in_window] = window_weights, single_counts
        return gaps, weights


class Collector:
    """Appends facts as the loop reports them; token gaps go straight into sketches.

    With ``keep_records`` False (no per-request output wanted), a request's
    record is folded into a compact row of its facts (:data:`FACT_FIELDS`,
    about 180 bytes against about a kilobyte) once it is sealed, and
    dropped, so memory holds whole records only for the requests in flight.
    """

    def __init__(self, *, keep_records: bool = True) -> None:
        self.records: list[RequestRecord] = []
        self._keep = keep_records
        self._count = 0
        self._open: dict[int, RequestRecord] = {}
        # Sealed requests' facts (keep_records False), _WIDTH doubles a request.
        self._rows = array("d")
        self._gaps = TokenGaps()
        # Set once the run ends: tokens the engines committed to prefill (recomputation included).
        self.committed_prefill_tokens = 0

    @property
    def itl(self) -> GapSketch:
        """Inter-token latencies (ms), every gap between two tokens of a request."""
        self._gaps.fold()
        return self._gaps.itl

    @property
    def per_user(self) -> GapSketch:
        """Per-user token rates (tokens/s): 1000 over each positive gap."""
        self._gaps.fold()
        return self._gaps.per_user

    def on_arrival(
        self,
        input_length: int,
        requested_output: int,
        arrival_ms: float,
        session_id: str | None,
        turn_index: int | None,
        *,
        request_id: str | None = None,
        play_id: str | None = None,
        agentic: dict[str, str] | None = None,
    ) -> RequestRecord:
        """A request reached the cluster; its uid is its arrival ordinal."""
        record = RequestRecord(
            self._count,
            arrival_ms,
            input_length,
            requested_output,
            session_id,
            turn_index,
            request_id,
            play_id,
            agentic,
        )
        self._count += 1
        if self._keep:
            self.records.append(record)
        else:
            self._open[record.uid] = record
        return record

    @property
    def num_requests(self) -> int:
        """Requests that reached the cluster."""
        return self._count

    def facts(self) -> Facts:
        """Every request's facts so far (ended, sealed or not, and in flight)."""
        return facts_of(self.records if self._keep else self._open.values(), self._rows)

    def on_route(self, record: RequestRecord, worker: int, dp_rank: int, dp_size: int) -> None:
        """The request was placed on ``worker``'s rank ``dp_rank`` (of ``dp_size``)."""
        record.worker = worker
        record.dp_rank = dp_rank
        record.decode_worker_idx = worker * dp_size + dp_rank

    def on_admit(
        self, record: RequestRecord, now: float, reused_tokens: int, host_tokens: int | None = None
    ) -> None:
        """A rank admitted the request (again, after a preemption) reusing cached tokens,
        ``host_tokens`` of them loaded from its host tier (None: it has none)."""
        if record.first_admit_ms is None:
            record.first_admit_ms = now
            record.first_admission_reused_input_tokens = reused_tokens
            record.first_admission_host_reused_input_tokens = host_tokens
        if reused_tokens > record.reused_input_tokens:
            record.reused_input_tokens = reused_tokens

    def on_token(self, record: RequestRecord, now: float) -> None:
        """One output token was emitted at ``now``."""
        if record.last_token_ms is None:
            record.first_token_ms = now
        else:
            self._next_token(record, now)
        record.last_token_ms = now
        record.output_length += 1

    def _next_token(self, record: RequestRecord, now: float) -> None:
        """A token after the first: its gap goes into the sketches."""
        assert record.last_token_ms is not None
        self._gaps.add(now - record.last_token_ms, 1)
        if record.output_length == 1:
            record.second_token_ms = now

    def on_shared_gap(self, gap: float, count: int) -> None:
        """``count`` requests each got a token ``gap`` ms after their previous one.

        Their records catch up when they leave the cohort (:meth:`on_catch_up`).
        """
        self._gaps.add(gap, count)

    def on_second_token(self, record: RequestRecord, at: float) -> None:
        """A cohort member that joined with its first token on its rank got its next at ``at``.

        It is the request's second token unless an earlier stage gave it one.
        """
        if record.output_length == 1:
            record.second_token_ms = at

    def on_catch_up(self, record: RequestRecord, tokens: int, last_ms: float) -> None:
        """A request's ``tokens`` tokens counted by :meth:`on_shared_gap`, the last at ``last_ms``."""
        assert record.output_length >= 1, "a cohort member joins after a token"
        record.output_length += tokens
        record.last_token_ms = last_ms
        assert record.second_token_ms is not None, "its second token was recorded when it came"

    def on_shared_gaps(self, prev_end: float, count: int, times: np.ndarray) -> None:
        """``count`` requests, whose previous token was at ``prev_end``, each got one at each of ``times``."""
        self._gaps.add_window(prev_end, count, times)

    def on_terminal(
        self, record: RequestRecord, now: float, terminal: Terminal, *, seal: bool = True
    ) -> None:
        """The request completed or was rejected at ``now``; ``seal`` False: facts about
        it may still come (a disaggregated handoff's source release), see :meth:`seal`."""
        record.terminal_status = terminal
        record.terminal_time_ms = now
        if seal:
            self.seal(record)

    def seal(self, record: RequestRecord) -> None:
        """An ended request's record changes no more: keep its facts (and drop it, unless
        records are kept)."""
        if not self._keep:
            self._rows.frombytes(_row(self._open.pop(record.uid)))
