"""lsan.data.download against a local loopback HTTP server: a MovieLens zip and raw files."""

from __future__ import annotations

import hashlib
import io
import json
import re
import socket
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from lsan.cli import main
from lsan.data.download import DOWNLOADS, FILES, download
from lsan.data.readers import REAL_DATASETS, DataError, read_dataset, read_ml100k
from lsan.digest import file_digest

U_DATA = "".join(
    f"{u}\t{i}\t{r}\t{ts}\n"
    for u, i, r, ts in [
        (1, 1, 5, 874965758),
        (1, 2, 3, 876893171),
        (2, 1, 4, 888550871),
        (2, 3, 2, 888551134),
        (3, 2, 1, 889237269),
        (3, 3, 5, 889237455),
        (3, 1, 4, 889237500),
    ]
)


def _u_item_line(item: int, title: str, genres: set[int]) -> str:
    flags = "|".join("1" if g in genres else "0" for g in range(19))
    return f"{item}|{title}|01-Jan-1995||http://example.invalid/{item}|{flags}\n"


U_ITEM = (
    _u_item_line(1, "Toy Story (1995)", {3, 4, 5})
    + _u_item_line(2, "Misérables, Les (1995)", {8, 12})
    + _u_item_line(3, "GoldenEye (1995)", {1, 2, 16})
).encode("latin-1")


def _make_zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("ml-100k/", "")
        zf.writestr("ml-100k/u.data", U_DATA)
        zf.writestr("ml-100k/u.item", U_ITEM)
        zf.writestr("ml-100k/README", "fake MovieLens 100K for tests\n" * 40)
    return buf.getvalue()


ZIP = _make_zip()
MD5 = hashlib.md5(ZIP).hexdigest()


class Server:
    """State shared with the handler: what to serve and every request seen."""

    def __init__(self) -> None:
        self.payload = ZIP
        self.files: dict[str, bytes] = {}  # path -> body; when set, other paths are 404
        self.status = 200  # anything else: answer every request with that error status
        self.honour_range = True
        self.truncate_at: int | None = None  # send only this many body bytes, then close
        self.requests: list[dict[str, str | None]] = []
        self.responses: list[int] = []
        self.httpd: ThreadingHTTPServer | None = None

    @property
    def base(self) -> str:
        assert self.httpd is not None
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def url(self) -> str:
        return f"{self.base}/ml-100k.zip"


