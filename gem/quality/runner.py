"""Great Expectations 1.x runner: one suite on one DataFrame, results and offline Data Docs.

`validate` runs one suite (gem.quality.expectations, .bronze, .silver) on one DataFrame (Spark;
pandas for one-row statistics) through a GX checkpoint in a file-backed context at `cfg.gx_root`
(so results and Data Docs persist), with suites, validation definitions and checkpoints
add-or-update'd so reruns are idempotent. A failed critical expectation raises `DataQualityError`;
warnings are only reported. Data Docs are made to render offline by gem.quality.docs_assets
(pinned vendored CSS/JS, no remote URL left in any page).

GX's file context needs a local folder. A `gx_root` on an object store (the lakehouse on S3) is
worked on in a local copy (`local_root`: the system temp folder, keyed by the gx_root), under the
same project lock: the published files (each suite's expectations, the stored results and the Data
Docs site) missing from the copy are fetched at the start, and the files the work changed are
published back after it, the site's index.html last (`_project`). GX's own configuration, data
sources and checkpoints stay per copy: every validation adds or updates its own.

Concurrent validations on several hosts lose nothing: every result, and its page, is a file of its
own (suite, run name and run time in its name), so no upload replaces another validation's. The
site index is re-rendered from every result the copy holds, and `build_data_docs` fetches the
results published meanwhile and re-renders it, so an index written by a validation that ran beside
another is completed by the next one (jobs call it after their validations).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from gem import storage
from gem.config import GemConfig
from gem.quality import docs_assets, masking
from gem.quality.gate import GateError, GateFailure

if TYPE_CHECKING:
    import pandas as pd
    from great_expectations.core.expectation_validation_result import (
        ExpectationValidationResult,
    )
    from great_expectations.data_context import FileDataContext
    from great_expectations.expectations import Expectation
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

# Great Expectations and pandas are imported in the functions that use them: each takes seconds to
# import, and gem.quality.results (the run report) imports this module for its paths alone.

DATASOURCE_NAME = "gem_spark"
# Tiny frames (one-row statistics) validate in pandas: GX runs ~2 Spark jobs per expectation,
# seconds of latency for a single row.
PANDAS_DATASOURCE_NAME = "gem_pandas"
BATCH_DEFINITION_NAME = "whole_dataframe"
DOCS_SITE_NAME = "local_site"
# Where the file context keeps its Data Docs site and its validation results, relative to cfg.gx_root.
DOCS_SITE_DIR = Path("uncommitted") / "data_docs" / DOCS_SITE_NAME
RESULTS_DIR = Path("uncommitted") / "validations"
EXPECTATIONS_DIR = Path("expectations")
# What a project on an object store publishes to its gx_root and fetches from it (module docstring).
PUBLISHED_DIRS = (EXPECTATIONS_DIR, RESULTS_DIR, DOCS_SITE_DIR)
# An exclusive flock on this file (in the GX project folder) serializes processes using the project.
PROJECT_LOCK_FILE = ".gem-project.lock"
# In a local copy of a project on an object store: the published files known to match the store
# (relative path -> size, modification time and sha256), so only what changed is uploaded.
PUBLISHED_STATE_FILE = ".gem-published.json"
# How many offending values a result (and an error message) shows per expectation.
SAMPLE_SIZE = 10


class DataQualityError(GateError):
    """One or more critical expectations failed; `reports` hold the full outcome, and the message
    ends with one line per failed expectation (gem.quality.gate)."""

    def __init__(self, message: str, reports: Sequence[ValidationReport]) -> None:
        super().__init__(message, [o.failure(r.suite_name) for r in reports for o in r.failed_critical])
        self.reports = tuple(reports)


# --------------------------------------------------------------------------------------------------
# Validation.


@dataclass(frozen=True)
class ExpectationOutcome:
    """One expectation's result, reduced to what a log line or an error message needs."""

    rule: str
    expectation_type: str
    critical: bool
    success: bool
    expected: str
    observed: str
    found: str = ""  # the value that broke the bound (the worst group's, for a group query)
    bound: str = ""  # the bound in words
    setting: str = ""  # the config key that sets the bound, or the contract that does

    def describe(self) -> str:
        level = "CRITICAL" if self.critical else "WARNING"
        return f"[{level}] {self.rule} ({self.expectation_type}; expected {self.expected}): {self.observed}"

    def failure(self, suite_name: str) -> GateFailure:
        return GateFailure(f"{suite_name}/{self.rule}", self.found or self.observed, self.bound or self.expected,
                           self.setting or "the expectation itself (no setting)")


@dataclass(frozen=True)
class ValidationReport:
    """Outcome of one suite on one batch, and where GX stored it."""

    suite_name: str
    batch_label: str
    success: bool
    outcomes: tuple[ExpectationOutcome, ...]
    result_path: str  # the validation result JSON under cfg.gx_root (a URI on an object store)
    docs_page: str  # its Data Docs page under cfg.gx_root
    seconds: float
    failed_critical: tuple[ExpectationOutcome, ...] = field(init=False)
    failed_warnings: tuple[ExpectationOutcome, ...] = field(init=False)

    def __post_init__(self) -> None:
        failed = [o for o in self.outcomes if not o.success]
        object.__setattr__(self, "failed_critical", tuple(o for o in failed if o.critical))
        object.__setattr__(self, "failed_warnings", tuple(o for o in failed if not o.critical))

    def summary(self) -> str:
        passed = sum(o.success for o in self.outcomes)
        return (
            f"{self.suite_name} [{self.batch_label}]: {passed}/{len(self.outcomes)} expectations passed, "
            f"{len(self.failed_critical)} critical failed, {len(self.failed_warnings)} warnings "
            f"({self.seconds:.1f}s)"
        )


def local_root(cfg: GemConfig) -> Path:
    """The GX project folder this machine works in: cfg.gx_root itself when it is local; for an
    object store, a local copy in the system temp folder named by a digest of the gx_root (the
    module docstring says how it is kept in step)."""
    if storage.is_local(cfg.gx_root):
        return storage.local_path(storage.normalized(cfg.gx_root))
    digest = hashlib.sha256(storage.normalized(cfg.gx_root).encode("utf-8")).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "gem-gx" / digest


def _published(cfg: GemConfig, local: Path) -> str:
    """Where a file of the local project folder is published under cfg.gx_root."""
    return storage.join(cfg.gx_root, local.relative_to(local_root(cfg)).as_posix())


def _docs_site_config() -> dict[str, Any]:
    """The one Data Docs site: no how-to buttons (they link out and clutter a pipeline's docs)."""
    return {
        "class_name": "SiteBuilder",
        "show_how_to_buttons": False,
        "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": f"{DOCS_SITE_DIR}/"},
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
    }


def _progress_bars_on(bars: Any) -> bool:
    """Whether GX would draw progress bars (its config holds a dict once read back from YAML)."""
    if bars is None:
        return True
    if isinstance(bars, Mapping):
        return bool(bars.get("globally", True) or bars.get("metric_calculations", True))
    return bool(bars.globally or bars.metric_calculations)


@contextmanager
def project_lock(cfg: GemConfig) -> Iterator[None]:
    """Hold the GX project for one process at a time (an exclusive flock on a file beside it).

    GX's file stores are not safe for concurrent writers: a process that loaded the project before
    another saved the same suite's validation definition fails on its own save (e.g. a backfill and
    a daily run ingesting at once: CheckpointRelatedResourcesFreshnessError
    "ValidationDefinition 'bronze.ad_events.schema' has changed since it has last been saved"), and
    both rewrite the Data Docs index. Validations are seconds long, so runs simply queue here.
    For a gx_root on an object store the lock covers this machine's copy (`local_root`)."""
    root = local_root(cfg)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / PROJECT_LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _published_files(root: Path) -> list[Path]:
    """The files of a local project that are published (hidden files, such as GX's store ids and
    temporary files, stay local)."""
    return sorted(p for d in PUBLISHED_DIRS if (root / d).is_dir() for p in (root / d).rglob("*")
                  if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts))


def _is_result(root: Path, path: Path) -> bool:
    return path.suffix == ".json" and (root / RESULTS_DIR) in path.parents


def _load_state(root: Path) -> dict[str, list[Any]]:
    path = root / PUBLISHED_STATE_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def _record(state: dict[str, list[Any]], root: Path, path: Path, digest: str) -> None:
    stat = path.stat()
    state[path.relative_to(root).as_posix()] = [stat.st_size, stat.st_mtime_ns, digest]


def _fetch(cfg: GemConfig, root: Path, state: dict[str, list[Any]]) -> list[Path]:
    """Fetch the published files the local copy lacks; returns them (results included)."""
    fetched = []
    for folder in PUBLISHED_DIRS:
        for path in storage.download_missing(storage.join(cfg.gx_root, folder.as_posix()), root / folder):
            _record(state, root, path, _digest(path))
            fetched.append(path)
    return fetched


def _changed(root: Path, files: Sequence[Path], state: dict[str, list[Any]]) -> list[tuple[Path, str]]:
    """The `files` whose contents differ from what was last published or fetched, with their
    digests (GX rewrites its static files on every build: same bytes, new times)."""
    changed = []
    for path in files:
        rel, stat = path.relative_to(root).as_posix(), path.stat()
        known = state.get(rel)
        if known and known[:2] == [stat.st_size, stat.st_mtime_ns]:
            continue
        digest = _digest(path)
        if known and known[2] == digest:
            _record(state, root, path, digest)
        else:
            changed.append((path, digest))
    return changed


def _publish(cfg: GemConfig, root: Path, state: dict[str, list[Any]]) -> None:
    """Upload what changed in the local copy to cfg.gx_root, the site's index.html last (a reader
    of the new index finds every page it links to). Results are masked first: a validation killed
    before masking its result leaves a raw one, which must not leave this machine."""
    personal = masking.personal_columns()
    files = _published_files(root)
    for path in files:
        if _is_result(root, path) and path.relative_to(root).as_posix() not in state:
            _mask_stored(path, personal)
    changed = _changed(root, files, state)
    index = root / DOCS_SITE_DIR / "index.html"
    with tempfile.TemporaryDirectory(prefix="gem-gx-publish-") as tmp:
        for path, _ in changed:
            if path != index:
                staged = Path(tmp) / path.relative_to(root)
                staged.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, staged)
        storage.upload_folder(Path(tmp), cfg.gx_root)
    if any(path == index for path, _ in changed):
        storage.write(_published(cfg, index), index.read_bytes())
    for path, digest in changed:
        _record(state, root, path, digest)
    storage.write_json(root / PUBLISHED_STATE_FILE, state)


@contextmanager
def _project(cfg: GemConfig) -> Iterator[list[Path]]:
    """The local GX project under the project lock, yielding the results fetched from the store.

    For a gx_root on an object store: the published files the local copy lacks are fetched first,
    and what the block changed is published when it ends without an error (what a failed block
    left is published by the next one, its results masked). A local gx_root is used in place."""
    root = local_root(cfg)
    with project_lock(cfg):
        if storage.is_local(cfg.gx_root):
            yield []
            return
        state = _load_state(root)
        fetched = _fetch(cfg, root, state)
        storage.write_json(root / PUBLISHED_STATE_FILE, state)
        yield [p for p in fetched if _is_result(root, p)]
        _publish(cfg, root, state)


def open_context(cfg: GemConfig) -> FileDataContext:
    """The file-backed GX project in `local_root` (created on first use), configured for the
    pipeline: our Data Docs site, no progress bars. Only writes its YAML when something changed."""
    import great_expectations as gx  # noqa: PLC0415 - GX is slow to import (note at the top)
    from great_expectations.data_context.types.base import ProgressBarsConfig  # noqa: PLC0415 - the same

    root = local_root(cfg)
    root.mkdir(parents=True, exist_ok=True)
    context = gx.get_context(mode="file", context_root_dir=str(root))
    sites = context.list_data_docs_sites()
    if sites.get(DOCS_SITE_NAME) != _docs_site_config():
        if DOCS_SITE_NAME in sites:
            context.update_data_docs_site(DOCS_SITE_NAME, _docs_site_config())
        else:
            context.add_data_docs_site(DOCS_SITE_NAME, _docs_site_config())
    if _progress_bars_on(context.variables.progress_bars):
        context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        context.variables.save()
    return context


