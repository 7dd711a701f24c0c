"""Offline Data Docs: pinned copies of the CSS, JS and fonts GX pages load, and the page rewrite.

Great Expectations 1.24 renders Data Docs pages that load jQuery, Bootstrap, bootstrap-table,
Font Awesome, vega and a logo from public CDNs, so a site opened without internet is unstyled
and every page view calls out. Here:

1. `fetch_assets` gets the files pinned in infra/dq_assets/assets.txt once, at set-up (`make setup`
   runs infra/dq_assets/fetch.sh, i.e. `python -m gem.quality.docs_assets --fetch`): `npm pack` per
   package, every file checked against its sha384, kept in `cfg.quality.docs_assets_dir`.
2. `install_assets` copies them into a site's `static/vendor/<package>@<version>/<file>`
   (package-internal paths kept, so Font Awesome's CSS finds its ../webfonts/).
3. `localize_site` rewrites every external reference of every HTML and CSS file of the site:
   a pinned CDN file becomes a relative link to its local copy (integrity/crossorigin dropped, as
   file:// pages cannot satisfy CORS), a GX image becomes the site's own static/images copy, and
   anything else is removed (links to GX's website lose their href, unknown scripts and
   stylesheets are dropped, a remote CSS `url(...)` becomes `none`). A reference left behind is a
   bug and raises.
"""

from __future__ import annotations

import base64
import filecmp
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import typer

from gem.command_line import ConfigOption, job_app, run_command
from gem.config import REPO_ROOT, load_config

ASSET_MANIFEST = REPO_ROOT / "infra" / "dq_assets" / "assets.txt"
# Where vendored files live inside a Data Docs site.
SITE_VENDOR_DIR = Path("static") / "vendor"
SITE_IMAGES_DIR = Path("static") / "images"
# Files of a site whose references are rewritten and scanned.
PAGE_SUFFIXES = (".html", ".css")


class MissingDocsAssetsError(RuntimeError):
    """The pinned Data Docs assets are not in the cache folder: `make setup` has not fetched them."""


class ExternalReferenceError(RuntimeError):
    """A Data Docs file still loads something remote after localisation (a bug in the rewrite)."""


@dataclass(frozen=True)
class VendoredFile:
    """One pinned file: which package it comes from, its digest, and the CDN reference it replaces."""

    package: str  # "name@version", e.g. "@fortawesome/fontawesome-free@6.6.0"
    path: str  # inside the package tarball, without the leading "package/"
    sha384: str  # SRI form: "sha384-<base64>"
    replaces: str | None  # URL path of the CDN reference; None for files other vendored files load

    @property
    def vendor_path(self) -> str:
        """Relative location under a vendor folder: `<package>@<version>/<path>`."""
        return f"{self.package}/{self.path}"


# --------------------------------------------------------------------------------------------------
# The pinned list.


def load_manifest(path: Path = ASSET_MANIFEST) -> tuple[VendoredFile, ...]:
    """Parse the tab-separated asset list; `#` lines are comments."""
    files = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 4:
            raise ValueError(f"{path}:{number}: expected 4 tab-separated fields, got {len(fields)}")
        package, file, digest, replaces = (f.strip() for f in fields)
        files.append(VendoredFile(package, file, digest, None if replaces == "-" else replaces))
    return tuple(files)


def sri_sha384(data: bytes) -> str:
    """The Subresource-Integrity form of a SHA-384 digest, as browsers and the list write it."""
    return "sha384-" + base64.b64encode(hashlib.sha384(data).digest()).decode("ascii")


def _is_intact(path: Path, file: VendoredFile) -> bool:
    return path.is_file() and sri_sha384(path.read_bytes()) == file.sha384


def missing_assets(cache_dir: str | Path, files: Sequence[VendoredFile]) -> list[VendoredFile]:
    """The pinned files absent from the cache or not matching their digest."""
    root = Path(cache_dir)
    return [f for f in files if not _is_intact(root / f.vendor_path, f)]


# --------------------------------------------------------------------------------------------------
# Fetching (set-up time only: needs npm and the package registry).


def _npm_pack(package: str, dest: Path) -> Path:
    """Download one package tarball with `npm pack` (npm checks the registry's integrity)."""
    out = subprocess.run(
        ["npm", "pack", package, "--silent", "--pack-destination", str(dest)],
        check=True,
        capture_output=True,
        text=True,
    )
    name = out.stdout.strip().splitlines()[-1]
    return dest / name


def _extract_checked(tarball: Path, files: Iterable[VendoredFile], cache_dir: Path) -> None:
    """Copy the listed members of a package tarball into the cache, refusing any digest mismatch."""
    with tarfile.open(tarball, "r:gz") as archive:
        for file in files:
            member = archive.extractfile(f"package/{file.path}")
            if member is None:
                raise MissingDocsAssetsError(f"{file.package} has no file {file.path}")
            data = member.read()
            if sri_sha384(data) != file.sha384:
                raise MissingDocsAssetsError(
                    f"{file.package}/{file.path}: digest {sri_sha384(data)} != pinned {file.sha384}"
                )
            target = cache_dir / file.vendor_path
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".partial")
            partial.write_bytes(data)
            partial.replace(target)


