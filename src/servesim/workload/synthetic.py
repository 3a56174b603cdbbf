"""Synthetic workloads: fixed lengths, unique tokens, fixed-interval or Poisson arrivals."""

from __future__ import annotations

import math
import sys

from servesim.errors import ConfigError
from servesim.workload.request import RequestSpec, Session, SyntheticPrompt
from servesim.workload.rng import uniform_floats


def synthetic_sessions(
    *,
    input_tokens: int,
    output_tokens: int,
    request_count: int,
    arrival_interval_ms: float | None = None,
    request_rate: float | None = None,
    seed: int = 42,
) -> list[Session]:
    """One-turn sessions whose prompts share no block with each other.

    Arrivals: request 0 at 0, then every ``arrival_interval_ms`` (0 = burst),
    or exponential gaps of mean ``1000 / request_rate`` ms drawn as the
    reference draws them (``-mean x ln(1 - u)``, u from its generator seeded
    with ``seed``: the same arrival times); with neither, all arrive at 0
    (closed loop ignores them).
    """
    for name, value in (
        ("input tokens", input_tokens),
        ("output tokens", output_tokens),
        ("request count", request_count),
    ):
        if value < 1:
            raise ConfigError(f"synthetic {name} must be at least 1, got {value}")
    if arrival_interval_ms is not None and request_rate is not None:
        raise ConfigError("give only one of --arrival-interval-ms and --request-rate")
    if arrival_interval_ms is not None:
        if not (math.isfinite(arrival_interval_ms) and arrival_interval_ms >= 0):
            raise ConfigError(
                f"arrival interval must be a finite non-negative number, got {arrival_interval_ms}"
            )
        starts = [i * arrival_interval_ms for i in range(request_count)]
    elif request_rate is not None:
        if not (math.isfinite(request_rate) and request_rate > 0):
            raise ConfigError(f"request rate must be a finite positive number, got {request_rate}")
        mean_gap = 1000.0 / request_rate
        starts = [0.0]
        for u in uniform_floats(seed, request_count - 1).tolist():
            starts.append(starts[-1] - mean_gap * math.log(max(1.0 - u, sys.float_info.min)))
    else:
        starts = [0.0] * request_count
    return [
        Session(
            turns=[
                RequestSpec(prompt=SyntheticPrompt(i, input_tokens), output_length=output_tokens)
            ],
            start_ms=start,
        )
        for i, start in enumerate(starts)
    ]
