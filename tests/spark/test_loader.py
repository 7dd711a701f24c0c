"""jobs.mix and gem.data: the manifest lists the Delta log's files at pinned versions and rewrites
nothing; the loader draws each source at its rate, never twice per pass across ranks and workers,
resumes exactly, cuts sequences strictly before the impression (brute-force reference), and its
importance weights recover the true base rate; stale manifests fail clearly."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import random
import shutil
from itertools import islice, pairwise, takewhile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import DataLoader

from gem.config import ConfigError, MixConfig
from gem.data import loader as loader_module
from gem.data.delta_log import MissingDataFileError, UnavailableVersionError, logged_files, read_table, table_version
from gem.data.encode import DENSE_COLUMNS, hash_ids
from gem.data.loader import ExampleStream, ResumableLoader
from gem.data.manifest import read_manifest
from gem.data.sampling import row_uniforms
from gem.days import day_range, shift_day
from gem.lakehouse import completions, tables
from gem.lakehouse.commit import StageContext
from jobs import assemble_examples, build_features, build_sequences, mix
from schemas.events import BRONZE_AD_EVENTS
from schemas.examples import LABEL_COLUMNS, SILVER_TRAINING_EXAMPLES
from schemas.features import SILVER_AD_FEATURES, SILVER_USER_FEATURES
from schemas.ops import COMPLETIONS
from schemas.sequences import SEQUENCE_COLUMNS, SILVER_USER_SEQUENCES
from schemas.tasks import pooled_groups
from tests.landing_lines import bronze_event
from tests.support import make_config, stand_in_records

S = "2026-01-01"
W = 1
DAYS = day_range(S, shift_day(S, 5))  # bronze S..S+5
# S..S+4 assembled; the mix of S+5 holds out S+4, validates on S+3 and trains on S..S+2.
EXAMPLE_DAYS = DAYS[:-W]
MIX_DS = DAYS[-1]
SURFACES = ("reels", "fb_feed")
TASKS = tuple(f"{s}/{t}" for s in SURFACES for t in LABEL_COLUMNS)


def _traffic(seed: int = 5) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for day in DAYS:
        for n in range(500):
            user, ad = f"u{rng.randint(0, 39)}", f"a{rng.randint(0, 9)}"
            surface = SURFACES[0] if rng.random() < 0.75 else SURFACES[1]  # unequal volumes
            t = dt.datetime.fromisoformat(day) + dt.timedelta(seconds=rng.uniform(0, 86_000))
            common = {"event_time": t, "user_id": user, "ad_id": ad, "surface": surface, "user_attrs": None}
            rows.append(bronze_event(f"{day}-{n}-i", day, "impression", **common))
            if rng.random() < 0.2:
                common["event_time"] = t + dt.timedelta(seconds=20)
                rows.append(bronze_event(f"{day}-{n}-k", day, "click", **common))
                if rng.random() < 0.3 and t.hour < 20:
                    common["event_time"] = t + dt.timedelta(hours=1)
                    rows.append(bronze_event(f"{day}-{n}-c", day, "conversion", conversion_type="lead", **common))
    return rows


def _append(spark, cfg, schema, rows) -> None:
    path = tables.ensure_table(spark, cfg, schema)
    spark.createDataFrame(rows, schema.spark_schema()).write.format("delta").mode("append").save(path)


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):
    """Real silver tables from planted bronze (validation records stand in for the DQ stages),
    then jobs.mix with temperature mixing and negatives down-sampled to 0.5."""
    cfg = make_config(
        tmp_path_factory.mktemp("loader"), start_ds=S, attribution_window_days=W, surfaces=list(SURFACES),
        mix={"policy": "temperature", "temperature": 2.0, "negative_rate": 0.5, "seed": 23, "validation_days": 1},
        loader={"batch_size": 64, "num_workers": 0, "max_impressions": 8, "max_clicks": 4, "max_conversions": 2},
    )
    _append(spark, cfg, BRONZE_AD_EVENTS, _traffic())
    bronze = {BRONZE_AD_EVENTS.name: table_version(tables.table_path(cfg, BRONZE_AD_EVENTS))}
    _append(spark, cfg, COMPLETIONS, stand_in_records("validate_events", DAYS, table_versions=bronze))
    # Sequences and features over the example days in one ranged run each (what the days' own runs
    # write: test_build_sequences, test_build_features); the stand-ins for the data-quality stages
    # name the versions they validated.
    sequences = build_sequences.run(StageContext(cfg, spark), EXAMPLE_DAYS[0], EXAMPLE_DAYS[-1])
    built = build_features.run(StageContext(cfg, spark), EXAMPLE_DAYS[0], EXAMPLE_DAYS[-1])
    _append(spark, cfg, COMPLETIONS, stand_in_records("validate_silver", list(EXAMPLE_DAYS), table_versions={
        SILVER_USER_SEQUENCES.name: sequences.table_versions[SILVER_USER_SEQUENCES.name],
        **{t: built.table_versions[t] for t in (SILVER_USER_FEATURES.name, SILVER_AD_FEATURES.name)}}))
    for day in EXAMPLE_DAYS:
        assembled = assemble_examples.run(StageContext(cfg, spark), day)
        # validate_examples' record names the version it validated (the one the assembly committed).
        _append(spark, cfg, COMPLETIONS, stand_in_records("validate_examples", [day], table_versions={
            SILVER_TRAINING_EXAMPLES.name: assembled.table_versions[SILVER_TRAINING_EXAMPLES.name]}))
    examples_version = table_version(tables.table_path(cfg, SILVER_TRAINING_EXAMPLES))
    result = mix.run(StageContext(cfg, spark), MIX_DS)
    return cfg, result, examples_version


def _stream(cfg, split="train", rank=None, world=None, **loader) -> ExampleStream:
    loader_cfg = dataclasses.replace(cfg.loader, **loader)
    return ExampleStream(read_manifest(cfg, MIX_DS, split), TASKS, loader_cfg, rank=rank, world_size=world)


def _pass(stream: ExampleStream, pass_index: int = 0) -> list[Any]:
    loader = ResumableLoader(stream)
    loader.load_state_dict({"pass": pass_index, "cursors": {}, "rotation": 0})
    return list(loader.epoch())


# --------------------------------------------------------------------------------------------------
# jobs.mix


def test_temperature_rates_follow_volume_to_the_power_one_over_t():
    rates = mix.sampling_rates({"a": 100, "b": 400, "c": 0}, MixConfig(policy="temperature", temperature=2.0))
    assert rates["a"] == 1.0 and rates["b"] == pytest.approx(0.5)
    assert 400 * rates["b"] / (100 * rates["a"]) == pytest.approx(math.sqrt(400 / 100))
    assert mix.sampling_rates({"a": 5, "b": 50}, MixConfig(policy="proportional", max_rate=0.3)) == {"a": 0.3, "b": 0.3}
    fixed = MixConfig(policy="fixed", fixed_rates={"reels/click": 0.2}, max_rate=0.9)
    assert mix.sampling_rates({"reels/click": 9, "reels/lead": 9}, fixed) == {"reels/click": 0.2, "reels/lead": 0.9}


def test_manifest_lists_the_logs_files_at_a_pinned_version_and_rewrites_nothing(spark, lake):
    cfg, result, examples_version = lake
    assert result.details["examples_version"] == examples_version  # mixing wrote nothing to the examples table
    assert table_version(tables.table_path(cfg, SILVER_TRAINING_EXAMPLES)) == examples_version
    train, held_out = read_manifest(cfg, MIX_DS, "train"), read_manifest(cfg, MIX_DS, "eval")
    validation = read_manifest(cfg, MIX_DS, "validation")
    logged = {f.path: f for f in logged_files(train.examples_path, train.examples_version)}
    expected_train = {p for p, f in logged.items() if f.partition["ds"] in EXAMPLE_DAYS[:-2]}
    assert set(train.files) == expected_train
    # The day before the held-out one validates: every row of it, in no other split.
    assert {validation.file_ds[f] for f in validation.files} == {EXAMPLE_DAYS[-2]}
    assert set(validation.files) == {p for p, f in logged.items() if f.partition["ds"] == EXAMPLE_DAYS[-2]}
    assert {held_out.file_ds[f] for f in held_out.files} == {EXAMPLE_DAYS[-1]}
    assert validation.mixture_id == train.mixture_id == held_out.mixture_id
    assert validation.examples_version == train.examples_version
    for source in train.sources:
        assert source.rows == sum(logged[f].rows for f in source.files)
        assert source.negative_rate == 0.5
    rates = {s.name: s.sampling_rate for s in train.sources}
    rows = {s.name: s.rows for s in train.sources}
    assert rates["fb_feed/click"] == 1.0 and rates["reels/click"] == pytest.approx(
        (rows["reels/click"] / rows["fb_feed/click"]) ** -0.5)
    assert all(s.sampling_rate == 1.0 and s.negative_rate == 1.0 for s in held_out.sources + validation.sources)
    assert {s.name for s in validation.sources} == {s.name for s in held_out.sources} == set(TASKS)


# --------------------------------------------------------------------------------------------------
# gem.data.loader


def test_sources_are_drawn_at_their_rates(lake):
    cfg, _, _ = lake
    stream = _stream(cfg)
    passes = 6
    drawn = {t: 0 for t in TASKS}
    for k in range(passes):
        for batch in _pass(stream, k):
            for j, t in enumerate(batch.tasks):
                drawn[t] += int(batch.label_mask[:, j].sum())
    for s in stream.manifest.sources:
        p_pos, p_neg = s.sampling_rate, s.sampling_rate * s.negative_rate
        mean = passes * (s.positives * p_pos + (s.rows - s.positives) * p_neg)
        var = passes * (s.positives * p_pos * (1 - p_pos) + (s.rows - s.positives) * p_neg * (1 - p_neg))
        assert abs(drawn[s.name] - mean) <= 4 * math.sqrt(var) + 1, (s.name, drawn[s.name], mean)


def test_no_row_twice_per_pass_across_two_ranks_and_two_workers(lake):
    cfg, _, _ = lake
    ids = []
    for rank in (0, 1):
        for batch in _pass(_stream(cfg, rank=rank, world=2, num_workers=2)):
            ids += batch.example_ids
    single = [i for b in _pass(_stream(cfg, rank=0, world=1)) for i in b.example_ids]
    assert len(ids) == len(set(ids)) and set(ids) == set(single)
    # Per task, a row is drawn at most once: its mask row is a set of tasks, not counts.
    assert len(single) == len(set(single)) > 100


@pytest.mark.parametrize("interleave", [1, 2, 8])
def test_resume_continues_exactly(lake, interleave):
    """Files read one by one, in groups (a shard reads 3 or 4 files here: two groups of them with 2),
    or all at once."""
    cfg, _, _ = lake

    def key(batch):
        return (batch.example_ids, batch.weights.tolist(), batch.meta["shard"])

    uninterrupted = ResumableLoader(_stream(cfg, num_workers=2, interleave_files=interleave))
    reference = [key(b) for b in uninterrupted.batches(limit=30)]
    for stop in (3, 7):
        first = ResumableLoader(_stream(cfg, num_workers=2, interleave_files=interleave))
        got = [key(b) for b in first.batches(limit=stop)]
        state = first.state_dict()
        assert set(state) == {"pass", "cursors", "rotation", "interleave_files"}
        resumed = ResumableLoader(_stream(cfg, num_workers=2, interleave_files=interleave))
        resumed.load_state_dict(state)
        got += [key(b) for b in resumed.batches(limit=30 - stop)]
        assert got == reference, stop  # crosses into the second pass too (a pass is ~12 batches here)


def test_a_state_resumes_only_under_its_interleaving(lake):
    """A cursor counts groups of loader.interleave_files files: under another value it would point
    elsewhere, so loading it fails and says how to resume. A state without the key (written before
    interleaving) read files one by one; one at a pass's start (no cursors) continues under any."""
    cfg, _, _ = lake
    first = ResumableLoader(_stream(cfg, interleave_files=8))
    list(first.batches(limit=3))
    state = first.state_dict()
    with pytest.raises(ConfigError, match="GEM__LOADER__INTERLEAVE_FILES=8"):
        ResumableLoader(_stream(cfg, interleave_files=1)).load_state_dict(state)
    one_by_one = ResumableLoader(_stream(cfg, interleave_files=1))
    list(one_by_one.batches(limit=3))
    older = {k: v for k, v in one_by_one.state_dict().items() if k != "interleave_files"}
    assert older["cursors"]
    ResumableLoader(_stream(cfg, interleave_files=1)).load_state_dict(older)
    with pytest.raises(ConfigError, match="interleave_files=1"):
        ResumableLoader(_stream(cfg, interleave_files=8)).load_state_dict(older)
    ResumableLoader(_stream(cfg, interleave_files=8)).load_state_dict({"pass": 1, "cursors": {}, "rotation": 0})


