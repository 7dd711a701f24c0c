"""`python -m gem ...`: the `gem` command without the console script (gem/command.py)."""

from gem.command import main

main()
