"""The model quality study: `python -m gem.study --preset {smoke,small,cpu,gpu}` (gem/study/study.py)."""
