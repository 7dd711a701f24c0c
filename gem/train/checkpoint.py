"""Checkpoints: torch.distributed.checkpoint shards + a small JSON of everything else, published by
that JSON, written last.

A run folder is a local folder or an object store prefix (gem.storage: `s3://bucket/lake/_checkpoints/
<run>`); the shards are written and read through fsspec on both (FsspecWriter / FsspecReader). A
checkpoint of step n is the folder `{root}/step-{n:08d}`:
    *.distcp, .metadata   model and optimizer state (torch.distributed.checkpoint; sharded per rank)
    extra.json            step, loader state, RNG states, the config, code version, losses so far

An object store has no rename, so a checkpoint is published by its extra.json, created (exclusively)
after every rank's shards are written: a step folder without it is a crashed writer's partial, never
listed or loaded (and `discard_partials` removes it, with the `.tmp-*` folders of writers that
published by renaming). An existing checkpoint is never overwritten: a second writer of the same
step fails before it writes a shard (one writer per run folder: the stage's lease), and its
extra.json could not be created twice anyway.
`latest(root)` is the highest published step; `load` refuses a folder whose extra.json or shards
are missing or unreadable, naming it, and a resuming trainer then sets it aside (`.corrupt-*`) and
falls back to the step before (see gem.train.trainer.Trainer.resume).

A checkpoint's location is a Path under a local run folder and a URI string under an object store.
"""

from __future__ import annotations

import json
import random
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp

# torch 2.13 does not export the fsspec storage classes from torch.distributed.checkpoint (dcp.save
# picks them itself only for a checkpoint_id string that FileSystemWriter refuses), hence the module.
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.api import CheckpointException

from gem import storage
from gem.faults import crash_point

EXTRA = "extra.json"
PREFIX = "step-"
PARTIAL_PREFIX = ".tmp-"  # the temporary folders of writers that published by renaming
SET_ASIDE_PREFIX = ".corrupt-"


class CheckpointError(RuntimeError):
    """A checkpoint that is incomplete, corrupted, or would overwrite another."""


