"""Readers for the raw benchmark formats, each returning the same `RawData`.

A reader only parses: interactions in raw file order (so ties keep file order downstream), raw
timestamps when the format has them, each item's full attribute list and its primary category.
Filtering, ordering, remapping and splitting happen in `prepare.py`, identically for every source.

Primary category, the one categorical context feature a model sees, is chosen per format:
- MovieLens: the first genre in the file's genre order (u.genre for 100K, the pipe list for 1M).
- S3-Rec (Amazon, Yelp, LastFM): the item's attribute that is most frequent across the catalogue
  among those listed for fewer than half of the items (ties -> first listed; an item whose every
  attribute is that common keeps its most frequent one). Amazon lists put the brand first and
  brand ids share the category id space, so "first attribute" would often be a brand; the most
  frequent one is a broad category, but an attribute on every item (a root category some
  releases list) or on most of them (Yelp's attribute 1, on 69% of the businesses) separates nothing, so it is
  skipped. Beauty and LastFM have no attribute that common: their categories are those of the
  plain "most frequent" rule.
Items without any attribute get category "unknown" downstream.
Ids must fit in 64 bits; a malformed or out-of-range value is one `path:line: reason` error.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd


class DataError(ValueError):
    """A dataset is missing or malformed; the message tells the user what to do."""


INT64_MAX = 2**63 - 1
# An attribute listed for at least this share of the catalogue separates no items: never a category.
CATEGORY_SHARE = 0.5
S3REC_CATEGORY_RULE = (
    f"most catalogue-frequent attribute among those on < {CATEGORY_SHARE:.0%} of items "
    "(ties: first listed; none such: most frequent)"
)


@dataclass
class RawData:
    users: np.ndarray  # (N,) int64 raw user ids, raw file order
    items: np.ndarray  # (N,) int64 raw item ids
    timestamps: np.ndarray | None  # (N,) int64 unix seconds, or None when the format has none
    item_category: dict[int, str] = field(
        default_factory=dict
    )  # raw item -> primary category label
    item_attributes: dict[int, list[int]] = field(
        default_factory=dict
    )  # raw item -> all attribute ids
    category_rule: str = "none"  # how the primary category was chosen (recorded with the data)
    files: list[Path] = field(default_factory=list)  # raw files read (their hashes key the cache)


def _need(path: Path, dataset: str, hint: str) -> Path:
    if not path.is_file():
        raise DataError(f"dataset '{dataset}': expected file {path} is missing. {hint}")
    return path


def _first_existing(candidates: list[Path]) -> Path | None:
    return next((p for p in candidates if p.is_file()), None)


def _bad_integers(path: Path, sep: str, columns: int | None, exc: Exception) -> DataError:
    """The one-line error for a file of integer columns (None = all): the first line not int64."""
    text = path.read_text("utf-8", errors="replace")
    for lineno, line in enumerate(text.splitlines(), 1):
        for token in re.split(sep, line.strip())[:columns]:
            try:
                value = int(token)
            except ValueError:
                return DataError(f"{path}:{lineno}: expected integers, got {line[:60]!r}")
            if abs(value) > INT64_MAX:
                return DataError(f"{path}:{lineno}: {token[:30]} does not fit in a 64-bit id")
    return DataError(f"{path}: cannot parse ({_reason(exc)})")


def _reason(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ---------------------------------------------------------------- MovieLens


def read_ml100k(folder: Path) -> RawData:
    """MovieLens-100K: u.data (tab separated, random order) and u.item (latin-1, 19 genre flags)."""
    hint = "Run `lsan data download ml-100k --data-dir DIR` or copy the GroupLens ml-100k folder there."
    data = _need(folder / "u.data", "ml-100k", hint)
    item = _need(folder / "u.item", "ml-100k", hint)
    try:
        ratings = pd.read_csv(
            data, sep="\t", header=None, names=["u", "i", "r", "t"], dtype="int64"
        )
    except (ValueError, OverflowError, pd.errors.ParserError) as exc:
        raise _bad_integers(data, r"\t", 4, exc) from None
    try:
        meta = pd.read_csv(item, sep="|", header=None, encoding="latin-1", dtype=str)
        ids = meta.iloc[:, 0].astype("int64").to_numpy()
    except (ValueError, OverflowError, IndexError, pd.errors.ParserError) as exc:
        raise DataError(f"{item}: cannot parse ({_reason(exc)})") from None
    genre_file = folder / "u.genre"
    if genre_file.is_file():
        genres = [
            ln.split("|")[0] for ln in genre_file.read_text("latin-1").splitlines() if "|" in ln
        ]
    else:
        genres = [f"genre{g}" for g in range(19)]
    flags = meta.iloc[:, 5:24].fillna("0").to_numpy() == "1"  # (I, 19)
    attrs = {
        int(i): [int(g) for g in np.flatnonzero(row)] for i, row in zip(ids, flags, strict=True)
    }
    cats = {i: genres[a[0]] for i, a in attrs.items() if a}
    return RawData(
        users=ratings["u"].to_numpy(),
        items=ratings["i"].to_numpy(),
        timestamps=ratings["t"].to_numpy(),
        item_category=cats,
        item_attributes=attrs,
        category_rule="first genre in u.genre order",
        files=[data, item],
    )


def read_ml1m(ratings_file: Path, movies_file: Path | None) -> RawData:
    """MovieLens-1M: ratings.dat `UserID::MovieID::Rating::Timestamp`, movies.dat (latin-1)."""
    hint = "Run `lsan data download ml-1m --data-dir DIR` or copy the GroupLens ml-1m folder there."
    _need(ratings_file, "ml-1m", hint)
    try:
        ratings = pd.read_csv(
            ratings_file,
            sep="::",
            engine="python",
            header=None,
            names=["u", "i", "r", "t"],
            dtype="int64",
        )
    except (ValueError, OverflowError, pd.errors.ParserError) as exc:
        raise _bad_integers(ratings_file, "::", 4, exc) from None
    cats: dict[int, str] = {}
    attrs: dict[int, list[int]] = {}
    files = [ratings_file]
    if movies_file is not None and movies_file.is_file():
        names: dict[str, int] = {}
        for line in movies_file.read_text("latin-1").splitlines():
            parts = line.split("::")
            if len(parts) != 3:
                continue
            genres = [g for g in parts[2].split("|") if g]
            attrs[int(parts[0])] = [names.setdefault(g, len(names)) for g in genres]
            if genres:
                cats[int(parts[0])] = genres[0]
        files.append(movies_file)
    return RawData(
        users=ratings["u"].to_numpy(),
        items=ratings["i"].to_numpy(),
        timestamps=ratings["t"].to_numpy(),
        item_category=cats,
        item_attributes=attrs,
        category_rule="first genre of the movies.dat list",
        files=files,
    )


# ---------------------------------------------------------------- S3-Rec / TiCoSeRec / SASRec


def _read_sequences(path: Path) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """`user item_1 ... item_n` per line -> (users, items) flat in file order, lengths per line."""
    users: list[int] = []
    items: list[int] = []
    lengths: list[int] = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        try:
            values = [int(p) for p in parts]
        except ValueError:
            raise DataError(f"{path}:{lineno}: expected integers, got {line[:60]!r}") from None
        users.extend([values[0]] * (len(values) - 1))
        items.extend(values[1:])
        lengths.append(len(values) - 1)
    try:
        return np.asarray(users, dtype=np.int64), np.asarray(items, dtype=np.int64), lengths
    except OverflowError as exc:
        raise _bad_integers(path, r"\s+", None, exc) from None


def _primary_by_frequency(attrs: dict[int, list[int]]) -> dict[int, str]:
    """Each item's category label by S3REC_CATEGORY_RULE (see the module docstring)."""
    freq = Counter(a for lst in attrs.values() for a in set(lst))
    limit = CATEGORY_SHARE * len(attrs)
    out: dict[int, str] = {}
    for item, lst in attrs.items():
        if lst:
            pool = [a for a in lst if freq[a] < limit] or lst
            best = max(pool, key=lambda a: (freq[a], -lst.index(a)))
            out[item] = str(best)
    return out


