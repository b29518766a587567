"""The page to try the model (GET /) and what it needs from the server: the catalogue search and
lookup route (GET /items), item titles carried in the artifact, and the page itself driven in
a real browser (the distribution's headless Chromium through selenium) against the real server.

Artifacts: a tiny LSAN on generated data (no titles) and, when the shared data is there, a tiny
SASRec on the real MovieLens-100K (titles from u.item). LSAN_PAGE_ARTIFACT=DIR adds an existing
artifact to the browser test; LSAN_SCREENSHOT=PATH keeps the browser's screenshot of it (of the
ML-100K one otherwise): the README's picture is made that way.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import httpx
import numpy as np
import pytest
import schemathesis
from conftest import REPO, fuzz_never_5xx, train_tiny, wait_ready
from fastapi.testclient import TestClient
from schemathesis import GenerationMode

from lsan import artifact
from lsan.artifact import MANIFEST, TABLES, ArtifactError, Tables, read
from lsan.data.readers import read_titles
from lsan.export.export import export
from lsan.serving.app import create_app
from lsan.serving.settings import Settings

T0 = 891_000_000  # 1998-03-27 (UTC), when the MovieLens-100K ratings were made
CHROMIUM = os.environ.get("LSAN_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("LSAN_CHROMEDRIVER", "/usr/bin/chromedriver")
GIVEN = os.environ.get("LSAN_PAGE_ARTIFACT", "")
SCREENSHOT = os.environ.get("LSAN_SCREENSHOT", "")


@pytest.fixture(scope="module")
def plain(small_ds, tmp_path_factory) -> Path:
    """LSAN (balanced qr tables) on generated data: raw ids and categories, no titles."""
    ck = train_tiny("lsan", {"dim": 16, "m1": 0}, small_ds, tmp_path_factory.mktemp("ck") / "lsan")
    out = tmp_path_factory.mktemp("art") / "plain"
    export(ck, out, quant="fp32", k=20, ds=small_ds, log=lambda *_: None)
    return out


@pytest.fixture(scope="module")
def titled(shared_data, tmp_path_factory) -> Path:
    """SASRec on the real ML-100K, one epoch: its artifact carries the titles of u.item."""
    from lsan.config import DataConfig, RunConfig, TrainConfig
    from lsan.data.prepare import load_dataset
    from lsan.models import model_config
    from lsan.train import train

    ds = load_dataset("ml-100k", str(shared_data))
    run = RunConfig(
        data=DataConfig(dataset="ml-100k", data_dir=str(shared_data), max_len=12),
        model_name="sasrec",
        model=model_config("sasrec", {"dim": 16, "layers": 1}),
        train=TrainConfig(epochs=1, batch_size=256, device="cpu"),
    )
    ck = tmp_path_factory.mktemp("ck") / "ml100k"
    train(run, ck, progress=False, ds=ds)
    out = tmp_path_factory.mktemp("art") / "ml100k"
    export(ck, out, quant="fp32", k=20, ds=ds, log=lambda *_: None)
    return out


@pytest.fixture(scope="module")
def plain_client(plain):
    with TestClient(create_app(Settings(artifact=plain))) as c:
        yield c


@pytest.fixture(scope="module")
def titled_client(titled):
    with TestClient(create_app(Settings(artifact=titled))) as c:
        yield c


def update_manifest(folder: Path, name: str) -> None:
    m = json.loads((folder / MANIFEST).read_text())
    data = (folder / name).read_bytes()
    m["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / MANIFEST).write_text(json.dumps(m))


def all_pages(client: TestClient, q: str, limit: int) -> list[dict]:
    """Every item of a search, page after page by next_offset."""
    got, offset = [], 0
    while offset is not None:
        page = client.get("/items", params={"q": q, "offset": offset, "limit": limit}).json()
        assert len(page["items"]) <= limit
        got += page["items"]
        offset = page["next_offset"]
    assert len(got) == page["total"]
    return got


# ---------------------------------------------------------------- titles in the artifact


def test_export_ships_the_datasets_titles(titled, shared_data):
    opened = read(titled)
    titles = opened.tables.item_titles
    raw = read_titles("ml-100k", shared_data)
    ids = opened.tables.raw_item_ids
    assert titles is not None and len(titles) == len(ids) == opened.meta.info.num_items + 1
    assert titles[0] == "" and titles[1:] == [raw[int(i)] for i in ids[1:]]
    assert titles[list(ids).index(1)] == "Toy Story (1995)"
    with np.load(titled / TABLES) as npz:  # compact: inside tables.npz, counted in its bytes
        assert artifact.TITLES in npz.files and npz[artifact.TITLES].dtype == np.uint8
    assert opened.meta.artifact_bytes == sum(p.stat().st_size for p in titled.iterdir())


def test_an_artifact_without_titles_reads_as_before(plain):
    """An artifact of a dataset without names (or of an older lsan) has exactly the three
    integer arrays, and the tables' digest the graph holds is computed as before."""
    with np.load(plain / TABLES) as npz:
        assert sorted(npz.files) == sorted(artifact.STORED_NAMES)
    opened = read(plain)
    assert opened.tables.item_titles is None
    t = opened.tables
    plain_digest = artifact.tables_digest(Tables(t.raw_item_ids, t.item_category, t.popular_items))
    assert artifact.tables_digest(t) == plain_digest


