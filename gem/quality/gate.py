"""A critical gate's failure, as a person fixing it reads it: one line per failed check.

    FAILED <suite>/<rule>: found <value> (ds=<day>, <the group's other columns>), and <n> more;
    bound <the bound in words>; set by <config key, or the contract>; rerun: <command>

Every gate that stops a stage (the Great Expectations suites' critical expectations,
gem.quality.runner.DataQualityError; the landing schema's drift, gem.bronze.drift.SchemaDriftError)
raises a GateError whose message ends with these lines. Where a bound comes from the table contract
in schemas/ and no setting relaxes it, `setting` says so. The rerun command is the caller's to
know (a stage's own command line, `gem bulk`, a backfill of the Airflow day): each entry point sets
`rerun` before the error is shown (gem.pipeline.cli, gem.pipeline.bulk,
gem.pipeline.airflow.orchestration).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class GateFailure:
    """One failed check: what it is, the value found, the bound it broke and what sets that bound."""

    check: str
    found: str
    bound: str
    setting: str

    def line(self, rerun: str | None) -> str:
        text = f"FAILED {self.check}: found {self.found}; bound {self.bound}; set by {self.setting}"
        return f"{text}; rerun: {rerun}" if rerun else text


class GateError(RuntimeError):
    """A critical gate failed: `summary` says where, `failures` which checks; the message ends with
    one line per failure, naming `rerun` once an entry point has set it."""

    def __init__(self, summary: str, failures: Sequence[GateFailure]) -> None:
        super().__init__(summary)
        self.summary = summary
        self.failures = tuple(failures)
        self.rerun: str | None = None

    def __str__(self) -> str:
        return "\n".join([self.summary, *(f.line(self.rerun) for f in self.failures)])
