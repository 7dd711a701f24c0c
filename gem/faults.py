"""Named crash and hold points for testing atomicity and scheduling: `GEM_CRASH_AT=<stage>:<point>`
kills the process there (`<stage>:<point>@k`: the k-th time it gets there); `GEM_HOLD_AT=<glob>`
makes a process wait at every point the glob matches until the file `GEM_HOLD_RELEASE` names exists.

Jobs call `crash_point("ingest_events:after_bronze")` between commits; in production the variable
is unset and the call is a dictionary lookup. Tests set it to prove that a process killed at that
point leaves nothing a downstream reader would use and that a rerun converges.
"""

from __future__ import annotations

import fnmatch
import os
import signal
import time

from gem.environment import CRASH_AT_ENV, HOLD_AT_ENV, HOLD_RELEASE_ENV

ENV_VAR = CRASH_AT_ENV


_passes: dict[str, int] = {}  # crash point -> times this process has reached it


def crash_point(name: str) -> None:
    """Kill this process at `name` when GEM_CRASH_AT is `name` (its first pass) or `name@k` (its
    k-th pass: e.g. the second checkpoint save, once a good checkpoint exists)."""
    wanted = os.environ.get(ENV_VAR)
    if wanted is None or not wanted.startswith(name):
        return
    _passes[name] = _passes.get(name, 0) + 1
    if wanted == name or wanted == f"{name}@{_passes[name]}":
        os.kill(os.getpid(), signal.SIGKILL)


def hold_point(name: str, poll_s: float = 0.2) -> None:
    """Wait here while GEM_HOLD_AT (a glob) matches `name` and the file GEM_HOLD_RELEASE names does
    not exist; a match without GEM_HOLD_RELEASE holds until the process is killed (a straggler that
    only a speculative copy gets past)."""
    pattern = os.environ.get(HOLD_AT_ENV)
    if pattern is None or not fnmatch.fnmatchcase(name, pattern):
        return
    release = os.environ.get(HOLD_RELEASE_ENV)
    while release is None or not os.path.exists(release):
        time.sleep(poll_s)
