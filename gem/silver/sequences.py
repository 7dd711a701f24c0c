"""silver.user_sequences rows: each active user's capped sequences advanced by a day's (or a range's)
bronze events, the compaction schedule and snapshots, and the lookup of each user's latest row
(jobs/build_sequences.py reads the inputs and commits).

Layout (schemas/sequences.py): partition ds=D holds ONLY users with events in bronze ds=D, with
their full capped sequences as of the end of D. A user's snapshot for day D is their row with the
greatest ds <= D; users without events on D keep their earlier row and are not rewritten.

advance_sequences(previous, events, caps): for each (user, day D with events), per type, the
previous sequence + the new events arrived by D (dedup on event_id), sorted by (event_time,
event_id), last `cap` kept; each day computed on its own, so a range is one pass.

A range writes what the daily runs of its days write, with one exception: an event_id arriving
again on a later day (a repeat further apart than ingest's dedup lookback). The daily merge drops
the copy only while the earlier one still sits in the capped sequence (of that type) of the day
before, and counts it again once the earlier one has aged out of the cap; a range drops a copy
whose earlier one arrived inside the range always (one count), and one whose earlier copy arrived
before the range when that copy is in the sequence before the range. The sequences agree whenever
the copies are identical (a repeat sorts where its aged-out original did, out of the cap); the
counts n_* can differ by the repeats the daily runs count again. The rows (one per user and day
with events) never differ.
"""

from __future__ import annotations

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from gem.config import GemConfig, SequenceCaps
from gem.silver.id_hashes import id_hash
from schemas.ids import hash_column
from schemas.sequences import (
    ELEMENT_ID_HASHES,
    SEQUENCE_COLUMNS,
    SEQUENCE_FIELDS,
    SILVER_USER_SEQUENCES,
    SILVER_USER_SEQUENCES_COMPACTED,
)

# --------------------------------------------------------------------------------------------------
# Pure transforms.


def _cap(caps: SequenceCaps, event_type: str) -> int:
    return int(getattr(caps, event_type))


def range_events(events: DataFrame) -> DataFrame:
    """bronze rows of one or more ds -> one row per user: (user_id, new_impressions, new_clicks,
    new_conversions), each an array of struct(e: the sequence element shaped as in
    schemas/sequences.py, its ids hashed at the end, arrival: its ds), in event order.

    An event_id counts once within a day (any type), and once per type over the days: the copy
    that arrived first is kept. Example: "e1" arriving on 01-02 and again on 01-09 -> one element
    with arrival 01-02."""
    once_a_day = events.dropDuplicates(["ds", "event_id"])
    hashes = [id_hash(F.col(c)).alias(hash_column(c)) for c in ELEMENT_ID_HASHES]
    tagged = once_a_day.select("user_id", "event_type", "event_id", "ds", *[
        # Null for the other types: collect_list below skips nulls, so each list holds its own type.
        F.when(F.col("event_type") == event_type,
               F.struct(F.struct(*fields, *hashes).alias("e"), F.col("ds").alias("arrival"))).alias(f"new_{seq}")
        for event_type, fields in SEQUENCE_FIELDS.items() for seq in [SEQUENCE_COLUMNS[event_type][0]]])
    new = [f"new_{seq}" for seq, _ in SEQUENCE_COLUMNS.values()]
    first_copy = tagged.groupBy("user_id", "event_type", "event_id").agg(*[F.min_by(c, "ds").alias(c) for c in new])
    return first_copy.groupBy("user_id").agg(*[F.sort_array(F.collect_list(c)).alias(c) for c in new])


def active_days(events: DataFrame) -> DataFrame:
    """bronze rows of one or more ds -> one row per (user, ds with events): (user_id, ds,
    last_event_time: the latest event_time of the user's events arrived in these days up to ds,
    next_ds: the user's next day with events, null after the last)."""
    days = events.groupBy("user_id", "ds").agg(F.max("event_time").alias("day_last_event_time"))
    in_order = Window.partitionBy("user_id").orderBy("ds")
    so_far = in_order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    return days.select("user_id", "ds", F.max("day_last_event_time").over(so_far).alias("last_event_time"),
                       F.lead("ds").over(in_order).alias("next_ds"))


def _unseen(new: SparkColumn, old: SparkColumn) -> SparkColumn:
    """The new (element, arrival) structs whose event_id is not in the old sequence: a replay of an
    event already kept must not count twice."""
    return F.filter(new, lambda x: ~F.exists(old, lambda o: o["event_id"] == x["e"]["event_id"]))


def _last(sequence: SparkColumn, cap: int) -> SparkColumn:
    """The last `cap` elements of an array (all of a shorter one)."""
    return F.slice(sequence, F.greatest(F.size(sequence) - F.lit(cap) + F.lit(1), F.lit(1)), F.lit(cap))


