"""What a rank does besides serving requests: its part in a P/D handoff.

A rank of an aggregated worker finishes a request by releasing its KV. In a
disaggregated deployment a rank plays one side of each handoff:

- the **source** (a prefill rank) computes the prompt and keeps its KV after
  the one hidden token, until the transfer is done and the flow releases it
  (:meth:`SourceRole.release`);
- the **destination** (a decode rank) reserves blocks for the prompt before
  the transfer, in the order reservations were queued and one per try
  (:meth:`DestinationRole.retry`), then receives the KV and decodes the
  request as a *prebuilt* one (:meth:`DestinationRole.activate`).

The role objects hold this bookkeeping, so every scheduler (vLLM, SGLang)
shares it; a scheduler only implements :class:`RoleHost`, the handful of KV
operations the roles need. The disaggregated flow issues its commands through
the worker (:meth:`~servesim.engine.worker.Worker.source`,
:meth:`~servesim.engine.worker.Worker.destination`).
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import Protocol

from servesim.config import Role
from servesim.engine.request import EngineRequest

Reservation = tuple[EngineRequest, int, int]
"""A granted destination: (request, reused prompt tokens, transferable tokens)."""


class RoleHost(Protocol):
    """The KV operations of a rank's scheduler that its role needs."""

    def destination_slot_free(self) -> bool:
        """Whether a reservation may be granted now as far as running requests go."""
        ...

    def release_kv(self, request: EngineRequest) -> None:
        """Return the request's KV (its computed full blocks stay cached)."""
        ...

    def reserve_prompt(self, request: EngineRequest) -> tuple[int, int] | None:
        """Reserve KV for the request's whole prompt, reusing a resident prefix.

        Returns:
            (reused prompt tokens, tokens the transfer must fill), or None
            when the prompt does not fit now.
        """
        ...

    def cancel_reservation(self, request: EngineRequest) -> None:
        """Drop the KV reserved for a prompt whose transfer will not happen."""
        ...

    def receive_prompt(self, request: EngineRequest, order: dict[int, int]) -> None:
        """The prompt's KV has arrived: make it visible and queue the request to decode.

        ``order`` maps the uids of destinations on this rank to the order in
        which they were queued; the scheduler queues the request by it.
        """
        ...


class RankRole:
    """An aggregated rank: a finished request releases its KV at once.

    The base of the P/D roles, whose commands the flow issues; the hooks
    here are what every scheduler and worker call whatever the role.
    """

    kind = Role.AGGREGATED

    def __init__(self, host: RoleHost) -> None:
        # A proxy: the host (a scheduler) holds its role, and a replay makes no
        # reference cycles (the collector is paused while it runs).
        self._host: RoleHost = weakref.proxy(host)

    def finished(self, request: EngineRequest) -> None:
        """A request produced its last token on this rank."""
        self._host.release_kv(request)

    def capacity_changed(self) -> None:
        """A running slot or blocks may have been freed."""

    def reservation_due(self) -> bool:
        """Whether a reservation would be tried now (it may change the rank's state)."""
        return False

    def retry(self) -> Reservation | None:
        """Try a queued reservation once (only a destination has any)."""
        return None

    def holds_work(self) -> bool:
        """Whether the rank still owes a handoff something (held KV, a reservation)."""
        return False


class SourceRole(RankRole):
    """A prefill rank: keeps a finished prompt's KV until the transfer is done."""

    kind = Role.PREFILL

    def __init__(self, host: RoleHost) -> None:
        super().__init__(host)
        self.held: dict[int, EngineRequest] = {}

    def finished(self, request: EngineRequest) -> None:
        self.held[request.uid] = request

    def holds_work(self) -> bool:
        return bool(self.held)

    def release(self, uid: int) -> bool:
        """Free the KV held for a request's transfer; False if nothing was held."""
        request = self.held.pop(uid, None)
        if request is None:
            return False
        self._host.release_kv(request)
        return True


class DestinationRole(RankRole):
    """A decode rank: a FIFO of reservations granted one per try, and the requests in transfer.

    The reference tries the queue head once at each pass end of the rank's
    worker (idle ranks of a DP group included) and after each command applied
    while the worker is idle (a reservation queued, an activation, a cancel).
    The head waits while its prompt does not fit or, on a vLLM rank, while its
    running slots are full (activated requests waiting to be admitted, and
    reservations, do not count); once tried, it is not tried again until the capacity generation
    changes (a request finished or was preempted, KV was released).
    """

    kind = Role.DECODE

    def __init__(self, host: RoleHost) -> None:
        super().__init__(host)
        self.pending: deque[EngineRequest] = deque()
        # Reserved, not yet activated (their KV is in transfer).
        self.in_transfer: set[EngineRequest] = set()
        self._generation = 0
        self._head_tried_at: int | None = None
        # The order in which destinations were queued here (the reference's waiting
        # order): an activated request is queued by it, not by activation order.
        self._order: dict[int, int] = {}
        self._queued = 0

    def capacity_changed(self) -> None:
        self._generation += 1

    def holds_work(self) -> bool:
        return bool(self.pending or self.in_transfer)

    def reservation_due(self) -> bool:
        return (
            bool(self.pending)
            and self._host.destination_slot_free()
            and self._head_tried_at != self._generation
        )

    def enqueue(self, request: EngineRequest) -> None:
        """Queue a reservation without trying it (the worker has a pass in flight)."""
        self._order[request.uid] = self._queued
        self._queued += 1
        self.pending.append(request)

    def reserve(self, request: EngineRequest) -> Reservation | None:
        """Queue a reservation on an idle rank, then try the queue head once.

        The head granted may be an earlier request: reservations are granted
        in order, one per try.
        """
        self.enqueue(request)
        return self.retry()

    def retry(self) -> Reservation | None:
        """Reserve the queue head's prompt if it fits now: at most one per call."""
        if not self.pending:
            return None
        generation = self._generation
        tried = self._head_tried_at == generation
        self._head_tried_at = generation
        if tried or not self._host.destination_slot_free():
            return None
        request = self.pending[0]
        reserved = self._host.reserve_prompt(request)
        if reserved is None:
            return None
        self.pending.popleft()
        self._head_tried_at = None  # the next head has not been tried
        self.in_transfer.add(request)
        return request, *reserved

    def activate(self, request: EngineRequest) -> None:
        """The prompt's KV has arrived: the request joins the rank's queue, prebuilt."""
        self.in_transfer.remove(request)
        self._host.receive_prompt(request, self._order)

    def cancel(self, request: EngineRequest) -> bool:
        """Drop a reservation not yet activated (queued or holding KV); False if there was none."""
        if request in self.pending:
            if self.pending[0] is request:
                self._head_tried_at = None
            self.pending.remove(request)
        elif request in self.in_transfer:
            self.in_transfer.remove(request)
            self._host.cancel_reservation(request)
        else:
            return False
        self._order.pop(request.uid, None)
        self.capacity_changed()
        return True

    def forget(self, uid: int) -> None:
        """A destination request left this rank (finished or rejected)."""
        self._order.pop(uid, None)


_ROLES: dict[Role, type[RankRole]] = {
    Role.AGGREGATED: RankRole,
    Role.PREFILL: SourceRole,
    Role.DECODE: DestinationRole,
}


def make_role(kind: Role, host: RoleHost) -> RankRole:
    """The role object of a rank of the given kind."""
    return _ROLES[kind](host)
