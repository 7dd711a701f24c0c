"""Content fingerprints of day partitions: what lets a rewrite with the same rows leave its readers valid.

A Delta version says that a partition was rewritten, not whether its rows changed: rerunning a stage
on an unchanged day commits a new version with the same rows. A completion record therefore also
names, per table it wrote, the fingerprint of its day's rows (gem.lakehouse.commit), and staleness
(gem.lakehouse.staleness) accepts a new version whose fingerprint equals the one a reader read.

The fingerprint is "<rows>:<sum of the rows' xxhash64>" (the sum as an exact decimal). A sum is
independent of row order and file layout, so any rewrite of the same rows, however Spark splits it,
gives the same fingerprint; a changed, added or removed row changes it (but for a 64-bit hash
collision). Spark computes it where the rows are: one aggregation per table, grouped by day, all of
a commit's tables in one job.

Map columns hash as their entries in stored order (Spark refuses to hash a map). A rerun builds a
map from the same input in the same order; a map with the same entries in another order reads as
changed, which costs a needless rerun, never a missed change. Sorting the entries, or hashing them
with a higher-order function, would double the aggregation's time.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

DAY_COLUMN = "ds"


def row_hash(df: DataFrame) -> Column:
    """The xxhash64 of each row of df over all its columns."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - JVM-free stages import this module and never load pyspark
    from pyspark.sql import types as T  # noqa: PLC0415

    return F.xxhash64(*[F.map_entries(F.col(f.name)) if isinstance(f.dataType, T.MapType) else F.col(f.name)
                        for f in df.schema.fields])


def tables_by_day(spark: SparkSession, versions: Mapping[str, tuple[str, int]],
                  days: Mapping[str, Iterable[str]]) -> dict[str, dict[str, str]]:
    """table -> day -> the fingerprint of the table's rows of that day (a day without rows: "0:0"),
    in one Spark job. versions: table -> (its location as Spark addresses it, the version to read);
    days: table -> the days wanted."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - as above

    parts = []
    for name, (location, version) in versions.items():
        df = spark.read.format("delta").option("versionAsOf", version).load(location)
        wanted = [dt.date.fromisoformat(d) for d in sorted(set(days[name]))]
        parts.append(df.where(F.col(DAY_COLUMN).isin(wanted))
                     .groupBy(F.col(DAY_COLUMN).cast("string").alias("day"))
                     .agg(F.count(F.lit(1)).alias("rows"), F.sum(row_hash(df).cast("decimal(38,0)")).alias("hash_sum"))
                     .withColumn("table", F.lit(name)))
    found: dict[tuple[str, str], tuple[int, int]] = {}
    if parts:
        union = parts[0]
        for part in parts[1:]:
            union = union.unionByName(part)
        found = {(r["table"], r["day"]): (int(r["rows"]), int(r["hash_sum"])) for r in union.collect()}
    return {name: {d: fingerprint(*found.get((name, d), (0, 0))) for d in days[name]} for name in versions}


def fingerprint(rows: int, hash_sum: int) -> str:
    return f"{rows}:{hash_sum}"


def combined(per_day: Mapping[str, str], days: Iterable[str]) -> str:
    """The fingerprint of several days' rows together (a record whose day covers several partitions)."""
    rows = hash_sum = 0
    for day in days:
        n, s = per_day[day].split(":")
        rows, hash_sum = rows + int(n), hash_sum + int(s)
    return fingerprint(rows, hash_sum)
