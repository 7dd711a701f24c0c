"""Services of the local cluster topology, each started as its own process with a readiness timeout
and stopped with everything it started: the S3 API server (moto in server mode) and a standalone
Spark cluster (a master and its workers, from pyspark's own distribution).

`make cluster-demo` and the tests that need an object store start them here, so a test exercises
the same service the demo runs on.
"""

from __future__ import annotations

import json
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

import psutil

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


def group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (zombies, which hold nothing, do not count)."""
    for process in psutil.process_iter(["status"]):
        try:
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


def stop_group(process: subprocess.Popen, timeout_s: float) -> None:
    """Stop the process group that `process` leads (started with start_new_session=True): SIGTERM
    to the whole group, then SIGKILL to what is left of it after timeout_s. Members that outlive
    their leader (a JVM whose Python driver died) are stopped too; the leader is reaped."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:  # the group is gone already
        process.poll()
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None and not group_alive(process.pid):
            return
        time.sleep(0.2)
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


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
        if self.process is not None:
            stop_group(self.process, timeout_s=10)

    def reset(self) -> None:
        """Forget every bucket and object (moto's reset endpoint)."""
        request = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def spark_home() -> Path:
    """pyspark's own distribution (bin/spark-class, the jars): pip's pyspark has no sbin/start-*.sh,
    so the daemons start through spark-class."""
    import pyspark  # noqa: PLC0415 - the S3 server's users need no pyspark

    return Path(pyspark.__file__).parent


@dataclass
class SparkCluster:
    """A standalone Spark master and `workers` workers on this host, each JVM on its own loopback
    address (127.0.0.1 the master, 127.0.0.2.. the workers) with capped memory.

    `master_url` is what a session or spark-submit connects to. Each worker offers `worker_cores`
    cores and `worker_memory` to executors; the daemons themselves run in `daemon_memory`. A worker
    whose process is killed drops out; its executors' tasks rerun on the others (Spark's own retry)."""

    log_dir: Path
    workers: int = 2
    worker_cores: int = 1
    worker_memory: str = "1g"
    daemon_memory: str = "256m"
    ready_timeout_s: float = 90.0
    master_host: str = "127.0.0.1"
    master_port: int = 0
    master_ui_port: int = 0
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, init=False)

    @property
    def master_url(self) -> str:
        return f"spark://{self.master_host}:{self.master_port}"

    def worker_host(self, index: int) -> str:
        return f"127.0.0.{2 + index}"

    def _start(self, name: str, main_class: str, *args: str) -> None:
        home = spark_home()
        log = self.log_dir / f"{name}.log"
        env = {**os.environ, "SPARK_HOME": str(home), "SPARK_DAEMON_MEMORY": self.daemon_memory,
               # Executors start their Python workers with this interpreter (the venv's).
               "PYSPARK_PYTHON": sys.executable, "SPARK_LOG_DIR": str(self.log_dir),
               "SPARK_WORKER_DIR": str(self.log_dir / f"{name}-work")}
        with open(log, "ab") as out:
            self.processes[name] = subprocess.Popen([str(home / "bin" / "spark-class"), main_class, *args],
                                                    stdout=out, stderr=subprocess.STDOUT, env=env,
                                                    start_new_session=True)

    def status(self) -> dict:
        """The master's view (its web UI's JSON): workers with their state, cores and memory."""
        with urllib.request.urlopen(f"http://{self.master_host}:{self.master_ui_port}/json/", timeout=5) as r:
            return json.loads(r.read())

    def alive_workers(self) -> int:
        try:
            return sum(1 for w in self.status().get("workers", []) if w.get("state") == "ALIVE")
        except OSError:
            return 0

    def start(self) -> Self:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.master_port = self.master_port or free_port(self.master_host)
        self.master_ui_port = self.master_ui_port or free_port(self.master_host)
        self._start("spark-master", "org.apache.spark.deploy.master.Master", "--host", self.master_host,
                    "--port", str(self.master_port), "--webui-port", str(self.master_ui_port))
        for i in range(self.workers):
            host = self.worker_host(i)
            self._start(f"spark-worker-{i + 1}", "org.apache.spark.deploy.worker.Worker", self.master_url,
                        "--host", host, "--cores", str(self.worker_cores), "--memory", self.worker_memory,
                        "--webui-port", str(free_port(host)), "--work-dir",
                        str(self.log_dir / f"spark-worker-{i + 1}-work"))
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    self.stop()
                    raise ServiceStartError(f"{name} exited with {process.returncode}:\n"
                                            f"{_tail(self.log_dir / f'{name}.log')}")
            if self.alive_workers() == self.workers:
                return self
            time.sleep(0.5)
        self.stop()
        raise ServiceStartError(f"the Spark master at {self.master_url} did not see {self.workers} workers after "
                                f"{self.ready_timeout_s:.0f} s:\n{_tail(self.log_dir / 'spark-master.log')}")

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker `index` (0-based) and its executors: a node lost mid-stage."""
        process = self.processes[f"spark-worker-{index + 1}"]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def stop(self) -> None:
        # Workers first (they take their executors with them), then the master.
        for name in sorted(self.processes, key=lambda n: n == "spark-master"):
            stop_group(self.processes[name], timeout_s=20)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
