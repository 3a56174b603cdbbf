"""A disk (G3) KV tier under the workers' host tiers, as Dynamo 1.6.1 models it.

One store per deployment: with scope ``worker_local`` each worker has its own
pool of ``num_g3_blocks``; with ``cluster_shared`` every worker reads and
writes one pool. Blocks are keyed by sequence hash; an entry is *pending*
while it is being written, and *pinned* while reads copy it to a host tier.

**Transfers** (jobs) move whole blocks: a write when a host store completes
(the blocks not on disk yet, after evicting the least recently touched
unpinned, written entries outside the store; as many of them as that makes
room for, the first), a read when a host
lookup finds blocks on disk that its host tier lacks. A job's bytes start
moving ``latency_to_first_byte_ms`` after it is submitted; jobs moving bytes
share bandwidth equally, per direction, per worker (and, for a shared pool,
across workers: the smaller share wins). A completed job is handed to the
worker that submitted it when that worker next looks.

Every probe, submission and completion advances an ordinal that orders
recency (``touched``); statistics mirror the reference's ``g3_offload``
summary object.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from servesim.config import DiskOffloadConfig
from servesim.engine.kv.fair_transfers import FairTransfers, bytes_per_ms


class Direction(IntEnum):
    """A job's direction (reads and writes have separate bandwidth)."""

    READ = 0
    WRITE = 1


class Probe(IntEnum):
    """What a probe finds for one block."""

    MISS = 0
    PENDING = 1
    RESIDENT = 2


@dataclass(slots=True)
class _Entry:
    pending: bool
    writer: int
    pins: int = 0
    touched: int = 0


@dataclass(slots=True)
class Job:
    """One disk transfer of whole blocks."""

    jid: int
    worker: int
    direction: Direction
    keys: list[int]
    submitted: float


@dataclass(slots=True)
class _IoStats:
    submitted_jobs: int = 0
    completed_jobs: int = 0
    cancelled_jobs: int = 0
    completed_bytes: int = 0
    transfer_ms: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "cancelled_jobs": self.cancelled_jobs,
            "completed_bytes": self.completed_bytes,
            "completed_jobs": self.completed_jobs,
            "submitted_jobs": self.submitted_jobs,
            "transfer_ms": self.transfer_ms,
        }


@dataclass(slots=True)
class _Stats:
    lookup_probes: int = 0
    lookup_hits: int = 0
    lookup_pending: int = 0
    evictions: int = 0
    cross_worker_read_blocks: int = 0
    bypassed_restores: int = 0
    io: tuple[_IoStats, _IoStats] = field(default_factory=lambda: (_IoStats(), _IoStats()))


