"""The Airflow adapters: DAGs built from the stage registry, the task callable, runs and backfills.

Modules here are imported by the DAG processor on every parse (daily_dag, upkeep_dag, orchestration):
they import Airflow and the heavy libraries only inside the functions that need them.
"""