def docs_site_dir(cfg: GemConfig) -> Path:
    """The Data Docs site of the local project folder (`local_root`); for a gx_root on an object
    store the published site is `docs_site_uri`."""
    return local_root(cfg) / DOCS_SITE_DIR


def docs_site_uri(cfg: GemConfig) -> str:
    """Where the Data Docs site is published: under cfg.gx_root (a local folder or a URI)."""
    return storage.join(cfg.gx_root, DOCS_SITE_DIR.as_posix())


def results_uri(cfg: GemConfig) -> str:
    """Where the validation results are published (gem.quality.results reads a day's results there)."""
    return storage.join(cfg.gx_root, RESULTS_DIR.as_posix())


def _is_pandas(df: Any) -> bool:
    import pandas as pd  # noqa: PLC0415 - pandas is slow to import (note at the top)

    return isinstance(df, pd.DataFrame)


def _data_source(context: FileDataContext, pandas: bool) -> Any:
    """The Spark or the pandas data source, created once (re-adding one would drop its assets
    and orphan the stored checkpoints that use them)."""
    name = PANDAS_DATASOURCE_NAME if pandas else DATASOURCE_NAME
    try:
        return context.data_sources.get(name)
    except KeyError:
        if pandas:
            return context.data_sources.add_pandas(name=name)
        # persist=False: GX would cache every batch and never release it; see _cached.
        return context.data_sources.add_spark(name=name, persist=False)


def _batch_definition(context: FileDataContext, asset_name: str, pandas: bool) -> Any:
    """DataFrame asset `asset_name` and its whole-DataFrame batch definition, reused if present."""
    source = _data_source(context, pandas)
    try:
        asset = source.get_asset(asset_name)
    except LookupError:
        asset = source.add_dataframe_asset(name=asset_name)
    try:
        return asset.get_batch_definition(BATCH_DEFINITION_NAME)
    except KeyError:
        return asset.add_batch_definition_whole_dataframe(BATCH_DEFINITION_NAME)


def _fresh_copies(expectations: Sequence[Expectation]) -> list[Expectation]:
    """Copies without ids, so the same expectation objects can seed several suites or reruns."""
    return [e.copy(update={"id": None}) for e in expectations]


def _checkpoint(
    context: FileDataContext, suite_name: str, expectations: Sequence[Expectation], pandas: bool,
    result_format: dict[str, Any],
) -> Any:
    """Suite, validation definition and checkpoint for `suite_name` (no Data Docs action: `validate`
    renders the result's page after masking it)."""
    import great_expectations as gx  # noqa: PLC0415 - GX is slow to import (note at the top)

    suite = context.suites.add_or_update(gx.ExpectationSuite(name=suite_name, expectations=_fresh_copies(expectations)))
    definition = context.validation_definitions.add_or_update(
        gx.ValidationDefinition(name=suite_name, data=_batch_definition(context, suite_name, pandas), suite=suite)
    )
    return context.checkpoints.add_or_update(
        gx.Checkpoint(
            name=suite_name,
            validation_definitions=[definition],
            actions=[],  # validate() renders the page itself, once personal values are masked
            result_format=result_format,
        )
    )


def _result_format(expectations: Sequence[Expectation], df: Any) -> dict[str, Any]:
    """The checkpoint's result format. BASIC: counts and a sample of offending values, without
    SUMMARY's extra value-count query per expectation. SUMMARY on a pandas batch with `ds` (a
    statistics frame, a row per day): it keeps each offending value's day at no cost worth naming,
    where on Spark the days would cost a query per expectation. COMPLETE for a suite of row queries
    only: their rows (at most GX's 200, fetched anyway to count them) are kept, so a failure says
    which day broke the bound and by how much."""
    from great_expectations.expectations import UnexpectedRowsExpectation  # noqa: PLC0415 - GX is slow to import (note at the top)

    if expectations and all(isinstance(e, UnexpectedRowsExpectation) for e in expectations):
        return {"result_format": "COMPLETE"}
    if _is_pandas(df) and "ds" in df.columns:  # SUMMARY keeps the days; on a small frame its value counts cost nothing
        return {"result_format": "SUMMARY", "partial_unexpected_count": SAMPLE_SIZE, "unexpected_index_column_names": ["ds"]}
    return {"result_format": "BASIC", "partial_unexpected_count": SAMPLE_SIZE}


