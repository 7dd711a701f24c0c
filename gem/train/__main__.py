"""`python -m gem.train`: the daily pretraining entry point (gem.train.daily)."""

import sys

from gem.train.daily import main

if __name__ == "__main__":
    sys.exit(main())