class DiskTier:
    """The deployment's disk pools, jobs under way and completions not yet taken."""

    def __init__(self, config: DiskOffloadConfig, block_bytes: int) -> None:
        self.config = config
        self.block_bytes = block_bytes
        self._shared = config.scope == "cluster_shared"
        self._entries: dict[tuple[int, int], _Entry] = {}  # (pool, key)
        self._jobs: dict[int, Job] = {}  # under way, in submission order
        self._completed: dict[int, list[tuple[Job, float]]] = {}
        self.now = 0.0
        self._ordinal = 0
        self.completion_epoch = 0
        """Completions so far, on any worker (a waiter on another worker's write retries)."""
        self._stats = _Stats()
        # Per direction: each worker's bandwidth, shared by its jobs; a shared pool's
        # bandwidth is shared by every job too.
        self._worker_rates = (
            bytes_per_ms(config.read_bandwidth_gbps),
            bytes_per_ms(config.write_bandwidth_gbps),
        )
        shared = (
            (
                bytes_per_ms(config.shared_read_bandwidth_gbps),
                bytes_per_ms(config.shared_write_bandwidth_gbps),
            )
            if self._shared
            else (math.inf, math.inf)
        )
        self._transfers = FairTransfers(shared)

    # ----- lookups -----

    def _pool(self, worker: int) -> int:
        return 0 if self._shared else worker

    def contains(self, worker: int, key: int) -> bool:
        """Whether the worker's pool has the block (pending or not); no side effect."""
        return (self._pool(worker), key) in self._entries

    def probe(self, worker: int, key: int) -> Probe:
        """Look a block up for a host lookup (touches it when resident)."""
        self._stats.lookup_probes += 1
        self._ordinal += 1
        entry = self._entries.get((self._pool(worker), key))
        if entry is None:
            return Probe.MISS
        if entry.pending:
            self._stats.lookup_pending += 1
            return Probe.PENDING
        entry.touched = self._ordinal
        self._stats.lookup_hits += 1
        return Probe.RESIDENT

    # ----- jobs -----

    def submit(self, worker: int, direction: Direction, keys: list[int], now: float) -> Job | None:
        """Start a read of resident blocks, or a write of the blocks not on disk yet.

        A write makes room by evicting the least recently touched unpinned,
        written blocks that are not among ``keys``, and takes as many new blocks
        as there is then room for (the first ones). Returns None when there is
        nothing to write or no room, or a read finds a block missing or pending.
        """
        self.advance(max(now, self.now))
        pool, entries = self._pool(worker), self._entries
        if direction is Direction.WRITE:
            # The store's blocks already on disk are neither written nor evicted to make
            # room for the others; of the new blocks, as many as the pool can make room
            # for are written (the first ones, in prompt order).
            offered = set(keys)
            keys = [k for k in keys if (pool, k) not in entries]
            capacity = self.config.num_g3_blocks
            needed = sum(1 for p, _ in entries if p == pool) + len(keys) - capacity
            if needed > 0:
                victims = sorted(
                    (e.touched, k)
                    for (p, k), e in entries.items()
                    if p == pool and not e.pending and not e.pins and k not in offered
                )
                if len(victims) < needed:
                    del keys[len(keys) - needed + len(victims) :]
                    needed = len(victims)
                for _, key in victims[:needed]:
                    del entries[pool, key]
                self._stats.evictions += needed
            if not keys:
                return None
            for key in keys:
                entries[pool, key] = _Entry(pending=True, writer=worker)
        else:
            if not keys or any((e := entries.get((pool, k))) is None or e.pending for k in keys):
                return None
            for key in keys:
                entries[pool, key].pins += 1
        self._ordinal += 1
        self._stats.io[direction].submitted_jobs += 1
        job = Job(self._ordinal, worker, direction, keys, self.now)
        self._jobs[job.jid] = job
        self._transfers.submit(
            job.jid,
            worker,
            direction,
            self._worker_rates[direction],
            self.now + self.config.latency_to_first_byte_ms,
            float(len(keys) * self.block_bytes),
        )
        return job

    def count_bypass(self) -> None:
        """A request gave up restoring from disk (see ``HostOffload``'s restore rounds)."""
        self._stats.bypassed_restores += 1

    def next_event(self) -> float:
        """When the next job starts moving bytes or completes (``math.inf`` if none)."""
        return self._transfers.next_event()

    def next_deadline(self, worker: int) -> float:
        """When the worker next has something to take: any job's event, or its completions."""
        pending = [at for _, at in self._completed.get(worker, ())]
        return min([self.next_event(), *pending])

    def advance(self, target: float) -> None:
        """Move the tier's clock to ``target``, completing the jobs due by then."""
        for jid, at in self._transfers.advance(max(target, self.now)):
            self.now = at
            self._finish(self._jobs.pop(jid))
        self.now = self._transfers.now

    def _finish(self, job: Job) -> None:
        self.completion_epoch += 1
        pool = self._pool(job.worker)
        self._ordinal += 1
        for key in job.keys:
            entry = self._entries[pool, key]
            if job.direction is Direction.WRITE:
                entry.pending = False
            else:
                entry.pins -= 1
                self._stats.cross_worker_read_blocks += entry.writer != job.worker
            entry.touched = self._ordinal
        io = self._stats.io[job.direction]
        io.completed_jobs += 1
        io.completed_bytes += len(job.keys) * self.block_bytes
        io.transfer_ms += self.now - job.submitted
        self._completed.setdefault(job.worker, []).append((job, self.now))

    def take_completed(self, worker: int, now: float) -> list[Job]:
        """The worker's jobs completed by ``now``, in completion order."""
        self.advance(now)
        done = self._completed.get(worker, [])
        taken = [job for job, at in done if at <= now]
        self._completed[worker] = [(job, at) for job, at in done if at > now]
        return taken

    def has_work(self, worker: int) -> bool:
        """Whether the worker has jobs under way or completions to take."""
        return bool(self._completed.get(worker)) or any(
            j.worker == worker for j in self._jobs.values()
        )

    def check(self) -> None:
        """Assert the tier's invariants: pools within capacity, pins matching the reads
        under way, pending entries matching the writes under way."""
        used: dict[int, int] = {}
        for pool, _ in self._entries:
            used[pool] = used.get(pool, 0) + 1
        assert all(n <= self.config.num_g3_blocks for n in used.values()), "disk pool over capacity"
        pins: dict[tuple[int, int], int] = {}
        writing: set[tuple[int, int]] = set()
        for job in self._jobs.values():
            for key in job.keys:
                identity = (self._pool(job.worker), key)
                assert identity in self._entries, (
                    f"disk job {job.jid} moves a block not in its pool"
                )
                if job.direction is Direction.READ:
                    pins[identity] = pins.get(identity, 0) + 1
                else:
                    writing.add(identity)
        for identity, entry in self._entries.items():
            assert entry.pins == pins.get(identity, 0), f"disk block {identity} pins disagree"
            assert entry.pending == (identity in writing), (
                f"disk block {identity} pending disagrees"
            )

    def summary(self) -> dict[str, Any]:
        """The reference's ``g3_offload`` summary object."""
        s = self._stats
        entries = self._entries.values()
        bypassed = {"bypassed_restores": s.bypassed_restores} if s.bypassed_restores else {}
        return bypassed | {
            "cross_worker_read_blocks": s.cross_worker_read_blocks,
            "evictions": s.evictions,
            "lookup_hits": s.lookup_hits,
            "lookup_pending": s.lookup_pending,
            "lookup_probes": s.lookup_probes,
            "pending_blocks": sum(1 for e in entries if e.pending),
            "read": s.io[Direction.READ].as_dict(),
            "resident_blocks": sum(1 for e in entries if not e.pending),
            "write": s.io[Direction.WRITE].as_dict(),
        }
