"""MovieLens ratings recast as ad events in the landing contract (schemas.events.LANDING_EVENTS), so
the whole pipeline runs on real users, items and skewed engagement unchanged.

Conversion rules (fixed, so reruns are byte-identical):
  * every rating -> one impression at the rating's timestamp (epoch seconds -> ms), landed in
    `ds=` the UTC day of that timestamp, file `movielens.json.gz`;
    rating >= 4 -> also a click at the same time; rating 5 -> also a conversion at the same time
    with conversion_type CONVERSION_TYPE ("offsite_purchase": a 5-star rating stands for a purchase).
  * the ad is the movie: ad_id "m{movie}"; surface = GENRE_SURFACE[first genre] (FALLBACK_SURFACE for
    a genre not in the map); advertiser_id "adv-{first genre}"; campaign_id
    "cmp-{first genre}-{decade}" where the decade comes from the title's "(1995)" in ml-1m and from
    the release date in ml-100k ("unknown" when absent).
  * objective OBJECTIVE ("sales", the objective that optimises for purchases), creative_type
    CREATIVE_TYPE ("video": the ad is a trailer), position 0 on impressions and clicks, null on
    conversions (the landing contract: conversions have no slot).
  * user_id "u{user}"; user_attrs keep the demographics as the raw strings of the users file
    (ml-1m: gender, age code, occupation code, zip; ml-100k: age, gender, occupation, zip).
  * event_id "ml-{user}-{movie}-{event_type}": unique as MovieLens has one rating per (user, movie).
  * within a day file, events are ordered by (timestamp, user, movie), then impression, click,
    conversion; every written day gets a `_SUCCESS` marker whose manifest counts its events.

The ratings file is streamed: ratings are bucketed by UTC day into temporary spool files (under
$TMPDIR), and only one day's ratings are held in memory when its landing file is written. Movies
and users (tens of thousands of rows at most) are held in memory.

Example:
    >>> summary = import_movielens(cfg, "tests/fixtures/movielens/ml-1m")
    >>> summary["days"], summary["events_by_type"]
    (['2000-12-29', '2000-12-30', '2000-12-31'], {'impression': 10, 'click': 5, 'conversion': 3})
"""

from __future__ import annotations

import json
import re
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from datetime import date, timedelta
from functools import cache
from pathlib import Path
from typing import Any

from gem.config import GemConfig
from gem.lakehouse.landing import LandingFile, mark_partition_complete
from gem.progress import Progress
from gem.sources.movielens_format import (
    UNKNOWN_GENRE,
    Movie,
    MovieLensFormatError,
    Rating,
    SourceFormat,
    User,
    detect_format,
    load_by_id,
    read_records,
)
from schemas.events import LANDING_EVENTS
from schemas.tasks import EVENT_TYPES

PRODUCER = "import_movielens"
# Name of the landing file in each ds folder: `ds=YYYY-MM-DD/movielens.json.gz`.
LANDING_FILE_NAME = "movielens"

LANDING_COLUMNS: tuple[str, ...] = tuple(LANDING_EVENTS.column_names)

OBJECTIVE = "sales"
CREATIVE_TYPE = "video"
CONVERSION_TYPE = "offsite_purchase"
IMPRESSION_POSITION = 0
CLICK_MIN_RATING = 4
CONVERSION_MIN_RATING = 5

# The movie's first genre decides the surface it is shown on. Genres are spelled as in MovieLens.
GENRE_SURFACE: dict[str, str] = {
    "Action": "reels",
    "Adventure": "reels",
    "War": "reels",
    "Western": "reels",
    "Comedy": "fb_feed",
    "Romance": "fb_feed",
    "Musical": "fb_feed",
    "Drama": "ig_feed",
    "Crime": "ig_feed",
    "Film-Noir": "ig_feed",
    "Mystery": "ig_feed",
    "Thriller": "ig_feed",
    "Animation": "stories",
    "Children's": "stories",
    "Fantasy": "stories",
    "Documentary": "marketplace",
    "Horror": "marketplace",
    "Sci-Fi": "marketplace",
}
# Surface of a genre missing from GENRE_SURFACE (ml-100k's "unknown", or no genre at all).
FALLBACK_SURFACE = "audience_network"
UNKNOWN_DECADE = "unknown"

# Ratings buffered in memory before they are appended to the per-day spool files.
DEFAULT_SPOOL_BATCH = 500_000
_EPOCH = date(1970, 1, 1)
_SECONDS_PER_DAY = 86_400


@dataclass(frozen=True)
class Ad:
    """The ad fields of a movie, derived once per movie."""

    ad_id: str
    advertiser_id: str
    campaign_id: str
    surface: str


# --------------------------------------------------------------------------------------------------
# Mapping movies to ads.


