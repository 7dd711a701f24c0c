"""Progress of a long loop (training steps, imported days): a tqdm bar when the stream is a
terminal, plain lines elsewhere (CI, Airflow task logs, files), where a bar's carriage returns
would make one unreadable line.

Example:
    >>> with Progress(total=120, desc="train", unit="step") as progress:
    ...     for step in range(120):
    ...         progress.update(loss=f"{0.5:.4f}")
    # not a terminal: "train: 12/120 step (10%) loss=0.5000" ... "train: 120/120 step (100%) loss=0.5000"
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any, Self

from tqdm import tqdm

# Plain-line mode prints at every this share of the total (and at the end).
LINES_PER_RUN = 10


class Progress:
    """Counts `update()` calls up to `total`; shows them as a bar or as about LINES_PER_RUN lines."""

    def __init__(self, total: int, desc: str, unit: str = "it", initial: int = 0, stream: IO[str] | None = None):
        self.total, self.desc, self.unit, self.done = total, desc, unit, initial
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.perf_counter()
        self._next_line = initial + max(1, total // LINES_PER_RUN)
        self.bar = None
        if self.stream.isatty():
            self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, file=self.stream)

    def update(self, n: int = 1, **postfix: Any) -> None:
        """n more done; `postfix` (e.g. loss=...) is shown beside the count."""
        self.done += n
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix(**postfix, refresh=False)
            self.bar.update(n)
        elif self.done >= self._next_line or self.done == self.total:
            self._next_line = self.done + max(1, self.total // LINES_PER_RUN)
            extra = "".join(f" {k}={v}" for k, v in postfix.items())
            pct = 100 * self.done / self.total if self.total else 100.0
            seconds = time.perf_counter() - self.started
            print(f"{self.desc}: {self.done}/{self.total} {self.unit} ({pct:.0f}%, {seconds:.0f}s){extra}",
                  file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
