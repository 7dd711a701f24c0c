"""Leases, backfill holds and promotion pointers on the local disk and on the local S3 API server
(moto): one holder at a time, a stale holder taken over once its heartbeat (`renewed_at`) is old, a
holder that was taken over never overwrites or removes its successor's lease, and a promotion
pointer reads back its checkpoint and never names one outside the checkpoint root."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from gem import storage
from gem.lakehouse import lease
from gem.lakehouse.backfill_hold import hold, hold_path, live_holds
from gem.train import promotion
from tests.support import make_config

CONTENDERS = 8
ROUNDS = 10
EXPIRY_S = 60.0


@pytest.fixture
def root(lake_root: str) -> str:
    return lake_root


def _as_if_elsewhere(uri: str, **fields) -> None:
    """Rewrite the lease's holder as one running on another host (its pid means nothing here)."""
    storage.write_json(uri, {**storage.read_json(uri), "host": "another-host", **fields})


def test_a_live_holder_is_refused_and_a_stale_one_taken_over(root: str):
    uri = storage.join(root, "_ops", "leases", "pretrain", "ds=2026-01-03.json")
    first = lease.acquire_path(uri, "run-first", "pretrain ds=2026-01-03", expiry_s=EXPIRY_S, renewed=True)
    holder = storage.read_json(uri)
    assert holder["run_id"] == "run-first" and holder["pid"] == os.getpid()
    assert abs(holder["renewed_at"] - time.time()) < 30 and holder["started_at"].startswith("20")
    _as_if_elsewhere(uri)
    with pytest.raises(lease.LeaseHeldError, match="pretrain ds=2026-01-03 is being run by run-first .*another-host"):
        lease.acquire_path(uri, "run-second", "pretrain ds=2026-01-03", expiry_s=EXPIRY_S, renewed=True)
    assert first.renew() and storage.read_json(uri)["renewed_at"] >= holder["renewed_at"]
    assert lease.live_holder(uri, EXPIRY_S, renewed=True)["run_id"] == "run-first"
    # Its heartbeat older than the expiry: dead, and taken over.
    _as_if_elsewhere(uri, renewed_at=time.time() - EXPIRY_S - 1)
    assert lease.live_holder(uri, EXPIRY_S, renewed=True) is None
    second = lease.acquire_path(uri, "run-second", "pretrain ds=2026-01-03", expiry_s=EXPIRY_S, renewed=True)
    taken = storage.read_bytes(uri)
    assert storage.read_json(uri)["run_id"] == "run-second"
    # The first holder, come back: it neither renews nor removes its successor's lease.
    assert not first.renew() and storage.read_bytes(uri) == taken
    first.release()
    assert storage.read_bytes(uri) == taken
    assert second.renew() and storage.read_json(uri)["run_id"] == "run-second"
    second.release()
    assert not storage.exists(uri) and not second.renew()


def test_a_lease_file_without_a_heartbeat_is_judged_by_its_modification_time(root: str):
    uri = storage.join(root, "old.json")
    storage.write_json(uri, {"run_id": "old-format", "host": "another-host", "pid": 1,
                             "started_at": "2026-01-01T00:00:00+00:00"})
    assert lease.live_holder(uri, EXPIRY_S, renewed=True)["run_id"] == "old-format"  # written just now
    assert lease.live_holder(uri, expiry_s=-1, renewed=True) is None
    assert lease.acquire_path(uri, "new", "old", expiry_s=-1, renewed=True).run_id == "new"


def _contend(root: str, who: int, barrier, won) -> None:
    for r in range(ROUNDS):
        barrier.wait()
        try:
            lease.acquire_path(storage.join(root, "race", f"round-{r}.json"), f"contender-{who}", f"round {r}",
                               expiry_s=EXPIRY_S, renewed=True)
        except lease.LeaseHeldError:
            continue
        won.put((r, who))
    barrier.wait()  # every winner's pid runs until all have judged the last round


