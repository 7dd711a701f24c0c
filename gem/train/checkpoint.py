"""Checkpoints: torch.distributed.checkpoint shards + a small JSON of everything else, published atomically.

A checkpoint of step n is the folder `{root}/step-{n:08d}`:
    *.distcp, .metadata   model and optimizer state (torch.distributed.checkpoint; sharded per rank)
    extra.json            step, loader state, RNG states, the config, code version, losses so far

It is written under `{root}/.tmp-step-{n:08d}-{nonce}` and renamed into place only when complete,
so a crash leaves at most a `.tmp-*` folder, which is never loaded (and `discard_partials` removes).
An existing step folder is never overwritten (a second writer of the same step fails).
`latest(root)` is the highest published step; `load` refuses a folder whose extra.json or shards
are missing or unreadable, naming it, and a resuming trainer then sets it aside and falls back to
the step before (see gem.train.trainer.Trainer.resume).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from gem.faults import crash_point

EXTRA = "extra.json"
PREFIX = "step-"


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


def step_dir(root: Path, step: int) -> Path:
    return root / f"{PREFIX}{step:08d}"


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


def save(root: Path, step: int, state: dict[str, Any], extra: dict[str, Any]) -> Path:
    """Write state (tensors / state_dicts) and extra (JSON-able) as step `step`; returns the folder."""
    root.mkdir(parents=True, exist_ok=True)
    final = step_dir(root, step)
    if final.exists():
        raise CheckpointError(f"checkpoint {final} already exists; checkpoints are never overwritten")
    alone = single_process()
    nonce = uuid.uuid4().hex[:8]
    if not alone:  # every rank must write into the same temporary folder
        box = [nonce]
        torch.distributed.broadcast_object_list(box, src=0)
        nonce = box[0]
    tmp = root / f".tmp-{PREFIX}{step:08d}-{nonce}"
    with _single_process_ok():
        dcp.save(state, checkpoint_id=str(tmp), no_dist=alone)
    crash_point("checkpoint:shards_written")  # drills.faults kills a save half done here
    if _is_rank0():
        (tmp / EXTRA).write_text(json.dumps({"step": step, **extra}))
        os.rename(tmp, final)  # atomic on one filesystem
    if not alone:
        torch.distributed.barrier()
    return final


def published(root: Path) -> list[Path]:
    """The published checkpoints under root, newest (highest step) first; `.tmp-*` and set-aside
    `.corrupt-*` folders are not among them."""
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)), reverse=True)


def latest(root: Path) -> Path | None:
    """The published checkpoint with the highest step under root, if any."""
    steps = published(root)
    return steps[0] if steps else None


def set_aside(path: Path) -> Path:
    """Rename a checkpoint that cannot be loaded to `.corrupt-<name>-<nonce>` beside it: kept for a
    post-mortem, never listed again, and its step can be written afresh."""
    target = path.with_name(f".corrupt-{path.name}-{uuid.uuid4().hex[:8]}")
    os.rename(path, target)
    return target


def read_extra(path: Path) -> dict[str, Any]:
    """extra.json of a published checkpoint; refuses partial folders and missing or broken JSON."""
    if path.name.startswith(".tmp-"):
        raise CheckpointError(f"{path} is an unpublished (partial) checkpoint; it is never loaded")
    extra_path = path / EXTRA
    if not extra_path.is_file():
        raise CheckpointError(f"checkpoint {path} is incomplete: {EXTRA} is missing")
    try:
        return json.loads(extra_path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"checkpoint {path} is corrupted: {EXTRA} is not valid JSON ({e})") from e


def load(path: Path, state: dict[str, Any]) -> dict[str, Any]:
    """Load shards into `state` (in place, as dcp does) and return extra.json; refuses broken folders."""
    extra = read_extra(path)
    try:
        with _single_process_ok():
            dcp.load(state, checkpoint_id=str(path), no_dist=single_process())
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


def discard_partials(root: Path) -> list[Path]:
    """Remove `.tmp-*` folders left by crashed writers; returns what was removed."""
    removed = [p for p in root.glob(".tmp-*") if p.is_dir()] if root.is_dir() else []
    for p in removed:
        shutil.rmtree(p)
    return removed