def fetch_assets(cache_dir: str | Path, files: Sequence[VendoredFile]) -> list[str]:
    """Fetch every package with a missing or damaged file; returns the packages fetched."""
    root = Path(cache_dir)
    wanted: dict[str, list[VendoredFile]] = {}
    for file in missing_assets(root, files):
        wanted.setdefault(file.package, []).append(file)
    if not wanted:
        return []
    if shutil.which("npm") is None:
        raise MissingDocsAssetsError("npm is not installed; it is needed once to fetch the Data Docs assets")
    with tempfile.TemporaryDirectory(prefix="dq_assets_") as tmp:
        for package, package_files in wanted.items():
            _extract_checked(_npm_pack(package, Path(tmp)), package_files, root)
    return sorted(wanted)


# --------------------------------------------------------------------------------------------------
# Into a site.


def install_assets(site_dir: str | Path, cache_dir: str | Path, files: Sequence[VendoredFile]) -> None:
    """Copy the pinned files from the cache into the site's static/vendor/ (only what differs)."""
    missing = missing_assets(cache_dir, files)
    if missing:
        names = ", ".join(sorted({f.package for f in missing}))
        raise MissingDocsAssetsError(
            f"Data Docs assets missing from {cache_dir} ({names}); run `make setup` once "
            f"(it runs `python -m gem.quality.docs_assets --fetch`)"
        )
    for file in files:
        source = Path(cache_dir) / file.vendor_path
        target = Path(site_dir) / SITE_VENDOR_DIR / file.vendor_path
        if target.is_file() and filecmp.cmp(source, target, shallow=False):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)


# --------------------------------------------------------------------------------------------------
# Rewriting references.

_REMOTE = r"(?:https?:)?//[^\"'\s>)]+"
# Resource-loading or navigating references: attributes, CSS url(...) and @import.
_ATTR_REF = re.compile(rf"""\b(?:src|href|srcset|poster|data)\s*=\s*(["']?)\s*({_REMOTE})""", re.IGNORECASE)
_CSS_URL_REF = re.compile(rf"""url\(\s*(["']?)({_REMOTE})\1\s*\)""", re.IGNORECASE)
_CSS_IMPORT_REF = re.compile(rf"""@import\s+(?:url\(\s*)?(["']?)({_REMOTE})""", re.IGNORECASE)

_SCRIPT_ELEMENT = re.compile(r"<script\b(?P<attrs>[^>]*)>(?P<body>.*?)</script\s*>", re.IGNORECASE | re.DOTALL)
_OPEN_TAG = re.compile(
    r"<(?P<name>link|a|img|source|iframe|embed|video|audio)\b(?P<attrs>[^>]*)>", re.IGNORECASE | re.DOTALL
)
_URL_ATTR = re.compile(rf"""(?P<attr>\b(?:src|href)\s*=\s*)(?P<q>["'])(?P<url>{_REMOTE})(?P=q)""", re.IGNORECASE)
_SRI_ATTRS = re.compile(r"""\s+(?:integrity|crossorigin)(?:\s*=\s*(?:"[^"]*"|'[^']*'|[^\s>]+))?""", re.IGNORECASE)
_CSS_URL = re.compile(rf"""url\(\s*(?P<q>["']?)(?P<url>{_REMOTE})(?P=q)\s*\)""", re.IGNORECASE)
_CSS_IMPORT = re.compile(rf"""@import\s+(?:url\(\s*)?["']?{_REMOTE}["']?\s*\)?[^;]*;""", re.IGNORECASE)


def external_references(text: str) -> list[str]:
    """Every remote URL the text would load or link to (src/href/srcset/url()/@import)."""
    found = []
    for pattern in (_ATTR_REF, _CSS_URL_REF, _CSS_IMPORT_REF):
        found.extend(m.group(2) for m in pattern.finditer(text))
    return found


@dataclass(frozen=True)
class _Resolver:
    """Maps a remote URL to a local file of the site, relative to the page that references it."""

    site_dir: Path
    by_url_path: dict[str, VendoredFile]

    def local_target(self, url: str) -> Path | None:
        path = urlsplit(url if "://" in url else "https:" + url).path
        file = self.by_url_path.get(path)
        if file is not None:
            return self.site_dir / SITE_VENDOR_DIR / file.vendor_path
        image = self.site_dir / SITE_IMAGES_DIR / Path(path).name
        return image if Path(path).name and image.is_file() else None

    def relative(self, url: str, page: Path) -> str | None:
        target = self.local_target(url)
        if target is None:
            return None
        return Path(os.path.relpath(target, page.parent)).as_posix()


