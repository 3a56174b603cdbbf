"""KV-aware placement: the reference's cost over (worker, DP rank) targets.

For a request of ``isl`` prompt tokens and ``n`` blocks, on target ``w``::

    prefill  = (active prefill tokens(w) + isl) / block_size        (if tracking prefill tokens)
    credit   = overlap_score_credit x decay(w) x overlap(w)         (cached leading blocks on w)
    decode   = active blocks(w) + request blocks not already active on w
    cost(w)  = prefill_load_scale x max(0, prefill - credit) + decode
               + decode_active_request_weight x active requests(w)

``decay(w) = 1 / (1 + credit_decay x ((prefill tokens(w) - min over targets) /
block_size) / n)`` when ``overlap_score_credit_decay`` > 0. As in the
reference, a request's blocks in the load and the decode term are its
*complete* prompt blocks (``isl // block_size``), while ``n`` in the decay is
rounded up. Temperature 0 takes the cheapest target (ties broken by a seeded
generator); a positive temperature samples
``p ∝ exp(-(c - c_min) / ((c_max - c_min) T))``.

Bookkeeping follows a request: its uncached prompt tokens load the target
until its prefill completes; its blocks are active on the target until it
ends. With ``router_assume_kv_reuse`` a block shared by two active requests
on a target counts once (blocks no other request shares are counted, not
hashed); otherwise every request's blocks count.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from servesim.config import RouterConfig
from servesim.router.indexer import KvIndexer


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteRequest:
    """What the router knows of a request.

    Attributes:
        uid: the request.
        isl: prompt tokens.
        blocks: prompt blocks, the last possibly partial (the decay's denominator only).
        hashes: sequence hashes of its leading blocks that another request
            may also hold; its other blocks are unique to it.
    """

    uid: int
    isl: int
    blocks: int
    hashes: list[int]
    session: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where a request goes and what the router saw there."""

    target: int
    overlap_blocks: int
    best_overlap_blocks: int


@dataclass(slots=True)
class _Load:
    prefill_tokens: int = 0
    unique_blocks: int = 0
    requests: int = 0
    shared: dict[int, int] | None = None  # hash -> active requests holding it


@dataclass(slots=True)
class _Active:
    target: int
    prefill_tokens: int
    hashes: list[int]
    unique_blocks: int


class KvRouter:
    """Selects targets by cost and tracks each target's load."""

    def __init__(
        self,
        config: RouterConfig,
        targets: int,
        block_size: int,
        rng: random.Random,
        *,
        indexer: KvIndexer | None,
    ) -> None:
        self.config = config
        self.block_size = block_size
        self.indexer = indexer
        self._rng = rng
        self._loads = [
            _Load(shared={} if config.router_assume_kv_reuse else None) for _ in range(targets)
        ]
        self._active: dict[int, _Active] = {}
        # Shared hash -> bit mask of the targets where it is active, so a request finds
        # its blocks already active per target in one pass over its hashes.
        self._active_on: dict[int, int] = {}

    @property
    def targets(self) -> int:
        """How many targets it chooses among."""
        return len(self._loads)

    def overlaps(self, request: RouteRequest) -> dict[int, int]:
        """Cached leading blocks of the request on each target that holds any."""
        return self.indexer.overlaps(request.hashes) if self.indexer is not None else {}

    def prefill_tokens(self, target: int) -> int:
        """Uncached prompt tokens routed to ``target`` whose prefill has not completed."""
        return self._loads[target].prefill_tokens

    def select(
        self,
        request: RouteRequest,
        *,
        preferred: int | None = None,
        overlaps: dict[int, int] | None = None,
    ) -> Placement:
        """The cheapest target for the request (or a sampled one, with a temperature).

        A ``preferred`` target (session affinity) wins outright. ``overlaps``
        prices the request with cached blocks seen earlier (a queued request
        keeps those it had when it entered the queue); by default the index's now.
        """
        if overlaps is None:
            overlaps = self.overlaps(request)
        if preferred is not None:
            target = preferred
        else:
            active = self._already_active(request)
            costs = [
                self.cost(request, t, overlaps.get(t, 0), already_active=active.get(t, 0))
                for t in range(len(self._loads))
            ]
            target = self._choose(costs)
        return Placement(
            target=target,
            overlap_blocks=overlaps.get(target, 0),
            best_overlap_blocks=max(overlaps.values(), default=0),
        )

    def cost(
        self, request: RouteRequest, target: int, overlap: int, *, already_active: int | None = None
    ) -> float:
        """The reference's cost of placing ``request`` on ``target`` (lower is better).

        ``already_active``: how many of the request's blocks are active on the
        target (worked out when not given).
        """
        config, load, bs = self.config, self._loads[target], self.block_size
        prefill = 0.0
        decay = 1.0
        if config.router_track_prefill_tokens:
            prefill = (load.prefill_tokens + request.isl) / bs
            if config.overlap_score_credit_decay > 0:
                least = min(other.prefill_tokens for other in self._loads)
                excess = (load.prefill_tokens - least) / bs
                decay = 1.0 / (
                    1.0 + config.overlap_score_credit_decay * excess / max(request.blocks, 1)
                )
        credit = config.overlap_score_credit * decay * overlap
        decode = self._decode_blocks(request, load, already_active)
        return (
            config.prefill_load_scale * max(0.0, prefill - credit)
            + decode
            + config.decode_active_request_weight * load.requests
        )

    def add(self, request: RouteRequest, placement: Placement) -> None:
        """The request was placed: load its target until its prefill completes and it ends."""
        load = self._loads[placement.target]
        cached = min(placement.overlap_blocks * self.block_size, request.isl)
        prefill_tokens = request.isl - cached if self.config.router_track_prefill_tokens else 0
        load.prefill_tokens += prefill_tokens
        load.requests += 1
        hashes: list[int] = []
        unique = 0
        if self.config.router_track_active_blocks:
            hashes = request.hashes if load.shared is not None else []
            unique = request.isl // self.block_size - len(hashes)
            load.unique_blocks += unique
            if load.shared is not None:
                bit = 1 << placement.target
                for h in hashes:
                    held = load.shared.get(h, 0)
                    load.shared[h] = held + 1
                    if not held:
                        self._active_on[h] = self._active_on.get(h, 0) | bit
        self._active[request.uid] = _Active(placement.target, prefill_tokens, hashes, unique)

    def prefill_completed(self, uid: int) -> None:
        """The request's prefill is done: its prompt tokens no longer load the target."""
        active = self._active.get(uid)
        if active is not None and active.prefill_tokens:
            self._loads[active.target].prefill_tokens -= active.prefill_tokens
            active.prefill_tokens = 0

    def free(self, uid: int) -> None:
        """The request ended: its blocks leave the target's active set."""
        active = self._active.pop(uid, None)
        if active is None:
            return
        load = self._loads[active.target]
        load.prefill_tokens -= active.prefill_tokens
        load.requests -= 1
        load.unique_blocks -= active.unique_blocks
        if load.shared is not None:
            bit = 1 << active.target
            for h in active.hashes:
                left = load.shared[h] - 1
                if left:
                    load.shared[h] = left
                    continue
                del load.shared[h]
                mask = self._active_on[h] & ~bit
                if mask:
                    self._active_on[h] = mask
                else:
                    del self._active_on[h]

    def _decode_blocks(
        self, request: RouteRequest, load: _Load, already_active: int | None
    ) -> float:
        blocks = request.isl // self.block_size
        if not self.config.router_track_active_blocks:
            return float(blocks)
        shared = load.shared
        if shared is None:
            return float(load.unique_blocks + blocks)
        if already_active is None:
            already_active = sum(map(shared.__contains__, request.hashes))
        return float(len(shared) + load.unique_blocks + blocks - already_active)

    def _already_active(self, request: RouteRequest) -> dict[int, int]:
        """Per target, how many of the request's blocks are active there."""
        counts: dict[int, int] = {}
        get = self._active_on.get
        for h in request.hashes:
            mask = get(h, 0)
            while mask:
                low = mask & -mask
                target = low.bit_length() - 1
                counts[target] = counts.get(target, 0) + 1
                mask ^= low
        return counts

    def _choose(self, costs: list[float]) -> int:
        temperature = self.config.router_temperature
        low = min(costs)
        if temperature <= 0:
            best = [i for i, c in enumerate(costs) if c == low]
            return best[0] if len(best) == 1 else self._rng.choice(best)
        high = max(costs)
        if high == low:
            return self._rng.randrange(len(costs))
        scale = (high - low) * temperature
        weights = [math.exp(-(c - low) / scale) for c in costs]
        return self._rng.choices(range(len(costs)), weights=weights)[0]