def test_bad_title_tables_are_refused_in_one_line(titled, tmp_path):
    t = read(titled).tables
    assert t.item_titles is not None
    swapped = [t.item_titles[0], t.item_titles[2], t.item_titles[1], *t.item_titles[3:]]
    joined = "\n".join(t.item_titles).encode()
    cases = [
        # (case, tables.npz arrays besides the integer ones, words in the message)
        ("one title too few", {artifact.TITLES: np.frombuffer(joined.rsplit(b"\n", 1)[0], np.uint8)}, "titles"),
        ("not UTF-8", {artifact.TITLES: np.frombuffer(b"\n\xff" + joined[2:], np.uint8)}, "UTF-8"),
        ("not bytes", {artifact.TITLES: np.frombuffer(joined, np.uint8).astype(np.int16)}, "uint8"),
        ("two titles swapped", {artifact.TITLES: np.frombuffer("\n".join(swapped).encode(), np.uint8)}, "differ"),
    ]  # fmt: skip
    with np.load(titled / TABLES) as npz:
        ints = {n: npz[n] for n in artifact.STORED_NAMES}
    for case, extra, words in cases:
        bad = tmp_path / case.replace(" ", "-")
        shutil.copytree(titled, bad)
        np.savez_compressed(bad / TABLES, **ints, **extra)
        update_manifest(bad, TABLES)  # a consistent manifest: only the tables' checks can tell
        with pytest.raises(ArtifactError) as info:
            read(bad)
        msg = str(info.value)
        assert "\n" not in msg and TABLES in msg and words in msg, (case, msg)


# ---------------------------------------------------------------- GET /items


def reference_search(q: str, folder: Path) -> list[int]:
    """What a search must answer, item by item in plain Python: the raw id equal to q, raw ids
    starting with q, titles starting with q, titles holding q, category names holding q."""
    opened = read(folder)
    t, names = opened.tables, opened.meta.category_names
    q = " ".join(q.split()).casefold()
    found = []
    for i in range(1, len(t.raw_item_ids)):
        rid = str(int(t.raw_item_ids[i]))
        title = " ".join(t.item_titles[i].split()).casefold() if t.item_titles else ""
        cat = int(t.item_category[i])
        category = names[cat].casefold() if cat > 1 else ""
        tests = [rid == q, rid.startswith(q), title.startswith(q) and title != "", q in title,
                 category != "" and q in category]  # fmt: skip
        if any(tests):
            found.append((tests.index(True), int(t.raw_item_ids[i])))
    return [item for _, item in sorted(found)]  # raw ids ascend with the item index


