"""The blocks a report section holds, and the verdict of a claim. Plain data: rendering is `html.py`."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ClaimStatus(enum.StrEnum):
    """The verdict on one claim; the value is the badge text."""

    REPRODUCED = "reproduced"
    NOT_REPRODUCED = "not reproduced"
    INCONCLUSIVE = "inconclusive"

    @classmethod
    def parse(cls, status: ClaimStatus | str) -> ClaimStatus:
        """`status` as a ClaimStatus; a string must be one of the values exactly."""
        try:
            return cls(status)
        except ValueError:
            allowed = ", ".join(repr(s.value) for s in cls)
            raise ValueError(f"claim status {status!r} is not one of {allowed}") from None


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Table:
    """Rows as dicts; `columns` fixes the order (missing cells render empty)."""

    rows: list[dict[str, object]]
    columns: list[str]
    caption: str
    formats: dict[str, str]


@dataclass(frozen=True)
class Link:
    """A table cell that links elsewhere; `href` is relative to the report's index.html (so the
    folder and what it links to move together) or a file: URL."""

    text: str
    href: str


@dataclass(frozen=True)
class Figure:
    """A figure already rendered: `png` is the file img/<name>.png."""

    name: str
    png: bytes
    caption: str


@dataclass(frozen=True)
class Claim:
    name: str
    status: ClaimStatus
    detail: str


Block = Paragraph | Table | Figure | Claim
