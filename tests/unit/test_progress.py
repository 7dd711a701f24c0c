"""gem.progress: a tqdm bar on a terminal, about ten plain lines anywhere else (CI, task logs)."""

from __future__ import annotations

import io

from gem.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    with Progress(total=95, desc="train", unit="step", stream=out) as progress:
        for step in range(95):
            progress.update(loss=f"{1 / (step + 1):.2f}")
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    # every 9 steps (95 // 10), and the last one
    assert [line.split()[1] for line in lines] == [f"{n}/95" for n in (9, 18, 27, 36, 45, 54, 63, 72, 81, 90, 95)]
    assert lines[-1].startswith("train: 95/95 step (100%, ") and lines[-1].endswith(" loss=0.01")


def test_a_resumed_loop_counts_from_where_it_was() -> None:
    out = io.StringIO()
    progress = Progress(total=10, desc="train", unit="step", initial=8, stream=out)
    progress.update()
    progress.update()
    assert [line.split()[1] for line in out.getvalue().splitlines()] == ["9/10", "10/10"]


def test_a_bar_on_a_terminal() -> None:
    out = Terminal()
    with Progress(total=3, desc="import", unit="day", stream=out) as progress:
        for day in ("2000-04-25", "2000-04-26", "2000-04-27"):
            progress.update(ds=day)
    text = out.getvalue()
    assert "\r" in text and "import: 100%" in text and "3/3" in text and "ds=2000-04-27" in text
    assert "(100%," not in text  # no plain lines
