"""Publish a folder of files all at once: build it aside, then rename it into place.

A reader (a browser, a file server, a CI artifact upload) sees the old folder or the complete new
one, never a half-written one. Replacing takes two renames on the same filesystem (old aside, new in;
POSIX has no portable atomic swap of non-empty folders), so between them the folder is briefly
absent, which a reader sees as "no report yet" rather than as a broken page.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath


def _replaceable(folder: Path) -> bool:
    return folder.is_dir() and (not any(folder.iterdir()) or (folder / "index.html").is_file())


def publish_folder(out_dir: Path, files: dict[str, bytes]) -> Path:
    """Replace `out_dir` with a folder holding exactly `files` (relative POSIX path -> bytes).

    Returns `out_dir`. Anything that was in `out_dir` before is gone afterwards, so an existing
    `out_dir` must be empty or a published report (hold an index.html): a mistyped path such as
    the repository root is refused instead of deleted.
    """
    out_dir = Path(out_dir).absolute()
    if out_dir.exists() and not _replaceable(out_dir):
        raise FileExistsError(f"{out_dir} exists and is not a report folder (no index.html); not replacing it")
    for rel in files:
        parts = PurePosixPath(rel).parts
        if not parts or PurePosixPath(rel).is_absolute() or ".." in parts:
            raise ValueError(f"file {rel!r} would be written outside {out_dir}")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # Siblings of out_dir, so the renames stay on one filesystem; dot-prefixed so listings skip them.
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.new-", dir=out_dir.parent))
    try:
        for rel, data in files.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        os.chmod(staging, 0o755)  # mkdtemp makes it 0700; a published report is meant to be read
        if out_dir.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.rename(out_dir, retired / "report")
            os.rename(staging, out_dir)
            shutil.rmtree(retired)
        else:
            os.rename(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir
