"""`lsan data download NAME`: every real dataset from its public source, laid out for the readers.

MovieLens comes as GroupLens' zips, checked against the MD5 sums GroupLens publishes beside them;
files are extracted into a temporary folder that is renamed into place at the end.
The other datasets are plain files in public GitHub repositories (the S3-Rec release for
Beauty, Sports, Toys, Yelp and LastFM; TiCoSeRec for the Beauty and Sports timestamps; SASRec's
release for Video), fetched from raw-file URLs pinned to a commit, checked against the sha256 of
the released files (recorded from the copies in ../shared/data) and stored exactly where
`lsan.data.readers` looks (`beauty/s3rec/Beauty.txt`, `beauty/ticoserec/...`, `video/sasrec/...`).
Every download is resumable: a partial file is kept as `<file>.part` and continued with an HTTP
Range request, and nothing takes a reader's file name before its checksum matches.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from lsan.data.readers import S3REC, DataError
from lsan.digest import file_digest


@dataclass(frozen=True)
class Download:
    url: str  # canonical zip
    md5: str  # checksum GroupLens publishes for the zip
    folder: str  # folder the zip unpacks to (and the reader expects)
    required: tuple[str, ...]  # files the reader needs, checked after unpacking


DOWNLOADS = {
    "ml-100k": Download(
        "https://files.grouplens.org/datasets/movielens/ml-100k.zip",
        "0e33842e24a9c977be4e0107933c0723",
        "ml-100k",
        ("u.data", "u.item"),
    ),
    "ml-1m": Download(
        "https://files.grouplens.org/datasets/movielens/ml-1m.zip",
        "c4d9eecfca2ab87c1945afe126590906",
        "ml-1m",
        ("ratings.dat", "movies.dat"),
    ),
}


# Raw-file URLs, pinned to the commits the copies in ../shared/data were taken from.
GITHUB = "https://raw.githubusercontent.com"
S3REC_DATA = f"{GITHUB}/RUCAIBox/CIKM2020-S3Rec/2a81540ae18615d88ef88227b0c066e5b74781e5/data"
TICOSEREC_DATA = f"{GITHUB}/KingGugu/TiCoSeRec/302b2959f27bb16bb77acae5a471de82819bd1bd/data"
SASREC_DATA = f"{GITHUB}/kang205/SASRec/e3738967fddab206d6eeb4fda433e7a7034dd8b1/data"
TICOSEREC_TIMES = ("Beauty", "Sports")  # the TiCoSeRec time files that line up with S3-Rec's

# sha256 of the released files, by their path under the data root. Sports and Toys were not
# among the copies, so theirs are not recorded: the download reports the digest it received.
SHA256 = {
    "beauty/s3rec/Beauty.txt": "226cce9c3105299ca0db9615d7d3fb32b3175e90da43100ae352599f0f0107b8",
    "beauty/s3rec/Beauty_item2attributes.json": "129e40f67486f6877eff0f5318cfa8530ee8ac23d8b0d1de04e1bb7a2ba0b2d4",
    "beauty/ticoserec/Beauty_time_org_rank.txt": "4e6a6e30f9dba1985ad9adae79a891df6b403e2132f0422a6f6e88f67d1fcc75",
    "yelp/s3rec/Yelp.txt": "724b219106b81dd2349027da997334ddb6da9fe2f152ad6e0d97a93170f7caed",
    "yelp/s3rec/Yelp_item2attributes.json": "f25acd5e1e680e0b22fd4e3f4fb6be4b2a7461e9222610616e3e1ee6702dd58d",
    "lastfm/s3rec/LastFM.txt": "9ded486adb5b0fe9dc761950afa0a9a05e93ff018992e0c52bf11afec529f802",
    "lastfm/s3rec/LastFM_item2attributes.json": "a4ccd678dc9ff6d43fe5073f491db5c9b02eb98dfa4f8c0382913a784be217ef",
    "video/sasrec/Video.txt": "b7376fe24430743f411dc7f567285657b2adb3f74361cc7ba0aee94f3024b651",
}  # fmt: skip


@dataclass(frozen=True)
class RawFile:
    url: str  # public raw-file URL, pinned to a commit
    path: str  # where the reader expects the file, relative to the data root


def _s3rec_files(name: str) -> tuple[RawFile, ...]:
    """The S3-Rec sequence and attribute files of `name`, plus TiCoSeRec's times where they exist."""
    spec = S3REC[name]
    files = [RawFile(f"{S3REC_DATA}/{spec.stem}{suffix}", f"{spec.folder}/s3rec/{spec.stem}{suffix}")
             for suffix in (".txt", "_item2attributes.json")]  # fmt: skip
    if spec.time_stem in TICOSEREC_TIMES:
        time_name = f"{spec.time_stem}_time_org_rank.txt"
        files.append(RawFile(f"{TICOSEREC_DATA}/{spec.time_stem}/{time_name}",
                             f"{spec.folder}/ticoserec/{time_name}"))  # fmt: skip
    return tuple(files)


FILES: dict[str, tuple[RawFile, ...]] = {
    **{name: _s3rec_files(name) for name in S3REC},
    "video": (RawFile(f"{SASREC_DATA}/Video.txt", "video/sasrec/Video.txt"),),
}


