"""Named crash points (gem.faults): GEM_CRASH_AT kills the process at a point's first pass, or at
its k-th with `@k` (the fault drill kills pretraining in its second checkpoint save that way)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from gem.faults import ENV_VAR

PROGRAM = """
from gem.faults import crash_point
for i in range(1, 4):
    crash_point("stage:point")
    print(i, flush=True)
"""


@pytest.mark.parametrize(("crash_at", "printed", "killed"), [
    ("stage:point", "", True),           # the first pass
    ("stage:point@2", "1\n", True),      # the second pass
    ("stage:point@4", "1\n2\n3\n", False),  # never reached a 4th time
    ("stage:other", "1\n2\n3\n", False),
    ("stage:poin", "1\n2\n3\n", False),  # a prefix names another point
])
def test_a_crash_point_kills_at_the_pass_it_names(crash_at: str, printed: str, killed: bool) -> None:
    env = {**os.environ, ENV_VAR: crash_at}
    run = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, check=False)
    assert run.stdout == printed
    assert run.returncode == (-signal.SIGKILL if killed else 0)
