"""What runs inside the rollout server (``policyzoo serve``): vLLM imports this module in every
worker through ``--worker-extension-cls policyzoo.engine.rollout.server.worker.PolicyzooWorkerExtension``.

Importing it registers :class:`GlooWeightTransferEngine` in vLLM's own weight-transfer registry
(``vllm.distributed.weight_transfer.factory.WeightTransferEngineFactory``) under the backend name
:data:`GLOO_BACKEND`. vLLM's built-in engines (``nccl``, ``ipc``) are CUDA-only; this one is the same
protocol (``init_weight_transfer_engine`` / ``start_weight_update`` / ``update_weights`` /
``finish_weight_update``, driven by the trainer over vLLM's HTTP routes) over a gloo process group, so
the server's weight push is testable on CPU. On CUDA the server runs with vLLM's ``nccl`` backend and
this engine is not used.

Protocol of one push (the trainer side is ``policyzoo.engine.rollout.server.weight_push``):

1. ``init``: the trainer (group rank 0) opened a ``TCPStore`` at ``master_address:master_port``; each
   worker joins a ``ProcessGroupGloo`` of ``world_size`` = 1 + the server's TP x PP ranks at rank
   ``rank_offset + worker rank``. A second ``init`` (a restarted or resumed trainer) drops the old group.
2. ``start``: vLLM's layer-wise reload begins (``initialize_layerwise_reload``), as ``reload_weights``.
3. ``update`` per chunk: the trainer posts the chunk's names, dtypes and shapes over HTTP and broadcasts
   each tensor from rank 0; the worker receives each into a fresh tensor and calls the model's
   ``load_weights`` (HF names; vLLM fuses q/k/v and gate/up and takes its TP shard itself).
4. ``finish``: ``finalize_layerwise_reload``, then the stale CPU GEMM kernels of the tied ``lm_head`` are
   rebuilt (``policyzoo.engine.sync.stale_gemm_modules``: the colocated engine's repair).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

from policyzoo.engine.sync import stale_gemm_modules

from .protocol import GLOO_BACKEND, gloo_group, installed_versions, model_identity


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    timeout_s: float = 600.0


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self):
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(f"names, dtype_names and shapes differ in length: {len(self.names)}, "
                             f"{len(self.dtype_names)}, {len(self.shapes)}")


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """vLLM's weight-transfer protocol over a gloo group (see the module docstring)."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group = None

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        self.shutdown()
        pc = self.parallel_config
        rank = init_info.rank_offset + pc.data_parallel_index * pc.world_size + pc.rank
        store = torch.distributed.TCPStore(init_info.master_address, init_info.master_port, init_info.world_size,
                                           is_master=False,
                                           timeout=datetime.timedelta(seconds=init_info.timeout_s))
        host = os.environ.get("POLICYZOO_SERVER_HOST")
        self.group = gloo_group(store, rank, init_info.world_size, host if host not in (None, "", "0.0.0.0") else None,
                                init_info.timeout_s)

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info: dict) -> None:
        # the base class ends with torch.accelerator.synchronize(), which raises on CPU; gloo is synchronous
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("the gloo weight transfer is not initialised: call init_weight_transfer_engine first")
        for name, dtype_name, shape in zip(update_info.names, update_info.dtype_names, update_info.shapes):
            weight = torch.empty(shape, dtype=getattr(torch, dtype_name))
            self.group.broadcast(weight, 0).wait()
            self.model.load_weights([(name, weight)])

    def finish_weight_update(self) -> None:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload
        from vllm.platforms import current_platform

        finalize_layerwise_reload(self.model, self.model_config)
        if current_platform.is_cpu():
            for module in stale_gemm_modules(self.model):
                dispatch_cpu_unquantized_gemm(module, remove_weight=False)

    def shutdown(self) -> None:
        self.group = None  # gloo closes its pairs when the group is released


WeightTransferEngineFactory.register_engine(GLOO_BACKEND, GlooWeightTransferEngine)


class PolicyzooWorkerExtension:
    """Methods vLLM mixes into each of the server's workers (called through vLLM's ``/collective_rpc``)."""

    def policyzoo_identity(self) -> dict:
        """What the trainer compares at connect: versions, the model's config, dtype, context length,
        log-prob mode and weight-transfer backend of this worker."""
        vc = self.vllm_config
        wt = vc.weight_transfer_config
        return {"versions": installed_versions(), "model": model_identity(vc.model_config.hf_config.to_dict()),
                "dtype": str(vc.model_config.dtype).removeprefix("torch."),
                "max_model_len": vc.model_config.max_model_len,
                "logprobs_mode": str(vc.model_config.logprobs_mode),
                "weight_transfer": wt.backend if wt is not None else None,
                "world_size": vc.parallel_config.world_size, "rank": vc.parallel_config.rank}
