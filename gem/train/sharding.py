"""An explicit torchrec sharding plan for the embedding tables, and the sharded train task.

Why explicit: left to itself the planner's CPU plan picks a kernel whose fused optimizer update is
skipped (tables do not train). Here every table is placed TABLE_WISE with the FUSED kernel, whose
optimizer runs inside the backward (apply_optimizer_in_backward), on CPU (gloo) and GPU (NCCL)
alike. DistributedModelParallel then shards the EmbeddingCollection and wraps the dense rest in
DDP. torchrec is imported only here and in gem.model.sparse.

    task = build_task(cfg, ..., sparse_backend="torchrec")
    model, plan = shard_task(task, embedding_lr=0.05)        # inside an initialized process group
    loss, logits = model(batch)                              # ids go through batch.to_kjt()
    plain_state = unsharded_state(model)                     # rank 0: loads into a "torch"-backend task

A single process gets a one-rank gloo group (`ensure_process_group`): DMP needs one.
"""

from __future__ import annotations

from typing import Any

import torch
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.model_parallel import (
    DataParallelWrapper,
    DefaultDataParallelWrapper,
    DistributedModelParallel,
)
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.optim import RowWiseAdagrad
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.optimizers import in_backward_optimizer_filter

from gem.model.embeddings import plain_state_key
from gem.train.checkpoint import single_process

SHARDING_TYPE = "table_wise"
COMPUTE_KERNEL = "fused"


def sharding_plan(task: torch.nn.Module, world_size: int, device_type: str, pg: Any = None) -> Any:
    """The plan: every table of task.embeddings.collection TABLE_WISE on the FUSED kernel; the
    planner only picks which rank holds each table (balancing their sizes)."""
    tables = list(task.embeddings.collection.embeddings)
    constraints = {t: ParameterConstraints(sharding_types=[SHARDING_TYPE], compute_kernels=[COMPUTE_KERNEL])
                   for t in tables}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, compute_device=device_type),
                                       constraints=constraints)
    sharders = [EmbeddingCollectionSharder()]
    if pg is not None or (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return planner.collective_plan(task, sharders, pg or torch.distributed.GroupMember.WORLD)
    return planner.plan(task, sharders)


def ensure_process_group(device: torch.device) -> bool:
    """Start a one-rank group when none is up (DMP needs one); True when this call started it."""
    if torch.distributed.is_initialized():
        return False
    backend = "nccl" if device.type == "cuda" else "gloo"
    torch.distributed.init_process_group(backend, store=torch.distributed.HashStore(), rank=0, world_size=1)
    return True


def _embedding_optimizer(name: str) -> type:
    """train.embedding_optimizer -> the optimizer class torchrec fuses into the table kernel."""
    if name == "sgd":
        return torch.optim.SGD
    if name == "rowwise_adagrad":  # one accumulator per row: the usual choice for large id tables
        return RowWiseAdagrad
    raise ValueError(f"unknown embedding optimizer {name!r}; expected 'sgd' or 'rowwise_adagrad'")


def shard_task(task: torch.nn.Module, embedding_lr: float, device: torch.device | None = None,
               optimizer: str = "sgd") -> tuple[Any, Any]:
    """-> (DistributedModelParallel of the task, its plan). The tables train with `optimizer`
    ("sgd" | "rowwise_adagrad") fused into the backward at `embedding_lr`; its state is
    `model.fused_optimizer`. The caller's optimizer covers the dense parameters (`dense_parameters`)."""
    device = device or torch.device("cpu")
    ensure_process_group(device)
    apply_optimizer_in_backward(_embedding_optimizer(optimizer), task.embeddings.collection.parameters(),
                                {"lr": embedding_lr})
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    plan = sharding_plan(task, world, device.type)
    model = DistributedModelParallel(task, device=device, plan=plan, sharders=[EmbeddingCollectionSharder()],
                                     data_parallel_wrapper=dense_data_parallel(world))
    return model, plan


def dense_data_parallel(world: int) -> Any:
    """DMP's wrapper of the dense (unsharded) modules: DDP across `world` ranks, none on one rank.

    On one rank DDP averages nothing, yet each step it copies gradients into its buckets, runs the
    all-reduce and (with find_unused_parameters) walks the autograd graph. Not a static graph: a
    batch can leave parts of the model without gradient (e.g. an event type with no history in any
    example), which DMP's default static-graph DDP rejects mid-training. Parameter and state names
    are the same either way (DMP names them by the unwrapped module)."""
    if world > 1:
        return DefaultDataParallelWrapper(static_graph=False, find_unused_parameters=True)

    class OneRank(DataParallelWrapper):
        def wrap(self, dmp: Any, env: Any, device: torch.device) -> None:
            pass  # the dense modules stay as they are

    return OneRank()


def dense_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters an ordinary optimizer must step: all but the fused (in-backward) tables."""
    return [p for _, p in in_backward_optimizer_filter(model.named_parameters())]


def unsharded_state(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """The sharded task's full state under the plain ("torch" backend) task's names, on rank 0
    (None on other ranks). Every rank must call it: each table is gathered from its owner.

    Why: evaluation, export and embedding precompute then run a plain-torch model, with no
    torchrec and no collectives (a rank with fewer eval batches cannot stall the others).
    """
    rank, alone = torch.distributed.get_rank(), single_process()
    out: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        if hasattr(value, "local_shards"):  # ShardedTensor: a table, gathered on rank 0
            full = torch.empty(value.size(), dtype=value.dtype) if rank == 0 else None
            if alone:  # every shard is local: copied here, not gathered in gloo's threads (single_process says why)
                for shard in value.local_shards():
                    full[tuple(slice(o, o + n) for o, n in zip(shard.metadata.shard_offsets,
                                                                shard.metadata.shard_sizes, strict=True))] = shard.tensor
            else:
                value.gather(dst=0, out=full)
            if rank == 0:
                out[plain_state_key(key)] = full
        else:
            out[key] = value.detach().cpu()
    return out if rank == 0 else None
