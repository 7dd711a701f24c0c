"""`python -m gem ...`: the `gem` command without the console script (gem/pipeline/command.py)."""

from gem.pipeline.command import main

main()