@contextmanager
def _cached(df: Any, cache: bool) -> Iterator[Any]:
    """Optionally cache `df` for the ~1.5 Spark jobs per expectation GX runs on it, releasing it
    afterwards unless the caller had cached it already. Off by default: on Parquet input,
    column-pruned rescans are as fast as a cache that holds every column."""
    if not cache or _is_pandas(df) or df.is_cached:
        yield df
        return
    df.persist()
    try:
        yield df
    finally:
        df.unpersist()


# Expectation arguments worth quoting in a message, in this order.
_EXPECTED_KWARGS = ("column_list", "type_", "value_set", "min_value", "max_value", "unexpected_rows_query")


def _expected(kwargs: Mapping[str, Any]) -> str:
    """What the expectation asked for, short enough for one line."""
    parts = [f"{k}={kwargs[k]!r}" for k in _EXPECTED_KWARGS if kwargs.get(k) is not None]
    text = ", ".join(parts) or "-"
    return text if len(text) <= 160 else text[:157] + "..."


def _exception_message(info: Mapping[str, Any]) -> str | None:
    """The message of an exception GX caught while validating, if any (GX 1.x keeps either one
    record or one per failed metric)."""
    records = [info] if "raised_exception" in info else [v for v in info.values() if isinstance(v, Mapping)]
    messages = [str(r.get("exception_message")) for r in records if r.get("raised_exception")]
    return "; ".join(messages) or None


def _observed(result: ExpectationValidationResult) -> str:
    """Observed value, or unexpected count with a sample, or the exception GX caught."""
    error = _exception_message(result.exception_info or {})
    if error:
        return f"error: {error}"
    r = result.result or {}
    if "unexpected_count" in r:
        sample = r.get("partial_unexpected_list") or []
        text = f"{r['unexpected_count']} of {r.get('element_count')} rows unexpected"
        return f"{text}, e.g. {sample[:SAMPLE_SIZE]}" if sample else text
    if "observed_value" in r:
        return f"observed {r['observed_value']!r}"
    return json.dumps(r, default=str)[:300]


def _value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _found(result: ExpectationValidationResult, measure: str | None) -> str:
    """What broke the bound, for the failure's line: a group query's worst group (its `measure`
    column and the others naming it, e.g. the day), or the offending values with their days."""
    r = result.result or {}
    rows = (r.get("details") or {}).get("unexpected_rows") or []
    if rows and isinstance(rows[0], Mapping):
        first = rows[0]
        others = ", ".join(f"{k}={_value(v)}" for k, v in first.items() if k != measure)
        text = f"{_value(first[measure])} ({others})" if measure in first else f"a row ({others})"
        more = int(r.get("observed_value") or len(rows)) - 1
        return f"{text}, and {more} more" if more > 0 else text
    indexed = r.get("partial_unexpected_index_list") or []
    if indexed and all(isinstance(i, Mapping) and "ds" in i for i in indexed):
        column = result.expectation_config.kwargs.get("column")
        return ", ".join(f"{_value(i.get(column))} (ds={i['ds']})" for i in indexed[:SAMPLE_SIZE])
    return ""


def _outcome(result: ExpectationValidationResult) -> ExpectationOutcome:
    config = result.expectation_config
    meta = config.meta or {}
    failed_by_exception = _exception_message(result.exception_info or {}) is not None
    return ExpectationOutcome(
        rule=str(meta.get("rule", config.type)),
        expectation_type=config.type,
        critical=bool(meta.get("critical", True)),  # unmarked expectations count as critical
        success=bool(result.success) and not failed_by_exception,
        expected=_expected(config.kwargs),
        observed=_observed(result),
        found="" if failed_by_exception else _found(result, meta.get("measure")),
        bound=str(meta.get("bound", "")),
        setting=str(meta.get("setting", "")),
    )


