"""Training: the loop, checkpoints, sharding plans, evaluation, promotion, and the daily entry."""
