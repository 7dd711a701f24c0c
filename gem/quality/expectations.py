"""Expectations every suite is built from, derived from a `TableSchema` and never re-listed by hand:
column order and types, NOT NULL, `allowed`, `min`/`max`, key uniqueness and the table-level
CHECKs (`schema_expectations`, all critical: a violation means the table contract is broken), plus
the small builders the layer suites share. Each expectation carries `meta={"critical": bool,
"rule": str}`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import great_expectations.expectations as gxe
from great_expectations.expectations.metadata_types import FailureSeverity

from schemas.table import TableSchema

if TYPE_CHECKING:
    from great_expectations.expectations import Expectation

# --------------------------------------------------------------------------------------------------
# Expectations derived from a schema.


def gx_expectations() -> Any:
    """The GX expectations module (the suites build their expectations from it by name)."""
    return gxe


def rule_meta(rule: str, critical: bool, setting: str | None = None, bound: str | None = None,
              measure: str | None = None) -> dict[str, Any]:
    """The meta every expectation of a suite carries: its rule name and whether it is critical; for a
    failure's line (gem.quality.gate): `setting`, the config key that sets its bound (or the contract
    that does), `bound` in words (default: the expectation's own arguments) and, for a query whose
    rows are groups (a day, a surface), `measure`, the column of each row holding the value found."""
    meta: dict[str, Any] = {"critical": critical, "rule": rule}
    meta.update({k: v for k, v in (("setting", setting), ("bound", bound), ("measure", measure)) if v is not None})
    return meta


def contract_setting(schema: TableSchema) -> str:
    """What sets a bound the table contract declares: no setting relaxes it."""
    return f"the {schema.name} contract in schemas/ (not a setting)"


def bound_text(low: float | None, high: float | None) -> str:
    """[low, high] in words (None: unbounded)."""
    if low is not None and high is not None:
        return f"{low} exactly" if low == high else f"between {low} and {high}"
    return f"at least {low}" if low is not None else f"at most {high}"


def expectation_severity(critical: bool) -> Any:
    return FailureSeverity.CRITICAL if critical else FailureSeverity.WARNING


def _structure_expectations(schema: TableSchema) -> list[Expectation]:
    """Column names in order, then each column's Spark type class."""
    gxe = gx_expectations()
    out = [
        gxe.ExpectTableColumnsToMatchOrderedList(
            column_list=schema.column_names, meta=rule_meta("columns_in_order", True), severity=expectation_severity(True)
        )
    ]
    for c in schema.columns:
        type_name = type(c.spark_type()).__name__
        out.append(
            gxe.ExpectColumnValuesToBeOfType(
                column=c.name, type_=type_name, meta=rule_meta(f"type:{c.name}", True), severity=expectation_severity(True)
            )
        )
    return out


def _column_rule_expectations(schema: TableSchema) -> list[Expectation]:
    """NOT NULL, allowed values and numeric bounds of every column that declares them."""
    gxe = gx_expectations()
    out: list[Expectation] = []
    for c in schema.columns:
        if not c.nullable:
            out.append(
                gxe.ExpectColumnValuesToNotBeNull(
                    column=c.name, meta=rule_meta(f"not_null:{c.name}", True), severity=expectation_severity(True)
                )
            )
        if c.allowed is not None:
            out.append(
                gxe.ExpectColumnValuesToBeInSet(
                    column=c.name,
                    value_set=list(c.allowed),
                    meta=rule_meta(f"allowed:{c.name}", True),
                    severity=expectation_severity(True),
                )
            )
        if c.min is not None or c.max is not None:
            out.append(
                gxe.ExpectColumnValuesToBeBetween(
                    column=c.name,
                    min_value=c.min,
                    max_value=c.max,
                    meta=rule_meta(f"range:{c.name}", True),
                    severity=expectation_severity(True),
                )
            )
    return out


def _key_expectations(schema: TableSchema) -> list[Expectation]:
    """The key is unique: one column, or the combination of several."""
    gxe = gx_expectations()
    if not schema.key:
        return []
    rule = rule_meta(f"unique_key:{','.join(schema.key)}", True)
    if len(schema.key) == 1:
        return [gxe.ExpectColumnValuesToBeUnique(column=schema.key[0], meta=rule, severity=expectation_severity(True))]
    return [gxe.ExpectCompoundColumnsToBeUnique(column_list=list(schema.key), meta=rule, severity=expectation_severity(True))]


def _table_check_expectations(schema: TableSchema) -> list[Expectation]:
    """Table-level CHECKs as queries for the rows that break them (NULL passes, as in a CHECK)."""
    gxe = gx_expectations()
    return [
        gxe.UnexpectedRowsExpectation(
            unexpected_rows_query=f"SELECT * FROM {{batch}} WHERE NOT ({expr})",
            description=f"No row breaks CHECK {name}: {expr}",
            meta=rule_meta(f"check:{name}", True),
            severity=expectation_severity(True),
        )
        for name, expr in schema.checks
    ]


def schema_expectations(schema: TableSchema) -> list[Expectation]:
    """Every structural and column rule of `schema` as GX expectations, all critical, each naming the
    contract as what sets its bound."""
    out = (
        _structure_expectations(schema)
        + _column_rule_expectations(schema)
        + _key_expectations(schema)
        + _table_check_expectations(schema)
    )
    for expectation in out:
        expectation.meta["setting"] = contract_setting(schema)
    return out


def expect_between(column: str, low: float | None, high: float | None, rule: str, critical: bool,
                   setting: str) -> Expectation:
    """The column's values lie in [low, high] (None: unbounded), as rule `rule`; `setting`: what sets
    the bound (a config key, or the contract)."""
    return gx_expectations().ExpectColumnValuesToBeBetween(
        column=column, min_value=low, max_value=high, severity=expectation_severity(critical),
        meta=rule_meta(rule, critical, setting=setting, bound=bound_text(low, high)),
    )