def test_interleaved_files_mix_surfaces_and_days_in_a_batch_with_the_same_examples(lake):
    """The example table is partitioned by (ds, surface): read one file at a time, a batch holds one
    surface of one day (two where it straddles a file's end); interleaved, the pass's examples are
    the same (draws, weights, labels, sequences) and a batch mixes the files."""
    cfg, _, _ = lake
    stream = _stream(cfg)
    one_by_one, interleaved = _pass(_stream(cfg, interleave_files=1)), _pass(_stream(cfg, interleave_files=8))
    assert len(stream.manifest.files) <= 8 and len(set(stream.manifest.file_ds.values())) == 3

    def files(batch):  # the (surface, day) partitions a batch's rows come from
        days = (batch.impression_times // 86_400_000_000).tolist()
        return set(zip(batch.sparse["surface"].values.tolist(), days, strict=True))

    assert _by_id(interleaved) == _by_id(one_by_one)
    assert max(len(files(b)) for b in one_by_one) <= 2
    assert sum(len(files(b)) == 1 for b in one_by_one) >= len(one_by_one) / 2
    # 6 partitions, unequal volumes: every full batch of 64 holds at least 4 of them.
    assert all(len(files(b)) >= 4 for b in interleaved if b.size == cfg.loader.batch_size)


def test_in_process_loader_serves_the_worker_processes_batches(lake, monkeypatch):
    """loader.in_process reads the rank's shards in the training process: the same batches in the
    same order as its DataLoader worker processes, with resume states either can continue from."""
    cfg, _, _ = lake
    processes_started = []  # per DataLoader made: its worker processes

    class CountingDataLoader(DataLoader):
        def __init__(self, *args: Any, num_workers: int = 0, **kwargs: Any) -> None:
            processes_started.append(num_workers)
            super().__init__(*args, num_workers=num_workers, **kwargs)

    monkeypatch.setattr(loader_module, "DataLoader", CountingDataLoader)

    def served(batch):
        return (batch.example_ids, batch.weights.tolist(), batch.meta)

    def continued(batch):  # a resumed DataLoader numbers its workers from the shard that comes next
        return (batch.example_ids, batch.weights.tolist(), batch.meta["shard"], batch.meta["cursor"])

    processes = ResumableLoader(_stream(cfg, num_workers=2))
    batches = list(processes.batches(limit=30))
    in_process = ResumableLoader(_stream(cfg, num_workers=2, in_process=True))
    assert processes_started and set(processes_started) == {2}
    processes_started.clear()
    assert [served(b) for b in in_process.batches(limit=30)] == [served(b) for b in batches]
    assert processes_started and set(processes_started) == {0}
    assert in_process.state_dict() == processes.state_dict()
    # The passes end with one shard exhausted before the other (two batches in a row from one
    # worker), so the order after a worker drops out is checked too.
    workers = [b.meta["worker"] for b in batches]
    assert any(a == b for a, b in pairwise(workers))
    # A state saved by either continues in the other exactly.
    reference = [continued(b) for b in batches]
    first = ResumableLoader(_stream(cfg, num_workers=2))
    got = [continued(b) for b in first.batches(limit=7)]
    resumed = ResumableLoader(_stream(cfg, num_workers=2, in_process=True))
    resumed.load_state_dict(first.state_dict())
    got += [continued(b) for b in resumed.batches(limit=11)]
    again = ResumableLoader(_stream(cfg, num_workers=2))
    again.load_state_dict(resumed.state_dict())
    got += [continued(b) for b in again.batches(limit=12)]
    assert got == reference


def _example(batch, i: int) -> tuple:
    """Everything the loader emits for example i of a batch, sequences included."""
    seqs = []
    for jag in batch.sequences.values():
        lo, hi = int(jag.offsets[i]), int(jag.offsets[i + 1])
        seqs.append({k: v[lo:hi].tolist() for k, v in sorted(jag.values.items())})
    return (batch.label_mask[i].tolist(), batch.weights[i].tolist(), batch.labels[i].tolist(),
            batch.dense[i].tolist(), {f: int(s.values[i]) for f, s in batch.sparse.items()}, seqs)


def _by_id(batches) -> dict[str, tuple]:
    return {iid: _example(b, i) for b in batches for i, iid in enumerate(b.example_ids)}


def test_length_sorted_batches_hold_the_stream_passs_examples_with_less_padding(lake):
    """loader.length_sort_batches regroups a pass: the same examples with the same draws, weights,
    labels and sequences, in batches of similar lengths (less padding)."""
    cfg, _, _ = lake
    # Files one by one: here most histories reach the cap of 8, and a batch mixing the days (the
    # first day's histories are the short ones) nearly always holds one at the cap, sorted or not.
    stream_pass = _pass(_stream(cfg, length_sort_batches=1, interleave_files=1))
    sorted_pass = _pass(_stream(cfg, length_sort_batches=4, interleave_files=1))
    assert _by_id(sorted_pass) == _by_id(stream_pass)
    assert [b.size for b in sorted_pass].count(cfg.loader.batch_size) >= len(sorted_pass) - 1

    def padding(batches):
        sizes = [b.padded_sizes()["impression"] for b in batches]
        return 1 - sum(r for r, _ in sizes) / sum(p for _, p in sizes)

    # Here most histories reach the cap of 8 (40 users): length-sorted batches pad far less than the
    # stream's, so the 0.75 factor has margin.
    assert padding(sorted_pass) < 0.75 * padding(stream_pass), (padding(sorted_pass), padding(stream_pass))


def test_resume_inside_a_length_sorted_buffer_continues_exactly(lake):
    """Stopped after any batch of a buffer (the state then names the buffer's start and how many of
    its batches are out), a resumed loader yields exactly the batches that were still to come."""
    cfg, _, _ = lake

    def key(batch):
        return (batch.example_ids, batch.weights.tolist(), batch.meta["shard"])

    reference = [key(b) for b in ResumableLoader(_stream(cfg, length_sort_batches=4)).batches(limit=16)]
    mid_buffer = 0
    for stop in (1, 2, 3, 5, 9):
        first = ResumableLoader(_stream(cfg, length_sort_batches=4))
        got = [key(b) for b in first.batches(limit=stop)]
        state = first.state_dict()
        mid_buffer += any(c[2] > 0 for c in state["cursors"].values())
        resumed = ResumableLoader(_stream(cfg, length_sort_batches=4))
        resumed.load_state_dict(state)
        got += [key(b) for b in resumed.batches(limit=16 - stop)]
        assert got == reference, stop
    assert mid_buffer >= 3  # most stops fell inside a buffer, not at its end


def test_sequences_equal_a_brute_force_cut(lake):
    cfg, _, _ = lake
    stream = _stream(cfg, "eval")
    snapshot_rows = {}
    for r in read_table(stream.manifest.sequences_path, stream.manifest.sequences_version).to_pylist():
        snapshot_rows[(r["ds"].isoformat(), r["user_id"])] = r
    checked = 0
    for batch in _pass(stream)[:3]:
        users = batch.sparse["user_id"].values.tolist()
        for i, iid in enumerate(batch.example_ids):
            t_us = int(batch.impression_times[i])
            ds = stream.manifest.file_ds[next(f for f in stream.manifest.files)]  # eval: one day
            row = next(r for (d, u), r in snapshot_rows.items() if d == ds and hash_ids(_arr([u]))[0] == users[i])
            for event_type, (seq, _) in SEQUENCE_COLUMNS.items():
                before = [e for e in row[seq] if _us(e["event_time"]) < t_us][-cfg.loader.max_length(event_type):]
                jag = batch.sequences[event_type]
                lo, hi = int(jag.offsets[i]), int(jag.offsets[i + 1])
                assert jag.values["ad_id"][lo:hi].tolist() == hash_ids(_arr([e["ad_id"] for e in before])).tolist(), iid
                gaps = [(t_us - _us(e["event_time"])) / 1e6 for e in before]
                assert jag.values["gap_s"][lo:hi].tolist() == pytest.approx(gaps)
                assert all(g > 0 for g in gaps)
                checked += hi - lo
    assert checked > 100


def _arr(values):
    import pyarrow as pa

    return pa.array(values, pa.string())


def _us(t: dt.datetime) -> int:
    epoch = dt.datetime(1970, 1, 1, tzinfo=t.tzinfo)
    return (t - epoch) // dt.timedelta(microseconds=1)


def test_importance_weights_recover_the_base_rate(lake):
    cfg, _, _ = lake
    stream = _stream(cfg)
    for s in stream.manifest.sources:
        if s.label_type != "click":
            continue
        true_rate = s.positives / s.rows
        num = den = 0.0
        for k in range(8):
            for b in _pass(stream, k):
                j = b.tasks.index(s.name)
                num += float((b.weights[:, j] * b.labels[:, j]).sum())
                den += float(b.weights[:, j].sum())
        unweighted = sum(float(b.labels[b.label_mask[:, b.tasks.index(s.name)], b.tasks.index(s.name)].sum())
                         for b in _pass(stream)) / sum(int(b.label_mask[:, b.tasks.index(s.name)].sum())
                                                       for b in _pass(stream))
        assert num / den == pytest.approx(true_rate, rel=0.1), s.name
        assert unweighted > 1.3 * true_rate  # negatives kept at 0.5: the unweighted rate is biased up


def test_batch_layout_and_kjt(lake):
    cfg, _, _ = lake
    batch = _pass(_stream(cfg))[0]
    b = batch.size
    assert batch.dense.shape[0] == b and batch.labels.shape == batch.weights.shape == (b, len(TASKS))
    assert torch.all(batch.weights[~batch.label_mask] == 0) and torch.all(batch.weights[batch.label_mask] >= 1)
    kjt = batch.to_kjt()
    assert kjt.keys() == list(batch.sparse) and kjt.lengths().tolist() == [1] * (b * len(batch.sparse))
    seq = batch.sequence_kjt("ad_id")
    assert seq.keys() == list(SEQUENCE_COLUMNS)
    assert seq["impression"].lengths().tolist() == batch.sequences["impression"].lengths.tolist()


def test_a_young_lakes_window_counts_enter_the_batch_as_full_window_estimates(lake):
    """The lake starts at S, so the counters of S+k read k days: the training days S..S+2 carry 0, 1
    and 2 days of each 7-day window, and the batch holds log1p(count * 7 / k) (gem.data.encode)."""
    cfg, _, _ = lake
    raw = {r["impression_id"]: r for r in read_table(tables.table_path(cfg, SILVER_TRAINING_EXAMPLES)).to_pylist()}
    j7, j1 = DENSE_COLUMNS.index("user_impressions_7d"), DENSE_COLUMNS.index("user_impressions_1d")
    scaled_by = {}  # days read -> rows with a non-zero 7-day count
    for batch in _pass(_stream(cfg)):
        for i, example_id in enumerate(batch.example_ids):
            row = raw[example_id]
            k = (row["features_ds"] - dt.date.fromisoformat(S)).days
            count = row["user_impressions_7d"]
            expected = np.log1p(count * 7 / k) if k else np.log1p(count)
            assert float(batch.dense[i, j7]) == pytest.approx(expected, rel=1e-6), (example_id, k)
            assert float(batch.dense[i, j1]) == pytest.approx(np.log1p(row["user_impressions_1d"]), rel=1e-6)
            scaled_by[k] = scaled_by.get(k, 0) + (count > 0)
    assert sorted(scaled_by) == [0, 1, 2] and scaled_by[1] > 0 and scaled_by[2] > 0


def test_draws_are_deterministic_and_differ_by_pass():
    a = row_uniforms(1, 0, "reels/click", "/f", 1000)
    assert np.array_equal(a, row_uniforms(1, 0, "reels/click", "/f", 1000))
    assert not np.array_equal(a, row_uniforms(1, 1, "reels/click", "/f", 1000))
    assert 0.0 <= a.min() and a.max() < 1.0 and abs(a.mean() - 0.5) < 0.05


def _repoint(table_root: Path, old: str, new: str) -> None:
    """Rewrite the path columns of every manifest file under table_root from `old` to `new`."""
    import pyarrow.compute as pc

    for f in table_root.rglob("*.parquet"):
        t = pq.read_table(f)
        for c in ("file_path", "table_path", "sequences_path"):
            t = t.set_column(t.schema.get_field_index(c), c, pc.replace_substring(t[c], old, new))
        pq.write_table(t, f)


def test_the_same_tables_draw_the_same_examples_wherever_the_lakehouse_sits(lake, tmp_path):
    """Draws and shuffles are keyed on a file's partition and rank, not its absolute path: a copy of
    the lakehouse in another folder (a fresh clone's) streams exactly the same pass."""
    cfg, _, _ = lake
    copy = tmp_path / "elsewhere" / "lake"
    shutil.copytree(cfg.lakehouse_uri, copy)
    _repoint(copy / "gold" / "mixture_manifest", cfg.lakehouse_uri, str(copy))
    moved = cfg.replace(lakehouse_uri=str(copy))
    here, there = read_manifest(cfg, MIX_DS), read_manifest(moved, MIX_DS)
    assert here.files != there.files and list(here.file_keys.values()) == list(there.file_keys.values())
    # Spark's random file ids do not enter the key: a file's rank in its partition folder does.
    assert all(key.split("#")[0].startswith("ds=") for key in here.file_keys.values())
    examples = [[_example(b, i) for b in _pass(_stream(c)) for i in range(b.size)] for c in (cfg, moved)]
    assert examples[0] == examples[1] and len(examples[0]) > 0


def test_the_hosts_disk_cache_changes_no_batch_and_decodes_each_file_once(lake, tmp_path):
    """loader.local_cache_mib: the first pass writes each example file and day index it decodes,
    the next maps them, decoding nothing; both emit exactly the batches of a loader without it."""
    cfg, _, _ = lake
    plain = [(b.example_ids, _by_id([b])) for b in _pass(_stream(cfg, local_cache_mib=0))]
    streams = [_stream(cfg, local_cache_dir=str(tmp_path / "cache"), local_cache_mib=64) for _ in range(2)]
    passes = [[(b.example_ids, _by_id([b])) for b in _pass(s)] for s in streams]
    assert passes[0] == plain and passes[1] == plain and len(plain) > 1
    cold, warm = streams[0].local_cache, streams[1].local_cache
    assert cold.misses > 0 and cold.hits == 0  # each file and day decoded once within the pass
    assert warm.misses == 0 and warm.hits == cold.misses
    assert len(cold.files()) == cold.misses


def test_stale_manifests_fail_clearly(lake, tmp_path):
    cfg, _, examples_version = lake
    copy = tmp_path / "lake"
    shutil.copytree(cfg.lakehouse_uri, copy)
    _repoint(copy / "gold" / "mixture_manifest", cfg.lakehouse_uri, str(copy))
    moved = cfg.replace(lakehouse_uri=str(copy))
    victim = Path(read_manifest(moved, MIX_DS).files[0])
    victim.unlink()  # as VACUUM would
    with pytest.raises(MissingDataFileError, match=victim.name):
        read_manifest(moved, MIX_DS)
    # A pinned version whose log entries are gone (log cleanup after VACUUM): remove every commit and
    # checkpoint up to it.
    log = copy / "silver" / "training_examples" / "_delta_log"
    for entry in log.iterdir():
        if entry.name[:20].isdigit() and int(entry.name[:20]) <= examples_version:
            entry.unlink()
    with pytest.raises(UnavailableVersionError, match="training_examples"):
        read_manifest(moved, MIX_DS, check_files=False)


def _plain(x):
    """Config dict -> YAML-safe (tuples as lists)."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def test_train_cli_trains_evaluates_and_warm_starts(lake, tmp_path, capsys):
    import yaml

    from gem.pipeline.airflow.orchestration import NOTHING_READY_EXIT
    from gem.train import checkpoint, daily, promotion
    from jobs import pretrain
    from schemas.metrics import GOLD_METRICS

    cfg, _, _ = lake
    data = _plain(cfg.to_dict())
    data["train"].update({"steps": 4, "checkpoint_every": 2, "checkpoint_root": str(tmp_path / "ckpt")})
    data["loader"]["num_workers"] = 0
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    # The DAG's job: no manifest for a day -> 99 (skipped); the mix day -> gem.train on it.
    assert pretrain.main(["--ds", "2025-12-31", "--config", str(path)]) == NOTHING_READY_EXIT
    assert pretrain.main(["--ds", MIX_DS, "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "padding share of sequence FLOPs" in out  # the default jagged layout
    assert "held-out day" in out and "reels/click" in out
    metrics_path = GOLD_METRICS.path(cfg.lakehouse_uri)
    rows = read_table(metrics_path).to_pylist()
    assert len(rows) == len(TASKS) + len(pooled_groups(TASKS))  # every task, and each label type pooled
    assert {r["ds"].isoformat() for r in rows} == {MIX_DS}  # the partition column, restored from the log
    click = next(r for r in rows if r["task"] == "reels/click")
    assert click["examples"] > 0 and 0 < click["auc"] <= 1 and click["train_steps"] == 4
    # A rerun of the same day (another run folder) must not start from the model trained for that
    # day: nothing was promoted for an earlier day, so it starts fresh.
    assert daily.main(["--config", str(path), "--mix-ds", MIX_DS, "--no-progress", "--run-dir",
                       str(tmp_path / "ckpt" / "rerun")]) == 0
    assert "warm start from" not in capsys.readouterr().out
    # Given a model promoted for an earlier day, a new run of the day starts from it.
    earlier = promotion.promote(tmp_path / "ckpt", cfg.model.arch, shift_day(MIX_DS, -1),
                                checkpoint.latest(tmp_path / "ckpt" / "rerun"), 4)
    assert daily.main(["--config", str(path), "--mix-ds", MIX_DS, "--no-progress", "--run-dir",
                       str(tmp_path / "ckpt" / "third"), "--steps", "2"]) == 0
    assert f"warm start from {earlier.checkpoint} (promoted for {earlier.mix_ds})" in capsys.readouterr().out
    assert promotion.current(tmp_path / "ckpt", cfg.model.arch).checkpoint.parent.name == "third"
    # Each later run of the same day and model replaced the rows before it instead of adding some.
    again = read_table(metrics_path).to_pylist()
    assert len(again) == len(rows) and len({r["run_id"] for r in again}) == 1
    assert again[0]["run_id"] != rows[0]["run_id"]


@pytest.mark.slow
def test_train_cli_under_torchrun_shards_tables_and_resumes(lake, tmp_path):
    """`torchrun --nproc-per-node 2 -m gem.train` with the torchrec backend: 2 gloo ranks, each reading
    its shard of the mixture, tables sharded; rank 0 alone writes gold.metrics; a rerun resumes."""
    import subprocess

    import yaml
    from deltalake import DeltaTable

    from schemas.metrics import GOLD_METRICS
    from tests.support import PYTHON, REPO, subprocess_env

    cfg, _, _ = lake
    data = _plain(cfg.to_dict())
    data["model"]["embeddings"]["backend"] = "torchrec"
    data["train"].update({"steps": 4, "checkpoint_every": 2, "checkpoint_root": str(tmp_path / "ckpt")})
    data["loader"]["num_workers"] = 0
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    metrics_path = GOLD_METRICS.path(cfg.lakehouse_uri)
    before = DeltaTable(metrics_path).version() if DeltaTable.is_deltatable(metrics_path) else -1

    def torchrun(*extra: str) -> str:
        cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "gem.train", "--config", str(path), "--mix-ds", MIX_DS, "--no-progress",
               "--run-dir", str(tmp_path / "ckpt" / "run"), *extra]
        done = subprocess.run(cmd, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=600,
                              check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    out = torchrun()
    assert "[rank 0] trained 4 steps" in out and "[rank 1] trained 4 steps" in out
    assert out.count("held-out day") == 1 and "reels/click" in out
    assert len(list((tmp_path / "ckpt" / "run" / "step-00000004").glob("*.distcp"))) == 2
    table = DeltaTable(metrics_path)
    # The table's creation aside (a slow-tier run alone finds no table: the tests that write it first
    # are in the default tier), one write, by rank 0.
    added = [a for a in table.history() if a["version"] > before and a["operation"] != "CREATE TABLE"]
    assert [a["operation"] for a in added] == ["WRITE"]
    # Other tests' runs of this day may have written it before: this run's rows replaced theirs.
    rows = read_table(metrics_path).to_pylist()
    assert len(rows) == len(TASKS) + len(pooled_groups(TASKS)) and len({r["run_id"] for r in rows}) == 1
    assert "resumed" in torchrun("--steps", "6")


def test_loader_states_saved_by_two_ranks_restart_their_pass_under_one_rank(lake):
    """Cursors belong to the saving world's shards, which one rank deals otherwise: resharded, the
    states of two ranks in the middle of pass 0 start one rank at the beginning of pass 0."""
    cfg, _, _ = lake
    states = []
    for rank in (0, 1):
        loader = ResumableLoader(_stream(cfg, rank=rank, world=2))
        list(islice(loader.batches(), 2))
        states.append(loader.state_dict())
    assert all(s["pass"] == 0 and s["cursors"] for s in states) and states[0]["cursors"] != states[1]["cursors"]
    alone = ResumableLoader(_stream(cfg, rank=0, world=1))
    alone.load_state_dict(alone.resharded_state(states))
    fresh = ResumableLoader(_stream(cfg, rank=0, world=1))
    resumed, expected = list(islice(alone.batches(), 3)), list(islice(fresh.batches(), 3))
    assert [b.example_ids for b in resumed] == [b.example_ids for b in expected]


@pytest.mark.slow
def test_train_cli_on_two_torchrun_nodes_resumes_a_killed_run_bit_identically(lake, tmp_path):
    """Two torchrun "nodes" of one process each, their agents on their own loopback addresses
    (127.0.0.2 hosting the c10d rendezvous, 127.0.0.3 joining it), train the day's model through
    `python -m gem.train` with the tables sharded across them (gloo; its connections on lo). Killed
    on both nodes right after writing the shards of its second checkpoint (left unpublished) and
    launched again, the run resumes from the first one, each rank at its own place in the mixture,
    and ends with the tensors (weights, AdamW and the tables' RowWiseAdagrad states), losses and
    held-out scores of an uninterrupted two-node run."""
    import os
    import re
    import signal
    import subprocess

    import yaml

    from gem.environment import CRASH_AT_ENV
    from gem.pipeline.services import free_port
    from gem.train import checkpoint
    from tests.support import PYTHON, REPO, checkpoint_tensors, subprocess_env

    cfg, _, _ = lake
    data = _plain(cfg.to_dict())
    data["model"]["embeddings"]["backend"] = "torchrec"
    data["train"].update({"steps": 6, "checkpoint_every": 2, "embedding_optimizer": "rowwise_adagrad"})
    data["loader"]["num_workers"] = 0
    nodes = (("127.0.0.2", True), ("127.0.0.3", False))  # (agent address, hosts the rendezvous store)

    def two_nodes(name: str, **env: str) -> list[tuple[int, str]]:
        """Launch both nodes' torchrun of the run `name` (its own checkpoint root); -> (exit code, output) per node."""
        data["train"]["checkpoint_root"] = str(tmp_path / name)
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data))
        endpoint = f"{nodes[0][0]}:{free_port(nodes[0][0])}"
        launched = []
        for i, (address, host) in enumerate(nodes):
            log = tmp_path / f"{name}-node{i}-{len(list(tmp_path.glob(f'{name}-node{i}-*')))}.log"
            cmd = [PYTHON, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                   "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", name,
                   "--rdzv-conf", f"is_host={int(host)}", "--local-addr", address, "--max-restarts", "0",
                   "-m", "gem.train", "--config", str(path), "--mix-ds", MIX_DS, "--no-progress",
                   "--run-dir", str(tmp_path / name / "run")]
            # LOGLEVEL: the agents log their rendezvous (group rank, the workers' master address).
            node_env = subprocess_env() | {"GLOO_SOCKET_IFNAME": "lo", "LOGLEVEL": "INFO", **env}
            with log.open("w") as out:
                process = subprocess.Popen(cmd, cwd=REPO, env=node_env, stdout=out, stderr=subprocess.STDOUT,
                                           start_new_session=True)
            launched.append((process, log))
        try:
            return [(process.wait(timeout=600), log.read_text()) for process, log in launched]
        finally:
            for process, _ in launched:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()

    def held_out(output: str) -> list[str]:
        """The lines of the held-out scores table a run prints (indented, after its run id line)."""
        lines = output.split("held-out day", 1)[1].splitlines()[1:]
        return list(takewhile(lambda line: line.startswith("  "), lines))

    full = two_nodes("full")
    assert [code for code, _ in full] == [0, 0], "\n".join(out[-3000:] for _, out in full)
    joined = "".join(out for _, out in full)
    assert "[rank 0] trained 6 steps" in joined and "[rank 1] trained 6 steps" in joined
    # The agents met as a group of two; the workers' store is on the address of the node that got rank 0.
    agents = [(int(re.search(r"group_rank=(\d+)", out)[1]), re.search(r"master_addr=(\S+)", out)[1], address)
              for (_, out), (address, _) in zip(full, nodes, strict=True)]
    assert sorted(rank for rank, _, _ in agents) == [0, 1]
    assert all(master == next(a for r, _, a in agents if r == 0) for _, master, _ in agents)
    # Killed on both nodes with its step-4 shards written and not yet published.
    killed = two_nodes("killed", **{CRASH_AT_ENV: "checkpoint:shards_written@2"})
    assert all(code != 0 for code, _ in killed)
    run = tmp_path / "killed" / "run"
    assert checkpoint.latest(run) == checkpoint.step_dir(run, 2)
    assert len(list(checkpoint.step_dir(run, 4).glob("*.distcp"))) == 2
    # Each rank's place in the mixture is its own: the shards they read are not the same.
    ranks = checkpoint.read_extra(checkpoint.step_dir(run, 2))["ranks"]
    assert len(ranks) == 2 and ranks[0]["loader"]["cursors"] and ranks[0]["loader"] != ranks[1]["loader"]
    resumed = two_nodes("killed")
    assert [code for code, _ in resumed] == [0, 0], "\n".join(out[-3000:] for _, out in resumed)
    assert all("resumed" in out and "at step 2" in out for _, out in resumed)
    assert "removed the unpublished checkpoint" in "".join(out for _, out in resumed)
    # The same tensors, bit for bit, as the uninterrupted run's final checkpoint.
    expected = checkpoint_tensors(checkpoint.step_dir(tmp_path / "full" / "run", 6))
    got = checkpoint_tensors(checkpoint.step_dir(run, 6))
    assert set(expected) == set(got)
    assert any(k.startswith("model.embeddings.collection.") for k in expected)
    assert any(k.startswith("embedding_optimizer.") for k in expected)
    for key, tensor in expected.items():
        assert torch.equal(tensor, got[key]), key
    extra_full = checkpoint.read_extra(checkpoint.step_dir(tmp_path / "full" / "run", 6))
    extra_resumed = checkpoint.read_extra(checkpoint.step_dir(run, 6))
    assert extra_resumed["losses"] == extra_full["losses"]
    # Every rank ends at the same place in the mixture. (Not the same torch RNG state: each DataLoader
    # iterator draws its base seed from it, and the resumed run started its iterator later; no
    # training op draws from it, as the equal tensors show.)
    assert [r["loader"] for r in extra_resumed["ranks"]] == [r["loader"] for r in extra_full["ranks"]]
    (scores_full,) = [held_out(out) for _, out in full if "held-out day" in out]
    (scores_resumed,) = [held_out(out) for _, out in resumed if "held-out day" in out]
    assert scores_resumed == scores_full and any("reels/click" in line for line in scores_full)


