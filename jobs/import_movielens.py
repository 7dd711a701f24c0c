"""Import a MovieLens ratings dataset (ml-1m or ml-100k) into the landing zone as ad events.

MovieLens gives real users, real items and real, skewed engagement; this job recasts it in the
landing contract (schemas.events.LANDING_EVENTS) so the whole pipeline can run on it unchanged.

    python -m jobs.import_movielens --path DIR [--config FILE]

DIR holds one of two layouts, detected from the files present (all latin-1 text, as published):
  ml-1m:   ratings.dat (UserID::MovieID::Rating::Timestamp), movies.dat (MovieID::Title::G1|G2|...),
           users.dat (UserID::Gender::Age::Occupation::Zip-code)
  ml-100k: u.data (user<TAB>item<TAB>rating<TAB>timestamp), u.user (id|age|gender|occupation|zip),
           u.item (id|title|release date|video release date|IMDb URL|19 genre flags, ML100K_GENRES order)

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

import argparse
import json
import re
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from datetime import date, timedelta
from functools import cache
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from gem.config import GemConfig, add_config_arg, load_config
from gem.landing import LandingFile, mark_partition_complete
from schemas.events import LANDING_EVENTS
from schemas.tasks import EVENT_TYPES

PRODUCER = "import_movielens"
# Name of the landing file in each ds folder: `ds=YYYY-MM-DD/movielens.json.gz`.
LANDING_FILE_NAME = "movielens"
SOURCE_ENCODING = "latin-1"

LANDING_COLUMNS: tuple[str, ...] = tuple(LANDING_EVENTS.column_names)

OBJECTIVE = "sales"
CREATIVE_TYPE = "video"
CONVERSION_TYPE = "offsite_purchase"
IMPRESSION_POSITION = 0
CLICK_MIN_RATING = 4
CONVERSION_MIN_RATING = 5
MIN_RATING, MAX_RATING = 1, 5

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
UNKNOWN_GENRE = "unknown"
UNKNOWN_DECADE = "unknown"

# The 19 genre flag columns of ml-100k's u.item, in file order (as listed in its u.genre).
ML100K_GENRES: tuple[str, ...] = (
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary",
    "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller",
    "War", "Western",
)  # fmt: skip

# Ratings buffered in memory before they are appended to the per-day spool files.
DEFAULT_SPOOL_BATCH = 500_000

_TITLE_YEAR = re.compile(r"\((\d{4})\)\s*$")
_EPOCH = date(1970, 1, 1)
_SECONDS_PER_DAY = 86_400


class MovieLensFormatError(ValueError):
    """The MovieLens folder is missing files, or a line does not match its file's format."""


# --------------------------------------------------------------------------------------------------
# Records read from the source files.


@dataclass(frozen=True)
class Rating:
    """One line of the ratings file: a user rated a movie 1-5 at an epoch-seconds timestamp."""

    user: int
    movie: int
    rating: int
    timestamp: int


@dataclass(frozen=True)
class Movie:
    """What the import needs of a movie: its first genre and release year."""

    movie: int
    first_genre: str
    year: int | None


@dataclass(frozen=True)
class User:
    """A user and their demographics, kept verbatim as landing user_attrs."""

    user: int
    attrs: dict[str, str]


@dataclass(frozen=True)
class Ad:
    """The ad fields of a movie, derived once per movie."""

    ad_id: str
    advertiser_id: str
    campaign_id: str
    surface: str


@dataclass(frozen=True)
class SourceFormat:
    """One MovieLens layout: its three file names and a line parser for each."""

    name: str
    ratings_file: str
    movies_file: str
    users_file: str
    parse_rating: Callable[[str], Rating]
    parse_movie: Callable[[str], Movie]
    parse_user: Callable[[str], User]

    @property
    def files(self) -> tuple[str, str, str]:
        return (self.ratings_file, self.movies_file, self.users_file)


# --------------------------------------------------------------------------------------------------
# Line parsers: each raises ValueError with what is wrong; the reader adds file and line number.


