"""Running days through the stages: the bulk path, the demo, the `gem` command and the Airflow adapters.

    bulk.py          a range of days through every stage in one process and Spark session
    demo.py          `make demo`: the demo days, then the summary (demo_process.py runs the days)
    cluster_demo.py  `make cluster-demo`: the same days on an S3 API server and a Spark cluster (services.py)
    command.py       the `gem` command (typer)
    cli.py           the jobs' command lines, built on typer from the stage registry
    airflow/         what Airflow sees: the DAGs built from the stage registry, the task callable,
                     manual runs, backfills and a scheduler for them
"""
