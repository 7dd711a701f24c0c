"""Parsers for the two published MovieLens layouts (ml-1m, ml-100k), detected from the files present
(all latin-1 text):

  ml-1m:   ratings.dat (UserID::MovieID::Rating::Timestamp), movies.dat (MovieID::Title::G1|G2|...),
           users.dat (UserID::Gender::Age::Occupation::Zip-code)
  ml-100k: u.data (user<TAB>item<TAB>rating<TAB>timestamp), u.user (id|age|gender|occupation|zip),
           u.item (id|title|release date|video release date|IMDb URL|19 genre flags, ML100K_GENRES order)

A malformed line raises MovieLensFormatError naming the file, the line number and the problem.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SOURCE_ENCODING = "latin-1"
UNKNOWN_GENRE = "unknown"

# The 19 genre flag columns of ml-100k's u.item, in file order (as listed in its u.genre).
ML100K_GENRES: tuple[str, ...] = (
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary",
    "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller",
    "War", "Western",
)  # fmt: skip

_TITLE_YEAR = re.compile(r"\((\d{4})\)\s*$")

MIN_RATING, MAX_RATING = 1, 5


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
