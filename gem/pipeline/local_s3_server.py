"""moto's S3 API server with each object write decided as one step:
`python -m gem.pipeline.local_s3_server -H HOST -p PORT` (moto_server's arguments).

moto serves every request on its own thread and checks a conditional write's precondition
(If-None-Match: *, If-Match) before it stores the object, so two racing creates of one key can both
succeed. S3 decides the precondition and the write together, and gem.storage.create and the lakehouse's
commit leases rely on that. One lock around moto's object puts and deletes gives the local stand-in
the same guarantee; its objects live in memory, so the lock costs little.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from moto import server
from moto.s3.responses import S3Response

_OBJECT_WRITES = threading.Lock()


def _one_at_a_time(handler: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(handler)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with _OBJECT_WRITES:
            return handler(*args, **kwargs)

    return locked


def main(argv: list[str] | None = None) -> None:
    S3Response._key_response_put = _one_at_a_time(S3Response._key_response_put)
    S3Response._key_response_delete = _one_at_a_time(S3Response._key_response_delete)
    server.main(argv)


if __name__ == "__main__":
    main()
