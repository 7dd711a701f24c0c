"""Finished study jobs, and the finished training runs of unfinished ones, kept across runs, so one
study can span several: a GPU lease of a few minutes, a run that was stopped or reached its time
limit. A JSON-lines file, appended to as each job finishes (one line), and as each training run of a
job still going finishes (a line marked "partial" holding the job's runs so far).

A line is reused only by the same preset (its full repr: traffic, targets, grid, seeds) for a job of
the same name, model config and tasks; anything else in the file is ignored, never merged. A finished
job's line wins over its partial ones; of those, the last holds the most runs. Each run of the study
also appends one line about itself (its command, commit, host, start, wall time and the jobs it
finished), so the published study names every run that made it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gem.study.study import Job


@dataclass(frozen=True)
class JobLog:
    path: Path
    preset_key: str  # repr(StudyPreset)
    finished_in_run: list[str] = field(default_factory=list)  # jobs this object appended

    def _identity(self, job: Job) -> dict[str, object]:
        return {"preset": self.preset_key, "name": job.name, "config": repr(job.config),
                "tasks": list(job.tasks) if job.tasks is not None else None}

    def restore(self, jobs: Iterable[Job]) -> set[str]:
        """Fill in the results of the jobs this file holds (in place) -> the names of the finished
        ones. A job with only partial lines gets the training runs of its last one (lr trials and
        seeds), so a rerun trains only the runs it lacks."""
        if not self.path.is_file():
            return set()
        lines = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        restored = set()
        for job in jobs:
            identity = self._identity(job)
            mine = [line for line in lines if all(line.get(k) == v for k, v in identity.items())]
            finished = [line for line in mine if not line.get("partial")]
            if mine:
                line = (finished or mine)[-1]
                job.lr_trials, job.lr, job.seeds = line["lr_trials"], line["lr"], line["seeds"]
                job.trial_seeds = line.get("trial_seeds", [])
            if finished:
                restored.add(job.name)
        return restored

    def record_run(self, run: dict[str, object]) -> None:
        """Record one run of the study (a line of its own, never taken for a job's)."""
        self._write({"preset": self.preset_key, "run": run})

    def runs(self) -> list[dict[str, object]]:
        """The runs of this preset recorded so far, oldest first."""
        if not self.path.is_file():
            return []
        lines = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        return [line["run"] for line in lines if line.get("preset") == self.preset_key and "run" in line]

    def _write(self, line: dict[str, object]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # One unbuffered append, one write: the study's worker processes append to the same file.
        with self.path.open("ab", buffering=0) as f:
            f.write((json.dumps(line) + "\n").encode())

    def append(self, job: Job) -> None:
        """Record a finished job (one line, written at once: a stopped run keeps every job it finished)."""
        self._write(self._identity(job) | {"lr_trials": job.lr_trials, "lr": job.lr, "seeds": job.seeds})
        self.finished_in_run.append(job.name)

    def append_partial(self, job: Job) -> None:
        """Record the training runs an unfinished job has so far: its lr trials with their seed-0
        held-out scores, the chosen lr once the grid is done, and the seeds trained with it."""
        self._write(self._identity(job) | {"partial": True, "lr_trials": job.lr_trials,
                                           "trial_seeds": job.trial_seeds, "lr": job.lr, "seeds": job.seeds})
