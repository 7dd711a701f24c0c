"""Landing files -> their lines, each with its arrival day and, for a damaged or misnamed file, the
file's own reason (LINES_SCHEMA): what `classify` reads.

Every line of every file is read: a file whose gzip stream is damaged contributes the lines read
before the damage (reason unreadable_file, the rest of the day is ingested), a file not named
*.json.gz all its lines (reason unexpected_file_name) - none is skipped unseen.
"""

from __future__ import annotations

import datetime as dt

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gem import storage
from gem.lakehouse.landing import DATA_FILE_PATTERN, gzip_problem, lines_before_damage, list_partition
from gem.lakehouse.tables import spark_location

LINES_SCHEMA = "value STRING, source_file STRING, ds DATE, file_reason STRING, file_detail STRING"


def read_days(spark: SparkSession, landing_root: str, days: tuple[str, ...]) -> DataFrame:
    """Every line of every file of the landing days (LINES_SCHEMA), each with its day: the readable
    files in one Spark read; a file whose gzip stream is damaged (checked first, in one streaming
    pass per file) gives the lines read before the damage, or one empty line when none could be,
    with file_reason unreadable_file; a file not named DATA_FILE_PATTERN gives all its lines with
    unexpected_file_name. A marker over no data file is refused (gem.lakehouse.landing)."""
    damaged_rows, readable, misnamed = [], [], []
    for day in days:
        listing = list_partition(landing_root, day)
        misnamed += [f"{day}/{storage.name(p)}" for p in listing.unexpected_files]
        for path in listing.all_files:
            name = storage.name(path)
            problem = gzip_problem(path) if name.endswith(".gz") else None
            if problem is None:
                readable.append(path)
                continue
            recovered = lines_before_damage(path) or [""]
            for i, raw in enumerate(recovered, start=1):
                why = (f"{name}: not a readable gzip file ({problem}); line {i} of the {len(recovered)} "
                       "read before the damage, the rest of the file could not be read")
                damaged_rows.append((raw, name, dt.date.fromisoformat(day), "unreadable_file", why))
    lines = spark.createDataFrame(damaged_rows, LINES_SCHEMA)
    if readable:
        is_misnamed = F.concat_ws("/", F.col("ds").cast("string"), "source_file").isin(misnamed)
        read = read_landing(spark, landing_root, readable).select(
            "value", "source_file", "ds",
            F.when(is_misnamed, F.lit("unexpected_file_name")).alias("file_reason"),
            F.when(is_misnamed, F.lit(f"file name does not match the landing pattern {DATA_FILE_PATTERN}"))
            .alias("file_detail"))
        lines = read.unionByName(lines)
    return lines


def read_landing(spark: SparkSession, landing_root: str, files: list[str]) -> DataFrame:
    """Landing files -> DataFrame(value: raw line, source_file: file name within its ds folder,
    ds: the arrival day, from the file's partition folder `ds=YYYY-MM-DD`), in one read. Spark is
    given the paths as its Hadoop file systems name them (gem.lakehouse.tables.spark_location: s3a://
    on S3, the session set up for the store)."""
    # Spark lists more than `threshold` named paths in a Spark job of one task per path, far slower
    # for hundreds of landing days' files than listing them here in the driver. The listing is
    # done when the DataFrame is made, so the setting is restored right after.
    threshold = "spark.sql.sources.parallelPartitionDiscovery.threshold"
    before = spark.conf.get(threshold)
    spark.conf.set(threshold, str(max(len(files), int(before))))
    try:
        read = (spark.read.option("basePath", spark_location(spark, landing_root))
                .text([storage.spark_uri(f) for f in files]))
    finally:
        spark.conf.set(threshold, before)
    return read.select("value", F.col("_metadata.file_name").alias("source_file"), F.col("ds").cast("date"))
