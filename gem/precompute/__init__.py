"""Solaris precompute: the foundation model's outputs written back to the lakehouse.

One day of `python -m jobs.precompute --ds D` (gem.precompute.run), a Spark application:
  plan.py         what the day computes: the model (pinned, refreshed every precompute.model_refresh_days),
                  which users (everyone on a refresh, else those whose sequences changed), the inputs' versions
  shards.py       fixed user-hash ranges: the unit of work (one Spark task each) and of commit
  executors.py    the shards as Spark tasks (mapInArrow), the model loaded once per executor Python worker
  shard_work.py   one shard's rows of the four tables, computed and committed by its task
  inputs.py       the day's inputs read from the Delta log (no Spark), restricted to a shard's users
  model.py        the promoted model as a plain-torch task: user embeddings, predictions, history codes
  speculative.py  the pairs expected tomorrow (policy) and the observed use of yesterday's
  read.py         readers: a user's embedding for a day and whether it was a hit
Tables: schemas/precompute.py.
"""