def _handler(state: Server) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            rng = self.headers.get("Range")
            state.requests.append({"path": self.path, "range": rng})
            if state.status != 200 or (state.files and self.path not in state.files):
                self._reply(state.status if state.status != 200 else 404, b"not here\n")
                return
            body = state.files.get(self.path, state.payload)
            if rng and state.honour_range and rng.startswith("bytes=") and rng.endswith("-"):
                start = int(rng[len("bytes=") : -1])
                if start >= len(body):
                    self._reply(416, b"", {"Content-Range": f"bytes */{len(body)}"})
                    return
                content_range = f"bytes {start}-{len(body) - 1}/{len(body)}"
                self._reply(206, body[start:], {"Content-Range": content_range})
                return
            self._reply(200, body)

        def _reply(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            state.responses.append(code)
            self.send_response(code)
            self.send_header("Content-Type", "application/zip")
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if state.truncate_at is not None and code in (200, 206):
                self.wfile.write(body[: state.truncate_at])
                self.close_connection = True
                return
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    return Handler


@pytest.fixture
def server(monkeypatch):
    # Loopback only: never route the request through a proxy from the environment.
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    state = Server()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    httpd.daemon_threads = True
    state.httpd = httpd
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    yield state
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


def _assert_unpacked(target: Path) -> None:
    assert (target / "u.data").read_text() == U_DATA
    assert (target / "u.item").read_bytes() == U_ITEM
    raw = read_ml100k(target)
    assert len(raw.users) == 7
    assert sorted(np.unique(raw.users).tolist()) == [1, 2, 3]
    assert raw.item_category == {1: "genre3", 2: "genre8", 3: "genre1"}


def test_download_unpacks_and_is_idempotent(server, tmp_path):
    target = download("ml-100k", tmp_path, url=server.url, md5=MD5, progress=False)
    assert target == tmp_path / "ml-100k"
    _assert_unpacked(target)
    assert (target / "README").is_file()
    # the zip, the part file and the temporary extraction folder are gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ml-100k"]
    assert server.requests == [{"path": "/ml-100k.zip", "range": None}]
    assert server.responses == [200]

    again = download("ml-100k", tmp_path, url=server.url, md5=MD5, progress=False)
    assert again == target
    assert len(server.requests) == 1  # no second HTTP request
    _assert_unpacked(target)


def test_download_resumes_a_part_file(server, tmp_path):
    half = len(ZIP) // 2
    (tmp_path / "ml-100k.zip.part").write_bytes(ZIP[:half])
    target = download("ml-100k", tmp_path, url=server.url, md5=MD5, progress=False)
    assert server.requests == [{"path": "/ml-100k.zip", "range": f"bytes={half}-"}]
    assert server.responses == [206]
    _assert_unpacked(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ml-100k"]


def test_download_restarts_when_server_ignores_range(server, tmp_path):
    server.honour_range = False
    (tmp_path / "ml-100k.zip.part").write_bytes(b"stale bytes from another file")
    target = download("ml-100k", tmp_path, url=server.url, md5=MD5, progress=False)
    assert server.requests[0]["range"] == f"bytes={len(b'stale bytes from another file')}-"
    assert server.responses == [200]
    _assert_unpacked(target)


def test_download_with_complete_part_file(server, tmp_path):
    (tmp_path / "ml-100k.zip.part").write_bytes(ZIP)
    target = download("ml-100k", tmp_path, url=server.url, md5=MD5, progress=False)
    assert server.requests == [{"path": "/ml-100k.zip", "range": f"bytes={len(ZIP)}-"}]
    assert server.responses == [416]
    _assert_unpacked(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ml-100k"]


def test_checksum_mismatch_leaves_nothing(server, tmp_path):
    with pytest.raises(DataError, match="checksum") as err:
        download("ml-100k", tmp_path, url=server.url, md5="0" * 32, progress=False)
    assert MD5 in str(err.value)  # the md5 that was actually received
    assert not (tmp_path / "ml-100k.zip").exists()
    assert not (tmp_path / "ml-100k.zip.part").exists()
    assert not (tmp_path / "ml-100k").exists()
    assert list(tmp_path.iterdir()) == []
    assert len(server.requests) == 1


def test_http_404_is_a_data_error(server, tmp_path):
    server.status = 404
    with pytest.raises(DataError, match="HTTP 404") as err:
        download("ml-100k", tmp_path, url=server.url, md5=MD5, progress=False)
    assert server.url in str(err.value)
    assert not (tmp_path / "ml-100k").exists()
    assert not (tmp_path / "ml-100k.zip").exists()
    assert len(server.requests) == 1


def test_not_a_zip_is_deleted(server, tmp_path):
    server.payload = b"<html>this is not a zip</html>"
    md5 = hashlib.md5(server.payload).hexdigest()
    with pytest.raises(DataError, match="not a valid zip"):
        download("ml-100k", tmp_path, url=server.url, md5=md5, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_zip_without_top_folder(server, tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("u.data", U_DATA)
        zf.writestr("u.item", U_ITEM)
    server.payload = buf.getvalue()
    md5 = hashlib.md5(server.payload).hexdigest()
    target = download("ml-100k", tmp_path, url=server.url, md5=md5, progress=False)
    _assert_unpacked(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ml-100k"]


def test_zip_lacking_a_required_file(server, tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("ml-100k/u.data", U_DATA)
    server.payload = buf.getvalue()
    md5 = hashlib.md5(server.payload).hexdigest()
    with pytest.raises(DataError, match="lacks u.item"):
        download("ml-100k", tmp_path, url=server.url, md5=md5, progress=False)
    assert not (tmp_path / "ml-100k").exists()


def test_truncated_transfer_is_kept_for_resume(server, tmp_path):
    half = len(ZIP) // 2
    server.truncate_at = half
    with pytest.raises(DataError, match="resume"):
        download("ml-100k", tmp_path, url=server.url, md5=MD5, progress=False)
    assert (tmp_path / "ml-100k.zip.part").read_bytes() == ZIP[:half]
    server.truncate_at = None
    target = download("ml-100k", tmp_path, url=server.url, md5=MD5, progress=False)
    assert server.requests[-1]["range"] == f"bytes={half}-"
    _assert_unpacked(target)


def test_unknown_download_name(tmp_path):
    with pytest.raises(DataError, match="no download for 'netflix'") as err:
        download("netflix", tmp_path)
    for name in REAL_DATASETS:  # every real dataset the readers know can be downloaded
        assert name in str(err.value)
    assert set(REAL_DATASETS) == set(DOWNLOADS) | set(FILES)


def test_cli_download(server, tmp_path, capsys):
    argv = ["data", "download", "ml-100k", "--data-dir", str(tmp_path)]
    rc = main([*argv, "--url", server.url, "--md5", MD5])
    captured = capsys.readouterr()
    assert rc == 0
    assert f"ml-100k ready in {tmp_path / 'ml-100k'}" in captured.out
    _assert_unpacked(tmp_path / "ml-100k")
    assert len(server.requests) == 1


def test_cli_download_404_is_one_error_line(server, tmp_path, capsys):
    server.status = 404
    argv = ["data", "download", "ml-100k", "--data-dir", str(tmp_path)]
    rc = main([*argv, "--url", server.url, "--md5", MD5])
    captured = capsys.readouterr()
    assert rc == 2
    errors = [ln for ln in captured.err.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1
    assert "HTTP 404" in errors[0]
    assert "Traceback" not in captured.err


# ---------------------------------------------------------------- raw files (S3-Rec, TiCoSeRec, SASRec)

# A tiny Beauty in the released formats: sequences, attributes, and TiCoSeRec's day-level times
# (line u token k is the time of the sequence file's line u item k).
BEAUTY = {
    "beauty/s3rec/Beauty.txt": b"1 1 2 3 4 5\n2 2 3 4 5 1\n3 3 4 5 1 2\n4 4 5 1 2 3\n5 5 1 2 3 4\n",
    "beauty/s3rec/Beauty_item2attributes.json": json.dumps(
        {str(i): [1, 100 + i % 3] for i in range(1, 6)}
    ).encode(),
    "beauty/ticoserec/Beauty_time_org_rank.txt": "".join(
        f"{u} " + " ".join(str(86400 * (u + k)) for k in range(5)) + "\n" for u in range(1, 6)
    ).encode(),
}
VIDEO = {
    "video/sasrec/Video.txt": "".join(
        f"{u} {i}\n" for u in range(1, 6) for i in range(1, 6)
    ).encode()
}


@pytest.fixture
def mirror(server, monkeypatch):
    """The server holds the fixture files in the data-root layout; their digests are recorded."""
    server.files = {f"/{path}": body for path, body in {**BEAUTY, **VIDEO}.items()}
    digests = {path: hashlib.sha256(body).hexdigest() for path, body in {**BEAUTY, **VIDEO}.items()}
    monkeypatch.setattr("lsan.data.download.SHA256", digests)
    return server


def test_registry_points_at_pinned_sources_with_the_released_digests(shared_data):
    from lsan.data.download import SHA256

    for name, files in FILES.items():
        for f in files:
            assert re.fullmatch(
                r"https://raw\.githubusercontent\.com/[\w.-]+/[\w.-]+/[0-9a-f]{40}/data/.+", f.url
            )
            assert f.url.rsplit("/", 1)[1] == f.path.rsplit("/", 1)[1]  # the released file name
            assert f.path.split("/")[0] == name
            local = shared_data / f.path
            if local.is_file():  # the copies in ../shared/data are the released files
                assert SHA256[f.path] == file_digest(local), f.path
    assert set(SHA256) == {f.path for files in FILES.values() for f in files
                           if (shared_data / f.path).is_file()}  # fmt: skip


def test_beauty_download_lays_out_what_the_reader_needs(mirror, tmp_path):
    target = download("beauty", tmp_path, mirror=mirror.base, progress=False)
    assert target == tmp_path / "beauty"
    for path, body in BEAUTY.items():
        assert (tmp_path / path).read_bytes() == body
    raw = read_dataset("beauty", tmp_path)
    assert raw.timestamps is not None and len(raw.users) == 25
    assert [p.name for p in raw.files] == ["Beauty.txt", "Beauty_item2attributes.json",
                                           "Beauty_time_org_rank.txt"]  # fmt: skip
    assert {p.name for p in (tmp_path / "beauty").rglob("*")} == {
        "s3rec",
        "ticoserec",
        "Beauty.txt",
        "Beauty_item2attributes.json",
        "Beauty_time_org_rank.txt",
    }  # no .part or .download left
    seen = len(mirror.requests)
    assert download("beauty", tmp_path, mirror=mirror.base, progress=False) == target
    assert len(mirror.requests) == seen == 3  # present and checked: nothing fetched again


def test_video_download(mirror, tmp_path):
    download("video", tmp_path, mirror=mirror.base, progress=False)
    assert len(read_dataset("video", tmp_path).users) == 25


def test_raw_file_download_resumes(mirror, tmp_path):
    body = BEAUTY["beauty/s3rec/Beauty.txt"]
    part = tmp_path / "beauty" / "s3rec" / "Beauty.txt.download.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(body[:7])
    download("beauty", tmp_path, mirror=mirror.base, progress=False)
    assert mirror.requests[0] == {"path": "/beauty/s3rec/Beauty.txt", "range": "bytes=7-"}
    assert mirror.responses[0] == 206
    assert (tmp_path / "beauty" / "s3rec" / "Beauty.txt").read_bytes() == body


def test_raw_file_checksum_mismatch_keeps_nothing(mirror, tmp_path, monkeypatch):
    monkeypatch.setitem(
        __import__("lsan.data.download", fromlist=["SHA256"]).SHA256,
        "beauty/s3rec/Beauty_item2attributes.json",
        "0" * 64,
    )
    with pytest.raises(DataError, match="Beauty_item2attributes.json: checksum mismatch"):
        download("beauty", tmp_path, mirror=mirror.base, progress=False)
    assert (tmp_path / "beauty" / "s3rec" / "Beauty.txt").is_file()  # checked, kept
    assert sorted(p.name for p in (tmp_path / "beauty" / "s3rec").iterdir()) == ["Beauty.txt"]


def test_an_existing_different_file_is_not_overwritten(mirror, tmp_path):
    mine = tmp_path / "beauty" / "s3rec" / "Beauty.txt"
    mine.parent.mkdir(parents=True)
    mine.write_text("1 1 2 3 4 5\n")
    with pytest.raises(DataError, match=r"Beauty\.txt: exists but its sha256 is"):
        download("beauty", tmp_path, mirror=mirror.base, progress=False)
    assert mine.read_text() == "1 1 2 3 4 5\n"
    assert mirror.requests == []


def test_a_file_without_recorded_digest_is_reported(mirror, tmp_path, monkeypatch):
    del_key = "video/sasrec/Video.txt"
    monkeypatch.delitem(__import__("lsan.data.download", fromlist=["SHA256"]).SHA256, del_key)
    lines: list[str] = []
    download("video", tmp_path, mirror=mirror.base, progress=False, log=lines.append)
    digest = hashlib.sha256(VIDEO[del_key]).hexdigest()
    assert lines == [f"warning: {del_key}: no recorded sha256 to check; received sha256 {digest}"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_offline_is_one_clear_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    offline = f"http://127.0.0.1:{_closed_port()}"
    for name in ("beauty", "ml-100k"):
        argv = ["data", "download", name, "--data-dir", str(tmp_path), "--mirror", offline]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: cannot reach 127.0.0.1:"), err
        assert "offline?" in err[0] and "rerun to resume" in err[0]


def test_cli_download_beauty(mirror, tmp_path, capsys):
    argv = ["data", "download", "beauty", "--data-dir", str(tmp_path), "--mirror", mirror.base]
    assert main(argv) == 0
    assert f"beauty ready in {tmp_path / 'beauty'}" in capsys.readouterr().out
    assert main([*argv, "--md5", "0" * 32]) == 2  # the zip options are for MovieLens only
    assert "use --mirror" in capsys.readouterr().err