def _result_path(context: FileDataContext, key: Any) -> Path:
    """Where the validation result JSON of `key` is stored."""
    backend = context.validation_results_store.store_backend
    return Path(backend.full_base_directory) / backend._convert_key_to_filepath(key.to_tuple())


def _docs_page(context: FileDataContext, key: Any) -> Path:
    """Where the Data Docs page of the validation result `key` was rendered."""
    (site,) = context.get_docs_sites_urls(resource_identifier=key, site_name=DOCS_SITE_NAME)
    return Path(unquote(urlsplit(site["site_url"]).path))


def _mask_stored(result_path: Path, personal: frozenset[str]) -> None:
    """Mask the personal sample values in a stored validation result (JSON of the local project),
    replaced whole."""
    stored = json.loads(result_path.read_text())
    pairs = ((r.get("expectation_config", {}).get("kwargs", {}), r.get("result")) for r in stored.get("results", []))
    if masking.mask_suite_result(pairs, personal):
        storage.write(result_path, json.dumps(stored, indent=2))


def format_failures(reports: Sequence[ValidationReport]) -> str:
    """The DataQualityError message (before its failure lines): every failed critical expectation
    with what was observed, and the Data Docs page of each failed suite."""
    lines = [
        f"{r.suite_name} [{r.batch_label}] {o.describe()}" for r in reports for o in r.failed_critical
    ]
    pages = [f"Data Docs of {r.suite_name}: {r.docs_page}" for r in reports if r.failed_critical]
    return f"{len(lines)} critical expectation(s) failed:\n  " + "\n  ".join(lines + pages)


def raise_for_critical(reports: Sequence[ValidationReport]) -> None:
    """Raise DataQualityError naming every failed critical expectation across `reports`."""
    if any(r.failed_critical for r in reports):
        raise DataQualityError(format_failures(reports), reports)


def _check_run_name(batch_label: str) -> None:
    """Refuse a run name GX's Data Docs cannot render: its page title parses the run name as a time
    (dateutil), and a bare day range such as "2000-04-25..2003-02-28" parses to a time zone offset
    beyond a day, which fails the page. The stages name the stage first ("validate_silver:A..B")."""
    from dateutil.parser import ParserError, parse  # noqa: PLC0415 - GX's own dependency, only needed here

    try:
        parsed = parse(batch_label)
        parsed.utcoffset()  # an offset beyond a day fails here, or in the parse
    except (ParserError, OverflowError):
        return  # not a time: GX shows the run name as it is
    except ValueError as e:
        raise ValueError(f"batch label {batch_label!r} reads as an invalid time ({e}), which GX's Data Docs "
                         "cannot render; name the stage first, e.g. 'validate_silver:<days>'") from None


