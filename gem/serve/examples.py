"""A day of the lakehouse's training examples as a student's feature rows (Delta log + pyarrow + numpy).

    gem score --model ARTIFACT --input <lakehouse>/silver/training_examples --ds D --out P

An example row names what serving would have sent but does not carry it: its user's history sits in
silver.user_sequences (late materialization, schemas/examples.py) and a LoopFM student's FM codes in
gold.fm_history_codes. `feature_rows` joins them as the training loader does: per example, the
user's row of partition sequence_ds cut strictly before impression_time (gem.data.sequences), the
newest `max_len` ad ids of each history the spec lists; the user's codes logged strictly before
the impression over the days max_age_days reaches back, the newest `max_codes`. The rows then
score as the distill stage's held-out rows do (tests/spark/test_serve_distill.py compares them).

Only the artifact's surface is read. No Spark and no torch: gem score stays a serving process.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gem import storage
from gem.data.delta_log import read_table
from gem.data.encode import timestamps_us
from gem.data.sequences import newest_before_each, runs_by_key, sequence_spans
from gem.data.snapshots import SNAPSHOT_COLUMNS, DaySnapshot, index_day
from gem.days import day_range, shift_day
from gem.serve.features import CODE_TIMES_COLUMN, CODES_COLUMN, history_column
from schemas.examples import SILVER_TRAINING_EXAMPLES
from schemas.precompute import GOLD_FM_HISTORY_CODES
from schemas.sequences import SILVER_USER_SEQUENCES


def lakehouse_of(examples_uri: str) -> str | None:
    """The lakehouse whose silver.training_examples table `examples_uri` is; None for any other path."""
    uri = storage.normalized(examples_uri).rstrip("/")
    suffix = f"/{SILVER_TRAINING_EXAMPLES.layer}/{SILVER_TRAINING_EXAMPLES.table}"
    return uri[: -len(suffix)] if uri.endswith(suffix) else None


def _histories(examples: pa.Table, snapshots: dict[str, DaySnapshot], spec: dict[str, Any]) -> dict[str, pa.Array]:
    """history_<event> -> list<int64> of hashed ad ids per example, for the spec's history columns: the
    loader's cut (gem.data.sequences.sequence_spans) at the spec's max_len."""
    history = {c["name"].removeprefix("history_"): int(c["max_len"]) for c in spec["columns"] if c["kind"] == "history"}
    days = [str(d) for d in examples["sequence_ds"].to_pylist()]
    times = timestamps_us(examples["impression_time"])
    spans = sequence_spans(snapshots.__getitem__, lambda event: history.get(event, 0), examples["user_id"].to_pylist(),
                           days, times)
    out = {}
    for event in history:
        first, cut = spans.first[event], spans.cut[event]
        ids = [snapshots[day].sequences[event].fields["ad_id"][a:b] for day, a, b in zip(days, first, cut, strict=True)]
        offsets = pa.array(np.r_[0, np.cumsum(cut - first)].astype(np.int32))
        values = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        out[history_column(event)] = pa.ListArray.from_arrays(offsets, pa.array(values, pa.int64()))
    return out


def _codes(lakehouse: str, ds: str, examples: pa.Table, codes: dict[str, Any]) -> dict[str, pa.Array]:
    """fm_codes / fm_code_times per example: its user's codes of gold.fm_history_codes logged strictly
    before its impression, from the days max_age_days reaches back to ds, the newest max_codes."""
    users = sorted(set(examples["user_id"].to_pylist()))
    days = day_range(shift_day(ds, -int(codes["max_age_days"]) - 1), ds)
    coded = read_table(GOLD_FM_HISTORY_CODES.path(lakehouse), columns=["user_id", "event_time", "codes"],
                       where={"ds": days})
    coded = coded.filter(pc.is_in(coded["user_id"], value_set=pa.array(users, pa.string())))
    coded = coded.sort_by([("user_id", "ascending"), ("event_time", "ascending")])
    runs = runs_by_key(coded["user_id"].to_numpy(zero_copy_only=False))
    spans = [runs.get(user, (0, 0)) for user in examples["user_id"].to_pylist()]
    index, lengths = newest_before_each(timestamps_us(coded["event_time"]), spans,
                                        timestamps_us(examples["impression_time"]), int(codes["max_codes"]))
    offsets = pa.array(np.r_[0, np.cumsum(lengths)].astype(np.int32))
    picked = coded.take(pa.array(index, pa.int64()))
    return {CODES_COLUMN: pa.ListArray.from_arrays(offsets, picked["codes"].combine_chunks()),
            CODE_TIMES_COLUMN: pa.ListArray.from_arrays(
                offsets, picked["event_time"].combine_chunks().cast(pa.timestamp("us", "UTC")))}


def feature_rows(lakehouse: str, ds: str, spec: dict[str, Any]) -> pa.Table:
    """The examples of day ds on the spec's surface (silver.training_examples, latest version), with the
    history and (LoopFM) code columns the spec names joined from the lakehouse (module docstring).
    An empty table when the day has no example of the surface."""
    examples = read_table(SILVER_TRAINING_EXAMPLES.path(lakehouse), where={"ds": ds, "surface": spec["surface"]})
    if examples.num_rows == 0:
        return examples
    users = set(examples["user_id"].to_pylist())
    sequences = SILVER_USER_SEQUENCES.path(lakehouse)
    snapshots = {}
    for day in sorted({str(d) for d in examples["sequence_ds"].to_pylist()}):
        rows = read_table(sequences, where={"ds": day}, columns=SNAPSHOT_COLUMNS)
        snapshots[day] = index_day(rows, day, f"{sequences} ds={day}", users)
    columns = {name: examples[name] for name in examples.column_names}
    columns.update(_histories(examples, snapshots, spec))
    codes = next((c for c in spec["columns"] if c["kind"] == "codes"), None)
    if codes is not None:
        columns.update(_codes(lakehouse, ds, examples, codes))
    return pa.table(columns)