@pytest.mark.parametrize(
    "q", ["star wars", "  STAR   wars ", "toy", "the", "(1995)", "12", "1", "western", "DRAMA",
          "ü", "zzzz-no-such-thing", "007", "0"],
)  # fmt: skip
def test_search_over_titles_ids_and_categories(titled_client, titled, q):
    got = all_pages(titled_client, q, 100)
    assert [it["item_id"] for it in got] == reference_search(q, titled)
    assert {it["title"] is None for it in got} <= {False}  # every ML-100K item has a title


def test_search_finds_a_title_first(titled_client):
    star = titled_client.get("/items", params={"q": "  STAR   wars "}).json()
    assert star["titles"] is True and star["items"][0]["title"] == "Star Wars (1977)"
    assert titled_client.get("/items", params={"q": "zzzz-no-such-thing"}).json() == {
        "items": [], "total": 0, "offset": 0, "next_offset": None, "unknown_items": [], "titles": True,
    }  # fmt: skip


def test_empty_query_pages_through_the_catalogue_most_popular_first(plain_client, plain):
    opened = read(plain)
    t = opened.tables
    got = all_pages(plain_client, "", 37)
    assert [it["item_id"] for it in got[: len(t.popular_items)]] == t.raw_item_ids[
        t.popular_items
    ].tolist()
    assert sorted(it["item_id"] for it in got) == sorted(t.raw_item_ids[1:].tolist())
    names = opened.meta.category_names
    by_id = {int(r): int(c) for r, c in zip(t.raw_item_ids, t.item_category, strict=True)}
    for it in got:
        assert it["title"] is None
        assert it["category"] == (names[by_id[it["item_id"]]] if by_id[it["item_id"]] > 1 else None)