def _rewrite_scripts(text: str, page: Path, resolver: _Resolver) -> str:
    """<script src=remote>: point at the local copy, or drop the element when there is none."""

    def one(match: re.Match[str]) -> str:
        attrs = match.group("attrs")
        ref = _URL_ATTR.search(attrs)
        if ref is None:
            return match.group(0)
        local = resolver.relative(ref.group("url"), page)
        if local is None:
            return ""
        attrs = _SRI_ATTRS.sub("", _URL_ATTR.sub(rf"\g<attr>\g<q>{local}\g<q>", attrs, count=1))
        return f"<script{attrs}>{match.group('body')}</script>"

    return _SCRIPT_ELEMENT.sub(one, text)


def _rewrite_tags(text: str, page: Path, resolver: _Resolver) -> str:
    """Stylesheets, images and links: local copy if pinned; else links lose href, the rest go."""

    def one(match: re.Match[str]) -> str:
        name, attrs = match.group("name"), match.group("attrs")
        ref = _URL_ATTR.search(attrs)
        if ref is None:
            return match.group(0)
        local = resolver.relative(ref.group("url"), page)
        if local is not None:
            attrs = _SRI_ATTRS.sub("", _URL_ATTR.sub(rf"\g<attr>\g<q>{local}\g<q>", attrs, count=1))
            return f"<{name}{attrs}>"
        if name.lower() == "a":
            return f"<{name}{_URL_ATTR.sub('', attrs, count=1)}>"
        return ""

    return _OPEN_TAG.sub(one, text)


def _rewrite_css(text: str, page: Path, resolver: _Resolver) -> str:
    """CSS (files or inline <style>): url(remote) -> local copy or `none`; remote @import dropped."""

    def one_url(match: re.Match[str]) -> str:
        local = resolver.relative(match.group("url"), page)
        return f"url('{local}')" if local is not None else "none"

    return _CSS_URL.sub(one_url, _CSS_IMPORT.sub("", text))


def localize_text(text: str, page: Path, resolver: _Resolver) -> str:
    """All rewrites for one file's text (page is its path, for relative links)."""
    return _rewrite_css(_rewrite_tags(_rewrite_scripts(text, page, resolver), page, resolver), page, resolver)


def site_files(site_dir: str | Path) -> list[Path]:
    """The site's HTML and CSS files (vendored ones included), in a stable order."""
    return sorted(p for p in Path(site_dir).rglob("*") if p.is_file() and p.suffix in PAGE_SUFFIXES)


def remote_references(site_dir: str | Path) -> dict[str, list[str]]:
    """Remote URLs each HTML/CSS file of the site would load or link to, by relative path; empty
    when the site is fully offline."""
    site = Path(site_dir)
    found = {str(p.relative_to(site)): external_references(p.read_text(encoding="utf-8")) for p in site_files(site)}
    return {page: refs for page, refs in found.items() if refs}


def localize_site(site_dir: str | Path, files: Sequence[VendoredFile]) -> int:
    """Rewrite every HTML/CSS file outside static/vendor so nothing remote is loaded; returns how
    many files changed. Raises ExternalReferenceError if any file of the site (vendored ones
    included) still references a remote URL afterwards."""
    site = Path(site_dir)
    resolver = _Resolver(site, {f.replaces: f for f in files if f.replaces})
    vendor = site / SITE_VENDOR_DIR
    changed = 0
    for page in site_files(site):
        if vendor in page.parents:
            continue
        text = page.read_text(encoding="utf-8")
        localized = localize_text(text, page, resolver) if "//" in text else text
        if localized != text:
            page.write_text(localized, encoding="utf-8")
            changed += 1
    leftovers = remote_references(site)
    if leftovers:
        raise ExternalReferenceError(f"Data Docs files still reference remote URLs: {leftovers}")
    return changed


# --------------------------------------------------------------------------------------------------
# Command line: `python -m gem.quality.docs_assets --fetch` (set-up) or `--check`.


def command_line(
    config: ConfigOption = None,
    fetch: Annotated[bool, typer.Option("--fetch", help="fetch missing assets (npm pack) into the cache")] = False,
    check: Annotated[bool, typer.Option("--check", help="exit 1 if any pinned asset is missing")] = False,
    dest: Annotated[str | None, typer.Option(help="cache folder (default: quality.docs_assets_dir)")] = None,
) -> int:
    if fetch == check:
        raise typer.BadParameter("give one of --fetch and --check", param_hint="--fetch / --check")
    cache_dir = dest or load_config(config).quality.docs_assets_dir
    files = load_manifest()
    if fetch:
        fetched = fetch_assets(cache_dir, files)
        print(f"Data Docs assets in {cache_dir}: fetched {fetched or 'nothing (all present)'}")
    missing = missing_assets(cache_dir, files)
    if missing:
        print(f"missing Data Docs assets in {cache_dir}: {[f.vendor_path for f in missing]}", file=sys.stderr)
        return 1
    print(f"all {len(files)} pinned Data Docs assets present in {cache_dir}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    app = job_app("python -m gem.quality.docs_assets")
    app.command(help="Fetch or check the pinned Data Docs assets.")(command_line)
    return run_command(app, argv)


if __name__ == "__main__":
    sys.exit(main())
