"""Download the canonical GroupLens MovieLens zips: resumable, checksum-verified, unpacked in place.

The MD5 sums are the ones GroupLens publishes beside each zip. A partial download is kept as
`<zip>.part` and continued with an HTTP Range request; the zip is only unpacked after its checksum
matches, and files are extracted into a temporary folder that is renamed into place at the end.
"""

from __future__ import annotations

import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from lsan.data.readers import DataError
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
        raise DataError(f"download of {url} failed: {reason} (rerun to resume)") from None
    if length and got < length:  # urllib ends quietly when a server closes early
        raise DataError(
            f"download of {url} stopped after {got} of {length} bytes (rerun to resume)"
        )
    part.replace(dest)
    return dest


def download(
    name: str, data_dir: Path, url: str | None = None, md5: str | None = None, progress: bool = True
) -> Path:
    """Fetch dataset `name` into `data_dir/<folder>`; returns that folder. Idempotent."""
    if name not in DOWNLOADS:
        raise DataError(f"no download for '{name}' (downloadable: {', '.join(DOWNLOADS)})")
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