def test_search_without_titles_matches_ids_and_categories(plain_client, plain):
    opened = read(plain)
    some = int(opened.tables.raw_item_ids[len(opened.tables.raw_item_ids) // 2])
    for q in (str(some), "1", "2", opened.meta.category_names[3].upper(), "cat", "x"):
        got = all_pages(plain_client, q, 7)
        assert [it["item_id"] for it in got] == reference_search(q, plain), q
    assert all_pages(plain_client, str(some), 7)[0]["item_id"] == some


def test_lookup_answers_in_order_and_lists_unknown_ids(plain_client, plain):
    ids = read(plain).tables.raw_item_ids[1:].tolist()
    ask = [ids[5], 99_999_999, ids[0], ids[3]]
    page = plain_client.get("/items", params={"ids": ask}).json()
    assert [it["item_id"] for it in page["items"]] == [ids[5], ids[0], ids[3]]
    assert page["unknown_items"] == [99_999_999] and page["total"] == 3


BAD_QUERIES = [
    # (case, query string, text in the message)
    ("limit zero", "limit=0", "query.limit: Input should be greater than or equal to 1"),
    ("limit above the page", "limit=101", "query.limit: Input should be less than or equal to 100"),
    ("limit not a number", "limit=ten", "query.limit"),
    ("limit a float", "limit=2.0", "query.limit: Input should be an integer in decimal digits"),
    ("limit in e-notation", "limit=1e2", "query.limit"),
    ("offset negative", "offset=-1", "query.offset"),
    ("offset huge", "offset=" + "9" * 25, "query.offset"),
    ("q too long", "q=" + "a" * 101, "query.q"),
    ("unknown parameter", "query=star", "query.query: Extra inputs are not permitted"),
    ("q and ids", "q=star&ids=1", "give q (a search) or ids (a lookup), not both"),
    ("too many ids", "&".join(["ids=1"] * 101), "query.ids"),
    ("id negative", "ids=-3", "query.ids[0]"),
    ("id not a number", "ids=1,2", "query.ids[0]"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("query", "says"), [c[1:] for c in BAD_QUERIES], ids=[c[0] for c in BAD_QUERIES]
)
def test_bad_item_queries_are_clear_422s(plain_client, query, says):
    r = plain_client.get("/items?" + query)
    assert r.status_code == 422 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert says in body["message"] and body["errors"], body


def test_items_is_503_before_the_model_is_ready(plain):
    c = TestClient(create_app(Settings(artifact=plain)))  # no lifespan: not loaded
    r = c.get("/items", params={"q": "1"})
    assert r.status_code == 503 and r.json() == {"message": "model not loaded yet"}


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_fuzzed_item_queries_never_get_a_5xx(plain, mode):
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(Settings(artifact=plain)))
    fuzz_never_5xx(schema["/items"]["GET"], mode)


# ---------------------------------------------------------------- GET / and the model card


def test_the_page_is_one_self_contained_file(plain_client):
    r = plain_client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    policy = r.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy
    page = r.text
    # nothing to fetch from elsewhere: no URL, no script or style file, no font
    assert "http:" not in page and "https:" not in page
    assert re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)""", page) == ["data:,"]  # the icon
    assert not re.search(r"<script[^>]+src|stylesheet|@import|@font-face|url\(", page)
    assert "innerHTML" not in page  # server text is shown with textContent only


def test_the_page_ships_with_the_serving_package():
    """`pip install '.[serve]'` installs it (CI also fetches GET / from such an install)."""
    shipped = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert shipped["package-data"]["lsan.serving"] == ["page.html"]
    assert (REPO / "serving" / "page.html").is_file()


def test_metadata_carries_the_card(plain_client, titled_client):
    for c, titles in ((plain_client, False), (titled_client, True)):
        m = c.get("/metadata").json()
        assert m["item_titles"] is titles
        w = m["warmup"]
        assert w["requests"] == 21 and 0 < w["p50_ms"] <= w["first_ms"] * 10 and w["p50_ms"] < 1000
        assert set(m["test_metrics"]) >= {"HR@10", "NDCG@10"}


# ---------------------------------------------------------------- the page in a real browser


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium from the distribution's packages; selenium never downloads a driver."""
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium not installed (pip install -e '.[dev]')"
    )
    from selenium.webdriver.chrome.service import Service

    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).is_file()]
    if missing:
        pytest.skip(f"no browser for the page test: {', '.join(missing)} missing "
                    "(apt-get install chromium chromium-driver; .ci/run installs them)")  # fmt: skip
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1440,1000", "--hide-scrollbars", "--lang=en-US"):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(params=["plain", "titled", *(["given"] if GIVEN else [])])
def served(request, tmp_path):
    """The real server (`python -m serving ARTIFACT`, uvicorn) on 127.0.0.1: (url, artifact)."""
    art = Path(GIVEN) if request.param == "given" else request.getfixturevalue(request.param)
    port, log = free_port(), tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "serving", str(art), "--port", str(port)],
                                cwd=REPO, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, log)
    yield url, art, request.param
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) in (0, -signal.SIGTERM), log.read_text()


