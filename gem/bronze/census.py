"""Counts of classified lines per arrival day and file: the records' reconciliation and the drift check's input."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from schemas.events import FILE_REASONS, LANDING_EVENTS


@dataclass(frozen=True)
class LineCensus:
    """What the classified lines of one arrival day say: counts by reason (overall and per file)
    and, over the lines of readable, expected files, per-column type errors."""

    by_reason: dict[str, int]  # "" = good lines
    wrong_type: dict[str, int]  # landing column -> lines whose value has the wrong JSON type
    unexpected: dict[str, int]  # unknown key -> lines carrying it
    by_file: dict[str, dict[str, int]]  # source file -> reason ("" = good) -> lines

    @property
    def rows_in(self) -> int:
        return sum(self.by_reason.values())

    @property
    def parsed(self) -> int:
        """Lines of readable, expected files that are JSON objects: the base of the drift rates."""
        return self.rows_in - sum(self.by_reason.get(r, 0) for r in ("malformed_json", *FILE_REASONS))

    def file_counts(self) -> dict[str, dict[str, object]]:
        """file -> {"in", "written", "quarantined": {reason: n}}; in = written + quarantined."""
        out: dict[str, dict[str, object]] = {}
        for name, reasons in sorted(self.by_file.items()):
            quarantined = {r: n for r, n in sorted(reasons.items()) if r}
            out[name] = {"in": sum(reasons.values()), "written": reasons.get("", 0), "quarantined": quarantined}
        return out


def take_census(classified: DataFrame) -> dict[str, LineCensus]:
    """Each arrival day's LineCensus ("YYYY-MM-DD" -> census), in two collects for all the days."""
    known = LANDING_EVENTS.column_names
    rows = (
        classified.groupBy("ds", "source_file", "reason")
        .agg(
            F.count(F.lit(1)).alias("n"),
            *[F.sum(F.array_contains("wrong_type_cols", c).cast("long")).alias(c) for c in known],
        )
        .collect()
    )
    # A damaged or misnamed file is not the producer's contract changing: its lines count for no drift.
    unexpected_rows = (
        classified.where((F.size("unexpected_keys") > 0) & ~F.coalesce(F.col("reason").isin(list(FILE_REASONS)), F.lit(False)))
        .select("ds", F.explode("unexpected_keys").alias("key"))
        .groupBy("ds", "key")
        .count()
        .collect()
    )
    by_reason: dict[str, dict[str, int]] = {}
    by_file: dict[str, dict[str, dict[str, int]]] = {}
    wrong_type: dict[str, dict[str, int]] = {}
    for r in rows:
        day, reason, n = r["ds"].isoformat(), r["reason"] or "", int(r["n"])
        by_reason.setdefault(day, {})[reason] = by_reason.get(day, {}).get(reason, 0) + n
        by_file.setdefault(day, {}).setdefault(r["source_file"], {})[reason] = n
        if r["reason"] not in FILE_REASONS:
            for c in known:
                if r[c]:
                    wrong_type.setdefault(day, {})[c] = wrong_type.get(day, {}).get(c, 0) + int(r[c])
    unexpected: dict[str, dict[str, int]] = {}
    for r in unexpected_rows:
        unexpected.setdefault(r["ds"].isoformat(), {})[r["key"]] = int(r["count"])
    return {day: LineCensus(by_reason[day], wrong_type.get(day, {}), unexpected.get(day, {}), by_file[day])
            for day in sorted(by_reason)}
