"""`make cluster-demo` leaves nothing behind: gem.pipeline.cluster_demo runs as a subprocess on a small
world while the test walks its process tree every half second, recording every process it started
(the S3 API server, the Spark master and workers, the executors, the demo's process and its driver
JVM) and every port they listened on. Interrupted once its Spark executors run (SIGINT in the quick
tier, SIGTERM in the slow one), or failing on a bad config after its services started, it exits
having stopped each of those processes, and no port it listened on is still listened on.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import yaml

from tests.support import PYTHON, REPO, subprocess_env

# Two days of a small world: the interrupt comes on the first day's first Spark stage.
SMALL_WORLD = {
    "start_ds": "2026-01-01", "attribution_window_days": 0,
    "demo": {"days": 2, "bulk_days": 1},
    "mix": {"cold_start_days": 0, "validation_days": 0},
    "generator": {"users": 300, "ads": 60, "advertisers": 12, "events_per_day": 3000, "chunk_impressions": 1500},
    "spark": {"master": "local[2]", "shuffle_partitions": 2},
    "train": {"steps": 8, "checkpoint_every": 8},
}
EXECUTOR = "CoarseGrainedExecutorBackend"
DEMO_PROCESS = "gem.pipeline.demo_process"
SERVICES_UP = "Spark master at spark://"


@dataclass
class Watched:
    """A cluster demo's subprocess, its output lines as they come, and everything seen under it."""

    process: subprocess.Popen[str]
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue)
    output: list[str] = field(default_factory=list)
    seen: dict[int, psutil.Process] = field(default_factory=dict)
    commands: dict[int, str] = field(default_factory=dict)  # pid -> its command line when first seen
    ports: set[tuple[str, int]] = field(default_factory=set)

    def look(self) -> None:
        """Record the processes under the demo now, their command lines, and the ports they listen on."""
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for child in children:
            try:
                if child.pid not in self.seen:
                    self.commands[child.pid] = " ".join(child.cmdline())
                    self.seen[child.pid] = child
                self.ports |= {(c.laddr.ip, c.laddr.port) for c in child.net_connections(kind="inet")
                               if c.status == psutil.CONN_LISTEN}
            except psutil.Error:
                continue

    def started(self, *names: str) -> list[str]:
        """Which of `names` no command line seen under the demo holds."""
        return [n for n in names if not any(n in command for command in self.commands.values())]

    def read(self) -> None:
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return
            if line is not None:
                self.output.append(line)

    def watch_until(self, done: Callable[[Watched], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.look()
            self.read()
            if done(self):
                return
            if self.process.poll() is not None:
                pytest.fail(f"the cluster demo exited with {self.process.returncode}:\n" + "\n".join(self.output[-40:]))
            time.sleep(0.5)
        pytest.fail(f"not reached in {timeout_s:.0f}s; output so far:\n" + "\n".join(self.output[-40:]))

    def demo_executor_seen(self) -> bool:
        """Whether an executor started after the demo's process: the bulk path's session is on the
        cluster (an earlier one belongs to the class archives' workload, on a first run)."""
        commands = list(self.commands.values())  # in the order first seen
        demo = next((i for i, command in enumerate(commands) if DEMO_PROCESS in command), None)
        return demo is not None and any(EXECUTOR in command for command in commands[demo + 1:])


def start_demo(root: Path, world: dict) -> Watched:
    """`python -m gem.pipeline.cluster_demo` on `world` (a config), its files under root."""
    root.mkdir(parents=True, exist_ok=True)
    config = root / "world.yaml"
    config.write_text(yaml.safe_dump(world))
    process = subprocess.Popen(
        [PYTHON, "-m", "gem.pipeline.cluster_demo", "--config", str(config), "--work-dir", str(root / "work")],
        cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    watched = Watched(process)

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            watched.lines.put(line.rstrip("\n"))
        watched.lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return watched


@pytest.fixture
def demos(tmp_path: Path) -> Iterator[Callable[[dict], Watched]]:
    """Starts cluster demos (`demos(world)`); afterwards kills whatever of theirs still runs, so a
    failing test leaves nothing behind either."""
    started: list[Watched] = []

    def start(world: dict) -> Watched:
        started.append(start_demo(tmp_path / f"demo-{len(started)}", world))
        return started[-1]

    yield start
    for watched in started:
        if watched.process.poll() is None:
            watched.process.kill()
            watched.process.wait()
        for process in watched.seen.values():
            with contextlib.suppress(psutil.Error):
                if process.is_running():
                    process.kill()


def finish(watched: Watched, timeout_s: float = 120) -> int:
    code = watched.process.wait(timeout=timeout_s)
    time.sleep(1)
    watched.read()
    return code


def still_running(processes: list[psutil.Process]) -> list[str]:
    left = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{process.pid} {' '.join(process.cmdline())[:160]}")
        except psutil.NoSuchProcess:
            continue
    return left


def still_listened(ports: set[tuple[str, int]]) -> list[tuple[str, int]]:
    """Ports of `ports` that a process listens on, or that cannot be bound (as a restarted server would)."""
    listening = {(c.laddr.ip, c.laddr.port) for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
    taken = []
    for ip, port in sorted(ports):
        if (ip, port) in listening:
            taken.append((ip, port))
            continue
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        with socket.socket(family) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((ip, port))
            except OSError:
                taken.append((ip, port))
    return taken


def assert_nothing_left(watched: Watched) -> None:
    assert "== cluster services (all stopped) ==" in watched.output, watched.output[-20:]
    assert not still_running(list(watched.seen.values())), still_running(list(watched.seen.values()))
    assert not still_listened(watched.ports), still_listened(watched.ports)


@pytest.mark.parametrize("signum", [pytest.param(signal.SIGINT, id="SIGINT"),
                                    pytest.param(signal.SIGTERM, id="SIGTERM", marks=pytest.mark.slow)])
def test_an_interrupt_while_executors_run_stops_everything_it_started(demos: Callable[[dict], Watched],
                                                                     signum: int) -> None:
    watched = demos(SMALL_WORLD)
    watched.watch_until(lambda w: any(SERVICES_UP in line for line in w.output), timeout_s=120)
    watched.watch_until(Watched.demo_executor_seen, timeout_s=240)
    watched.look()
    watched.process.send_signal(signum)
    code = finish(watched)
    assert code == 128 + signum, watched.output[-20:]
    assert any(f"{signal.Signals(signum).name} received" in line for line in watched.output), watched.output[-20:]
    # What ran under it: the S3 server, the Spark daemons, the demo's process with its driver JVM.
    assert not watched.started("gem.pipeline.local_s3_server", "deploy.master.Master", "deploy.worker.Worker",
                               DEMO_PROCESS, "org.apache.spark.deploy.SparkSubmit"), watched.commands
    assert len(watched.ports) >= 6, watched.ports  # S3, the master's two, each worker's, the driver's
    assert_nothing_left(watched)


def test_a_failure_after_the_services_started_stops_them(demos: Callable[[dict], Watched]) -> None:
    """A config the cluster demo cannot load (demo.days must be positive) fails once both services
    are up, when it loads the config it wrote for them: it exits with the error and stops both."""
    watched = demos({**SMALL_WORLD, "demo": {"days": 0, "bulk_days": 0}})
    deadline = time.monotonic() + 120
    while watched.process.poll() is None and time.monotonic() < deadline:
        watched.look()
        time.sleep(0.2)
    code = finish(watched)
    assert code != 0
    assert any(SERVICES_UP in line for line in watched.output), watched.output[-20:]
    assert any("demo.days" in line for line in watched.output), watched.output[-20:]
    assert not watched.started("gem.pipeline.local_s3_server", "deploy.master.Master",
                               "deploy.worker.Worker"), watched.commands
    assert_nothing_left(watched)
