"""A precompute day's inputs, read through the Delta log at the plan's versions (no Spark).

An executor's Python worker keeps one DayInputs for the run (gem.precompute.executors): the small
indexes (which users have a sequence row on which day, the held-out day's examples) are read once
per worker; a shard's sequences are read and flattened for that shard's users only, so a task's
work grows with its shard, not with the day.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gem.data.delta_log import LoggedFile, logged_files, read_logged, read_table
from gem.data.encode import DENSE_COLUMNS
from gem.data.loader import EXAMPLE_COLUMNS
from gem.data.snapshots import SNAPSHOT_COLUMNS, DaySnapshot, index_day
from gem.precompute.plan import DayPlan
from gem.precompute.shards import shard_of
from schemas.examples import AD_FEATURE_PREFIX, USER_FEATURE_PREFIX
from schemas.features import COUNTER_COLUMNS

AD_ATTRIBUTES: tuple[str, ...] = ("advertiser_id", "campaign_id", "objective", "creative_type")


class DayInputs:
    def __init__(self, plan: DayPlan) -> None:
        self.plan = plan
        self._sequence_files: dict[str, list[LoggedFile]] | None = None
        self._user_day: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._examples: pa.Table | None = None
        self._days: dict[str, pa.Table] = {}  # sequence partitions read (SNAPSHOT_COLUMNS), read once per worker
        self._counters: tuple[pa.Table, pa.Table] | None = None

    def sequence_files(self) -> dict[str, list[LoggedFile]]:
        """ds -> the silver.user_sequences files of that partition at the plan's version."""
        if self._sequence_files is None:
            files: dict[str, list[LoggedFile]] = {}
            for f in logged_files(self.plan.sequences.path, self.plan.sequences.version):
                files.setdefault(f.partition["ds"], []).append(f)
            self._sequence_files = files
        return self._sequence_files

    def _latest_days(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(users, their newest partition among the plan's sequence days, their shard), users sorted."""
        if self._user_day is None:
            files = self.sequence_files()
            users: dict[str, str] = {}
            for day in self.plan.sequence_days:  # oldest first: a later row wins
                if day in files:
                    for user in read_logged(files[day], {}, ["user_id"])["user_id"].to_pylist():
                        users[user] = day
            names = np.array(sorted(users), dtype=object)
            days = np.array([users[u] for u in names], dtype=object)
            self._user_day = names, days, shard_of(pa.array(names, pa.string()), self.plan.shards)
        return self._user_day

    def users(self, shard: int) -> tuple[list[str], list[str]]:
        """The users the day recomputes in `shard` (sorted) and the partition of each one's snapshot."""
        names, days, shards = self._latest_days()
        mine = shards == shard
        return list(names[mine]), list(days[mine])

    def sequence_day(self, day: str) -> pa.Table:
        """Partition `day` of silver.user_sequences (SNAPSHOT_COLUMNS), read once per worker."""
        if day not in self._days:
            files = self.sequence_files().get(day, [])
            empty = pa.schema([pa.field("user_id", pa.string())]).empty_table()
            self._days[day] = read_logged(files, {}, SNAPSHOT_COLUMNS) if files else empty
        return self._days[day]

    def snapshot_reader(self, users: Collection[str]) -> Callable[[str], DaySnapshot]:
        """day -> that partition's snapshot of `users` alone (each day flattened once per reader)."""
        cache: dict[str, DaySnapshot] = {}
        keep = set(users)

        def snapshot(day: str) -> DaySnapshot:
            if day not in cache:
                table = self.sequence_day(day)
                cache[day] = index_day(table if table.num_rows else None, day, f"precompute ds={self.plan.ds}", keep)
            return cache[day]

        return snapshot

    def examples(self, shard: int) -> pa.Table:
        """The held-out day's examples of `shard`'s users, by impression_id (EXAMPLE_COLUMNS, ad_id, surface)."""
        if self.plan.examples is None:  # no held-out day yet: no impression to predict
            return pa.table({c: pa.array([], pa.string()) for c in ("impression_id", "user_id", "ad_id", "surface")})
        if self._examples is None:
            day = read_table(self.plan.examples.path, self.plan.examples.version,
                             columns=[*EXAMPLE_COLUMNS, "ad_id", "surface"], where={"ds": self.plan.examples_ds})
            self._examples = day.append_column("shard", pa.array(shard_of(day["user_id"], self.plan.shards)))
        mine = self._examples.filter(pc.equal(self._examples["shard"], shard)).drop_columns(["shard"])
        return mine.sort_by("impression_id")

    def active_impressions(self, users: Collection[str]) -> pa.Table:
        """user_id and impressions (oldest first) of `users`' rows in partition ds: the users active on ds."""
        table = self.sequence_day(self.plan.ds)
        if not table.num_rows:
            return pa.table({"user_id": pa.array([], pa.string()), "impressions": pa.array([], pa.null())})
        table = table.select(["user_id", "impressions"])
        return table.filter(pc.is_in(table["user_id"], value_set=pa.array(sorted(users), pa.string())))

    def _features(self) -> tuple[pa.Table, pa.Table]:
        """The plan day's user and ad features, columns named as in the examples; read once per worker."""
        if self._counters is None:
            ds = self.plan.ds
            users = read_table(self.plan.user_features.path, self.plan.user_features.version,
                               columns=["user_id", *(c.name for c in COUNTER_COLUMNS)], where={"ds": ds})
            ads = read_table(self.plan.ad_features.path, self.plan.ad_features.version,
                             columns=["ad_id", *AD_ATTRIBUTES, *(c.name for c in COUNTER_COLUMNS)], where={"ds": ds})
            self._counters = (
                users.rename_columns(["user_id", *(f"{USER_FEATURE_PREFIX}{c.name}" for c in COUNTER_COLUMNS)]),
                ads.rename_columns(["ad_id", *AD_ATTRIBUTES, *(f"{AD_FEATURE_PREFIX}{c.name}" for c in COUNTER_COLUMNS)]))
        return self._counters

    def counters(self, user_ids: list[str], ad_ids: list[str]) -> pa.Table:
        """One row per (user_ids[i], ad_ids[i]): the ad's attributes (AD_ATTRIBUTES) and the user's and
        the ad's counters of the plan's features day, named as in the examples (DENSE_COLUMNS); nulls
        where a user or an ad has no features row."""
        users, ads = self._features()
        pairs = pa.table({"user_id": pa.array(user_ids, pa.string()), "ad_id": pa.array(ad_ids, pa.string()),
                          "_row": pa.array(np.arange(len(user_ids)))})
        joined = pairs.join(users, "user_id", join_type="left outer").join(ads, "ad_id", join_type="left outer")
        joined = joined.sort_by("_row")  # joins do not keep the order
        return joined.select(["user_id", "ad_id", *AD_ATTRIBUTES, *DENSE_COLUMNS])