def _merged(old: SparkColumn, arrived: SparkColumn, cap: int) -> SparkColumn:
    """The last `cap` of sort(old + the elements of `arrived`): old a capped sequence, arrived
    (element, arrival) structs in element order. Only arrived's last `cap` can reach the result."""
    newest = F.transform(_last(arrived, cap), lambda x: x["e"])
    return _last(F.sort_array(F.concat(old, newest)), cap)


def advance_sequences(previous: DataFrame, events: DataFrame, caps: SequenceCaps, block_days: int = 1) -> DataFrame:
    """Each (user, ds) of `events` -> the user's silver.user_sequences row as of the end of ds, plus
    next_ds (the user's next day with events in `events`, null on their last).

    previous: silver.user_sequences rows, at most one per user (their latest before the first ds of
        `events`); users not in events are ignored.
    events: bronze.ad_events rows of one or more consecutive ds.
    block_days: the days are grouped into blocks of this many (by ds since the epoch) for the work
        of a range; any value gives the same rows.

    Per user and type: old = the previous capped sequence, new = the events of these days
    (`range_events`) less those already in old. The sequence as of ds is the last `cap` of
    sort(old + the new events arrived by ds), the count old count + those events, computed for
    each day on its own, with no state carried from day to day (one pass, however many days).
    That equals the daily merge iterated: sorting puts late events in place (order is
    (event_time, event_id)), and the last `cap` of the whole history are among old's (which holds
    the last `cap` of the history before) and the new events' last `cap`.
    Example, cap 2: old [a@1, b@5]; c@3 arrives on 01-02, d@9 on 01-03 -> 01-02: [c@3, b@5] (c is
    late: placed before b), 01-03: [b@5, d@9].

    Computed in two steps so a long range costs about 2 sqrt(days) passes over each user's new
    events, not one per active day (1,000 days of a user with thousands of events, each day's row
    carrying them all, runs a 4 GB driver out of memory): per (user, block with events) the sequence
    as of the block's start (the same merge, over the events arrived before it) and the events
    arriving within the block; per (user, day) the merge of those two. The last `cap` of a sorted
    union is the last `cap` of (the last `cap` of one part + the other), so the rows are the same.
    """
    prior = previous.select(
        "user_id",
        *[F.col(seq).alias(f"old_{seq}") for seq, _ in SEQUENCE_COLUMNS.values()],
        *[F.col(n).alias(f"old_{n}") for _, n in SEQUENCE_COLUMNS.values()],
        F.col("last_event_time").alias("old_last_event_time"),
    )
    old = {seq: F.coalesce(F.col(f"old_{seq}"), F.array().cast(SILVER_USER_SEQUENCES.column(seq).sql_type))
           for seq, _ in SEQUENCE_COLUMNS.values()}
    users = range_events(events).join(prior, "user_id", "left").select(
        "user_id",
        *[old[seq].alias(f"old_{seq}") for seq, _ in SEQUENCE_COLUMNS.values()],
        *[F.coalesce(F.col(f"old_{n}"), F.lit(0)).alias(f"old_{n}") for _, n in SEQUENCE_COLUMNS.values()],
        "old_last_event_time",
        *[_unseen(F.col(f"new_{seq}"), old[seq]).alias(f"new_{seq}") for seq, _ in SEQUENCE_COLUMNS.values()],
    )
    k = max(int(block_days), 1)
    days = active_days(events).withColumnRenamed("last_event_time", "days_last_event_time") \
        .withColumn("block", F.floor(F.unix_date("ds") / k))
    # One row per (user, block with events): the state at the block's start and the block's arrivals.
    block_start, block_end = (F.date_from_unix_date((F.col("block") * k + j).cast("int")) for j in (0, k))
    blocks = users.join(days.select("user_id", "block").distinct(), "user_id").select(
        "user_id", "block", "old_last_event_time", *[
            col
            for event_type, (seq, n) in SEQUENCE_COLUMNS.items()
            for before in [F.filter(f"new_{seq}", lambda x: x["arrival"] < block_start)]
            for col in (
                _merged(F.col(f"old_{seq}"), before, _cap(caps, event_type)).alias(f"start_{seq}"),
                (F.col(f"old_{n}") + F.size(before)).alias(f"start_{n}"),
                F.filter(f"new_{seq}", lambda x: (x["arrival"] >= block_start) & (x["arrival"] < block_end))
                .alias(f"block_{seq}"),
            )
        ])
    # One row per (user, active day), carrying only its block's arrivals: each day on its own.
    by_then = days.join(blocks, ["user_id", "block"]).select("*", *[
        F.filter(f"block_{seq}", lambda x: x["arrival"] <= F.col("ds")).alias(f"by_then_{seq}")
        for seq, _ in SEQUENCE_COLUMNS.values()])

    out = []
    for event_type, (seq, n) in SEQUENCE_COLUMNS.items():
        arrived = F.col(f"by_then_{seq}")
        out += [_merged(F.col(f"start_{seq}"), arrived, _cap(caps, event_type)).alias(seq),
                (F.col(f"start_{n}") + F.size(arrived)).cast("long").alias(n)]
    # greatest() skips nulls: a user seen for the first time has no old_last_event_time.
    last = F.greatest(F.col("old_last_event_time"), F.col("days_last_event_time")).alias("last_event_time")
    rows = by_then.select("user_id", "ds", *out, last, "next_ds")
    return rows.select(*SILVER_USER_SEQUENCES.column_names, "next_ds")


