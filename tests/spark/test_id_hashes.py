"""schemas/ids.py's id hash: Spark's side (gem.silver.id_hashes, written by the stages) and Python's
(gem.data.encode.hash_ids, for served requests) give the same integers."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import functions as F

from gem.data.encode import hash_ids, id_values
from gem.silver.id_hashes import id_hash

IDS = ["u42", "a7", "adv3", "c12", "", "ünïcödé-ad", "x" * 300, "tab\there", None, "u42"]


def test_spark_and_python_hash_every_id_alike(spark):
    df = spark.createDataFrame([(i, v) for i, v in enumerate(IDS)], "i int, id string")
    by_spark = [r["h"] for r in df.select("i", id_hash(F.col("id")).alias("h")).orderBy("i").collect()]
    by_python = hash_ids(pa.array(IDS, pa.string())).tolist()
    assert by_spark == by_python
    assert by_python[-2] == 0 and by_python[0] == by_python[-1]  # null -> 0; the same id, the same hash
    assert all(0 <= h < 2**63 for h in by_python) and len(set(by_python[:-2])) == len(IDS) - 2


def test_a_table_with_the_hash_column_is_read_not_hashed():
    table = pa.table({"ad_id": pa.array(["a1", "a2"]), "ad_id_hash": pa.array([11, 12], pa.int64())})
    assert id_values(table, "ad_id").tolist() == [11, 12]  # the column the stage wrote
    assert id_values(table.drop_columns(["ad_id_hash"]), "ad_id").tolist() == hash_ids(table["ad_id"]).tolist()
