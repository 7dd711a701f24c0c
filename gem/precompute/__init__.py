"""Solaris precompute: the foundation model's outputs written back to the lakehouse.

One day of `python -m jobs.precompute --ds D` (gem.precompute.run):
  plan.py         what the day computes: the model (pinned, refreshed every precompute.model_refresh_days),
                  which users (everyone on a refresh, else those whose sequences changed), the inputs' versions
  shards.py       fixed user-hash ranges and their leases: the unit of work and of commit
  inputs.py       the day's inputs read from the Delta log (no Spark), restricted to a shard's users
  model.py        the promoted model, loaded once per worker: user embeddings, predictions
  speculative.py  the pairs expected tomorrow (policy) and the observed use of yesterday's
  worker.py       claims shards until none is left; any number of workers, joining or leaving
  read.py         readers: a user's embedding for a day and whether it was a hit
Tables: schemas/precompute.py.
"""
