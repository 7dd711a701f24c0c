"""Column and TableSchema: the single definition each table derives everything else from.

From one `TableSchema` come the Spark schema, the Delta table (partition columns, NOT NULL,
CHECK constraints, table properties), the column order of writes, and the Great Expectations
suite's structural expectations (see gem.quality). pyspark is imported lazily so that DAG files
and the loader can read schemas without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Logical type names -> (Spark DDL type, Arrow factory name). Kept small on purpose.
_SIMPLE_TYPES = {
    "string": "STRING",
    "long": "BIGINT",
    "int": "INT",
    "double": "DOUBLE",
    "float": "FLOAT",
    "boolean": "BOOLEAN",
    "timestamp": "TIMESTAMP",
    "date": "DATE",
}


def _sql_literal(v: Any) -> str:
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return repr(v)


@dataclass(frozen=True)
class Column:
    """One column. `allowed`, `min` and `max` become CHECK constraints and expectations."""

    name: str
    dtype: str
    nullable: bool = True
    allowed: tuple[str, ...] | None = None
    min: float | None = None
    max: float | None = None
    doc: str = ""

    def __post_init__(self) -> None:
        if self.dtype not in _SIMPLE_TYPES and not self.dtype.startswith(("map<", "array<")):
            raise ValueError(f"column {self.name}: unsupported dtype {self.dtype!r}")

    @property
    def sql_type(self) -> str:
        if self.dtype in _SIMPLE_TYPES:
            return _SIMPLE_TYPES[self.dtype]
        inner = self.dtype[self.dtype.index("<") + 1 : -1]
        parts = [_SIMPLE_TYPES[p.strip()] for p in inner.split(",")]
        kind = "MAP" if self.dtype.startswith("map<") else "ARRAY"
        return f"{kind}<{', '.join(parts)}>"

    def spark_type(self) -> Any:
        from pyspark.sql import types as T

        simple = {
            "string": T.StringType(),
            "long": T.LongType(),
            "int": T.IntegerType(),
            "double": T.DoubleType(),
            "float": T.FloatType(),
            "boolean": T.BooleanType(),
            "timestamp": T.TimestampType(),
            "date": T.DateType(),
        }
        if self.dtype in simple:
            return simple[self.dtype]
        inner = [p.strip() for p in self.dtype[self.dtype.index("<") + 1 : -1].split(",")]
        if self.dtype.startswith("map<"):
            return T.MapType(simple[inner[0]], simple[inner[1]], valueContainsNull=True)
        return T.ArrayType(simple[inner[0]], containsNull=True)

    def check_sql(self) -> str | None:
        """The CHECK constraint body for this column's domain, or None."""
        terms = []
        if self.allowed is not None:
            terms.append(f"{self.name} IN ({', '.join(_sql_literal(a) for a in self.allowed)})")
        if self.min is not None:
            terms.append(f"{self.name} >= {self.min!r}")
        if self.max is not None:
            terms.append(f"{self.name} <= {self.max!r}")
        if not terms:
            return None
        body = " AND ".join(terms)
        return f"{self.name} IS NULL OR ({body})" if self.nullable else body


@dataclass(frozen=True)
class TableSchema:
    """A lakehouse table: `layer.name`, its columns, partitioning, key and extra CHECKs."""

    name: str
    columns: tuple[Column, ...]
    partition_by: tuple[str, ...] = ()
    # Columns that identify a row; the quality suite expects them unique.
    key: tuple[str, ...] = ()
    # Extra table-level CHECK constraints: (constraint name, SQL boolean expression).
    checks: tuple[tuple[str, str], ...] = ()
    doc: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [c.name for c in self.columns]
        if len(names) != len(set(names)):
            raise ValueError(f"{self.name}: duplicate column names")
        for p in self.partition_by + self.key:
            if p not in names:
                raise ValueError(f"{self.name}: {p} is not a column")

    @property
    def layer(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def table(self) -> str:
        return self.name.split(".", 1)[1]

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"{self.name} has no column {name!r}")

    def path(self, lakehouse_uri: str) -> str:
        return f"{lakehouse_uri.rstrip('/')}/{self.layer}/{self.table}"

    def spark_schema(self) -> Any:
        from pyspark.sql import types as T

        return T.StructType([T.StructField(c.name, c.spark_type(), c.nullable) for c in self.columns])

    def check_constraints(self) -> list[tuple[str, str]]:
        """All CHECK constraints: one per constrained column plus the table-level ones."""
        out = [(f"{c.name}_domain", sql) for c in self.columns if (sql := c.check_sql())]
        return out + list(self.checks)
