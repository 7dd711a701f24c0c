"""Loader and mixing costs, side by side in one run.

    python -m bench.loader_throughput [--lakehouse lakehouse --mix-ds 2026-01-03]
                                      [--examples 200000 --users 5000 --workers 2 --batches 60]

1. Mixing is a manifest, not a copy: the bytes jobs.mix wrote for the manifest partition of
   --mix-ds (its Parquet files, from the Delta log) vs the bytes of a materialized mixed copy (the
   rows one pass of the loader draws, written as Parquet with the same codec). Needs a lakehouse
   with a manifest (`make demo` leaves one); skipped otherwise.
2. Loader examples/s on synthetic Delta tables written with the `deltalake` package (no Spark):
   one day of examples on 5 surfaces and a user_sequences snapshot whose users each hold exactly L
   impressions (L/4 clicks, L/16 conversions) before the day:
     a. a 5-source mix (click on each surface, rates 1.0 .. 0.6) vs 1 source (click on one surface,
        rate 1) over the same files, L = 256 (goal: the mix at >= 0.95x the single source);
     b. L = 256 vs L = 1024 (the model takes the whole prefix: loader max lengths = L).
   Each figure is the median of 3 timed runs of `--batches` batches after one warm-up pass of the
   worker processes.
3. A batch's cost on real histories (`--history NAME=LAKEHOUSE@DS`, repeatable; default: the
   lakehouse above at --mix-ds, named demo, when it has that manifest): the train manifest of DS
   read in process, as gem.train.daily builds its loader, milliseconds per batch of the first pass
   (an empty host cache: every Parquet file decoded) and of a second pass (the host cache's
   memory-mapped files), with the mean sequence elements per example.
The figures and their ratios are published through bench.results (loader_throughput). Not a test:
nothing here gates CI.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import typer
from deltalake import write_deltalake

from bench.data_path import train_loader_setup
from bench.results import RESULTS_DIR, Figure, ResultsDirOption, record
from gem.command_line import day_option, job_app, run_command
from gem.config import LoaderConfig, load_config
from gem.data.delta_log import logged_files, partition_types, table_version
from gem.data.encode import hash_ids
from gem.data.loader import ExampleStream, ResumableLoader
from gem.data.manifest import Manifest, Source, read_manifest
from schemas.examples import LABEL_COLUMNS, SILVER_TRAINING_EXAMPLES
from schemas.ids import HASHED_IDS, hash_column
from schemas.mixture import GOLD_MIXTURE_MANIFEST
from schemas.sequences import ELEMENT_ID_HASHES
from schemas.tasks import SURFACES

DAY = "2026-01-10"
# The synthetic counters stand for a lake older than the longest window: none is scaled.
COUNTERS_START_DS = "2025-12-01"
BENCH_SURFACES = SURFACES[:5]


# --------------------------------------------------------------------------------------------------
# 1. Manifest bytes vs a materialized copy.


def mixing_bytes(lakehouse: str, mix_ds: str) -> dict[str, Any] | None:
    cfg = load_config(overrides={"lakehouse_uri": lakehouse}, environ={})
    path = GOLD_MIXTURE_MANIFEST.path(lakehouse)
    if not Path(path, "_delta_log").is_dir():
        return None
    manifest_files = [f for f in logged_files(path, table_version(path)) if f.partition["ds"] == mix_ds]
    if not manifest_files:
        return None
    manifest = read_manifest(cfg, mix_ds, "train")
    stream = ExampleStream(manifest, tuple(s.name for s in manifest.sources), dataclasses.replace(cfg.loader, num_workers=0))
    copy_bytes, drawn = 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, f in enumerate(manifest.files):
            table = pq.read_table(f)
            rows, _, _ = stream.draw(f, stream.read_file(f), 0)
            out = Path(tmp) / f"part-{i}.parquet"
            pq.write_table(table.take(pa.array(np.sort(rows))), out, compression="snappy")
            copy_bytes += out.stat().st_size
            drawn += len(rows)
    return {"manifest_bytes": sum(f.bytes for f in manifest_files), "manifest_rows": sum(f.rows for f in manifest_files),
            "materialized_copy_bytes": copy_bytes, "rows_drawn_one_pass": drawn,
            "source_files_bytes": sum(Path(f).stat().st_size for f in manifest.files)}


# --------------------------------------------------------------------------------------------------
# 2. Synthetic tables.


def _strings(prefix: str, indices: np.ndarray, pool: int) -> pa.Array:
    dictionary = pa.array([f"{prefix}{i}" for i in range(pool)])
    return pa.DictionaryArray.from_arrays(pa.array(indices.astype(np.int32)), dictionary).cast(pa.string())


def _sequence_column(rng: np.random.Generator, users: int, length: int, with_conversion_type: bool) -> pa.Array:
    n = users * length
    day_start = np.datetime64(f"{DAY}T00:00:00", "us").astype(np.int64)
    # Each user's events spread over the 60 days before DAY, ascending.
    times = day_start - np.sort(rng.integers(1, 60 * 86_400_000_000, size=(users, length)), axis=1)[:, ::-1]
    ads = rng.integers(0, 2_000, size=n)
    fields = [
        pa.array(times.reshape(-1), pa.timestamp("us", tz="UTC")),
        pa.array(np.char.add("e", np.arange(n).astype(str))),
        _strings("a", ads, 2_000), _strings("adv", ads % 200, 200), _strings("c", ads % 600, 600),
        pa.array(np.array(SURFACES)[rng.integers(0, len(SURFACES), size=n)]),
        pa.array(np.array(["sales", "traffic"])[rng.integers(0, 2, size=n)]),
    ]
    names = ["event_time", "event_id", "ad_id", "advertiser_id", "campaign_id", "surface", "objective"]
    if with_conversion_type:
        fields.append(pa.array(np.array(["lead", "app_install"])[rng.integers(0, 2, size=n)]))
        names.append("conversion_type")
    for name in ELEMENT_ID_HASHES:  # what build_sequences writes beside each id (schemas/ids.py)
        fields.append(pa.array(hash_ids(fields[names.index(name)])))
        names.append(hash_column(name))
    fields = [f.combine_chunks() if isinstance(f, pa.ChunkedArray) else f for f in fields]
    elements = pa.StructArray.from_arrays(fields, names=names)
    offsets = pa.array(np.arange(0, n + 1, length, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, elements)


def write_synthetic(root: Path, examples: int, users: int, length: int, seed: int = 0) -> dict[str, Any]:
    """Examples (5 surfaces) and a sequences snapshot as Delta tables; their paths and versions."""
    rng = np.random.default_rng(seed)
    seq_path, ex_path = str(root / "silver" / "user_sequences"), str(root / "silver" / "training_examples")
    sequences = pa.table({
        "ds": pa.array([dt.date.fromisoformat(DAY)] * users, pa.date32()),
        "user_id": pa.array([f"u{i}" for i in range(users)]),
        "impressions": _sequence_column(rng, users, length, False),
        "clicks": _sequence_column(rng, users, max(1, length // 4), False),
        "conversions": _sequence_column(rng, users, max(1, length // 16), True),
    })
    write_deltalake(seq_path, sequences, partition_by=["ds"])
    user = rng.integers(0, users, size=examples)
    ads = rng.integers(0, 2_000, size=examples)
    day_start = np.datetime64(f"{DAY}T00:00:00", "us").astype(np.int64)
    columns: dict[str, Any] = {}
    for c in SILVER_TRAINING_EXAMPLES.columns:
        if c.dtype == "long":
            columns[c.name] = pa.array(rng.poisson(3, size=examples).astype(np.int64))
        elif c.dtype == "double":
            columns[c.name] = pa.array(rng.random(examples))
    columns.update({
        "ds": pa.array([dt.date.fromisoformat(DAY)] * examples, pa.date32()),
        "surface": pa.array(np.array(BENCH_SURFACES)[rng.integers(0, len(BENCH_SURFACES), size=examples)]),
        "impression_id": pa.array(np.char.add("i", np.arange(examples).astype(str))),
        "impression_time": pa.array(day_start + rng.integers(0, 86_400_000_000, size=examples), pa.timestamp("us", tz="UTC")),
        "user_id": _strings("u", user, users), "ad_id": _strings("a", ads, 2_000),
        "advertiser_id": _strings("adv", ads % 200, 200), "campaign_id": _strings("c", ads % 600, 600),
        "objective": pa.array(["sales"] * examples), "creative_type": pa.array(["image"] * examples),
        "position": pa.array(rng.integers(0, 10, size=examples).astype(np.int32)),
        "sequence_ds": pa.array([dt.date.fromisoformat(DAY)] * examples, pa.date32()),
        "features_ds": pa.array([dt.date.fromisoformat(DAY)] * examples, pa.date32()),
        "attributed_conversions": pa.array(np.zeros(examples, np.int32)),
    })
    columns.update({hash_column(c): pa.array(hash_ids(columns[c])) for c in HASHED_IDS})
    for t, col in LABEL_COLUMNS.items():
        columns[col] = pa.array((rng.random(examples) < (0.05 if t == "click" else 0.005)).astype(np.int32))
    write_deltalake(ex_path, pa.table({name: columns[name] for name in SILVER_TRAINING_EXAMPLES.column_names}),
                    partition_by=["ds", "surface"])
    return {"examples_path": ex_path, "sequences_path": seq_path}


def synthetic_manifest(paths: dict[str, Any], rates: dict[str, float]) -> Manifest:
    ex_version, seq_version = table_version(paths["examples_path"]), table_version(paths["sequences_path"])
    files = logged_files(paths["examples_path"], ex_version)
    sources = []
    for surface, rate in rates.items():
        mine = tuple(sorted(f.path for f in files if f.partition["surface"] == surface))
        rows = sum(f.rows for f in files if f.partition["surface"] == surface)
        sources.append(Source(f"{surface}/click", surface, "click", rate, 1.0, rows, 0, mine))
    used = {p for s in sources for p in s.files}
    return Manifest(
        mixture_id="bench", ds=DAY, split="train", seed=1, examples_path=paths["examples_path"],
        examples_version=ex_version, sequences_path=paths["sequences_path"], sequences_version=seq_version,
        sources=tuple(sources), file_ds={f.path: DAY for f in files if f.path in used},
        file_rows={f.path: f.rows for f in files if f.path in used},
        file_surface={f.path: f.partition["surface"] for f in files if f.path in used},
        counters_start_ds=COUNTERS_START_DS,
        example_files={f.path: f for f in files if f.path in used},
        example_partition_types=partition_types(paths["examples_path"], ex_version),
    )


def examples_per_second(manifest: Manifest, cfg: LoaderConfig, batches: int, repeats: int = 3) -> float:
    tasks = tuple(s.name for s in manifest.sources)
    rates = []
    for r in range(repeats + 1):  # the first run warms the page cache and the worker start-up path
        loader = ResumableLoader(ExampleStream(manifest, tasks, cfg))
        loader.load_state_dict({"pass": r, "cursors": {}, "rotation": 0})
        t0, n = time.perf_counter(), 0
        for batch in loader.batches(limit=batches):
            n += batch.size
        if r:
            rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates)


def batch_cost(lakehouse: str, ds: str, batches: int) -> dict[str, float]:
    """Milliseconds per batch of the train manifest of `ds`, in process: a first pass with an empty
    host cache, then a second (section 3 of the module doc)."""
    with tempfile.TemporaryDirectory() as cache:
        _, manifest, tasks, cfg = train_loader_setup(str(Path(lakehouse).resolve()), "", ds, True, cache)
        out: dict[str, float] = {}
        for name in ("first_pass", "second_pass"):
            t0, n, examples, elements = time.perf_counter(), 0, 0, 0
            for batch in ResumableLoader(ExampleStream(manifest, tasks, cfg)).batches(limit=batches):
                n, examples = n + 1, examples + batch.size
                elements += sum(int(j.offsets[-1]) for j in batch.sequences.values())
            out[f"{name}_ms_per_batch"] = 1000 * (time.perf_counter() - t0) / n
        out["batch_size"], out["sequence_elements_per_example"] = examples / n, elements / examples
    return out


def command_line(
    lakehouse: Annotated[str, typer.Option()] = "lakehouse",
    mix_ds: Annotated[str, day_option("--mix-ds", "the mixture manifest's day")] = "2026-01-03",  # the demo's last day
    examples: Annotated[int, typer.Option()] = 200_000,
    users: Annotated[int, typer.Option()] = 5_000,
    workers: Annotated[int, typer.Option()] = 2,
    batches: Annotated[int, typer.Option()] = 60,
    batch_size: Annotated[int, typer.Option()] = 512,
    history: Annotated[list[str] | None, typer.Option(
        help="NAME=LAKEHOUSE@DS: a history whose train manifest of DS section 3 reads (repeat)")] = None,
    results_dir: ResultsDirOption = RESULTS_DIR,
) -> None:

    mixing = mixing_bytes(lakehouse, mix_ds)
    if mixing is None:
        print(f"mixing bytes: skipped (no gold.mixture_manifest ds={mix_ds} under {lakehouse})")
    else:
        print(f"mixing bytes: manifest {mixing['manifest_bytes']:,} B ({mixing['manifest_rows']} rows) vs materialized "
              f"copy of one pass {mixing['materialized_copy_bytes']:,} B ({mixing['rows_drawn_one_pass']:,} rows; "
              f"source files {mixing['source_files_bytes']:,} B): ratio "
              f"{mixing['materialized_copy_bytes'] / mixing['manifest_bytes']:.0f}x")

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for length in (256, 1024):
            paths = write_synthetic(Path(tmp) / f"L{length}", examples, users, length)
            cfg = LoaderConfig(batch_size=batch_size, num_workers=workers, max_impressions=length,
                               max_clicks=max(1, length // 4), max_conversions=max(1, length // 16))
            if length == 256:
                five = synthetic_manifest(paths, dict(zip(BENCH_SURFACES, (1.0, 0.9, 0.8, 0.7, 0.6), strict=True)))
                one = synthetic_manifest(paths, {BENCH_SURFACES[0]: 1.0})
                results["one_source"] = examples_per_second(one, cfg, batches)
                results["five_sources"] = examples_per_second(five, cfg, batches)
            all_rate_one = synthetic_manifest(paths, {s: 1.0 for s in BENCH_SURFACES})
            results[f"length_{length}"] = examples_per_second(all_rate_one, cfg, batches)
    histories = dict(h.split("=", 1) for h in history or [])
    if not histories and mixing is not None:
        histories = {"demo": f"{lakehouse}@{mix_ds}"}
    costs = {}
    for name, where in histories.items():
        path, _, ds = where.rpartition("@")
        costs[name] = batch_cost(path, ds, batches)
        print(f"history {name} ({where}): a batch of {costs[name]['batch_size']:.0f} examples, "
              f"{costs[name]['sequence_elements_per_example']:.0f} sequence elements each: first pass "
              f"{costs[name]['first_pass_ms_per_batch']:.1f} ms, second pass {costs[name]['second_pass_ms_per_batch']:.1f} ms")
    print(f"loader, {workers} workers, batch {batch_size}, examples/s (median of 3):")
    print(f"  1 source {results['one_source']:,.0f} | 5-source mix {results['five_sources']:,.0f} "
          f"| ratio {results['five_sources'] / results['one_source']:.2f}x (goal >= 0.95x)")
    print(f"  sequences L=256 {results['length_256']:,.0f} | L=1024 {results['length_1024']:,.0f} "
          f"| ratio {results['length_1024'] / results['length_256']:.2f}x")
    figures = [
        Figure("one_source_examples_per_s", "1 source (click on one surface), L=256", round(results["one_source"]),
               "examples/s"),
        Figure("five_sources_examples_per_s", "5-source mix (rates 1.0 .. 0.6), L=256", round(results["five_sources"]),
               "examples/s"),
        Figure("mix_over_one_source", "5-source mix / 1 source (goal >= 0.95x)",
               round(results["five_sources"] / results["one_source"], 2), "x"),
        Figure("length_256_examples_per_s", "sequences L=256, 5 surfaces at rate 1", round(results["length_256"]),
               "examples/s"),
        Figure("length_1024_examples_per_s", "sequences L=1024, 5 surfaces at rate 1", round(results["length_1024"]),
               "examples/s"),
        Figure("length_1024_over_256", "L=1024 / L=256", round(results["length_1024"] / results["length_256"], 2), "x"),
    ]
    for name, cost in costs.items():
        figures += [
            Figure(f"{name}_first_pass_ms_per_batch", f"{name} history: ms per batch, first pass (empty host cache)",
                   round(cost["first_pass_ms_per_batch"], 1), "ms"),
            Figure(f"{name}_second_pass_ms_per_batch", f"{name} history: ms per batch, second pass (host cache)",
                   round(cost["second_pass_ms_per_batch"], 1), "ms"),
            Figure(f"{name}_sequence_elements_per_example", f"{name} history: sequence elements per example",
                   round(cost["sequence_elements_per_example"]), ""),
        ]
    if mixing is not None:
        figures += [
            Figure("manifest_bytes", f"mixture manifest of {mix_ds}", mixing["manifest_bytes"], "B"),
            Figure("materialized_copy_bytes", "a materialized copy of one pass's rows",
                   mixing["materialized_copy_bytes"], "B"),
            Figure("copy_over_manifest_bytes", "materialized copy / manifest, bytes",
                   round(mixing["materialized_copy_bytes"] / mixing["manifest_bytes"]), "x"),
        ]
    record("loader_throughput", "Loader and mixing costs: a mix against one source, long sequences, manifest bytes",
           figures, notes=f"{workers} loader workers, batch {batch_size}, {examples:,} examples of "
                          f"{users:,} users; median of 3 runs of {batches} batches. Histories (in process, "
                          f"{batches} batches a pass): {', '.join(f'{k}={v}' for k, v in histories.items()) or 'none'}."
                          + ("" if mixing else " Mixing bytes skipped: no mixture manifest in the lakehouse."),
           results_dir=results_dir)


def main(argv: list[str] | None = None) -> int:
    app = job_app("python -m bench.loader_throughput")
    app.command(help=__doc__.splitlines()[0])(command_line)
    return run_command(app, argv)


if __name__ == "__main__":
    sys.exit(main())