@contextmanager
def _single_process_ok() -> Iterator[None]:
    """Without a process group dcp warns that it assumes one process: that is the intent here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def single_process() -> bool:
    """Whether this process trains alone: no process group, or a one-rank group (torchrec's tables
    need one). Its checkpoints and unsharded state then run no collective. A gloo group runs them in
    its worker threads, where a torch op that goes parallel starts a second OpenMP team; with more
    OpenMP threads than cores libgomp throttles every thread's spin-wait, so each later parallel
    region waits on a wake-up: after the first checkpoint save (or a warm start's load) every later
    training step is slower for the rest of the process, and after the tables' gather so is the
    held-out forward."""
    return not (torch.distributed.is_available() and torch.distributed.is_initialized()) or \
        torch.distributed.get_world_size() == 1


Location = str | Path  # a checkpoint or run folder: a local path, or an object store URI


def child(folder: Location, name: str) -> Location:
    """`folder`/`name`: a Path under a local folder (as the caller spelled it, relative or not), a
    URI under an object store."""
    return storage.local_path(folder) / name if storage.is_local(folder) else storage.join(folder, name)


def step_dir(root: Location, step: int) -> Location:
    return child(root, f"{PREFIX}{step:08d}")


def rng_state() -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state().tolist(),
        "numpy": [np.random.get_state()[0], np.random.get_state()[1].tolist(), *np.random.get_state()[2:]],
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


def _is_rank0() -> bool:
    return not (torch.distributed.is_available() and torch.distributed.is_initialized()) or torch.distributed.get_rank() == 0


def is_published(path: Location) -> bool:
    """Whether `path` holds a published checkpoint: its extra.json exists (it is written last)."""
    return storage.exists(storage.join(path, EXTRA))


def save(root: Location, step: int, state: dict[str, Any], extra: dict[str, Any]) -> Location:
    """Write state (tensors / state_dicts) and extra (JSON-able) as step `step`; returns the folder."""
    final = step_dir(root, step)
    if is_published(final):
        raise CheckpointError(f"checkpoint {final} already exists; checkpoints are never overwritten")
    alone = single_process()
    if _is_rank0():
        for leftover in storage.listdir(final):  # a crashed writer's shards of this step
            storage.delete(leftover, recursive=True)
    if not alone:  # no rank writes before rank 0 has cleared the folder
        torch.distributed.barrier()
    local = storage.is_local(final)
    # An object store's upload is whole at close: there is nothing to fsync (and the writer's fallback
    # for a stream without a file descriptor would sync every local disk instead).
    writer = FsspecWriter(storage.normalized(final), sync_files=local, overwrite=False)
    with _single_process_ok():
        dcp.save(state, storage_writer=writer, no_dist=alone)
    crash_point("checkpoint:shards_written")  # drills.faults kills a save half done here
    if _is_rank0() and not storage.create(storage.join(final, EXTRA), json.dumps({"step": step, **extra})):
        raise CheckpointError(f"checkpoint {final} was published by another writer meanwhile")
    if not alone:
        torch.distributed.barrier()
    return final


def _entries(root: Location) -> list[Location]:
    return [child(root, storage.name(entry)) for entry in storage.listdir(root)]


def published(root: Location) -> list[Location]:
    """The published checkpoints under root, newest (highest step) first; partial step folders (no
    extra.json), `.tmp-*` and set-aside `.corrupt-*` folders are not among them."""
    steps = [p for p in _entries(root) if storage.name(p).startswith(PREFIX) and is_published(p)]
    return sorted(steps, key=storage.name, reverse=True)


def latest(root: Location) -> Location | None:
    """The published checkpoint with the highest step under root, if any."""
    steps = published(root)
    return steps[0] if steps else None


def set_aside(path: Location) -> Location:
    """Move a checkpoint that cannot be loaded to `.corrupt-<name>-<nonce>` beside it: kept for a
    post-mortem, never listed again, and its step can be written afresh. On an object store the move
    is a copy and a delete; a crash between them leaves the checkpoint where it was (set aside again
    by the next resume) or partly deleted (a partial, discarded)."""
    target = child(storage.parent(path), f"{SET_ASIDE_PREFIX}{storage.name(path)}-{uuid.uuid4().hex[:8]}")
    storage.move_folder(path, target)
    return target


def read_extra(path: Location) -> dict[str, Any]:
    """extra.json of a published checkpoint; refuses partial or set-aside folders and missing or
    broken JSON."""
    if storage.name(path).startswith(PARTIAL_PREFIX):
        raise CheckpointError(f"{path} is an unpublished (partial) checkpoint; it is never loaded")
    if storage.name(path).startswith(SET_ASIDE_PREFIX):
        raise CheckpointError(f"{path} was set aside as unloadable; it is never loaded")
    try:
        text = storage.read_text(storage.join(path, EXTRA))
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} is incomplete: {EXTRA} is missing (it is written last, so "
                              f"this is an unpublished, partial checkpoint)") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"checkpoint {path} is corrupted: {EXTRA} is not valid JSON ({e})") from e


def load(path: Location, state: dict[str, Any], alone: bool = False) -> dict[str, Any]:
    """Load shards into `state` (in place, as dcp does) and return extra.json; refuses broken folders.
    alone: this rank loads without the others (a plain copy on rank 0 while the others wait), so the
    load runs no collective even inside a process group."""
    extra = read_extra(path)
    try:
        with _single_process_ok():
            dcp.load(state, storage_reader=FsspecReader(storage.normalized(path)), no_dist=alone or single_process())
    except (Exception, CheckpointException) as e:  # CheckpointException derives from BaseException
        raise CheckpointError(f"checkpoint {path} is corrupted or incomplete: its shards cannot be read ({e})") from e
    return extra


def _create_optimizer_slots(optimizer: torch.optim.Optimizer) -> None:
    """Give an optimizer that has not stepped its state tensors, without moving any weight: one
    step on zero gradients at learning rate 0 (for Adam(W): the update and the decay are both
    multiplied by lr, so each weight gets exactly + 0)."""
    lrs = [group["lr"] for group in optimizer.param_groups]
    grads = {}
    for group in optimizer.param_groups:
        group["lr"] = 0.0
        for p in group["params"]:
            grads[p] = p.grad
            p.grad = torch.zeros_like(p)
    optimizer.step()
    for group, lr in zip(optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    for p, g in grads.items():
        p.grad = g


def optimizer_state(named_parameters: Iterator[tuple[str, torch.Tensor]], optimizer: torch.optim.Optimizer
                    ) -> dict[str, dict[str, Any]]:
    """The optimizer's per-parameter state keyed by parameter NAME, holding its live tensors.

    Names, not positions: the same state then loads whatever order a model lists its parameters in.
    A fresh optimizer first gets its slots (`_create_optimizer_slots`) so that dcp.load has
    tensors to fill in place. Example: {"body.proj.weight": {"step": tensor(4.), "exp_avg": ...}}.
    """
    if not optimizer.state:
        _create_optimizer_slots(optimizer)
    names = {id(p): n for n, p in named_parameters}
    return {names[id(p)]: optimizer.state[p] for group in optimizer.param_groups for p in group["params"]}


def load_optimizer_state(named_parameters: Iterator[tuple[str, torch.Tensor]], optimizer: torch.optim.Optimizer,
                         state: dict[str, dict[str, Any]]) -> None:
    """Put a loaded `optimizer_state` back (its non-tensor entries come back as new objects)."""
    params = dict(named_parameters)
    for name, slots in state.items():
        optimizer.state[params[name]].update(slots)


def discard_partials(root: Location) -> list[Location]:
    """Remove what crashed writers left: step folders without extra.json and `.tmp-*` folders;
    returns what was removed."""
    removed = [p for p in _entries(root) if storage.name(p).startswith(PARTIAL_PREFIX)
               or (storage.name(p).startswith(PREFIX) and not is_published(p))]
    for p in removed:
        storage.delete(p, recursive=True)
    return removed
