"""Services of the local cluster topology, each started as its own process with a readiness timeout
and stopped with everything it started: the S3 API server (moto in server mode) and a standalone
Spark cluster (a master and its workers, from pyspark's own distribution).

`make cluster-demo` and the tests that need an object store start them here, so a test exercises
the same service the demo runs on.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
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
        command = [sys.executable, "-m", "gem.pipeline.local_s3_server", "-H", self.host, "-p", str(self.port)]
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


# Debian's package of the redis-server program (infra/cluster_services.sh installs it where root can).
REDIS_SERVER = "redis-server"


@dataclass
class RedisServer:
    """redis-server on 127.0.0.1 in its own process, as the Celery executor's broker: no persistence
    (no snapshots, no append-only file), its working folder `work_dir`, its log work_dir/redis.log.

    `url` is what a client connects to (database 0; `url_of(n)` names another database). Never a
    system service: started here on a free port and stopped with `stop()`."""

    work_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    ready_timeout_s: float = 30.0
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return self.url_of(0)

    def url_of(self, database: int) -> str:
        return f"redis://{self.host}:{self.port}/{database}"

    def ping(self) -> bool:
        """Whether the server answers PING (its protocol's inline form) with PONG."""
        try:
            with socket.create_connection((self.host, self.port), timeout=2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def start(self) -> Self:
        self.port = self.port or free_port(self.host)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        log = self.work_dir / "redis.log"
        command = [REDIS_SERVER, "--bind", self.host, "--port", str(self.port), "--save", "", "--appendonly", "no",
                   "--dir", str(self.work_dir), "--daemonize", "no", "--logfile", str(log)]
        try:
            self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        except FileNotFoundError:
            raise ServiceStartError(f"no {REDIS_SERVER} on PATH: install Debian's redis-server package "
                                    "(infra/cluster_services.sh does, as root)") from None
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServiceStartError(f"redis-server exited with {self.process.returncode}:\n{_tail(log)}")
            if self.ping():
                return self
            time.sleep(0.1)
        self.stop()
        raise ServiceStartError(f"redis-server was not ready on {self.host}:{self.port} after "
                                f"{self.ready_timeout_s:.0f} s:\n{_tail(log)}")

    def stop(self) -> None:
        if self.process is not None:
            stop_group(self.process, timeout_s=10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# Where Debian installs PostgreSQL's server programs (initdb, postgres, pg_ctl), one folder per version.
POSTGRES_LIB = Path("/usr/lib/postgresql")
# The unprivileged system user a PostgresServer started by root runs as (PostgreSQL refuses root).
POSTGRES_OS_USER = "gem-postgres"


def postgres_bin() -> Path:
    """The folder of PostgreSQL's server programs: that of `initdb` on PATH, else Debian's newest."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted((p for p in POSTGRES_LIB.glob("*/bin") if p.parent.name.isdigit()), key=lambda p: int(p.parent.name))
    if not versions:
        raise ServiceStartError(f"no PostgreSQL server programs (initdb on PATH or {POSTGRES_LIB}/<version>/bin): "
                                "install Debian's postgresql package")
    return versions[-1]


def postgres_os_user() -> pwd.struct_passwd:
    """POSTGRES_OS_USER, created as a system user without a home or login shell when missing."""
    try:
        return pwd.getpwnam(POSTGRES_OS_USER)
    except KeyError:
        pass
    made = subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell",
                           "/usr/sbin/nologin", POSTGRES_OS_USER], capture_output=True, text=True, check=False)
    try:
        return pwd.getpwnam(POSTGRES_OS_USER)  # made here, or by a process that ran useradd at the same time
    except KeyError:
        raise ServiceStartError(f"cannot create the system user {POSTGRES_OS_USER} PostgreSQL runs as "
                                f"(useradd exited with {made.returncode}): {made.stderr.strip()}") from None


@dataclass
class PostgresServer:
    """PostgreSQL on 127.0.0.1 in its own process group, from Debian's binaries: a new cluster at
    each start (initdb, fsync off: a throwaway database) with one database, `database`, owned by
    `user`, who connects without a password over the loopback address only (no Unix socket). Its
    log: work_dir/postgres.log. Never a system service.

    Root cannot run PostgreSQL: under root the cluster belongs to POSTGRES_OS_USER (created when
    missing) and lives in a folder of its own under the system's temporary folder, which that user
    can reach (work_dir may sit in a folder only root can enter); `stop()` removes it. Otherwise the
    cluster is work_dir/postgres-data.

    `shut_down()` stops the server and keeps its cluster; `resume()` starts it again on the same
    cluster and port (an outage of the database, in a fault drill).

    `url` is the SQLAlchemy URL (psycopg2 driver) to connect with."""

    work_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    user: str = "gem"
    database: str = "airflow"
    ready_timeout_s: float = 60.0
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    data_dir: Path | None = field(default=None, init=False)
    _own_dir: Path | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://{self.user}@{self.host}:{self.port}/{self.database}"

    @staticmethod
    def _as_owner(command: list[str]) -> list[str]:
        """`command` as the cluster's owner: POSTGRES_OS_USER under root (runuser), else this user."""
        return ["runuser", "-u", POSTGRES_OS_USER, "--", *command] if os.geteuid() == 0 else command

    def _run(self, command: list[str], log: Path, what: str) -> None:
        with open(log, "ab") as out:
            done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
        if done.returncode != 0:
            raise ServiceStartError(f"{what} exited with {done.returncode}:\n{_tail(log)}")

    def start(self) -> Self:
        programs = postgres_bin()
        self.port = self.port or free_port(self.host)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        log = self.work_dir / "postgres.log"
        if os.geteuid() == 0:
            owner = postgres_os_user()
            self._own_dir = Path(tempfile.mkdtemp(prefix="gem-postgres-"))
            os.chown(self._own_dir, owner.pw_uid, owner.pw_gid)
            self.data_dir = self._own_dir / "data"
        else:
            self.data_dir = self.work_dir / "postgres-data"
            shutil.rmtree(self.data_dir, ignore_errors=True)
        self._run(self._as_owner([str(programs / "initdb"), "-D", str(self.data_dir), "-U", self.user, "--auth=trust",
                                  "-E", "UTF8", "--no-locale", "--no-sync"]), log, "initdb")
        self._launch(programs, log)
        self._run([str(programs / "createdb"), "-h", self.host, "-p", str(self.port), "-U", self.user,
                   self.database], log, "createdb")
        return self

    def resume(self) -> Self:
        """Start the server again on the cluster `shut_down()` kept, on the same port."""
        if self.data_dir is None:
            raise ServiceStartError("this PostgresServer was never started: nothing to resume")
        self._launch(postgres_bin(), self.work_dir / "postgres.log")
        return self

    def _launch(self, programs: Path, log: Path) -> None:
        """The postmaster on the cluster at data_dir, waited for until it accepts connections."""
        assert self.data_dir is not None
        command = [str(programs / "postgres"), "-D", str(self.data_dir), "-h", self.host, "-p", str(self.port),
                   "-c", "unix_socket_directories=", "-c", "fsync=off"]
        with open(log, "ab") as out:
            # Its own session: stopping it signals the whole group (runuser, the postmaster, its backends).
            self.process = subprocess.Popen(self._as_owner(command), stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        ready = [str(programs / "pg_isready"), "-q", "-h", self.host, "-p", str(self.port), "-U", self.user, "-d", "postgres"]
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise ServiceStartError(f"postgres exited with {self.process.returncode}:\n{_tail(log)}")
            if subprocess.run(ready, check=False).returncode == 0:
                return
            time.sleep(0.2)
        self.stop()
        raise ServiceStartError(f"postgres was not ready on {self.host}:{self.port} after "
                                f"{self.ready_timeout_s:.0f} s:\n{_tail(log)}")

    def shut_down(self) -> None:
        """A fast shutdown (open sessions are ended: pg_ctl stop -m fast), then whatever is left of its
        process group; the cluster stays (`resume()`)."""
        if self.process is not None and self.process.poll() is None and self.data_dir is not None:
            subprocess.run(self._as_owner([str(postgres_bin() / "pg_ctl"), "stop", "-D", str(self.data_dir),
                                           "-m", "fast", "-w", "-t", "20"]),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        if self.process is not None:
            stop_group(self.process, timeout_s=10)

    def stop(self) -> None:
        """`shut_down()`, then the folder made for it under root goes too."""
        self.shut_down()
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
            self._own_dir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
