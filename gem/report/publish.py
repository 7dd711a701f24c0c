"""Publish a folder of files all at once under a local folder or an object store prefix.

The files are written into a local staging folder first, then published:

- on a local disk the staging folder is a sibling of the destination and is renamed into place. A
  reader (a browser, a file server, a CI artifact upload) sees the old folder or the complete new
  one, never a half-written one. Replacing takes two renames on the same filesystem (old aside, new
  in; POSIX has no portable atomic swap of non-empty folders), so between them the folder is
  briefly absent, which a reader sees as "no report yet" rather than as a broken page;
- on an object store (gem.storage) every file but index.html is uploaded first and index.html
  last, so a reader who finds the new index finds everything it links to; files of the old report
  that the new one lacks are deleted afterwards.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from gem import storage

INDEX = "index.html"


def _check_relative(out_dir: str, files: dict[str, bytes]) -> None:
    for rel in files:
        parts = PurePosixPath(rel).parts
        if not parts or PurePosixPath(rel).is_absolute() or ".." in parts:
            raise ValueError(f"file {rel!r} would be written outside {out_dir}")


def _stage(staging: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = staging / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _refuse_foreign(out_dir: str, replaceable: bool) -> None:
    if not replaceable:
        raise FileExistsError(f"{out_dir} exists and is not a report folder (no {INDEX}); not replacing it")


def publish_folder(out_dir: str | Path, files: dict[str, bytes]) -> str:
    """Replace `out_dir` (a local folder or an object store prefix) with exactly `files` (relative
    POSIX path -> bytes), index.html among them; returns `out_dir` as gem.storage spells it.

    Anything that was in `out_dir` before is gone afterwards, so an existing `out_dir` must be empty
    or a published report (hold an index.html): a mistyped path such as the repository root is
    refused instead of deleted.
    """
    out = storage.normalized(out_dir)
    _check_relative(out, files)
    if INDEX not in files:
        raise ValueError(f"a published folder needs an {INDEX}; got {sorted(files)}")
    if storage.is_local(out):
        folder = storage.local_path(out)
        if folder.exists():
            _refuse_foreign(out, folder.is_dir() and (not any(folder.iterdir()) or (folder / INDEX).is_file()))
        folder.parent.mkdir(parents=True, exist_ok=True)
        # Siblings of out_dir, so the renames stay on one filesystem; dot-prefixed so listings skip them.
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.new-", dir=folder.parent))
        try:
            _stage(staging, files)
            os.chmod(staging, 0o755)  # mkdtemp makes it 0700; a published report is meant to be read
            if folder.exists():
                retired = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old-", dir=folder.parent))
                os.rename(folder, retired / "report")
                os.rename(staging, folder)
                shutil.rmtree(retired)
            else:
                os.rename(staging, folder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return out
    index = storage.join(out, INDEX)
    before = storage.walk_files(out)
    _refuse_foreign(out, not before or index in before)
    with tempfile.TemporaryDirectory(prefix="gem-publish-") as tmp:
        staging = Path(tmp)
        _stage(staging, {rel: data for rel, data in files.items() if rel != INDEX})
        storage.upload_folder(staging, out)
    storage.write(index, files[INDEX])
    published = {storage.join(out, rel) for rel in files}
    for stale in before:
        if stale not in published:
            storage.delete(stale)
    return out