def test_the_page_in_a_real_browser(browser, served, tmp_path, request):
    """Open the page, read the card, search, add four items, remove one and reorder, set the
    times and k, ask: the list is POST /recommend's for the same history; the cold start is
    shown as the popular fallback; bad input shows the server's message, never a traceback."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    url, art, which = served
    api = httpx.Client(base_url=url, timeout=10)
    request.addfinalizer(api.close)
    meta = api.get("/metadata").json()
    tables = read(art).tables
    d = browser
    wait = WebDriverWait(d, 10)

    def settles(get, want) -> None:
        """Wait until the page shows `want`; if it never does, fail showing what it shows."""
        with contextlib.suppress(TimeoutException):
            wait.until(lambda _: get() == want)
        assert get() == want

    one = d.find_element

    def text(css: str) -> str:
        return one(By.CSS_SELECTOR, css).text

    # read in one script call: the page re-renders lists, an element found earlier may be gone
    def shown_ids(css: str) -> list[int]:
        return d.execute_script("return [...document.querySelectorAll(arguments[0])]"
                                ".map(e => Number(e.dataset.itemId))", css)  # fmt: skip

    def answer_rows() -> list[tuple[int, float]]:
        rows = d.execute_script("return [...document.querySelectorAll('#answer tbody tr')]"
                                ".map(e => [e.dataset.itemId, e.dataset.score])")  # fmt: skip
        return [(int(i), float(s)) for i, s in rows]

    def api_rows(body: dict) -> list[tuple[int, float]]:
        got = api.post("/recommend", json=body).json()
        return [(it["item_id"], it["score"]) for it in got["items"]]

    d.get(url + "/")
    # the card: what /metadata says of this exact file
    wait.until(lambda _: d.find_elements(By.CSS_SELECTOR, '[data-field="model"]'))
    assert text('[data-field="model"]') == meta["model"]
    assert text('[data-field="format"]') == meta["quantization"]
    assert text('[data-field="artifact bytes"]') == f"{meta['artifact_bytes']:,}"
    assert text('[data-field="dataset"]').startswith(meta["dataset"])
    for name in ("HR@10", "NDCG@10"):
        value = (meta["test_metrics"] or {}).get(name)
        assert text(f'[data-field="test {name}"]') == (
            f"{value:.4f}" if value is not None else "not measured"
        )
    assert text('[data-field="p50 at warm-up"]').startswith(f"{meta['warmup']['p50_ms']:.3f} ms")
    hp = meta["hyperparameters"]
    assert f"D = {hp['dim']}" in text('[data-field="layout"]')

    # the catalogue, most popular first, before anything is typed
    popular = tables.raw_item_ids[tables.popular_items].tolist()
    settles(lambda: shown_ids("#found li")[:5], popular[:5])

    # cold start: an empty history gets the popular fallback, shown as such
    one(By.ID, "go").click()
    empty = {"history": [], "k": 10, "exclude_seen": True}
    settles(answer_rows, api_rows(empty))
    assert one(By.ID, "fallback").is_displayed()
    assert one(By.ID, "fallback").get_attribute("data-fallback") == "popular"
    assert "popular" in text("#fallback")

    # search for four items (by title when there are titles, else by raw id) and add each
    titles = tables.item_titles
    index = {int(r): i for i, r in enumerate(tables.raw_item_ids)}
    chosen = popular[1:5]
    search = one(By.ID, "q")
    for item in chosen:
        q = titles[index[item]] if titles else str(item)
        search.clear()
        search.send_keys(q)
        first_page = [
            it["item_id"] for it in api.get("/items", params={"q": q, "limit": 30}).json()["items"]
        ]
        assert item in first_page
        settles(lambda: shown_ids("#found li"), first_page)
        one(By.CSS_SELECTOR, f'#found li[data-item-id="{item}"]').click()
    assert shown_ids("#history li") == chosen

    # results as you type, page after page
    q = "the" if titles else "1"
    pages = api.get("/items", params={"q": q, "limit": 60}).json()
    assert pages["total"] > 30  # two pages of the page's 30
    search.clear()
    search.send_keys(q)
    settles(lambda: shown_ids("#found li"), [it["item_id"] for it in pages["items"][:30]])
    one(By.ID, "more").click()
    settles(lambda: shown_ids("#found li"), [it["item_id"] for it in pages["items"]])
    assert one(By.ID, "more").is_displayed() == (pages["total"] > 60)
    assert text("#found-info") == f"{pages['total']:,} matches"

    # remove the second, move the (new) last one up: a, d, c
    d.find_elements(By.CSS_SELECTOR, "#history li .remove")[1].click()
    d.find_elements(By.CSS_SELECTOR, "#history li .up")[2].click()
    order = [chosen[0], chosen[3], chosen[2]]
    assert shown_ids("#history li") == order

    # optional timestamps, an hour apart; k 10; seen items excluded
    for n, box in enumerate(d.find_elements(By.CSS_SELECTOR, "#history .ts")):
        box.send_keys(str(T0 + 3600 * n))
    k_box = one(By.ID, "k")
    k_box.send_keys(Keys.CONTROL, "a")
    k_box.send_keys("10")
    body = {"history": [{"item_id": i, "timestamp": T0 + 3600 * n} for n, i in enumerate(order)],
            "k": 10, "exclude_seen": True}  # fmt: skip
    expected = api_rows(body)
    assert len(expected) == 10 and not {i for i, _ in expected} & set(order)
    one(By.ID, "go").click()
    settles(answer_rows, expected)
    assert json.loads(one(By.ID, "request").get_attribute("textContent")) == body
    assert not one(By.ID, "fallback").is_displayed() and not one(By.ID, "error").is_displayed()
    ranks = [r.text for r in d.find_elements(By.CSS_SELECTOR, "#answer tbody tr td:first-child")]
    assert ranks == [str(r) for r in range(1, 11)]
    names = [r.text for r in d.find_elements(By.CSS_SELECTOR, "#answer tbody tr td:nth-child(2)")]
    for (item, _), name in zip(expected, names, strict=True):
        title = titles[index[item]] if titles else ""
        assert name == (f"{title} #{item}" if title else f"item {item}")
    cats = [r.text for r in d.find_elements(By.CSS_SELECTOR, "#answer tbody tr td:nth-child(3)")]
    cat_names = meta["category_names"]
    assert cats == [cat_names[c] if (c := int(tables.item_category[index[i]])) > 1 else ""
                    for i, _ in expected]  # fmt: skip
    latency = float(one(By.ID, "latency").get_attribute("data-latency-ms"))
    assert 0 < latency < 1000 and f"{latency:.3f} ms on the server" in text("#latency")
    shot = tmp_path / "page.png"
    assert d.save_screenshot(str(shot)) and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if SCREENSHOT and which == ("given" if GIVEN else "titled"):
        shutil.copyfile(shot, SCREENSHOT)

    # bad input: the server's message, readable, in place of the answer
    boxes = d.find_elements(By.CSS_SELECTOR, "#history .ts")
    boxes[2].send_keys(Keys.CONTROL, "a")
    boxes[2].send_keys(str(T0 - 60))  # older than the first: not oldest first
    one(By.ID, "go").click()
    settles(lambda: one(By.ID, "error").is_displayed(), True)
    shown = text("#error")
    assert shown.startswith("HTTP 422: invalid request: history") and "oldest first" in shown
    assert not one(By.ID, "answer").is_displayed()
    boxes[2].send_keys(Keys.CONTROL, "a")
    boxes[2].send_keys("soon")  # not a time: sent as typed, the server names the field
    one(By.ID, "go").click()
    settles(lambda: "history[2].timestamp" in text("#error"), True)
    assert text("#error").startswith(
        "HTTP 422: invalid request: history[2].timestamp: Input should be"
    )
    boxes[2].send_keys(Keys.CONTROL, "a", Keys.DELETE)
    k_box.send_keys(Keys.CONTROL, "a")
    k_box.send_keys(str(meta["limits"]["k_max"] + 1))
    one(By.ID, "go").click()
    settles(lambda: "k must be at most" in text("#error"), True)
    assert text("#error") == (f"HTTP 422: invalid request: k: k must be at most "
                              f"{meta['limits']['k_max']} (this server's k max)")  # fmt: skip
    assert "Traceback" not in d.page_source and "internal server error" not in d.page_source

    # nothing came from anywhere but this server, and no script error
    loaded = d.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert loaded and all(name.startswith(url + "/") for name in loaded), loaded
    errors = [e["message"] for e in d.get_log("browser") if "Uncaught" in e["message"]]
    assert not errors, errors