def fetch(url: str, dest: Path, progress: bool = True, timeout: float = 60.0) -> Path:
    """Download `url` to `dest`, resuming from `dest.part` when the server honours Range."""
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            resumed = have and resp.status == 206
            length = int(resp.headers.get("Content-Length", 0))
            total = length + (have if resumed else 0)
            mode = "ab" if resumed else "wb"
            got = 0
            with open(part, mode) as fh, tqdm(
                total=total or None, initial=have if resumed else 0, unit="B", unit_scale=True,
                desc=dest.name, disable=not progress,
            ) as bar:  # fmt: skip
                for chunk in iter(lambda: resp.read(1 << 16), b""):
                    fh.write(chunk)
                    got += len(chunk)
                    bar.update(len(chunk))
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # the part file is already complete
            part.replace(dest)
            return dest
        raise DataError(f"download of {url} failed: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        host = urllib.parse.urlsplit(url).netloc
        raise DataError(
            f"cannot reach {host} to download {url} ({reason}); offline? rerun to resume"
        ) from None
    if length and got < length:  # urllib ends quietly when a server closes early
        raise DataError(
            f"download of {url} stopped after {got} of {length} bytes (rerun to resume)"
        )
    part.replace(dest)
    return dest


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def download(
    name: str, data_dir: Path, url: str | None = None, md5: str | None = None,
    progress: bool = True, mirror: str | None = None, log: Callable[[str], None] = _stderr,
) -> Path:  # fmt: skip
    """Fetch dataset `name` into `data_dir` in the readers' layout; returns its folder. Idempotent.

    `url` and `md5` replace a MovieLens zip's address and checksum; `mirror` is a base URL that
    holds the files in the data-root layout (`<mirror>/ml-100k.zip`, `<mirror>/beauty/s3rec/...`).
    """
    if name in FILES:
        if url or md5:
            raise DataError(
                f"--url and --md5 are for the MovieLens zips; use --mirror for '{name}'"
            )
        return _download_files(name, data_dir, progress, mirror, log)
    if name not in DOWNLOADS:
        known = ", ".join([*DOWNLOADS, *FILES])
        raise DataError(f"no download for '{name}' (downloadable: {known})")
    if mirror and not url:
        url = f"{mirror.rstrip('/')}/{DOWNLOADS[name].folder}.zip"
    return _download_zip(name, data_dir, url, md5, progress)


def _download_files(
    name: str, data_dir: Path, progress: bool, mirror: str | None, log: Callable[[str], None]
) -> Path:
    """Each raw file: fetched to `<file>.download` (resumable), checked, then renamed into place."""
    for f in FILES[name]:
        target = data_dir / f.path
        want = SHA256.get(f.path)
        if target.is_file():
            got = file_digest(target) if want else ""
            if got != (want or ""):
                raise DataError(
                    f"{target}: exists but its sha256 is {got}, not the released file's {want}; "
                    "move it away and rerun"
                )
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = target.with_name(target.name + ".download")
        source = f"{mirror.rstrip('/')}/{f.path}" if mirror else f.url
        fetch(source, staged, progress)
        got = file_digest(staged)
        if want is not None and got != want:
            staged.unlink()
            raise DataError(
                f"{target}: checksum mismatch (sha256 {got}, expected {want}); deleted, rerun"
            )
        if want is None:
            log(f"warning: {f.path}: no recorded sha256 to check; received sha256 {got}")
        staged.replace(target)
    return data_dir / FILES[name][0].path.split("/")[0]


def _download_zip(
    name: str, data_dir: Path, url: str | None, md5: str | None, progress: bool
) -> Path:
    """A GroupLens zip: fetched (resumable), MD5-checked, unpacked into `data_dir/<folder>`."""
    spec = DOWNLOADS[name]
    target = data_dir / spec.folder
    if all((target / f).is_file() for f in spec.required):
        return target
    data_dir.mkdir(parents=True, exist_ok=True)
    zpath = data_dir / f"{spec.folder}.zip"
    if not zpath.exists():
        fetch(url or spec.url, zpath, progress)
    got, want = file_digest(zpath, "md5"), (md5 or spec.md5)
    if got != want:
        zpath.unlink()
        raise DataError(
            f"{zpath.name}: checksum mismatch (md5 {got}, expected {want}); deleted, rerun"
        )
    with tempfile.TemporaryDirectory(dir=data_dir) as tmp:
        try:
            with zipfile.ZipFile(zpath) as zf:
                zf.extractall(tmp)
        except zipfile.BadZipFile:
            zpath.unlink()
            raise DataError(f"{zpath.name} is not a valid zip; deleted, rerun") from None
        found = next((p for p in Path(tmp).rglob(spec.required[0])), None)
        if found is None:
            raise DataError(f"{zpath.name} does not contain {spec.required[0]}")
        missing = [f for f in spec.required if not (found.parent / f).is_file()]
        if missing:
            raise DataError(f"{zpath.name} lacks {', '.join(missing)}")
        if target.exists():
            shutil.rmtree(target)
        found.parent.rename(target)
    zpath.unlink()
    return target
