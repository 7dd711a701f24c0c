"""What every `python -m` command line of the project shares, on typer: the --config option, day
options, an app with the project's settings and the runners that give a command's `main(argv)`.

It sits below gem.pipeline (which adds the stage registry's day options for the jobs: gem.pipeline.cli)
so that the library's own entry points (gem.train, gem.distill.transfer, gem.quality.docs_assets) and
the benches build their command lines from it too. Help is plain click help, as the `gem` command's
(gem/pipeline/command.py), and an exception's traceback is Python's own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from typer.models import OptionInfo

from gem.days import iso_day

__all__ = ["DAY", "ConfigOption", "day_option", "day_value", "job_app", "run_command", "run_function"]

R = TypeVar("R")

DAY = "YYYY-MM-DD"
ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", help="YAML config file (default: $GEM_CONFIG, else the built-in defaults)",
                 exists=True, dir_okay=False),
]


def day_value(value: str | None) -> str | None:
    """typer callback: a day written YYYY-MM-DD (gem.days.iso_day), normalised; a usage error otherwise."""
    if value is None:
        return None
    try:
        return iso_day(value)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


def day_option(flag: str, help: str) -> OptionInfo:
    """A day option, `Annotated[str, day_option("--ds", "the day to process")]` (required without a
    default): written YYYY-MM-DD, normalised, a usage error otherwise."""
    return typer.Option(flag, help=help, metavar=DAY, callback=day_value)


def job_app(prog: str) -> typer.Typer:
    """An empty typer app for `prog` (e.g. "python -m jobs.status"): register its one command with
    `app.command(help=...)` and run it with `run_command`."""
    return typer.Typer(
        name=prog,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,  # plain click help: paragraphs re-wrapped to the terminal
    )


def run_command(app: typer.Typer, argv: Sequence[str] | None = None) -> int:
    """Run a command line as its `main(argv)` does (argv None: the process's arguments) -> the exit
    status its command returns (0 after --help; a typer.Exit's code). A usage error prints the usage
    and raises SystemExit(2)."""
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name=app.info.name, standalone_mode=False)
    except typer.TyperException as e:
        # The usage errors typer raises (its click's ClickException) print themselves, usage line included.
        e.show()
        raise SystemExit(e.exit_code) from None
    return int(code or 0)


def run_function(function: Callable[..., R], argv: Sequence[str] | None = None, *, prog: str,
                 help: str | None = None) -> R | None:
    """Run `function`, whose parameters are typer options, as the command line `prog` on argv (None:
    the process's arguments) -> what it returned; None after --help. For a command whose caller wants
    its result (a benchmark's figures) rather than an exit status; usage errors as `run_command`, and
    a typer.Exit with a code other than 0 raises SystemExit with it."""
    returned: list[R] = []

    @functools.wraps(function)
    def command(*args: object, **kwargs: object) -> None:
        returned.append(function(*args, **kwargs))

    app = job_app(prog)
    app.command(help=help)(command)
    code = run_command(app, argv)
    if code:
        raise SystemExit(code)
    return returned[0] if returned else None