def test_a_day_rewritten_after_its_validation_is_refused_until_revalidated(lake, tmp_path):
    """On a copy of the lakehouse: a commit rewrites one training day's examples without a new
    validation; the mix refuses it, naming the validation to rerun, and mixes again once a new
    validation record names the rewritten version."""
    from deltalake import write_deltalake

    cfg, _, _ = lake
    copy = tmp_path / "lake"
    shutil.copytree(cfg.lakehouse_uri, copy)
    moved = cfg.replace(lakehouse_uri=str(copy))
    day = mix.mix_days(cfg, MIX_DS).train[0]
    path = tables.table_path(moved, SILVER_TRAINING_EXAMPLES)
    rows = read_table(path, where={"ds": day})
    write_deltalake(path, rows.select(SILVER_TRAINING_EXAMPLES.column_names), mode="overwrite",
                    predicate=f"ds = '{day}'", partition_by=list(SILVER_TRAINING_EXAMPLES.partition_by))
    with pytest.raises(completions.StaleInputError,
                       match=rf"training_examples ds={day} changed after its validation.*"
                             rf"python -m jobs.validate_silver --ds {day} --examples"):
        mix.run(StageContext(moved), MIX_DS)
    revalidated = stand_in_records("validate_examples", [day], table_versions={
        SILVER_TRAINING_EXAMPLES.name: table_version(path)})
    completions.publish_completion(moved, "validate_examples", day, "test", None, 0, {},
                                 revalidated[0]["table_versions"], reconciliation=revalidated[0]["reconciliation"])
    result = mix.run(StageContext(moved), MIX_DS)
    assert result.details["examples_version"] == table_version(path)
