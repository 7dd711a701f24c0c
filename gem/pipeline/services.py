"""Services of the local cluster topology, each started as its own process with a readiness timeout
and stopped with everything it started: the S3 API server (moto in server mode) for now.

`make cluster-demo` and the tests that need an object store start them here, so a test exercises
the same service the demo runs on.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

# Stand-in credentials of the local S3 API server: moto accepts any key, and botocore, s3fs, S3A
# and delta-rs all refuse to sign a request without one.
LOCAL_S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "gem-local", "AWS_SECRET_ACCESS_KEY": "gem-local"}
LOCAL_S3_REGION = "us-east-1"


class ServiceStartError(RuntimeError):
    """A service did not become ready within its timeout (its log's tail is in the message)."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log written)"


@dataclass
class S3Server:
    """moto's S3 (and DynamoDB) API on 127.0.0.1, in its own process.

    `environment()` is what a client of it needs: the standard AWS variables (endpoint, region,
    stand-in credentials) and AWS_ALLOW_HTTP for delta-rs, which refuses plain HTTP otherwise.
    """

    log_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    ready_timeout_s: float = 30.0
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def environment(self) -> dict[str, str]:
        return {**LOCAL_S3_CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": LOCAL_S3_REGION,
                "AWS_DEFAULT_REGION": LOCAL_S3_REGION, "AWS_ALLOW_HTTP": "true"}

    def start(self) -> Self:
        self.port = self.port or free_port(self.host)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / "s3-server.log"
        moto_server = Path(sys.executable).with_name("moto_server")
        command = [str(moto_server), "-H", self.host, "-p", str(self.port)]
        with open(log, "ab") as out:
            # Its own session: stopping it signals the whole group (werkzeug's reloader, if any).
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                            env={**os.environ, **LOCAL_S3_CREDENTIALS})
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServiceStartError(f"the S3 API server exited with {self.process.returncode}:\n{_tail(log)}")
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2):
                    return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise ServiceStartError(f"the S3 API server was not ready on {self.endpoint} after "
                                f"{self.ready_timeout_s:.0f} s:\n{_tail(log)}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def reset(self) -> None:
        """Forget every bucket and object (moto's reset endpoint)."""
        request = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
