"""Named crash points for testing atomicity: `GEM_CRASH_AT=<stage>:<point>` kills the process there.

Jobs call `crash_point("ingest_events:after_bronze")` between commits; in production the variable
is unset and the call is a dictionary lookup. Tests set it to prove that a process killed at that
point leaves nothing a downstream reader would use and that a rerun converges.
"""

from __future__ import annotations

import os
import signal

ENV_VAR = "GEM_CRASH_AT"


def crash_point(name: str) -> None:
    if os.environ.get(ENV_VAR) == name:
        os.kill(os.getpid(), signal.SIGKILL)