def read_s3rec(
    seq_file: Path, attr_file: Path | None, time_file: Path | None, dataset: str
) -> RawData:
    """S3-Rec form: `<Name>.txt` sequences (time ordered) + `<Name>_item2attributes.json`.

    When a TiCoSeRec `*_time_org_rank.txt` file is given, its line u token k is the timestamp of
    the sequence file's line u token k; users and per-user lengths must match exactly.
    """
    users, items, lengths = _read_sequences(seq_file)
    files = [seq_file]
    attrs: dict[int, list[int]] = {}
    if attr_file is not None:
        try:
            loaded = json.loads(attr_file.read_text())
            attrs = {int(k): [int(a) for a in v] for k, v in loaded.items()}
        except (json.JSONDecodeError, ValueError, AttributeError, TypeError) as exc:
            raise DataError(f"{attr_file}: cannot parse ({exc})") from None
        if any(abs(v) > INT64_MAX for lst in [list(attrs), *attrs.values()] for v in lst):
            raise DataError(f"{attr_file}: an item or attribute id does not fit in 64 bits")
        files.append(attr_file)
    timestamps = None
    if time_file is not None:
        t_users, t_values, t_lengths = _read_sequences(time_file)
        if t_lengths != lengths or not np.array_equal(t_users, users):
            raise DataError(
                f"{dataset}: time file {time_file} does not line up with {seq_file} "
                "(users or per-user lengths differ); remove it to load without timestamps"
            )
        timestamps = t_values
        files.append(time_file)
    return RawData(
        users=users,
        items=items,
        timestamps=timestamps,
        item_category=_primary_by_frequency(attrs),
        item_attributes=attrs,
        category_rule=S3REC_CATEGORY_RULE,
        files=files,
    )