def _id_slug(text: str) -> str:
    """A lower-case id fragment: `Children's` -> `childrens`, `Film-Noir` -> `film_noir`."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower().replace("'", "")).strip("_") or UNKNOWN_GENRE


def decade_label(year: int | None) -> str:
    """`1995` -> `1990s`; UNKNOWN_DECADE when the year is unknown."""
    return UNKNOWN_DECADE if year is None else f"{year // 10 * 10}s"


def ad_for_movie(movie: Movie) -> Ad:
    """The movie as an ad: surface from its first genre, advertiser by genre, campaign by genre+decade."""
    genre = _id_slug(movie.first_genre)
    return Ad(
        ad_id=f"m{movie.movie}",
        advertiser_id=f"adv-{genre}",
        campaign_id=f"cmp-{genre}-{decade_label(movie.year)}",
        surface=GENRE_SURFACE.get(movie.first_genre, FALLBACK_SURFACE),
    )


def _check_surfaces_configured(ads: dict[int, Ad], cfg: GemConfig) -> None:
    """Fail before writing anything if some movie lands on a surface the config does not run."""
    unconfigured = sorted({ad.surface for ad in ads.values()} - set(cfg.surfaces))
    if unconfigured:
        raise MovieLensFormatError(
            f"movies map to surfaces {unconfigured} that are not in the config's surfaces {list(cfg.surfaces)}"
        )


# --------------------------------------------------------------------------------------------------
# Ratings -> landing events.


@cache
def _ds_of_epoch_day(epoch_day: int) -> str:
    return (_EPOCH + timedelta(days=epoch_day)).isoformat()


def utc_day(timestamp_s: int) -> str:
    """The UTC calendar day (YYYY-MM-DD) of an epoch-seconds timestamp."""
    return _ds_of_epoch_day(timestamp_s // _SECONDS_PER_DAY)


def event_types_for_rating(rating: int) -> tuple[str, ...]:
    """Impression always; click from CLICK_MIN_RATING; conversion from CONVERSION_MIN_RATING."""
    types = ["impression"]
    if rating >= CLICK_MIN_RATING:
        types.append("click")
    if rating >= CONVERSION_MIN_RATING:
        types.append("conversion")
    return tuple(types)


def _as_landing_record(fields: dict[str, Any]) -> dict[str, Any]:
    """The fields in LANDING_EVENTS column order; any missing or extra column is a bug here."""
    if fields.keys() != set(LANDING_COLUMNS):
        raise AssertionError(f"landing record columns {sorted(fields)} != {sorted(LANDING_COLUMNS)}")
    return {name: fields[name] for name in LANDING_COLUMNS}


def rating_events(rating: Rating, ad: Ad, user_attrs: dict[str, str]) -> list[dict[str, Any]]:
    """The landing events of one rating, all at the rating's time, in EVENT_TYPES order."""
    events = []
    for event_type in event_types_for_rating(rating.rating):
        is_conversion = event_type == "conversion"
        events.append(
            _as_landing_record(
                {
                    "event_id": f"ml-{rating.user}-{rating.movie}-{event_type}",
                    "event_type": event_type,
                    "event_time": rating.timestamp * 1000,
                    "user_id": f"u{rating.user}",
                    "ad_id": ad.ad_id,
                    "advertiser_id": ad.advertiser_id,
                    "campaign_id": ad.campaign_id,
                    "objective": OBJECTIVE,
                    "creative_type": CREATIVE_TYPE,
                    "surface": ad.surface,
                    "position": None if is_conversion else IMPRESSION_POSITION,
                    "conversion_type": CONVERSION_TYPE if is_conversion else None,
                    "user_attrs": user_attrs,
                }
            )
        )
    return events


def landing_line(event: dict[str, Any]) -> str:
    """One compact JSON line; same event -> same bytes."""
    return json.dumps(event, separators=(",", ":"), ensure_ascii=True)


# --------------------------------------------------------------------------------------------------
# Streaming: bucket ratings by UTC day on disk, then write one landing file per day.