def test_concurrent_acquisitions_have_exactly_one_holder(root: str):
    """CONTENDERS processes take one lease at once, ROUNDS times; every other round starts from a
    stale lease of another host, which they race to take over: one holder per round, and the lease
    names it."""
    for r in range(1, ROUNDS, 2):
        storage.write_json(storage.join(root, "race", f"round-{r}.json"),
                           {"run_id": "dead", "host": "another-host", "pid": 1, "started_at": "2026-01-01T00:00:00",
                            "renewed_at": time.time() - EXPIRY_S - 1})
    ctx = multiprocessing.get_context("fork")
    barrier, won = ctx.Barrier(CONTENDERS, timeout=120), ctx.Queue()
    workers = [ctx.Process(target=_contend, args=(root, who, barrier, won)) for who in range(CONTENDERS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=300)
    assert [w.exitcode for w in workers] == [0] * CONTENDERS
    winners: dict[int, list[int]] = {}
    while not won.empty():
        r, who = won.get()
        winners.setdefault(r, []).append(who)
    assert sorted(winners) == list(range(ROUNDS)) and all(len(w) == 1 for w in winners.values()), winners
    for r, (who,) in winners.items():
        assert storage.read_json(storage.join(root, "race", f"round-{r}.json"))["run_id"] == f"contender-{who}"


def test_a_backfill_holds_its_range_on_the_object_store(s3_bucket: str, tmp_path: Path):
    cfg = make_config(tmp_path, lakehouse_uri=s3_bucket + "/lake")
    assert live_holds(cfg) == []
    with hold(cfg, "2026-01-01", "2026-01-03", "backfill-s3"):
        assert hold_path(cfg, "2026-01-01", "2026-01-03") == f"{s3_bucket}/lake/_ops/backfills/2026-01-01..2026-01-03.json"
        assert [(s, e, h["run_id"]) for s, e, h in live_holds(cfg)] == [("2026-01-01", "2026-01-03", "backfill-s3")]
    assert live_holds(cfg) == [] and not storage.exists(hold_path(cfg, "2026-01-01", "2026-01-03"))


def test_a_promotion_pointer_round_trips_on_the_object_store(s3_bucket: str):
    root, arch = s3_bucket + "/lake/_checkpoints", "kunlun"
    d3, d5 = storage.join(root, "kunlun-2026-01-03", "step-00000004"), storage.join(root, "kunlun-2026-01-05", "step-00000002")
    promotion.promote(root, arch, "2026-01-03", d3, 4, ("click/ctr",), trained_through="2026-01-02")
    promotion.promote(root.replace("s3://", "s3a://"), arch, "2026-01-05", d5.replace("s3://", "s3a://"), 2)
    pointer = storage.join(root, "promoted", arch, "2026-01-03.json")
    assert storage.read_json(pointer)["checkpoint"] == "kunlun-2026-01-03/step-00000004"  # portable
    assert [(p.mix_ds, p.checkpoint, p.step) for p in promotion.promotions(root, arch)] == \
        [("2026-01-03", d3, 4), ("2026-01-05", d5, 2)]
    assert promotion.warm_start_for(root, arch, "2026-01-05").checkpoint == d3
    assert promotion.of_day(root, arch, "2026-01-03").tasks == ("click/ctr",)
    assert promotion.current(root, arch).checkpoint == d5 and promotion.promotions(root, "hstu") == []


def test_a_pointer_escaping_the_object_store_root_is_refused(s3_bucket: str, tmp_path: Path):
    root, arch = s3_bucket + "/lake/_checkpoints", "kunlun"
    escapes = [f"{s3_bucket}/lake/elsewhere/step-00000001", f"{root}/../elsewhere/step-00000001",
               f"{root}-evil/step-00000001", "s3://another-bucket/lake/_checkpoints/run/step-00000001",
               str(tmp_path / "run" / "step-00000001"), root]
    for outside in escapes:
        with pytest.raises(promotion.PromotionError, match="outside the checkpoint root"):
            promotion.promote(root, arch, "2026-01-04", outside, 1)
    pointer = storage.join(root, "promoted", arch, "2026-01-05.json")
    for planted in ["../elsewhere/step-00000001", "run/../../elsewhere/step-00000001",
                    "s3://another-bucket/run/step-00000001", "/etc/run/step-00000001"]:
        storage.write_json(pointer, {"arch": arch, "mix_ds": "2026-01-05", "checkpoint": planted, "step": 1})
        with pytest.raises(promotion.PromotionError, match=f"{pointer}: .*outside the checkpoint root"):
            promotion.warm_start_for(root, arch, "2026-01-09")
    storage.write_json(pointer, {"arch": arch, "mix_ds": "2026-01-05", "checkpoint": "run/./x/../step-00000001",
                                 "step": 1})
    assert promotion.current(root, arch).checkpoint == f"{root}/run/step-00000001"  # inside, spelled plainly
