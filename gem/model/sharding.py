"""An explicit torchrec sharding plan for the embedding tables, and the sharded train task.

Why explicit: left to itself the planner's CPU plan chose a kernel whose fused optimizer update was
skipped (tables did not train). Here every table is placed TABLE_WISE with the FUSED kernel, whose
optimizer runs inside the backward (apply_optimizer_in_backward), on CPU (gloo) and GPU (NCCL)
alike. DistributedModelParallel then shards the EmbeddingCollection and wraps the dense rest in
DDP. torchrec is imported only here and in gem.model.sparse.

    task = build_task(cfg, ..., sparse_backend="torchrec")
    model, plan = shard_task(task, embedding_lr=0.05)        # inside an initialized process group
    loss, logits = model(batch)                              # ids go through batch.to_kjt()
"""

from __future__ import annotations

from typing import Any

import torch

SHARDING_TYPE = "table_wise"
COMPUTE_KERNEL = "fused"


def sharding_plan(task: torch.nn.Module, world_size: int, device_type: str, pg: Any = None) -> Any:
    """The plan: every table of task.embeddings.collection TABLE_WISE on the FUSED kernel; the
    planner only picks which rank holds each table (balancing their sizes)."""
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints

    tables = list(task.embeddings.collection.embeddings)
    constraints = {t: ParameterConstraints(sharding_types=[SHARDING_TYPE], compute_kernels=[COMPUTE_KERNEL])
                   for t in tables}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, compute_device=device_type),
                                       constraints=constraints)
    sharders = [EmbeddingCollectionSharder()]
    if pg is not None or (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return planner.collective_plan(task, sharders, pg or torch.distributed.GroupMember.WORLD)
    return planner.plan(task, sharders)


def shard_task(task: torch.nn.Module, embedding_lr: float, device: torch.device | None = None) -> tuple[Any, Any]:
    """-> (DistributedModelParallel of the task, its plan). The tables train with exact SGD fused
    into the backward at `embedding_lr`; the caller's optimizer covers the dense parameters
    (`dense_parameters`)."""
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    device = device or torch.device("cpu")
    apply_optimizer_in_backward(torch.optim.SGD, task.embeddings.collection.parameters(), {"lr": embedding_lr})
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    plan = sharding_plan(task, world, device.type)
    model = DistributedModelParallel(task, device=device, plan=plan, sharders=[EmbeddingCollectionSharder()])
    return model, plan


def dense_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters an ordinary optimizer must step: all but the fused (in-backward) tables."""
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    return [p for _, p in in_backward_optimizer_filter(model.named_parameters())]