def _split_exact(line: str, sep: str, n_fields: int) -> list[str]:
    """The line's fields, or ValueError unless there are exactly n_fields."""
    fields = line.split(sep)
    if len(fields) != n_fields:
        raise ValueError(f"expected {n_fields} fields separated by {sep!r}, got {len(fields)}")
    return fields


def _parse_int(text: str, what: str) -> int:
    """A non-negative decimal integer field."""
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError(f"{what} {text!r} is not a non-negative integer")
    return int(text)


def _rating_from_fields(fields: Sequence[str]) -> Rating:
    """A Rating from its four text fields (user, movie, rating, timestamp), range-checked."""
    user = _parse_int(fields[0], "user id")
    movie = _parse_int(fields[1], "movie id")
    rating = _parse_int(fields[2], "rating")
    timestamp = _parse_int(fields[3], "timestamp")
    if not MIN_RATING <= rating <= MAX_RATING:
        raise ValueError(f"rating {rating} is outside {MIN_RATING}..{MAX_RATING}")
    return Rating(user=user, movie=movie, rating=rating, timestamp=timestamp)


def parse_ml1m_rating(line: str) -> Rating:
    """`UserID::MovieID::Rating::Timestamp`."""
    return _rating_from_fields(_split_exact(line, "::", 4))


def parse_ml1m_movie(line: str) -> Movie:
    """`MovieID::Title (YYYY)::Genre1|Genre2|...`; the year is read from the title."""
    movie_id, title, genres = _split_exact(line, "::", 3)
    match = _TITLE_YEAR.search(title)
    first_genre = genres.split("|")[0].strip() or UNKNOWN_GENRE
    return Movie(
        movie=_parse_int(movie_id, "movie id"),
        first_genre=first_genre,
        year=int(match.group(1)) if match else None,
    )


def parse_ml1m_user(line: str) -> User:
    """`UserID::Gender::Age::Occupation::Zip-code` (age and occupation are the dataset's codes)."""
    user_id, gender, age, occupation, zip_code = _split_exact(line, "::", 5)
    return User(
        user=_parse_int(user_id, "user id"),
        attrs={"gender": gender, "age": age, "occupation": occupation, "zip": zip_code},
    )


def parse_ml100k_rating(line: str) -> Rating:
    """`user id<TAB>item id<TAB>rating<TAB>timestamp`."""
    return _rating_from_fields(_split_exact(line, "\t", 4))


def _release_year(release_date: str) -> int | None:
    """The year of an ml-100k release date like `01-Jan-1995`; None when the date is empty."""
    if not release_date:
        return None
    year = release_date.rsplit("-", 1)[-1]
    if len(year) != 4 or not year.isdigit():
        raise ValueError(f"release date {release_date!r} is not DD-Mon-YYYY")
    return int(year)


def _first_flagged_genre(flags: Sequence[str]) -> str:
    """The first genre whose 0/1 flag is set, in ML100K_GENRES order."""
    for genre, flag in zip(ML100K_GENRES, flags):
        if flag not in ("0", "1"):
            raise ValueError(f"genre flag {genre!r} is {flag!r}, not 0 or 1")
    return next((g for g, f in zip(ML100K_GENRES, flags) if f == "1"), UNKNOWN_GENRE)


def parse_ml100k_movie(line: str) -> Movie:
    """`id|title|release date|video release date|IMDb URL|` then the 19 genre flags."""
    fields = _split_exact(line, "|", 5 + len(ML100K_GENRES))
    return Movie(
        movie=_parse_int(fields[0], "movie id"),
        first_genre=_first_flagged_genre(fields[5:]),
        year=_release_year(fields[2]),
    )


def parse_ml100k_user(line: str) -> User:
    """`user id|age|gender|occupation|zip code`."""
    user_id, age, gender, occupation, zip_code = _split_exact(line, "|", 5)
    return User(
        user=_parse_int(user_id, "user id"),
        attrs={"age": age, "gender": gender, "occupation": occupation, "zip": zip_code},
    )


