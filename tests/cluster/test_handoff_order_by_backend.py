"""Each backend's P/D handoff runs in the reference's order: SGLang reserves the destination
first; vLLM and TRT-LLM prefill first. Checked on every handoff of a disaggregated run, by the
actions its coordinator issued and the lifecycle it recorded."""

from __future__ import annotations

from typing import ClassVar

import pytest

from servesim import RunConfig, SyntheticWorkload, parse_engine_args, run
from servesim.cluster import disagg
from servesim.cluster.handoff import (
    NORMALIZED_LIFECYCLE,
    Action,
    ActivateDestination,
    Complete,
    Fact,
    HandoffCoordinator,
    HandoffOrder,
    Outcome,
    ReleaseSource,
    ReserveDestination,
    StartTransfer,
    SubmitPrefill,
)
from servesim.config import Role


class RecordingCoordinator(HandoffCoordinator):
    """A coordinator that keeps the actions it issues, in order, and lists itself."""

    made: ClassVar[list[RecordingCoordinator]] = []

    def __init__(self, order: HandoffOrder, *, handoff_latency_ms: float = 0.0) -> None:
        super().__init__(order, handoff_latency_ms=handoff_latency_ms)
        self.issued: list[type[Action]] = []
        RecordingCoordinator.made.append(self)

    def _keep(self, actions: list[Action]) -> list[Action]:
        self.issued += [type(action) for action in actions]
        return actions

    def start(self) -> list[Action]:
        return self._keep(super().start())

    def on_fact(self, fact: Fact) -> list[Action]:
        return self._keep(super().on_fact(fact))

    def on_outcome(self, action_id: int, outcome: Outcome, *, message: str = "") -> list[Action]:
        return self._keep(super().on_outcome(action_id, outcome, message=message))


TAIL = [StartTransfer, ActivateDestination, ReleaseSource, Complete]


@pytest.mark.parametrize(
    ("backend", "order", "first_two"),
    [
        ("sglang", HandoffOrder.DESTINATION_FIRST, [ReserveDestination, SubmitPrefill]),
        ("vllm", HandoffOrder.SOURCE_FIRST, [SubmitPrefill, ReserveDestination]),
        ("trtllm", HandoffOrder.SOURCE_FIRST, [SubmitPrefill, ReserveDestination]),
    ],
)
def test_every_handoff_follows_its_backends_order(
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
    order: HandoffOrder,
    first_two: list[type[Action]],
) -> None:
    monkeypatch.setattr(RecordingCoordinator, "made", [])
    monkeypatch.setattr(disagg, "HandoffCoordinator", RecordingCoordinator)
    engine = {"backend": backend, "block_size": 16, "num_gpu_blocks": 400}
    transfer = {"kv_transfer_bandwidth": 10.0, "kv_transfer_bytes_per_token": 1e5}
    report = run(
        RunConfig(
            synthetic=SyntheticWorkload(
                input_tokens=1000, output_tokens=20, request_count=12, arrival_interval_ms=10
            ),
            prefill_engine=parse_engine_args({**engine, **transfer}, role=Role.PREFILL),
            decode_engine=parse_engine_args(engine, role=Role.DECODE),
            num_prefill_workers=1,
            num_decode_workers=2,
        )
    )
    assert all(r.output_length == 20 for r in report.records)
    coordinators = RecordingCoordinator.made
    assert len(coordinators) == 12
    for coordinator in coordinators:
        assert coordinator.order is order
        assert coordinator.issued == [*first_two, *TAIL]
        assert coordinator.lifecycle == NORMALIZED_LIFECYCLE[order]
