"""Training data access without Spark: Delta tables read through their log, sequences materialized late."""
