"""Raw-format loaders on the real public files in the shared data folder (see its README.md)."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from lsan.cli import main
from lsan.data.prepare import build, category_warning
from lsan.data.readers import (
    REAL_DATASETS,
    DataError,
    read_dataset,
    read_ml1m,
    read_ml100k,
    read_s3rec,
    read_titles,
)

DATA = Path(
    os.environ.get(
        "LSAN_TEST_DATA_DIR", Path(__file__).resolve().parents[1].parent / "shared" / "data"
    )
)
if not DATA.is_dir():
    pytest.skip(f"shared data folder {DATA} not found", allow_module_level=True)

BEAUTY = DATA / "beauty"


@pytest.fixture(scope="module")
def beauty_raw():
    return read_dataset("beauty", DATA)


# ---------------------------------------------------------------- MovieLens-100K


@pytest.fixture(scope="module")
def ml100k_raw():
    return read_ml100k(DATA / "ml-100k")


def test_ml100k_raw_counts(ml100k_raw):
    raw = ml100k_raw
    assert len(raw.users) == len(raw.items) == len(raw.timestamps) == 100_000
    assert len(np.unique(raw.users)) == 943
    assert len(np.unique(raw.items)) == 1682
    assert raw.timestamps.min() == 874724710
    assert raw.timestamps.max() == 893286638
    assert [p.name for p in raw.files] == ["u.data", "u.item"]


def test_ml100k_latin1_items_and_genres(ml100k_raw):
    raw = ml100k_raw
    # u.item is latin-1, not UTF-8: a reader using the default codec would fail on it.
    with pytest.raises(UnicodeDecodeError):
        (DATA / "ml-100k" / "u.item").read_text("utf-8")
    assert len(raw.item_attributes) == 1682
    assert set(raw.item_attributes) == set(range(1, 1683))
    # Every item has at least one genre flag.
    assert all(raw.item_attributes[i] for i in raw.item_attributes)
    # 1 Toy Story: Animation|Children's|Comedy -> flags 3, 4, 5 in u.genre order.
    assert raw.item_attributes[1] == [3, 4, 5]
    assert raw.item_category[1] == "Animation"
    # 543 "Misérables, Les (1995)" has a latin-1 title; its genres are Drama|Musical.
    genres = [
        ln.split("|")[0]
        for ln in (DATA / "ml-100k" / "u.genre").read_text("latin-1").splitlines()
        if "|" in ln
    ]
    assert len(genres) == 19
    assert [genres[g] for g in raw.item_attributes[543]] == ["Drama", "Musical"]
    assert raw.item_category[543] == "Drama"
    # The category is always the name of the first genre flag.
    for item, attrs in raw.item_attributes.items():
        assert raw.item_category[item] == genres[attrs[0]]
    assert raw.category_rule == "first genre in u.genre order"


def test_ml100k_prepared_counts(ml100k_raw):
    ds = build(ml100k_raw, "ml-100k", 5)
    assert ds.num_users == 943
    assert ds.num_items == 1349
    assert len(ds.items) == 99_287
    assert ds.slot_rule == "hour"
    assert ds.stats["raw_interactions"] == 100_000
    assert ds.stats["removed_interactions"] == 100_000 - 99_287
    # Names of the categories come from u.genre, not a numbered fallback.
    assert "Animation" in ds.category_names


# ---------------------------------------------------------------- MovieLens-1M


def test_ml1m_partial_ratings_with_latin1_movies():
    raw = read_ml1m(
        DATA / "ml-1m" / "partial" / "first10_per_user_ratings.dat", DATA / "ml-1m" / "movies.dat"
    )
    assert len(raw.users) == len(raw.items) == len(raw.timestamps) == 60_400
    assert len(np.unique(raw.users)) == 6040
    assert len(np.unique(raw.items)) == 1893
    assert (int(raw.users[0]), int(raw.items[0]), int(raw.timestamps[0])) == (1, 1193, 978300760)
    assert np.all(np.bincount(raw.users)[1:] == 10)
    # movies.dat is latin-1 (not valid UTF-8); all 3,883 movies are read.
    with pytest.raises(UnicodeDecodeError):
        (DATA / "ml-1m" / "movies.dat").read_text("utf-8")
    assert len(raw.item_attributes) == 3883
    assert raw.item_category[1] == "Animation"
    assert raw.item_category[73] == "Drama"  # "Misérables, Les (1995)::Drama|Musical"
    assert raw.item_category[582] == "Comedy"  # "Metisse (Café au Lait) (1993)::Comedy"
    assert len({g for a in raw.item_attributes.values() for g in a}) == 18
    assert [p.name for p in raw.files] == ["first10_per_user_ratings.dat", "movies.dat"]


def test_ml1m_without_ratings_dat_explains_download():
    with pytest.raises(DataError) as err:
        read_dataset("ml-1m", DATA)
    msg = str(err.value)
    assert "ratings.dat" in msg
    assert "lsan data download ml-1m" in msg


# ---------------------------------------------------------------- item titles


def test_movielens_titles_are_read_from_their_latin1_files():
    ml100k = read_titles("ml-100k", DATA)
    assert len(ml100k) == 1682 and set(ml100k) == set(range(1, 1683))
    assert ml100k[1] == "Toy Story (1995)" and ml100k[543] == "Misérables, Les (1995)"
    ml1m = read_titles("ml-1m", DATA)
    assert len(ml1m) == 3883
    assert ml1m[73] == "Misérables, Les (1995)" and ml1m[582] == "Metisse (Café au Lait) (1993)"


@pytest.mark.parametrize("name", ["beauty", "yelp", "lastfm", "video", "synthetic"])
def test_datasets_without_names_have_no_titles(name):
    # S3-Rec's item2attributes hold integer ids only; SASRec's pairs nothing at all
    assert read_titles(name, DATA) == {}


def test_titles_are_optional_one_line_and_bounded(tmp_path):
    assert read_titles("ml-100k", tmp_path) == {}  # no u.item: no titles, not an error
    (tmp_path / "ml-100k").mkdir()
    long = "x" * 500
    (tmp_path / "ml-100k" / "u.item").write_bytes(
        b"7|A\tB\x85  C (1990)|01-Jan-1990||\n\n8|" + long.encode() + b"|\n"
    )
    assert read_titles("ml-100k", tmp_path) == {7: "A B C (1990)", 8: "x" * 200}
    (tmp_path / "ml-100k" / "u.item").write_text("7|ok|\nseven|bad|\n")
    with pytest.raises(DataError, match=r"u.item:2: expected an integer id, got 'seven'"):
        read_titles("ml-100k", tmp_path)


# ---------------------------------------------------------------- Amazon (S3-Rec + TiCoSeRec)


def test_beauty_joins_ticoserec_times(beauty_raw):
    raw = beauty_raw
    assert len(raw.users) == len(raw.items) == 198_502
    assert raw.timestamps is not None
    assert len(raw.timestamps) == 198_502
    assert np.all(raw.timestamps % 86400 == 0)
    assert np.all(raw.timestamps > 0)
    # Times never decrease within a user (the sequence file is time ordered).
    same_user = raw.users[1:] == raw.users[:-1]
    assert np.all(np.diff(raw.timestamps)[same_user] >= 0)
    assert [p.name for p in raw.files] == [
        "Beauty.txt",
        "Beauty_item2attributes.json",
        "Beauty_time_org_rank.txt",
    ]
    # The first token of line 1 of the time file is the first interaction's timestamp.
    first_time_line = (BEAUTY / "ticoserec" / "Beauty_time_org_rank.txt").open().readline()
    assert int(raw.timestamps[0]) == int(first_time_line.split()[1])


def test_beauty_attributes_and_primary_category(beauty_raw):
    raw = beauty_raw
    assert len(raw.item_attributes) == 12_101
    assert len({a for lst in raw.item_attributes.values() for a in lst}) == 637
    freq = Counter(a for lst in raw.item_attributes.values() for a in set(lst))
    # No Beauty attribute is on half of the catalogue (the largest, 17, on 31.5%), so skipping
    # such attributes changes nothing: every item keeps its most catalogue-frequent attribute.
    assert max(freq.values()) == 3814 < 0.5 * len(raw.item_attributes)
    for item, lst in raw.item_attributes.items():
        cat = int(raw.item_category[item])
        assert cat in lst
        assert freq[cat] == max(freq[a] for a in lst)
        # ties go to the first listed attribute
        assert cat == next(a for a in lst if freq[a] == freq[cat])


def test_beauty_prepared_counts(beauty_raw):
    ds = build(beauty_raw, "beauty", 5)
    assert (ds.num_users, ds.num_items, len(ds.items)) == (22_363, 12_101, 198_502)
    assert ds.slot_rule == "weekday"
    assert ds.stats["removed_interactions"] == 0


def _copy_beauty_as(root: Path, folder: str, stem: str, time_stem: str | None) -> None:
    s3 = root / folder / "s3rec"
    s3.mkdir(parents=True)
    shutil.copyfile(BEAUTY / "s3rec" / "Beauty.txt", s3 / f"{stem}.txt")
    shutil.copyfile(
        BEAUTY / "s3rec" / "Beauty_item2attributes.json", s3 / f"{stem}_item2attributes.json"
    )
    if time_stem is not None:
        tico = root / folder / "ticoserec"
        tico.mkdir()
        shutil.copyfile(
            BEAUTY / "ticoserec" / "Beauty_time_org_rank.txt",
            tico / f"{time_stem}_time_org_rank.txt",
        )


def test_sports_loads_with_beauty_formats(tmp_path, beauty_raw):
    _copy_beauty_as(tmp_path, "sports", "Sports_and_Outdoors", "Sports")
    raw = read_dataset("sports", tmp_path)
    assert np.array_equal(raw.users, beauty_raw.users)
    assert np.array_equal(raw.items, beauty_raw.items)
    assert raw.timestamps is not None
    assert np.array_equal(raw.timestamps, beauty_raw.timestamps)
    assert raw.item_category == beauty_raw.item_category
    assert [p.name for p in raw.files] == [
        "Sports_and_Outdoors.txt",
        "Sports_and_Outdoors_item2attributes.json",
        "Sports_time_org_rank.txt",
    ]


def test_toys_loads_with_beauty_formats_without_times(tmp_path, beauty_raw):
    _copy_beauty_as(tmp_path, "toys", "Toys_and_Games", None)
    raw = read_dataset("toys", tmp_path)
    assert len(raw.users) == 198_502
    assert np.array_equal(raw.items, beauty_raw.items)
    assert raw.timestamps is None
    assert len(raw.item_attributes) == 12_101
    assert [p.name for p in raw.files] == [
        "Toys_and_Games.txt",
        "Toys_and_Games_item2attributes.json",
    ]
    ds = build(raw, "toys", 5)
    assert ds.slot_rule == "none"
    assert np.all(ds.timestamps == -1)


def test_misaligned_time_file_is_rejected(tmp_path):
    lines = (BEAUTY / "ticoserec" / "Beauty_time_org_rank.txt").read_text().splitlines()
    lines[100] = " ".join(lines[100].split()[:-1])  # drop one timestamp of user 101
    bad = tmp_path / "Beauty_time_org_rank.txt"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match="does not line up"):
        read_s3rec(
            BEAUTY / "s3rec" / "Beauty.txt",
            BEAUTY / "s3rec" / "Beauty_item2attributes.json",
            bad,
            "beauty",
        )


def test_misaligned_time_file_found_by_read_dataset(tmp_path):
    _copy_beauty_as(tmp_path, "sports", "Sports_and_Outdoors", "Sports")
    tfile = tmp_path / "sports" / "ticoserec" / "Sports_time_org_rank.txt"
    lines = tfile.read_text().splitlines()
    lines[0] = " ".join(lines[0].split()[:-1])
    tfile.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match="does not line up"):
        read_dataset("sports", tmp_path)


# ---------------------------------------------------------------- Yelp, LastFM, Video


@pytest.mark.parametrize(
    ("name", "users", "items", "interactions"),
    [("yelp", 30_431, 20_033, 316_354), ("lastfm", 1_090, 3_646, 52_551)],
)
def test_s3rec_without_times(name, users, items, interactions):
    raw = read_dataset(name, DATA)
    assert len(raw.users) == interactions
    assert len(np.unique(raw.users)) == users
    assert len(np.unique(raw.items)) == items
    assert raw.timestamps is None  # Yelp's TiCoSeRec ids differ: never joined
    assert len(raw.item_attributes) == items


def test_yelp_item_without_attributes_has_no_category():
    raw = read_dataset("yelp", DATA)
    empty = [i for i, a in raw.item_attributes.items() if not a]
    assert len(empty) == 1
    assert empty[0] not in raw.item_category
    assert len(raw.item_category) == 20_032


def test_video_sasrec_pairs():
    raw = read_dataset("video", DATA)
    assert len(raw.users) == 287_107
    assert len(np.unique(raw.users)) == 31_013
    assert len(np.unique(raw.items)) == 23_715
    assert raw.timestamps is None
    assert raw.item_category == {}
    # grouped by user in the file
    assert np.all(np.diff(raw.users) >= 0)


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ml-100k", "u.data"),
        ("ml-1m", "ratings.dat"),
        ("beauty", "Beauty.txt"),
        ("sports", "Sports_and_Outdoors.txt"),
        ("toys", "Toys_and_Games.txt"),
        ("yelp", "Yelp.txt"),
        ("lastfm", "LastFM.txt"),
        ("video", "Video.txt"),
    ],
)
def test_missing_files_name_the_expected_file(tmp_path, name, expected):
    with pytest.raises(DataError) as err:
        read_dataset(name, tmp_path)
    msg = str(err.value)
    assert expected in msg
    assert str(tmp_path) in msg
    assert f"'{name}'" in msg


def test_every_real_dataset_has_a_missing_file_case():
    assert set(REAL_DATASETS) == {
        "ml-100k",
        "ml-1m",
        "beauty",
        "sports",
        "toys",
        "yelp",
        "lastfm",
        "video",
    }


def test_unknown_dataset_lists_known_names():
    with pytest.raises(DataError) as err:
        read_dataset("netflix", DATA)
    msg = str(err.value)
    assert "unknown dataset 'netflix'" in msg
    for name in (*REAL_DATASETS, "synthetic"):
        assert name in msg


def test_malformed_sequence_file_reports_file_and_line(tmp_path):
    folder = tmp_path / "lastfm" / "s3rec"
    folder.mkdir(parents=True)
    seq = folder / "LastFM.txt"
    seq.write_text("1 10 11 12\n2 10 x1 13\n")
    with pytest.raises(DataError) as err:
        read_dataset("lastfm", tmp_path)
    msg = str(err.value)
    assert f"{seq}:2" in msg
    assert "x1" in msg


def test_malformed_item2attributes_is_a_data_error(tmp_path):
    folder = tmp_path / "lastfm" / "s3rec"
    folder.mkdir(parents=True)
    (folder / "LastFM.txt").write_text("1 10 11 12\n")
    (folder / "LastFM_item2attributes.json").write_text(json.dumps({"10": ["a"]}))
    with pytest.raises(DataError, match="LastFM_item2attributes.json"):
        read_dataset("lastfm", tmp_path)


# ---------------------------------------------------------------- CLI


def test_cli_data_stats_json(tmp_path, capsys):
    argv = ["data", "stats", "--dataset", "beauty", "--data-dir", str(DATA)]
    rc = main([*argv, "--cache-dir", str(tmp_path), "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    stats = json.loads(out)
    assert stats["dataset"] == "beauty"
    assert stats["users"] == 22_363
    assert stats["items"] == 12_101
    assert stats["interactions"] == 198_502
    assert stats["slot_rule"] == "weekday"
    assert list(tmp_path.glob("beauty-*.npz")), "the prepared dataset was not cached"


def test_cli_missing_dataset_is_one_error_line(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    argv = ["data", "stats", "--dataset", "beauty", "--data-dir", str(empty)]
    rc = main([*argv, "--cache-dir", str(tmp_path / "cache")])
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: ")
    assert "Beauty.txt" in lines[0]
    assert "Traceback" not in captured.err


# ---------------------------------------------------------------- informative categories


@pytest.mark.parametrize(
    ("name", "categories", "largest"),
    [("ml-100k", 18, 0.2906), ("beauty", 7, 0.3152), ("yelp", 109, 0.2845), ("lastfm", 85, 0.393)],
)
def test_shipped_datasets_have_informative_categories(name, categories, largest):
    ds = build(read_dataset(name, DATA), name, 5)
    assert category_warning(ds) is None
    assert ds.stats["categories"] == categories >= 3
    assert ds.stats["largest_category_share"] == pytest.approx(largest, abs=1e-4)
    assert largest <= 0.8


def test_yelp_skips_the_attribute_on_most_businesses():
    raw = read_dataset("yelp", DATA)
    freq = Counter(a for lst in raw.item_attributes.values() for a in set(lst))
    common, count = freq.most_common(1)[0]
    assert count / len(raw.item_attributes) == pytest.approx(0.686, abs=1e-3)
    assert str(common) not in set(raw.item_category.values())
