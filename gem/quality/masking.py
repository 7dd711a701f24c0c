"""Masking personal values in validation results, so Data Docs and messages show none.

Great Expectations keeps sample values of what failed: a column expectation's unexpected values
(`partial_unexpected_list` and its relatives) and a row expectation's unexpected rows
(`details.unexpected_rows`). Where those come from a column the schemas mark `personal` (user ids,
user attributes, raw landing lines), each value becomes MASK: counts and rates stay, so a failure
still says how much broke and where, never whose. gem.quality.runner applies this to every result,
in memory (its messages) and in the stored JSON the Data Docs are rendered from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from schemas import LANDING_EVENTS, TABLES

MASK = "***"
# Result keys holding sample values of the expectation's column.
VALUE_KEYS = ("partial_unexpected_list", "unexpected_list", "partial_unexpected_index_list",
              "unexpected_index_list")
COUNT_KEYS = ("partial_unexpected_counts",)  # [{"value": v, "count": n}, ...]


def personal_columns() -> frozenset[str]:
    """Every column name some table's schema marks personal."""
    return frozenset(c.name for s in (*TABLES.values(), LANDING_EVENTS) for c in s.columns if c.personal)


def _columns(kwargs: Mapping[str, Any]) -> set[str]:
    names = {kwargs.get("column"), kwargs.get("column_A"), kwargs.get("column_B")}
    return {n for n in (*names, *(kwargs.get("column_list") or ())) if isinstance(n, str)}


def _masked_row(row: Any, personal: Iterable[str]) -> Any:
    if isinstance(row, Mapping):
        return {k: (MASK if k in personal else v) for k, v in row.items()}
    return MASK  # a row without column names: nothing in it can be shown safely


def mask_result(kwargs: Mapping[str, Any], result: dict[str, Any], personal: frozenset[str]) -> bool:
    """Mask, in place, the personal sample values in one expectation's `result`; -> whether any was."""
    changed = False
    if _columns(kwargs) & personal:
        for key in VALUE_KEYS:
            if result.get(key):
                result[key] = [MASK] * len(result[key])
                changed = True
        for key in COUNT_KEYS:
            if result.get(key):
                result[key] = [{**c, "value": MASK} for c in result[key]]
                changed = True
    details = result.get("details")
    if isinstance(details, dict) and details.get("unexpected_rows"):
        details["unexpected_rows"] = [_masked_row(r, personal) for r in details["unexpected_rows"]]
        changed = True
    return changed


def mask_suite_result(results: Iterable[tuple[Mapping[str, Any], dict[str, Any] | None]],
                      personal: frozenset[str]) -> bool:
    """mask_result over (kwargs, result) pairs; -> whether anything was masked."""
    changed = False
    for kwargs, result in results:  # every result masked: no short-circuit
        if result:
            changed = mask_result(kwargs, result, personal) or changed
    return changed
