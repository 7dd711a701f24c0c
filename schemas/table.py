"""Column and TableSchema: the single definition each table derives everything else from.

From one `TableSchema` come the Spark schema, the Delta table (partition columns, NOT NULL,
CHECK constraints, table properties), the column order of writes, and the Great Expectations
suite's structural expectations (see gem.quality.expectations). pyspark is imported lazily so that DAG files
and the loader can read schemas without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from gem import storage

# The engines that write Delta tables. Each table has one (TableSchema.writer): the commits of one
# engine's writes, compactions and deletes never interleave with the other's on the same table.
WRITERS = ("spark", "deltalake")

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
    "binary": "BINARY",
}


def _sql_literal(v: Any) -> str:
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return repr(v)


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside angle brackets: "a:string,b:map<string,long>" -> ["a:string", "b:map<string,long>"]."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


def _parse_dtype(dtype: str) -> tuple[Any, ...]:
    """A dtype string -> a small tree: ("simple", name) | ("map", k, v) | ("array", elem) |
    ("struct", ((field, tree), ...)). Raises ValueError on anything else.

    Example: "array<struct<ad_id:string,event_time:timestamp>>" ->
        ("array", ("struct", (("ad_id", ("simple", "string")), ("event_time", ("simple", "timestamp")))))
    """
    dtype = dtype.strip()
    if dtype in _SIMPLE_TYPES:
        return ("simple", dtype)
    for kind in ("map", "array", "struct"):
        if dtype.startswith(f"{kind}<") and dtype.endswith(">"):
            args = _split_top_level(dtype[len(kind) + 1 : -1])
            if kind == "map" and len(args) == 2:
                return ("map", _parse_dtype(args[0]), _parse_dtype(args[1]))
            if kind == "array" and len(args) == 1:
                return ("array", _parse_dtype(args[0]))
            if kind == "struct" and all(":" in a for a in args):
                fields = tuple((a.split(":", 1)[0].strip(), _parse_dtype(a.split(":", 1)[1])) for a in args)
                if all(name for name, _ in fields):
                    return ("struct", fields)
    raise ValueError(f"unsupported dtype {dtype!r}")


def _tree_sql(tree: tuple[Any, ...]) -> str:
    kind = tree[0]
    if kind == "simple":
        return _SIMPLE_TYPES[tree[1]]
    if kind == "map":
        return f"MAP<{_tree_sql(tree[1])}, {_tree_sql(tree[2])}>"
    if kind == "array":
        return f"ARRAY<{_tree_sql(tree[1])}>"
    return "STRUCT<" + ", ".join(f"`{name}`: {_tree_sql(sub)}" for name, sub in tree[1]) + ">"


def _tree_spark(tree: tuple[Any, ...]) -> Any:
    from pyspark.sql import types as T

    kind = tree[0]
    if kind == "simple":
        return {
            "string": T.StringType(),
            "long": T.LongType(),
            "int": T.IntegerType(),
            "double": T.DoubleType(),
            "float": T.FloatType(),
            "boolean": T.BooleanType(),
            "timestamp": T.TimestampType(),
            "date": T.DateType(),
            "binary": T.BinaryType(),
        }[tree[1]]
    if kind == "map":
        return T.MapType(_tree_spark(tree[1]), _tree_spark(tree[2]), valueContainsNull=True)
    if kind == "array":
        return T.ArrayType(_tree_spark(tree[1]), containsNull=True)
    return T.StructType([T.StructField(name, _tree_spark(sub), True) for name, sub in tree[1]])


def _tree_arrow(tree: tuple[Any, ...]) -> Any:
    import pyarrow as pa

    kind = tree[0]
    if kind == "simple":
        return {
            "string": pa.string(), "long": pa.int64(), "int": pa.int32(), "double": pa.float64(),
            "float": pa.float32(), "boolean": pa.bool_(), "timestamp": pa.timestamp("us", tz="UTC"),
            "date": pa.date32(), "binary": pa.binary(),
        }[tree[1]]
    if kind == "map":
        return pa.map_(_tree_arrow(tree[1]), _tree_arrow(tree[2]))
    if kind == "array":
        return pa.list_(_tree_arrow(tree[1]))
    return pa.struct([pa.field(name, _tree_arrow(sub)) for name, sub in tree[1]])


@dataclass(frozen=True)
class Column:
    """One column. `allowed`, `min` and `max` become CHECK constraints and expectations.

    `dtype` is a simple type name (see _SIMPLE_TYPES) or a nesting of map<k,v>, array<t> and
    struct<name:t,...>, e.g. "map<string,long>" or "array<struct<ad_id:string,event_time:timestamp>>".
    """

    name: str
    dtype: str
    nullable: bool = True
    allowed: tuple[str, ...] | None = None
    min: float | None = None
    max: float | None = None
    doc: str = ""
    # A person's identity or attributes (or a raw line carrying them): sample values of it are
    # masked in Data Docs and messages (gem.quality.masking); `gem delete-user` erases by user_id.
    personal: bool = False

    def __post_init__(self) -> None:
        try:
            _parse_dtype(self.dtype)
        except ValueError:
            raise ValueError(f"column {self.name}: unsupported dtype {self.dtype!r}") from None

    @property
    def sql_type(self) -> str:
        return _tree_sql(_parse_dtype(self.dtype))

    def spark_type(self) -> Any:
        return _tree_spark(_parse_dtype(self.dtype))

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
    # The one engine that writes the Delta table (WRITERS): "spark" for the Spark stages' tables,
    # "deltalake" for those written without a JVM; None for what is not a Delta table (landing files).
    # Every table declares it; gem.lakehouse.tables refuses a write through the other engine.
    writer: Literal["spark", "deltalake"] | None = field(kw_only=True)

    def __post_init__(self) -> None:
        if self.writer is not None and self.writer not in WRITERS:
            raise ValueError(f"{self.name}: writer {self.writer!r} is not one of {WRITERS} (or None)")
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
        """The table's location under the lakehouse, in storage's one spelling (an absolute local
        path, or s3://...): what is stored and compared; Spark is given storage.spark_uri of it."""
        return storage.join(lakehouse_uri, self.layer, self.table)

    def spark_schema(self) -> Any:
        from pyspark.sql import types as T

        return T.StructType([T.StructField(c.name, c.spark_type(), c.nullable) for c in self.columns])

    def arrow_schema(self) -> Any:
        """The same columns as a pyarrow schema (for writers and readers without Spark)."""
        import pyarrow as pa

        return pa.schema([pa.field(c.name, _tree_arrow(_parse_dtype(c.dtype)), c.nullable) for c in self.columns])

    def check_constraints(self) -> list[tuple[str, str]]:
        """All CHECK constraints: one per constrained column plus the table-level ones."""
        out = [(f"{c.name}_domain", sql) for c in self.columns if (sql := c.check_sql())]
        return out + list(self.checks)
