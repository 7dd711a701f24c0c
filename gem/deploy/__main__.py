"""`python -m gem.deploy`: render deploy/'s files, or write compose's local secrets.

    python -m gem.deploy render [--out deploy] [--config configs/demo.yaml] [--bucket gem-demo]
    python -m gem.deploy local-secrets [--out deploy/compose/secrets]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from gem.command_line import job_app, run_command
from gem.deploy.render import BUCKET, DEFAULT_CONFIG, DEFAULT_OUT, SECRETS_DIR, render, write, write_local_secrets

app = job_app("python -m gem.deploy")


@app.command("render")
def render_command(
    out: Annotated[Path, typer.Option(help="the folder the files go in", file_okay=False)] = DEFAULT_OUT,
    config: Annotated[Path, typer.Option(help="the YAML config the deployments run", exists=True,
                                         dir_okay=False)] = DEFAULT_CONFIG,
    bucket: Annotated[str, typer.Option(help="the S3 bucket of the lakehouse and the task logs")] = BUCKET,
) -> int:
    """Render the image, compose file, Helm values and Kubernetes manifests from the config and the
    stage registry into --out."""
    for path in write(render(config, bucket), out):
        print(path)
    return 0


@app.command("local-secrets")
def local_secrets_command(
    out: Annotated[Path, typer.Option(help="the compose secrets' folder", file_okay=False)] = DEFAULT_OUT / SECRETS_DIR,
) -> int:
    """Write new random secrets for the compose project (owner-only files; never replaces one)."""
    try:
        paths = write_local_secrets(out)
    except FileExistsError as error:
        print(f"local-secrets: {error}", file=sys.stderr)
        return 1
    print(f"wrote {len(paths)} secret files under {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(app, argv)


if __name__ == "__main__":
    sys.exit(main())