ML_1M = SourceFormat(
    name="ml-1m",
    ratings_file="ratings.dat",
    movies_file="movies.dat",
    users_file="users.dat",
    parse_rating=parse_ml1m_rating,
    parse_movie=parse_ml1m_movie,
    parse_user=parse_ml1m_user,
)
ML_100K = SourceFormat(
    name="ml-100k",
    ratings_file="u.data",
    movies_file="u.item",
    users_file="u.user",
    parse_rating=parse_ml100k_rating,
    parse_movie=parse_ml100k_movie,
    parse_user=parse_ml100k_user,
)
SOURCE_FORMATS: tuple[SourceFormat, ...] = (ML_1M, ML_100K)


# --------------------------------------------------------------------------------------------------
# Reading the source folder.


def detect_format(path: str | Path) -> SourceFormat:
    """The layout whose files are in `path`; MovieLensFormatError naming what is missing otherwise."""
    folder = Path(path)
    if not folder.is_dir():
        raise MovieLensFormatError(f"MovieLens folder {folder} does not exist")
    complete = [f for f in SOURCE_FORMATS if all((folder / name).is_file() for name in f.files)]
    if len(complete) > 1:
        raise MovieLensFormatError(
            f"{folder} holds the files of several MovieLens layouts ({[f.name for f in complete]}); "
            "point --path at a folder with one"
        )
    if complete:
        return complete[0]
    partial = [f for f in SOURCE_FORMATS if any((folder / name).is_file() for name in f.files)]
    if partial:
        fmt = partial[0]
        missing = [name for name in fmt.files if not (folder / name).is_file()]
        raise MovieLensFormatError(f"{folder} looks like {fmt.name} but lacks {missing}")
    expected = "; ".join(f"{f.name}: {', '.join(f.files)}" for f in SOURCE_FORMATS)
    raise MovieLensFormatError(f"{folder} holds no MovieLens files; expected one of {expected}")


def _line_error(path: Path, line_number: int, problem: str, line: str) -> MovieLensFormatError:
    """The error for one bad source line, naming file, line number and the line itself."""
    return MovieLensFormatError(f"{path}, line {line_number}: {problem}: {line!r}")


def read_records(path: Path, parse: Callable[[str], Any]) -> Iterator[tuple[int, Any]]:
    """(line number, parsed record) for each non-blank line, streamed; bad lines raise with their place."""
    with open(path, encoding=SOURCE_ENCODING, newline="") as lines:
        for line_number, raw in enumerate(lines, start=1):
            line = raw.rstrip("\r\n")
            if not line.strip():
                continue
            try:
                record = parse(line)
            except ValueError as e:
                raise _line_error(path, line_number, str(e), line) from None
            yield line_number, record


def load_by_id(path: Path, parse: Callable[[str], Any], id_field: str) -> dict[int, Any]:
    """All records of a small file (movies, users) keyed by id; a repeated id is an error."""
    records: dict[int, Any] = {}
    for line_number, record in read_records(path, parse):
        key = getattr(record, id_field)
        if key in records:
            raise MovieLensFormatError(f"{path}, line {line_number}: {id_field} {key} appears twice")
        records[key] = record
    return records


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


def import_movielens(cfg: GemConfig, path: str | Path, spool_batch: int = DEFAULT_SPOOL_BATCH) -> dict[str, Any]:
    """Import the MovieLens folder `path` into cfg.landing_root; one landing file per UTC day.

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
        for ds in days:
            ratings = spool.read_day(ds)
            counts = write_day(cfg.landing_root, ds, ratings, ads, users)
            mark_partition_complete(cfg.landing_root, ds, day_manifest(fmt, len(ratings), counts))
            for event_type, n in counts.items():
                totals[event_type] += n
    return {"format": fmt.name, "ratings": n_ratings, "days": days, "events_by_type": totals}


# --------------------------------------------------------------------------------------------------
# CLI.


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m jobs.import_movielens",
        description="Import a MovieLens ml-1m or ml-100k folder into the landing zone as ad events.",
    )
    parser.add_argument(
        "--path", required=True, help="folder with ratings.dat, movies.dat, users.dat (ml-1m) or u.data, u.item, u.user"
    )
    add_config_arg(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the import; print the summary as JSON, or a one-line error and exit status 1."""
    args = parse_args(argv)
    cfg = load_config(args.config)
    try:
        summary = import_movielens(cfg, args.path)
    except MovieLensFormatError as e:
        print(f"import_movielens: {e}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