class DaySpool:
    """Ratings bucketed by UTC day in temporary files, so the ratings file is never in memory whole.

    Ratings are buffered per day and appended to `{folder}/{ds}.tsv` every `batch` ratings; files
    are opened only while flushing, so thousands of days need no more than one open file.
    """

    def __init__(self, folder: Path, batch: int = DEFAULT_SPOOL_BATCH):
        if batch < 1:
            raise ValueError(f"spool batch must be >= 1, got {batch}")
        self.folder = folder
        self.batch = batch
        self._buffer: dict[str, list[str]] = defaultdict(list)
        self._buffered = 0
        self._days: set[str] = set()

    def add(self, rating: Rating) -> None:
        self._buffer[utc_day(rating.timestamp)].append(
            f"{rating.timestamp}\t{rating.user}\t{rating.movie}\t{rating.rating}\n"
        )
        self._buffered += 1
        if self._buffered >= self.batch:
            self.flush()

    def flush(self) -> None:
        for ds, lines in self._buffer.items():
            with open(self.folder / f"{ds}.tsv", "a", encoding="ascii") as spool:
                spool.writelines(lines)
            self._days.add(ds)
        self._buffer.clear()
        self._buffered = 0

    def days(self) -> list[str]:
        """Every day that received a rating, ascending (flushes first)."""
        self.flush()
        return sorted(self._days)

    def read_day(self, ds: str) -> list[Rating]:
        """The day's ratings ordered by (timestamp, user, movie): independent of source line order."""
        ratings = []
        with open(self.folder / f"{ds}.tsv", encoding="ascii") as spool:
            for line in spool:
                timestamp, user, movie, rating = (int(v) for v in line.split("\t"))
                ratings.append(Rating(user=user, movie=movie, rating=rating, timestamp=timestamp))
        ratings.sort(key=lambda r: (r.timestamp, r.user, r.movie, r.rating))
        return ratings


def spool_ratings(
    path: Path, fmt: SourceFormat, movies: dict[int, Movie], users: dict[int, User], spool: DaySpool
) -> int:
    """Stream the ratings file into the spool, checking each rating's movie and user exist."""
    count = 0
    for line_number, rating in read_records(path, fmt.parse_rating):
        if rating.movie not in movies:
            raise MovieLensFormatError(f"{path}, line {line_number}: movie {rating.movie} is not in {fmt.movies_file}")
        if rating.user not in users:
            raise MovieLensFormatError(f"{path}, line {line_number}: user {rating.user} is not in {fmt.users_file}")
        spool.add(rating)
        count += 1
    return count


def _zero_counts() -> dict[str, int]:
    return {event_type: 0 for event_type in EVENT_TYPES}


def write_day(
    landing_root: str, ds: str, ratings: list[Rating], ads: dict[int, Ad], users: dict[int, User]
) -> dict[str, int]:
    """Write one day's landing file (published atomically) and return its events per type.

    The day's lines are compressed in one block: the day is in memory already, and one large
    gzip write is much faster than one per line.
    """
    counts = _zero_counts()
    lines = []
    for rating in ratings:
        for event in rating_events(rating, ads[rating.movie], users[rating.user].attrs):
            lines.append(landing_line(event) + "\n")
            counts[event["event_type"]] += 1
    with LandingFile(landing_root, ds, LANDING_FILE_NAME) as landing:
        landing.write_text("".join(lines), len(lines))
    return counts


def day_manifest(fmt: SourceFormat, ratings: int, counts: dict[str, int]) -> dict[str, Any]:
    """The `_SUCCESS` body of one imported day: who wrote it, from what, and how many events."""
    return {"producer": PRODUCER, "source_format": fmt.name, "ratings": ratings, "events_by_type": counts}


def import_movielens(cfg: GemConfig, path: str | Path, spool_batch: int = DEFAULT_SPOOL_BATCH,
                     progress: bool = False) -> dict[str, Any]:
    """Import the MovieLens folder `path` into cfg.landing_root; one landing file per UTC day
    (`progress`: the days written, as a bar on a terminal, plain lines on stderr otherwise).

    Returns a summary: {"format", "ratings", "days" (written, ascending), "events_by_type"}.
    Every file is checked before the first landing file is written, except the ratings file, which
    is checked while it is spooled (still before any landing file is written).
    """
    folder = Path(path)
    fmt = detect_format(folder)
    movies: dict[int, Movie] = load_by_id(folder / fmt.movies_file, fmt.parse_movie, "movie")
    users: dict[int, User] = load_by_id(folder / fmt.users_file, fmt.parse_user, "user")
    ads = {movie_id: ad_for_movie(movie) for movie_id, movie in movies.items()}
    _check_surfaces_configured(ads, cfg)

    totals = _zero_counts()
    with tempfile.TemporaryDirectory(prefix="movielens-spool-") as spool_dir:
        spool = DaySpool(Path(spool_dir), batch=spool_batch)
        n_ratings = spool_ratings(folder / fmt.ratings_file, fmt, movies, users, spool)
        days = spool.days()
        bar = Progress(len(days), "import", "day") if progress else None
        for ds in days:
            ratings = spool.read_day(ds)
            counts = write_day(cfg.landing_root, ds, ratings, ads, users)
            mark_partition_complete(cfg.landing_root, ds, day_manifest(fmt, len(ratings), counts))
            for event_type, n in counts.items():
                totals[event_type] += n
            if bar is not None:
                bar.update(ds=ds)
        if bar is not None:
            bar.close()
    return {"format": fmt.name, "ratings": n_ratings, "days": days, "events_by_type": totals}
