"""Synthetic workloads, built as the reference (Dynamo 1.6.1) builds them.

Two kinds, as in the reference:

- **One-shot requests** (the default): ``request_count`` requests of
  ``input_tokens`` unique tokens each (:class:`SyntheticPrompt`), sharing no
  block with each other.
- **Sessions**, as soon as any of ``turns_per_session > 1``,
  ``shared_prefix_ratio > 0``, ``num_prefix_groups > 0`` or
  ``inter_turn_delay_ms > 0`` asks for them: ``request_count`` sessions of
  ``turns_per_session`` turns each. Turn k+1 is ready ``inter_turn_delay_ms``
  after turn k completes. A prompt of ``nb = ceil(input_tokens / block_size)``
  blocks (the engine's block size) is one hash id per block: with prefix
  groups and a ratio above 0, each session draws a group, and the first
  ``P = round(nb x shared_prefix_ratio)`` ids of each of its turns are that
  group's (rounded half away from zero); every other id is new. So two turns
  share exactly their first P blocks when their sessions drew the same group,
  and nothing otherwise: turns do not accumulate context. The ids are interned
  to dense tokens in order of first appearance and each fills one block
  (:class:`TracePrompt` with the engine's block size), the last one cut to the
  prompt's length.

The groups come from the reference's generator seeded with 42, whatever the
run's seed: one ``random_range(0..num_prefix_groups)`` per session, in session
order. Arrivals are a separate stream. A session's first turn (or a one-shot
request) arrives at 0, then every ``arrival_interval_ms`` (0 = all at once;
the gap is ``1000 / (1000 / interval)`` and the times its running sum, as in
the reference), or after exponential gaps of mean ``1000 / request_rate`` ms
drawn from the reference's generator seeded with ``seed``. In closed loop
(neither given) all start at 0: the admission ignores them.
"""

from __future__ import annotations

import math
import sys

from servesim.errors import ConfigError
from servesim.workload.request import (
    BlockContentCache,
    RequestSpec,
    Session,
    SyntheticPrompt,
    TracePrompt,
)
from servesim.workload.rng import StdRng, uniform_floats

GROUP_SEED = 42
"""The seed of the generator that draws sessions' prefix groups (fixed in the reference)."""

MAX_PREFIX_GROUPS = 1 << 32
"""The most prefix groups a session can draw from (the reference draws a 32-bit index)."""


