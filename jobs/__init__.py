"""Batch jobs, each runnable as `python -m jobs.NAME --ds YYYY-MM-DD`."""
