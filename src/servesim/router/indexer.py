"""Where cached blocks live, learned only from the engines' KV events.

One index for a pool: for each target (worker DP rank, as a global id), the
set of block sequence hashes its device holds. A ``Stored`` event adds its
blocks to the target's set; ``Removed`` takes them away. Because a sequence
hash names a block *and its whole prefix* (hashes chain), a request's overlap
on a target is the number of its leading hashes that the target holds,
stopping at the first miss: a ``Removed`` in the middle of a chain cuts the
overlap there even if later blocks are still held.

An event is one set operation over its blocks, in C, on one target's set,
small enough to stay in the processor's caches. (One map from every hash to
a bit mask of its holders made a look-up a single walk, but each event an
update of that large map block by block, in Python: on the Mooncake trace,
16 targets and 1,000 alike, the events then cost twice what they do here,
and the look-ups as much.) A look-up takes the targets holding the request's
first block from :attr:`KvIndexer._firsts`, then counts each one's leading
blocks: in C, and with two look-ups and a subset test when it holds as many
as the target before it (requests mostly start with the same blocks).

Host-tier events (``host``) go to a second set per target: the blocks its
host tier holds. A target's host *extension* continues its device prefix:
the consecutive blocks after it that its host tier holds (from the first
block when the device holds none), so a block cached on both counts once, on
the device.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator
from itertools import compress, filterfalse, islice, repeat

from servesim.engine.kv.block_pool import KvEvent, KvStored


class KvIndexer:
    """Per target, the block hashes its device holds, and those its host tier holds."""

    __slots__ = ("_device", "_firsts", "_host", "_host_events")

    def __init__(self) -> None:
        self._device: list[set[int]] = []
        self._host: list[set[int]] = []
        self._host_events = False
        # Each block a look-up has asked about as a request's first, with the bit mask
        # of the targets whose device holds it, kept current by the events: a look-up
        # then visits the targets holding its first block, not every target's set.
        self._firsts: dict[int, int] = {}

    def apply(self, target: int, events: Iterable[KvEvent]) -> None:
        """Apply one target's KV events, in order."""
        if target >= len(self._device):
            grow = target + 1 - len(self._device)
            self._device += [set() for _ in range(grow)]
            self._host += [set() for _ in range(grow)]
        device, host, firsts = self._device[target], self._host[target], self._firsts
        bit = 1 << target
        for event in events:
            hashes, stored = event.hashes, isinstance(event, KvStored)
            if event.host:
                self._host_events = True
                if stored:
                    host.update(hashes)
                else:
                    host.difference_update(hashes)
                continue
            if stored:
                device.update(hashes)
            else:
                device.difference_update(hashes)
            if not firsts.keys().isdisjoint(hashes):
                for h in firsts.keys() & hashes:
                    firsts[h] = firsts[h] | bit if stored else firsts[h] & ~bit

    def overlaps(self, hashes: list[int]) -> dict[int, int]:
        """For each target holding the first block: how many leading blocks it holds."""
        if not hashes:
            return {}
        device, n = self._device, len(hashes)
        mask = self._firsts.get(hashes[0])
        if mask is None:  # (once per first block: then the events keep it)
            mask = self._firsts[hashes[0]] = sum(1 << t for t in _holding(device, hashes[0]))
        found: dict[int, int] = {}
        count, prefix = 0, hashes[:0]  # the previous target's count, and its blocks
        for target in targets_in(mask):
            held = device[target]
            if not (
                count and (count == n or hashes[count] not in held) and held.issuperset(prefix)
            ):
                count = _leading(held, hashes, 0)
                prefix = hashes[:count]
            found[target] = count
        return found

    def host_extensions(self, hashes: list[int], device: dict[int, int]) -> dict[int, int]:
        """For each target whose host tier continues its device prefix (``device``, from
        :meth:`overlaps`): how many consecutive blocks it holds after that prefix."""
        if not hashes or not self._host_events:
            return {}
        host = self._host
        starts = dict(device)
        for target in _holding(host, hashes[0]):
            starts.setdefault(target, 0)
        found: dict[int, int] = {}
        for target, start in starts.items():
            count = _leading(host[target], hashes, start)
            if count:
                found[target] = count
        return found

    def holders(self, block_hash: int) -> frozenset[int]:
        """Targets holding a block (for tests and diagnostics)."""
        return frozenset(_holding(self._device, block_hash))


def targets_in(mask: int) -> tuple[int, ...]:
    """The targets whose bits are set in ``mask``, lowest first.

    Remembered: a trace's requests start with a few blocks, held by the same
    few sets of targets, so the same masks come again and again.
    """
    targets = _TARGETS.get(mask)
    if targets is None:
        if len(_TARGETS) >= 4096:
            _TARGETS.clear()
        targets = _TARGETS[mask] = tuple(_bits(mask))
    return targets


_TARGETS: dict[int, tuple[int, ...]] = {}


def _bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        mask ^= low
        yield low.bit_length() - 1


def _holding(sets: list[set[int]], block_hash: int) -> list[int]:
    """The targets whose set holds ``block_hash``, in order."""
    return list(compress(range(len(sets)), map(operator.contains, sets, repeat(block_hash))))


def _leading(held: set[int], hashes: list[int], start: int) -> int:
    """How many of ``hashes[start:]`` lead in ``held``, up to the first miss."""
    missing = next(filterfalse(held.__contains__, islice(hashes, start, None)), None)
    if missing is None:
        return len(hashes) - start
    # Its first occurrence from start on is the first miss: an earlier one would miss too.
    return hashes.index(missing, start) - start
