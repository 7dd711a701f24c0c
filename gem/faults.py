"""Named crash points for testing atomicity: `GEM_CRASH_AT=<stage>:<point>` kills the process there
(`<stage>:<point>@k`: the k-th time it gets there).

Jobs call `crash_point("ingest_events:after_bronze")` between commits; in production the variable
is unset and the call is a dictionary lookup. Tests set it to prove that a process killed at that
point leaves nothing a downstream reader would use and that a rerun converges.
"""

from __future__ import annotations

import os
import signal

from gem.environment import CRASH_AT_ENV

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