def synthetic_sessions(
    *,
    input_tokens: int,
    output_tokens: int,
    request_count: int,
    block_size: int,
    arrival_interval_ms: float | None = None,
    request_rate: float | None = None,
    seed: int = 42,
    turns_per_session: int = 1,
    inter_turn_delay_ms: float = 0.0,
    shared_prefix_ratio: float = 0.0,
    num_prefix_groups: int = 0,
) -> list[Session]:
    """The workload: one-shot requests, or sessions when any session setting asks for them.

    Args:
        input_tokens: prompt length of every request (turn).
        output_tokens: output length of every request (turn).
        request_count: one-shot requests, or sessions.
        block_size: the engine's block size, the size of a session prompt's blocks.
        arrival_interval_ms: fixed gap between first arrivals (0 = all at 0).
        request_rate: Poisson first arrivals, requests per second.
        seed: seed of the Poisson arrivals.
        turns_per_session: turns of each session.
        inter_turn_delay_ms: think time between a turn's completion and the next turn.
        shared_prefix_ratio: share of a prompt's blocks taken from its session's group.
        num_prefix_groups: groups the sessions draw from (0 = no shared prefixes).

    Raises:
        ConfigError: a value out of its range, naming it and the range.
    """
    _validate(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        request_count=request_count,
        arrival_interval_ms=arrival_interval_ms,
        request_rate=request_rate,
        turns_per_session=turns_per_session,
        inter_turn_delay_ms=inter_turn_delay_ms,
        shared_prefix_ratio=shared_prefix_ratio,
        num_prefix_groups=num_prefix_groups,
    )
    starts = first_arrivals(request_count, arrival_interval_ms, request_rate, seed)
    sessions_asked = (
        turns_per_session > 1
        or shared_prefix_ratio > 0.0
        or num_prefix_groups > 0
        or inter_turn_delay_ms > 0.0
    )
    if not sessions_asked:
        return [
            Session(
                turns=[
                    RequestSpec(
                        prompt=SyntheticPrompt(i, input_tokens), output_length=output_tokens
                    )
                ],
                start_ms=start,
            )
            for i, start in enumerate(starts)
        ]
    if block_size < 1:
        raise ConfigError(f"block size must be at least 1, got {block_size}")
    groups = (
        prefix_groups(request_count, num_prefix_groups)
        if num_prefix_groups > 0 and shared_prefix_ratio > 0.0
        else [None] * request_count
    )
    num_blocks = -(-input_tokens // block_size)
    shared = min(round_half_away(num_blocks * shared_prefix_ratio), num_blocks)
    cache = BlockContentCache()
    group_tokens: dict[int, tuple[int, ...]] = {}
    next_token = 0  # the interned ids so far: every id not a group's is new
    sessions = []
    for s, (group, start) in enumerate(zip(groups, starts, strict=True)):
        name = f"session_{s}"
        turns = []
        for t in range(turns_per_session):
            prefix: tuple[int, ...] = ()
            if group is not None:
                known = group_tokens.get(group)
                if known is None:
                    known = group_tokens[group] = tuple(range(next_token, next_token + shared))
                    next_token += shared
                prefix = known
            own = num_blocks - len(prefix)
            tokens = prefix + tuple(range(next_token, next_token + own))
            next_token += own
            turns.append(
                RequestSpec(
                    prompt=TracePrompt(tokens, block_size, input_tokens, cache),
                    output_length=output_tokens,
                    session_id=name,
                    turn_index=t,
                    affinity_key=name,
                    delay_ms=inter_turn_delay_ms if t else 0.0,
                )
            )
        sessions.append(Session(turns=turns, start_ms=start))
    return sessions


def first_arrivals(
    count: int, arrival_interval_ms: float | None, request_rate: float | None, seed: int
) -> list[float]:
    """The first turns' arrival times (ms), as the reference's arrival specs make them."""
    if request_rate is not None:
        mean_gap = 1000.0 / request_rate
        starts = [0.0]
        for u in uniform_floats(seed, count - 1).tolist():
            starts.append(starts[-1] - mean_gap * math.log(max(1.0 - u, sys.float_info.min)))
        return starts
    # A fixed interval is a rate of 1000 / interval per second, whose gap is 1000 / rate:
    # not always the interval to the last bit (30 ms gives 29.999999999999996).
    gap = 1000.0 / (1000.0 / arrival_interval_ms) if arrival_interval_ms else 0.0
    starts, t = [0.0], 0.0
    for _ in range(count - 1):
        t += gap
        starts.append(t)
    return starts


def prefix_groups(count: int, num_prefix_groups: int) -> list[int]:
    """The groups ``count`` sessions draw, in session order, from the generator seeded with 42."""
    rng = StdRng(GROUP_SEED)
    return [rng.random_range(num_prefix_groups) for _ in range(count)]


def round_half_away(x: float) -> int:
    """``x`` (>= 0) rounded to the nearest integer, halves away from zero (Rust's ``f64::round``)."""
    whole = math.floor(x)
    return int(whole) + (1 if x - whole >= 0.5 else 0)


def _validate(
    *,
    input_tokens: int,
    output_tokens: int,
    request_count: int,
    arrival_interval_ms: float | None,
    request_rate: float | None,
    turns_per_session: int,
    inter_turn_delay_ms: float,
    shared_prefix_ratio: float,
    num_prefix_groups: int,
) -> None:
    if arrival_interval_ms is not None and request_rate is not None:
        raise ConfigError("give only one of --arrival-interval-ms and --request-rate")
    if arrival_interval_ms is not None and not (
        math.isfinite(arrival_interval_ms) and arrival_interval_ms >= 0
    ):
        raise ConfigError(
            f"arrival interval (--arrival-interval-ms) must be a finite non-negative number, "
            f"got {arrival_interval_ms}"
        )
    if request_rate is not None and not (math.isfinite(request_rate) and request_rate > 0):
        raise ConfigError(
            f"request rate (--request-rate) must be a finite positive number, got {request_rate}"
        )
    for name, flag, value in (
        ("input tokens", "--input-tokens", input_tokens),
        ("output tokens", "--output-tokens", output_tokens),
        ("request count", "--request-count", request_count),
        ("turns per session", "--turns-per-session", turns_per_session),
    ):
        if value < 1:
            raise ConfigError(f"synthetic {name} ({flag}) must be at least 1, got {value}")
    if not (math.isfinite(inter_turn_delay_ms) and inter_turn_delay_ms >= 0):
        raise ConfigError(
            "synthetic inter-turn delay (--inter-turn-delay-ms) must be a finite non-negative "
            f"number, got {inter_turn_delay_ms}"
        )
    if not 0.0 <= shared_prefix_ratio <= 1.0:  # NaN fails too
        raise ConfigError(
            "synthetic shared prefix ratio (--shared-prefix-ratio) must be between 0 and 1, "
            f"got {shared_prefix_ratio}"
        )
    if not 0 <= num_prefix_groups <= MAX_PREFIX_GROUPS:
        raise ConfigError(
            f"synthetic prefix groups (--num-prefix-groups) must be between 0 and "
            f"{MAX_PREFIX_GROUPS}, got {num_prefix_groups}"
        )
