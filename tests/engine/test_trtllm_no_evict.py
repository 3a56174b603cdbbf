"""TensorRT-LLM's no-evict policy on a decode rank: a destination's output is cut to the room its
prompt leaves, as an aggregated rank cuts it, before its footprint is judged."""

from __future__ import annotations

from servesim.config import Backend, EngineConfig, Role
from servesim.engine.request import EngineRequest
from servesim.engine.worker import Worker
from servesim.workload.request import SyntheticPrompt


def test_a_destination_is_sized_by_the_output_it_can_realise() -> None:
    """4 blocks of 64 tokens: a 100-token prompt asking for 1,000 more can have 156."""
    config = EngineConfig(
        backend=Backend.TRTLLM, worker_type=Role.DECODE, num_gpu_blocks=4, block_size=64
    )
    worker = Worker(0, config)
    request = EngineRequest(0, SyntheticPrompt(0, 100), 1000)
    assert not worker.never_fits(0, request)
    granted = worker.destination(0).reserve(request)
    assert granted == (request, 0, 128)  # no prefix credit: both prompt blocks transfer
    assert request.max_output == 156