def read_sasrec_pairs(path: Path, dataset: str) -> RawData:
    """SASRec form: `user item` per line, grouped by user and time ordered; no time, no category."""
    try:
        pairs = pd.read_csv(path, sep=r"\s+", header=None, names=["u", "i"], dtype="int64")
    except (ValueError, OverflowError, pd.errors.ParserError) as exc:
        raise _bad_integers(path, r"\s+", 2, exc) from None
    return RawData(
        users=pairs["u"].to_numpy(), items=pairs["i"].to_numpy(), timestamps=None, files=[path]
    )


# ---------------------------------------------------------------- the registry


@dataclass(frozen=True)
class S3RecSpec:
    folder: str  # folder under the data root
    stem: str  # `<stem>.txt`, `<stem>_item2attributes.json`
    time_stem: str | None  # `<time_stem>_time_org_rank.txt` (TiCoSeRec), None = never joined


S3REC = {
    "beauty": S3RecSpec("beauty", "Beauty", "Beauty"),
    "sports": S3RecSpec("sports", "Sports_and_Outdoors", "Sports"),
    "toys": S3RecSpec("toys", "Toys_and_Games", "Toys"),
    # Yelp's TiCoSeRec ids are assigned differently from S3-Rec's: no time join is possible.
    "yelp": S3RecSpec("yelp", "Yelp", None),
    "lastfm": S3RecSpec("lastfm", "LastFM", None),
}

REAL_DATASETS = ("ml-100k", "ml-1m", *S3REC, "video")


# ---------------------------------------------------------------- item titles

MAX_TITLE_CHARS = 200  # a longer title is cut: titles ship to the device inside the artifact
# where a dataset's titles are: (file under the data root, field separator); id is field 0,
# title field 1. The S3-Rec (Amazon, Yelp, LastFM) and SASRec files carry no names at all.
TITLE_FILES = {"ml-100k": ("ml-100k/u.item", "|"), "ml-1m": ("ml-1m/movies.dat", "::")}


def read_titles(name: str, root: Path) -> dict[int, str]:
    """Raw item id -> title, for the datasets whose files name their items (MovieLens u.item and
    movies.dat, both latin-1); {} for the others or when the file is absent (titles are
    optional). Control characters become spaces, so a title is always one line."""
    if name not in TITLE_FILES:
        return {}
    rel, sep = TITLE_FILES[name]
    path = root / rel
    if not path.is_file():
        return {}
    titles: dict[int, str] = {}
    # split on line feeds only: str.splitlines would also split inside a title at \x85 (NEL)
    for lineno, line in enumerate(path.read_text("latin-1").split("\n"), 1):
        if not line.strip():
            continue
        parts = line.split(sep)
        if len(parts) < 2:
            raise DataError(f"{path}:{lineno}: expected id{sep}title{sep}..., got {line[:60]!r}")
        try:
            item = int(parts[0])
        except ValueError:
            raise DataError(
                f"{path}:{lineno}: expected an integer id, got {parts[0][:30]!r}"
            ) from None
        if not 0 <= item <= INT64_MAX:
            raise DataError(f"{path}:{lineno}: {parts[0][:30]} does not fit in a 64-bit id")
        title = " ".join("".join(c if c.isprintable() else " " for c in parts[1]).split())
        titles[item] = title[:MAX_TITLE_CHARS]
    return titles


def read_dataset(name: str, root: Path) -> RawData:
    """Read dataset `name` from its folder under `root` (see the data README for the layout)."""
    if name == "ml-100k":
        return read_ml100k(root / "ml-100k")
    if name == "ml-1m":
        return read_ml1m(root / "ml-1m" / "ratings.dat", root / "ml-1m" / "movies.dat")
    if name == "video":
        folder = root / "video"
        path = _first_existing([folder / "sasrec" / "Video.txt", folder / "Video.txt"])
        if path is None:
            raise DataError(
                f"dataset 'video': expected {folder}/sasrec/Video.txt (SASRec's data/Video.txt) is missing"
            )
        return read_sasrec_pairs(path, name)
    if name in S3REC:
        spec = S3REC[name]
        folder = root / spec.folder
        seq = _first_existing([folder / "s3rec" / f"{spec.stem}.txt", folder / f"{spec.stem}.txt"])
        if seq is None:
            raise DataError(
                f"dataset '{name}': expected {folder}/s3rec/{spec.stem}.txt and "
                f"{spec.stem}_item2attributes.json (RUCAIBox/CIKM2020-S3Rec data/) are missing"
            )
        attr = _first_existing([seq.parent / f"{spec.stem}_item2attributes.json"])
        time = None
        if spec.time_stem is not None:
            name_t = f"{spec.time_stem}_time_org_rank.txt"
            time = _first_existing([folder / "ticoserec" / name_t, folder / name_t])
        return read_s3rec(seq, attr, time, name)
    known = ", ".join((*REAL_DATASETS, "synthetic"))
    raise DataError(f"unknown dataset '{name}' (known: {known})")
