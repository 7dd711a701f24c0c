"""The model quality study: `python -m gem.study --preset {smoke,small,gpu}` (gem/study/study.py)."""
