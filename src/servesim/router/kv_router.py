"""KV-aware placement: the reference's cost over (worker, DP rank) targets.

For a request of ``isl`` prompt tokens and ``n`` blocks, on target ``w``::

    prefill  = (active prefill tokens(w) + isl) / block_size        (if tracking prefill tokens)
    credit   = overlap_score_credit x decay(w) x overlap(w)         (cached leading blocks on w)
               + host_cache_hit_weight x host(w)                    (host blocks right after them)
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

With host offload, ``host(w)`` counts the blocks after the device prefix that
the target's host tier holds (see :class:`~servesim.router.indexer.KvIndexer`).
The router's view of a target is then the *effective* overlap
``overlap(w) + host_cache_hit_weight x host(w)`` blocks: a placement reports it
rounded half away from zero, and takes ``round(effective x block_size)``
tokens as cached (the reference's ``cache_hit_estimates_from_tiered_matches``).

Bookkeeping follows a request: its uncached prompt tokens load the target
until its prefill completes; its blocks are active on the target until it
ends. With ``router_assume_kv_reuse`` a block shared by two active requests
on a target counts once (blocks no other request shares are counted, not
hashed); otherwise every request's blocks count.

Every target is priced for every request, so the per-target loads are
arrays and :meth:`KvRouter.select` prices all targets in a few numpy
operations, each the same float operation the reference does for one target
(a test holds them equal, bit for bit, to a per-target formula).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from itertools import islice

import numpy as np

from servesim.config import RouterConfig
from servesim.router.indexer import KvIndexer, targets_in


@dataclass(slots=True)  # one a request: not frozen (a frozen init costs 3.7x), built by position
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


@dataclass(slots=True)  # not frozen (see RouteRequest)
class Overlaps:
    """What the index shows of a request, per target that holds any of it.

    Attributes:
        device: its cached leading blocks on the target's GPU.
        host: the blocks right after those that the target's host tier holds.
    """

    device: dict[int, int]
    host: dict[int, int]


@dataclass(slots=True, kw_only=True)  # not frozen (see RouteRequest)
class Placement:
    """Where a request goes and what the router saw there.

    Attributes:
        overlap_blocks: the effective overlap on the target, rounded.
        best_overlap_blocks: the largest effective overlap on any target, rounded.
        cached_tokens: prompt tokens the router counts as cached on the target.
    """

    target: int
    overlap_blocks: int
    best_overlap_blocks: int
    cached_tokens: int


def _active_prefix(hashes: list[int], active: set[int]) -> int:
    """How many of ``hashes`` (a chain) lead it in ``active`` (closed under prefixes), by
    bisection."""
    held, beyond = 0, len(hashes) + 1  # hashes[:held] are all active, hashes[:beyond] not
    while beyond - held > 1:
        middle = (held + beyond) // 2
        if hashes[middle - 1] in active:
            held = middle
        else:
            beyond = middle
    return held


def round_half_away(value: float) -> int:
    """``value`` (not negative) rounded to the nearest integer, halves up (Rust's ``f64::round``)."""
    whole = math.floor(value)
    return whole + 1 if value - whole >= 0.5 else whole


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
        # Per target: uncached prompt tokens whose prefill has not completed, active
        # blocks no other request shares, active requests, and (with
        # router_assume_kv_reuse) its active shared hashes and how many there are.
        # Those hashes form a forest (a hash's parent is the block before it in every
        # chain that holds it); a hash's weight is its active children plus the active
        # requests whose hashes end there, and _branches keeps the weights above 1. A
        # request adds and removes only the blocks that become active or inactive, not
        # every block of its prefix, in one set operation: the ones it removes are those
        # after its deepest hash of weight above 1.
        self._prefill = np.zeros(targets, dtype=np.int64)
        self._unique = np.zeros(targets, dtype=np.int64)
        self._requests = np.zeros(targets, dtype=np.int64)
        self._shared: list[set[int]] | None = None
        self._branches: list[dict[int, int]] = []
        if config.router_assume_kv_reuse:
            self._shared = [set() for _ in range(targets)]
            self._branches = [{} for _ in range(targets)]
        self._shared_count = np.zeros(targets, dtype=np.int64)
        self._active: dict[int, _Active] = {}
        # The targets requests may go to (None: all; a planner changes the set).
        self._eligible: np.ndarray | None = None
        # A request's first shared hash -> bit mask of the targets where it is active: where
        # to look for the request's active prefix (see _already_active).
        self._root_on: dict[int, int] = {}

    @property
    def targets(self) -> int:
        """How many targets it chooses among."""
        return len(self._prefill)

    def set_eligible(self, targets: list[int], total: int) -> None:
        """Place only on ``targets`` from now on, of ``total`` targets (more than before when
        workers were added: the new ones start unloaded). Loads on the others stay until
        their requests end."""
        grow = total - self.targets
        if grow > 0:
            pad = np.zeros(grow, dtype=np.int64)
            self._prefill = np.concatenate([self._prefill, pad])
            self._unique = np.concatenate([self._unique, pad])
            self._requests = np.concatenate([self._requests, pad])
            self._shared_count = np.concatenate([self._shared_count, pad])
            if self._shared is not None:
                self._shared += [set() for _ in range(grow)]
                self._branches += [{} for _ in range(grow)]
        eligible = np.zeros(self.targets, dtype=bool)
        eligible[targets] = True
        self._eligible = eligible

    def eligible(self, target: int) -> bool:
        """Whether requests may be placed on ``target``."""
        return self._eligible is None or bool(self._eligible[target])

    def overlaps(self, request: RouteRequest) -> Overlaps:
        """The request's cached blocks on each target that holds any."""
        indexer = self.indexer
        if indexer is None:
            return Overlaps({}, {})
        device = indexer.overlaps(request.hashes)
        return Overlaps(device, indexer.host_extensions(request.hashes, device))

    def effective(self, overlaps: Overlaps, target: int) -> float:
        """The effective overlap (blocks) on ``target``: device blocks, host blocks weighted."""
        device = overlaps.device.get(target, 0)
        host = overlaps.host.get(target, 0)
        return device + self.config.host_cache_hit_weight * host if host else float(device)

    def best_effective(self, overlaps: Overlaps) -> float:
        """The largest effective overlap on any target (0.0 when none holds any block)."""
        if not overlaps.host:  # device blocks alone: the largest count
            return float(max(overlaps.device.values(), default=0))
        targets = overlaps.device.keys() | overlaps.host.keys()
        return max((self.effective(overlaps, t) for t in targets), default=0.0)

    def prefill_tokens(self, target: int) -> int:
        """Uncached prompt tokens routed to ``target`` whose prefill has not completed."""
        return int(self._prefill[target])

    def all_loaded_beyond(self, limit: float) -> bool:
        """Whether every eligible target's :meth:`prefill_tokens` exceeds ``limit``."""
        prefill = self._prefill if self._eligible is None else self._prefill[self._eligible]
        return bool((prefill > limit).all())

    def select(
        self,
        request: RouteRequest,
        *,
        preferred: int | None = None,
        overlaps: Overlaps | None = None,
    ) -> Placement:
        """The cheapest target for the request (or a sampled one, with a temperature).

        A ``preferred`` target (session affinity) wins outright. ``overlaps``
        prices the request with cached blocks seen earlier (a queued request
        keeps those it had when it entered the queue); by default the index's now.
        """
        if overlaps is None:
            overlaps = self.overlaps(request)
        if preferred is not None and self.eligible(preferred):
            target = preferred
        else:
            target = self._choose(self._costs(request, overlaps, self._already_active(request)))
        effective = self.effective(overlaps, target)
        return Placement(
            target=target,
            overlap_blocks=round_half_away(effective),
            best_overlap_blocks=round_half_away(self.best_effective(overlaps)),
            cached_tokens=min(round_half_away(effective * self.block_size), request.isl),
        )

    def cost(
        self,
        request: RouteRequest,
        target: int,
        overlap: int,
        *,
        host: int = 0,
        already_active: int | None = None,
    ) -> float:
        """The reference's cost of placing ``request`` on ``target`` (lower is better).

        ``overlap`` device blocks and ``host`` host blocks after them are
        cached there; ``already_active``: how many of the request's blocks are
        active on the target (worked out when not given). One element of
        :meth:`_costs`.
        """
        if already_active is None:
            already_active = self._already_active(request).get(target, 0)
        overlaps = Overlaps({target: overlap}, {target: host} if host else {})
        costs = self._costs(request, overlaps, {target: already_active})
        return float(costs[target])

    def _costs(
        self, request: RouteRequest, overlaps: Overlaps, active: dict[int, int]
    ) -> np.ndarray:
        """The reference's cost of every target: prefill load less overlap credit, active
        blocks and requests (see the module docstring), with its float operations in order.

        Integer parts stay int64 (exact) until the reference's would become float;
        ints below 2^53 convert exactly, so each division and product rounds as
        Python's does on one target (tests/router/test_kv_router_vectorised.py).
        """
        config, bs = self.config, self.block_size
        # Each step touches only the targets it changes: a target with no overlap keeps
        # its prefill load whole (x - 0.0 is x), a zero weight adds nothing (x + 0.0 is x,
        # up to the sign of a zero, which no comparison of costs sees) and a unit scale
        # multiplies nothing; the work is then a few whole-array operations.
        decay: np.ndarray | None = None  # (None: 1.0, and x * 1.0 is x)
        if config.router_track_prefill_tokens:
            uncredited = (self._prefill + request.isl) / bs
            if config.overlap_score_credit_decay > 0:
                eligible = self._eligible
                low = (self._prefill if eligible is None else self._prefill[eligible]).min()
                excess = (self._prefill - low) / bs
                decay = 1.0 / (
                    1.0 + config.overlap_score_credit_decay * excess / max(request.blocks, 1)
                )
        else:
            uncredited = np.zeros(self.targets)
        device, host, unit = overlaps.device, overlaps.host, config.overlap_score_credit
        if device or host:
            # As Python floats (the same doubles): a numpy element costs several times more.
            lefts = uncredited.tolist()
            decays = None if decay is None else decay.tolist()
            for target in (device.keys() | host.keys()) if host else device:
                factor = unit if decays is None else unit * decays[target]
                credit = factor * device.get(target, 0)
                if target in host:
                    credit = credit + config.host_cache_hit_weight * host[target]
                left = lefts[target] - credit
                # max(0.0, x) keeps 0.0 unless x > 0.0 (NaN and -0.0 included).
                lefts[target] = left if left > 0.0 else 0.0
            uncredited = np.array(lefts)
        blocks = request.isl // bs
        if not config.router_track_active_blocks:
            costs = np.full(self.targets, float(blocks))
        elif self._shared is None:
            costs = (self._unique + blocks).astype(np.float64)
        else:
            costs = (self._shared_count + self._unique + blocks).astype(np.float64)
            for target, already in active.items():
                costs[target] -= already  # whole numbers: exact
        if config.prefill_load_scale != 1.0:
            uncredited *= config.prefill_load_scale
        costs += uncredited
        if config.decode_active_request_weight != 0.0:
            costs += config.decode_active_request_weight * self._requests
        return costs

    def add(self, request: RouteRequest, placement: Placement) -> None:
        """The request was placed: load its target until its prefill completes and it ends."""
        target = placement.target
        prefill_tokens = (
            request.isl - placement.cached_tokens if self.config.router_track_prefill_tokens else 0
        )
        self._prefill[target] += prefill_tokens
        self._requests[target] += 1
        hashes: list[int] = []
        unique = 0
        if self.config.router_track_active_blocks:
            shared = self._shared[target] if self._shared is not None else None
            hashes = request.hashes if shared is not None else []
            unique = request.isl // self.block_size - len(hashes)
            self._unique[target] += unique
            if shared is not None and hashes:
                # The blocks already active there are a prefix (see _already_active):
                # the rest hang below its last one, each the parent of the next.
                held = _active_prefix(hashes, shared)
                if held:  # a new child of its last active block, or (all active) an end there
                    branches = self._branches[target]
                    last = hashes[held - 1]
                    branches[last] = branches.get(last, 1) + 1
                else:
                    root = hashes[0]
                    self._root_on[root] = self._root_on.get(root, 0) | 1 << target
                if held < len(hashes):
                    shared.update(islice(hashes, held, None))  # weight 1: a child, or the end
                    self._shared_count[target] += len(hashes) - held
        self._active[request.uid] = _Active(target, prefill_tokens, hashes, unique)

    def prefill_completed(self, uid: int) -> None:
        """The request's prefill is done: its prompt tokens no longer load the target."""
        active = self._active.get(uid)
        if active is not None and active.prefill_tokens:
            self._prefill[active.target] -= active.prefill_tokens
            active.prefill_tokens = 0

    def free(self, uid: int) -> None:
        """The request ended: its blocks leave the target's active set."""
        active = self._active.pop(uid, None)
        if active is None:
            return
        target = active.target
        self._prefill[target] -= active.prefill_tokens
        self._requests[target] -= 1
        self._unique[target] -= active.unique_blocks
        if self._shared is not None and active.hashes:
            # From its end up, a block of weight 1 (this request's end, or the one active
            # child, gone) becomes inactive, up to the first of weight above 1, which
            # loses that end or child.
            hashes, branches = active.hashes, self._branches[target]
            kept = next(filter(branches.__contains__, reversed(hashes)), None)
            index = -1 if kept is None else hashes.index(kept)  # (a chain's hashes differ)
            if kept is not None:
                weight = branches[kept] - 1
                if weight > 1:
                    branches[kept] = weight
                else:
                    del branches[kept]
            self._shared[target].difference_update(islice(hashes, index + 1, None))
            self._shared_count[target] -= len(hashes) - 1 - index
            if index < 0:  # its first block too: no longer active there
                root = hashes[0]
                mask = self._root_on[root] & ~(1 << target)
                if mask:
                    self._root_on[root] = mask
                else:
                    del self._root_on[root]

    def _already_active(self, request: RouteRequest) -> dict[int, int]:
        """Per target, how many of the request's blocks are active there.

        A hash names its block and the whole prefix before it, and an active request's
        hashes are a prefix of its chain, so a target's active blocks among the request's
        are a prefix of them too: found by bisection, target by target, from the targets
        where its first block is active (not by a walk over every hash and target). Two
        look-ups confirm that a target holds as many as the one before (requests mostly
        start with the same blocks), before any bisection.
        """
        counts: dict[int, int] = {}
        hashes, shared = request.hashes, self._shared
        if not hashes or shared is None:  # (no shared blocks are tracked without it)
            return counts
        held, n = 0, len(hashes)
        for target in targets_in(self._root_on.get(hashes[0], 0)):
            active = shared[target]
            if not (
                held and hashes[held - 1] in active and (held == n or hashes[held] not in active)
            ):
                held = _active_prefix(hashes, active)
            counts[target] = held
        return counts

    def _choose(self, costs: np.ndarray) -> int:
        if self._eligible is not None:
            assert self._eligible.any(), "no eligible target"
            costs = np.where(self._eligible, costs, math.inf)
        temperature = self.config.router_temperature
        if temperature <= 0:
            best = (costs == costs.min()).nonzero()[0]
            return int(best[0]) if len(best) == 1 else self._rng.choice(best.tolist())
        values = costs.tolist()
        targets = list(range(len(values)))
        if self._eligible is not None:  # sample among the eligible targets only
            targets = [t for t in targets if self._eligible[t]]
            values = [values[t] for t in targets]
        low, high = min(values), max(values)
        if high == low:
            return targets[self._rng.randrange(len(values))]
        scale = (high - low) * temperature
        weights = [math.exp(-(c - low) / scale) for c in values]
        return self._rng.choices(targets, weights=weights)[0]
