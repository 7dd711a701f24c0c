"""Data quality: the Great Expectations runner, suites per layer, offline Data Docs assets."""