def validate(
    cfg: GemConfig,
    df: DataFrame | pd.DataFrame,
    suite_name: str,
    expectations: Sequence[Expectation],
    batch_label: str,
    raise_on_critical: bool = True,
    cache: bool = False,
) -> ValidationReport:
    """Validate `df` against `expectations` as suite `suite_name` through a GX checkpoint.

    `df` is a Spark DataFrame, or a pandas one for tiny frames (GX's Spark engine costs ~1.5
    Spark jobs per expectation, seconds even for one row). The result is stored under
    cfg.gx_root with run name `batch_label`, its Data Docs page and the site index are rendered and
    made offline, and (gx_root on an object store) published. Raises DataQualityError when a critical expectation fails,
    unless raise_on_critical is False (for callers that collect several reports first). `cache`
    persists `df` for the run: worth it when `df` is expensive to recompute or the suite queries it
    many times (each query expectation runs its own Spark jobs over it)."""
    from great_expectations.core.run_identifier import RunIdentifier  # noqa: PLC0415 - GX is slow to import (note at the top)

    started = time.perf_counter()
    _check_run_name(batch_label)
    assets = docs_assets.load_manifest()
    _require_docs_assets(cfg, assets)
    with _project(cfg):
        context = open_context(cfg)
        checkpoint = _checkpoint(context, suite_name, expectations, pandas=_is_pandas(df),
                                 result_format=_result_format(expectations, df))
        run_id = RunIdentifier(run_name=batch_label, run_time=dt.datetime.now(dt.UTC))
        with _cached(df, cache) as batch:
            result = checkpoint.run(batch_parameters={"dataframe": batch}, run_id=run_id)
        ((key, suite_result),) = result.run_results.items()
        # Personal sample values masked in memory (the messages) and in the stored result, then
        # its page rendered from the masked one (the checkpoint has no Data Docs action for that).
        personal = masking.personal_columns()
        masking.mask_suite_result(((r.expectation_config.kwargs, r.result) for r in suite_result.results), personal)
        result_path = _result_path(context, key)
        _mask_stored(result_path, personal)
        context.build_data_docs(site_names=[DOCS_SITE_NAME], resource_identifiers=[key])
        docs_page = _docs_page(context, key)
        _localize_docs(cfg, assets)
    report = ValidationReport(
        suite_name=suite_name,
        batch_label=batch_label,
        success=bool(suite_result.success),
        outcomes=tuple(_outcome(r) for r in suite_result.results),
        result_path=_published(cfg, result_path),
        docs_page=_published(cfg, docs_page),
        seconds=time.perf_counter() - started,
    )
    log.info(report.summary())
    if raise_on_critical:
        raise_for_critical([report])
    return report


# --------------------------------------------------------------------------------------------------
# Data Docs.


def _require_docs_assets(cfg: GemConfig, assets: Sequence[docs_assets.VendoredFile]) -> None:
    """Fail before validating if the pinned Data Docs assets were never fetched."""
    missing = docs_assets.missing_assets(cfg.quality.docs_assets_dir, assets)
    if missing:
        raise docs_assets.MissingDocsAssetsError(
            f"{len(missing)} pinned Data Docs assets missing from {cfg.quality.docs_assets_dir}; "
            "run `make setup` once (it runs `python -m gem.quality.docs_assets --fetch`)"
        )


def _localize_docs(cfg: GemConfig, assets: Sequence[docs_assets.VendoredFile]) -> None:
    """Vendor the pinned assets into the site and rewrite every remote reference to them."""
    site = docs_site_dir(cfg)
    docs_assets.install_assets(site, cfg.quality.docs_assets_dir, assets)
    docs_assets.localize_site(site, assets)


def build_data_docs(cfg: GemConfig, rebuild: bool = True) -> str:
    """Make the Data Docs site render offline and return its index.html (under cfg.gx_root: a
    local path, or a URI on an object store, where the site is published).

    rebuild=True re-renders every page from the stored suites and results first (time grows with
    the number of stored results); rebuild=False keeps the pages `validate` already rendered (it
    also refreshes the index), which is all a daily job needs; on an object store it renders the
    pages of results other hosts published meanwhile, and so the index of every result.
    Before a rebuild every stored result is masked (`_mask_stored`, a no-op on a masked one): a
    validation killed between GX storing its result and `validate` masking it left raw values."""
    assets = docs_assets.load_manifest()
    _require_docs_assets(cfg, assets)
    local_index = docs_site_dir(cfg) / "index.html"
    with _project(cfg) as fetched:
        if rebuild or not local_index.is_file():
            context = open_context(cfg)
            results = Path(context.validation_results_store.store_backend.full_base_directory)
            personal = masking.personal_columns()
            for stored in sorted(results.rglob("*.json")):
                _mask_stored(stored, personal)
            context.build_data_docs(site_names=[DOCS_SITE_NAME])
        elif fetched:  # results published elsewhere (already masked there): their pages and the index
            context = open_context(cfg)
            keys = [k for k in context.validation_results_store.list_keys() if _result_path(context, k) in fetched]
            context.build_data_docs(site_names=[DOCS_SITE_NAME], resource_identifiers=keys)
        _localize_docs(cfg, assets)
        if not local_index.is_file():
            raise FileNotFoundError(f"GX did not write {local_index}")
    return _published(cfg, local_index)