def with_next_ds(rows: DataFrame) -> DataFrame:
    """silver rows of a range of days -> the same rows with next_ds (the user's next ds among them,
    null on their last), found from the two key columns and joined back by broadcast: the wide rows
    are never shuffled."""
    keys = rows.select("user_id", "ds")
    nexts = keys.select("user_id", "ds", F.lead("ds").over(Window.partitionBy("user_id").orderBy("ds")).alias("next_ds"))
    return rows.join(F.broadcast(nexts), ["user_id", "ds"])


def merge_sequences(previous: DataFrame, events: DataFrame, caps: SequenceCaps) -> DataFrame:
    """`advance_sequences` as silver.user_sequences rows: one per (user, ds) of events."""
    return advance_sequences(previous, events, caps).select(*SILVER_USER_SEQUENCES.column_names)


def _compaction_days_between(cfg: GemConfig, first: SparkColumn, last: SparkColumn) -> SparkColumn:
    """The compaction days first..last (dates, both inclusive) as an array<date>, by arithmetic on the
    schedule (start_ds + j*k - 1), so a row costs its own compactions, not a scan of them all.
    Example: start 2026-01-01, k=7, 2026-01-05..2026-01-20 -> [2026-01-07, 2026-01-14]."""
    k, start = cfg.sequence_compaction_days, F.lit(cfg.start_ds).cast("date")
    # Compaction j (from 0) is start + j*k + k-1: the first at or after `first`, the last at or before `last`.
    j_first = F.floor(F.datediff(first, start) / k)
    j_last = F.floor((F.datediff(last, start) + 1) / k) - 1
    days = F.transform(F.sequence(j_first, j_last), lambda j: F.date_add(start, (j * k + k - 1).cast("int")))
    return F.when(j_first <= j_last, days).otherwise(F.array().cast("array<date>"))


def compaction_snapshots(cfg: GemConfig, rows: DataFrame, before: DataFrame, first: str, last: str) -> DataFrame:
    """Every user's snapshot as of each compaction day first..last: silver.user_sequences_compacted rows.

    rows: `advance_sequences` rows of a range of days holding first..last (with next_ds).
    before: each user's latest silver row before that range (every user), with next_ds: the user's
        first day in `rows` (null when none).
    A row is the user's snapshot for the compaction days from its ds to the day before its next_ds
    (to `last` when null). Example, k=2 from 01-01: a row of 01-01 with next_ds 01-05 -> the snapshot
    of 01-02 and 01-04.
    """
    lo, hi = F.lit(first).cast("date"), F.lit(last).cast("date")
    candidates = rows.unionByName(before)
    until = F.least(F.coalesce(F.date_sub(F.col("next_ds"), 1), hi), hi)
    covered = _compaction_days_between(cfg, F.greatest(F.col("ds"), lo), until)
    state = [c for c in SILVER_USER_SEQUENCES_COMPACTED.column_names if c != "ds"]
    return candidates.select(F.explode(covered).alias("ds"), *state).select(*SILVER_USER_SEQUENCES_COMPACTED.column_names)


def latest_rows(history: DataFrame) -> DataFrame:
    """silver rows (any days) -> each user's row with the greatest ds: the snapshots as of the last day.

    The max(ds) per user is found from the two narrow columns (user_id, ds); the wide rows are then
    kept by a broadcast join on those keys, filtered where they are scanned, never shuffled (a
    shuffle of every row's arrays costs more than the whole daily build).
    """
    latest = history.select("user_id", "ds").groupBy("user_id").agg(F.max("ds").alias("ds"))
    return history.join(F.broadcast(latest), ["user_id", "ds"], "inner")


def latest_previous_rows(history: DataFrame, users: DataFrame, ds: str) -> DataFrame:
    """silver rows, users (user_id) -> for each of those users, their row with the greatest ds < `ds`."""
    before = history.where(F.col("ds") < F.lit(ds).cast("date"))
    return latest_rows(before.join(users, "user_id", "left_semi"))
