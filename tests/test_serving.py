"""The HTTP server on a tiny trained artifact: routes, bad input, the real uvicorn process,
schema fuzzing and a bounded load test with a flat-memory check."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import schemathesis
from conftest import fuzz_never_5xx, train_tiny, wait_ready
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from schemathesis import GenerationMode

from lsan.artifact import MODEL, read
from lsan.benchmarks import serve_load
from lsan.data.prepare import with_slot_rule
from lsan.data.slots import UNKNOWN, time_slots
from lsan.export.export import export
from lsan.serving import app as app_module
from lsan.serving.app import create_app, serve
from lsan.serving.runtime import ArtifactError, load_artifact
from lsan.serving.schemas import RecommendResponse
from lsan.serving.settings import Settings

REPO = Path(__file__).resolve().parents[1]
T0 = 1_700_000_000  # a unix time to build histories from


@pytest.fixture(scope="module")
def artifact(small_ds, tmp_path_factory) -> Path:
    ck = train_tiny("lsan", {"dim": 16, "m1": 0}, small_ds, tmp_path_factory.mktemp("ck"))
    out = tmp_path_factory.mktemp("artifacts") / "lsan"
    # fp32 only: the server is format-agnostic and measuring every format would double the time
    export(ck, out, quant="fp32", k=20, ds=small_ds, log=lambda *_: None)
    return out


@pytest.fixture(scope="module")
def opened(artifact):
    return read(artifact)


@pytest.fixture(scope="module")
def meta(opened):
    return opened.meta


@pytest.fixture(scope="module")
def catalogue(opened) -> list[int]:
    return [int(r) for r in opened.tables.raw_item_ids[1:]]  # index 0 is padding


@pytest.fixture(scope="module")
def client(artifact):
    with TestClient(create_app(Settings(artifact=artifact))) as c:
        yield c


def history(ids, times=True) -> list[dict]:
    return [{"item_id": i, "timestamp": T0 + 3600 * n} if times else {"item_id": i}
            for n, i in enumerate(ids)]  # fmt: skip


def counter(text: str, name: str, **labels: str) -> float:
    """Value of one Prometheus sample (0 when absent)."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


# ---------------------------------------------------------------- routes


def test_health_ready_metadata(client, artifact, meta):
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").json() == {"status": "ready", "model": "lsan"}
    r = client.get("/metadata")
    assert r.status_code == 200 and len(r.content) < 10_000  # no id tables
    got = r.json()
    assert "raw_item_ids" not in r.text and "popular_items" not in r.text
    assert got["model"] == "lsan" and got["dataset"] == "synthetic"
    assert got["contract"]["max_len"] == 12 and got["contract"]["k"] == 20
    assert got["quantization"] == "fp32" and got["batch_invariant"] is True
    assert got["model_onnx_bytes"] == (artifact / MODEL).stat().st_size
    assert got["artifact_bytes"] == sum(p.stat().st_size for p in artifact.iterdir())
    assert got["parity"]["fp32"]["top10_identical"] is True
    assert got["test_metrics"] == meta.test_metrics
    assert got["files"][MODEL]["sha256"] == read(artifact).manifest.files[MODEL].sha256
    assert got["threads"] == 1
    assert got["limits"] == {"k_max": 20, "max_history": 1000, "max_batch": 64,
                             "max_body_bytes": 1 << 20}  # fmt: skip


def test_recommend_ranks_raw_ids_and_excludes_seen(client, catalogue):
    seen = catalogue[5:20]
    r = client.post("/recommend", json={"history": history(seen), "k": 7})
    assert r.status_code == 200
    body = r.json()
    assert body["model"] == "lsan" and body["fallback"] is None and body["unknown_items"] == []
    assert [it["rank"] for it in body["items"]] == list(range(1, 8))
    scores = [it["score"] for it in body["items"]]
    assert scores == sorted(scores, reverse=True)
    ids = [it["item_id"] for it in body["items"]]
    assert set(ids) <= set(catalogue) and not set(ids) & set(seen) and len(set(ids)) == 7
    assert body["latency_ms"] > 0
    # the server adds nothing to the runtime's answer
    direct = load_artifact(client.app.state.settings.artifact).recommend(
        [[(e["item_id"], e["timestamp"]) for e in history(seen)]], k=7
    )[0]
    assert ids == [i for i, _ in direct.items]
    assert scores == pytest.approx([s for _, s in direct.items], abs=1e-6)


def gap_slot(prev: float | None, cur: float | None) -> int:
    """The "gap" rule for one entry, written out: the time since the entry before it."""
    if prev is None or cur is None or int(cur) < int(prev) or prev < 0:
        return UNKNOWN
    seconds = int(cur) - int(prev)
    if seconds == 0:
        return 2
    return 3 + min(max(math.floor(math.log2(max(seconds / 60, 1))), 0), 22)


@pytest.mark.parametrize("rule", ["own", "gap"])
def test_id_lookup_and_encoding_match_a_plain_reference(artifact, catalogue, rule):
    """The runtime's vectorised encoding against one written entry by entry: the direct id
    table and the binary search agree on every id (out-of-range ones too), unknown ids are
    skipped and reported in order, None means an unknown time slot, the last max_len known
    entries are kept, and every known id is excluded. Under "gap" each kept entry's slot is the
    time since the known entry before it, the first kept one included (truncation keeps it)."""
    art = load_artifact(artifact)
    if rule == "gap":
        art.slot_rule = "gap"
    assert art.direct is not None  # the test data's raw ids are dense
    index = {raw: i for i, raw in enumerate(catalogue, 1)}
    probe = [*catalogue, -(2**63), -1, 0, max(catalogue) + 1, 10**12, 2**63 - 1]
    want = [index.get(raw, 0) for raw in probe]
    assert art.indices(probe).tolist() == want
    direct, art.direct = art.direct, None
    assert art.indices(probe).tolist() == want
    art.direct = direct
    rng = random.Random(0)
    for trial in range(30):
        n = rng.randint(0, 3 * art.max_len)
        raw = [rng.choice(catalogue) if rng.random() < 0.8 else 10**9 + j for j in range(n)]
        # times mostly rising (by up to ~2 days, sometimes not at all), now and then earlier
        when = [T0 + rng.choice([0, 0.5, 59, 3571.5, 170000]) * j * rng.choice([1, 1, 1, -1])
                for j in range(n)]  # fmt: skip
        hist = [(r, None if rng.random() < 0.3 else w) for r, w in zip(raw, when, strict=True)]
        feeds, unknown, known = art.encode([hist], exclude_seen=trial % 2 == 0)
        kept = [(index[r], s) for r, s in hist if r in index]
        assert unknown == [[r for r, _ in hist if r not in index]] and known == [len(kept)]
        start = len(kept) - min(len(kept), art.max_len)
        last = kept[start:]
        pad = art.max_len - len(last)
        if rule == "gap":
            before = [None, *(s for _, s in kept)]
            slots = [gap_slot(before[start + j], s) for j, (_, s) in enumerate(last)]
        else:
            slots = [int(time_slots(np.array([-1 if s is None else int(s)]), art.slot_rule)[0])
                     for _, s in last]  # fmt: skip
        assert feeds["items"][0].tolist() == [0] * pad + [i for i, _ in last]
        assert feeds["slots"][0].tolist() == [0] * pad + slots
        assert feeds["cats"][0].tolist() == art.category[feeds["items"][0]].tolist()
        excluded = feeds["exclude"][0].tolist()
        if trial % 2 == 0:
            assert excluded[: len(kept)] == [i for i, _ in kept] and not any(excluded[len(kept) :])
        else:
            assert excluded == [0]


@pytest.mark.parametrize("rule", ["hour", "weekday", "gap", "ahead", "none"])
def test_served_slots_are_the_trained_ones(artifact, small_ds, rule):
    """A user's whole history sent to the runtime gets the time slots training windows read
    for that user's last max_len items, under every rule ("gap" across the truncation too;
    "ahead" with the next interaction's time as the request's, `at`, its history the rest)."""
    art = load_artifact(artifact)
    art.slot_rule = rule
    ds = with_slot_rule(small_ds, rule)
    assert ds.slot_rule == rule and small_ds.slot_rule == "hour"  # the fixture's own rule kept
    long = [u for u in range(ds.num_users) if ds.lengths[u] > art.max_len][:20]
    assert long, "the fixture has users longer than max_len"
    for u in [*long, 0, 1]:
        lo, hi = ds.offsets[u], ds.offsets[u + 1] - (rule == "ahead")
        hist = [(int(ds.raw_item_ids[i]), float(t))
                for i, t in zip(ds.items[lo:hi], ds.timestamps[lo:hi], strict=True)]  # fmt: skip
        at = [float(ds.timestamps[hi])] if rule == "ahead" else []
        feeds, _, _ = art.encode([hist], exclude_seen=False, at=at)
        n = min(hi - lo, art.max_len)
        assert feeds["slots"][0, art.max_len - n :].tolist() == ds.slots[hi - n : hi].tolist()


def test_the_request_time_is_read_only_by_the_ahead_rule(client, catalogue):
    """`at` is accepted (no earlier than the history) and changes nothing for an artifact whose
    time rule does not read it; the runtime's reading of it is test_served_slots_are_the_trained_ones'."""
    h = history(catalogue[:5])
    plain = client.post("/recommend", json={"history": h, "k": 5}).json()
    last = max(e["timestamp"] for e in h)
    for at in (last, last + 86400 * 30):
        timed = client.post("/recommend", json={"history": h, "k": 5, "at": at})
        assert timed.status_code == 200 and timed.json()["items"] == plain["items"]


def test_most_recent_entries_are_used(client, catalogue):
    long = history(catalogue[:40])  # max_len is 12: only the last 12 count
    a = client.post("/recommend", json={"history": long, "exclude_seen": False}).json()
    b = client.post("/recommend", json={"history": long[-12:], "exclude_seen": False}).json()
    assert [i["item_id"] for i in a["items"]] == [i["item_id"] for i in b["items"]]


def test_unknown_items_are_skipped_and_reported(client, catalogue):
    unknown = [max(catalogue) + 1, 10**12]
    h = history([catalogue[0], unknown[0], catalogue[1], unknown[1]])
    body = client.post("/recommend", json={"history": h, "k": 5}).json()
    assert body["unknown_items"] == unknown and body["fallback"] is None
    known = client.post("/recommend", json={"history": [h[0], h[2]], "k": 5}).json()
    assert [i["item_id"] for i in body["items"]] == [i["item_id"] for i in known["items"]]


def test_empty_or_unknown_history_falls_back_to_popular(client, opened):
    t = opened.tables
    popular = [int(t.raw_item_ids[i]) for i in t.popular_items[:5]]
    for h, unknown in [([], []), (history([10**9, 10**9 + 1]), [10**9, 10**9 + 1])]:
        body = client.post("/recommend", json={"history": h, "k": 5}).json()
        assert body["fallback"] == "popular" and body["unknown_items"] == unknown
        assert [i["item_id"] for i in body["items"]] == popular
        assert [i["rank"] for i in body["items"]] == [1, 2, 3, 4, 5]


def test_never_returns_seen_items_when_few_are_left(client, catalogue):
    seen = catalogue[:-5]  # only 5 unseen items left for k=20
    body = client.post("/recommend", json={"history": history(seen, times=False), "k": 20}).json()
    ids = [i["item_id"] for i in body["items"]]
    assert sorted(ids) == sorted(catalogue[-5:])


def test_batch_matches_single_requests(client, catalogue):
    # every personalised history reaches max_len (12), so each row is encoded with the same
    # length alone or in the batch: the model's scores depend slightly on the padded length
    reqs = [
        {"history": history(catalogue[10:25]), "k": 3},
        {"history": history(catalogue[30:42]), "k": 8, "exclude_seen": False},
        {"history": []},
        {"history": history([*catalogue[50:62], 10**9]), "k": 20},
    ]
    r = client.post("/recommend/batch", json={"requests": reqs})
    assert r.status_code == 200
    got = r.json()["results"]
    assert [len(g["items"]) for g in got] == [3, 8, 10, 20]
    for req, g in zip(reqs, got, strict=True):
        single = client.post("/recommend", json=req).json()
        assert [i["item_id"] for i in g["items"]] == [i["item_id"] for i in single["items"]]
        assert [i["score"] for i in g["items"]] == pytest.approx(
            [i["score"] for i in single["items"]], abs=1e-5
        )
        assert (g["fallback"], g["unknown_items"]) == (single["fallback"], single["unknown_items"])


@given(data=st.data())
@settings(max_examples=50, deadline=None, database=None)
def test_any_valid_history_gets_a_sound_answer(client, catalogue, data):
    """Property: known and unknown ids, with or without times, any k and exclusion."""
    ids = data.draw(st.lists(st.sampled_from(catalogue) | st.integers(0, 10**6), max_size=30))
    times = data.draw(
        st.lists(st.none() | st.integers(0, 2 * T0), min_size=len(ids), max_size=len(ids))
    )
    stamps = iter(sorted(t for t in times if t is not None))  # oldest first
    entries = {(i, None if t is None else next(stamps)) for i, t in zip(ids, times, strict=True)}
    h = sorted(entries, key=lambda e: -1 if e[1] is None else e[1])  # no duplicates
    k, exclude = data.draw(st.integers(1, 20)), data.draw(st.booleans())
    body = {
        "history": [{"item_id": i, "timestamp": t} for i, t in h],
        "k": k,
        "exclude_seen": exclude,
    }
    r = client.post("/recommend", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    items = [i["item_id"] for i in got["items"]]
    known = {i for i, _ in h if i in set(catalogue)}
    assert [i["rank"] for i in got["items"]] == list(range(1, len(items) + 1))
    assert len(items) == min(k, len(catalogue) - (len(known) if exclude else 0))
    assert len(set(items)) == len(items) and set(items) <= set(catalogue)
    assert not (exclude and set(items) & known)
    scores = [i["score"] for i in got["items"]]
    assert scores == sorted(scores, reverse=True)
    assert got["fallback"] == (None if known else "popular")
    assert got["unknown_items"] == [i for i, _ in h if i not in known]


def test_metrics_count_requests_by_route_and_status(client):
    before = client.get("/metrics").text
    client.post("/recommend", json={"history": []})
    client.post("/recommend", json={"history": [], "k": 0})
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    name, ok = "lsan_http_requests_total", {"route": "/recommend", "method": "POST"}
    for status in ("200", "422"):
        assert counter(text, name, status=status, **ok) == counter(before, name, status=status, **ok) + 1  # fmt: skip
    assert counter(text, "lsan_http_request_duration_seconds_count", route="/recommend") >= 2
    assert counter(text, "lsan_recommendations_total", fallback="popular") >= 1
    assert counter(text, "lsan_model_ready") == 1


def timing(response: httpx.Response) -> dict[str, float]:
    """Server-Timing `name;dur=ms, ...` as {name: ms}."""
    parts = (p.strip().partition(";dur=") for p in response.headers["server-timing"].split(","))
    return {name: float(ms) for name, _, ms in parts}


def test_server_timing_says_the_model_and_the_total(client, catalogue):
    r = client.post("/recommend", json={"history": history(catalogue[:10]), "k": 5})
    t = timing(r)
    assert set(t) == {"model", "total"}
    assert 0 < t["model"] <= r.json()["latency_ms"] <= t["total"]  # model <= route <= server
    batch = {"requests": [{"history": history(catalogue[:5])},
                          {"history": history(catalogue[5:9]), "exclude_seen": False}]}  # fmt: skip
    r = client.post("/recommend/batch", json=batch)
    t = timing(r)
    assert 0 < t["model"] <= r.json()["latency_ms"] <= t["total"]
    for r in (client.get("/health"), client.post("/recommend", json={"history": [], "k": 0})):
        assert set(timing(r)) == {"total"} and timing(r)["total"] > 0


def test_the_fast_path_answers_as_the_framework_does(client, catalogue, monkeypatch):
    """A plain `application/json` body is answered by the fast path; another JSON media type
    goes through FastAPI's route: the same answer either way."""
    calls: list[int] = []
    real = app_module.recommend
    monkeypatch.setattr(app_module, "recommend", lambda *a: calls.append(1) or real(*a))
    body = json.dumps({"history": [*history(catalogue[3:30]), {"item_id": 10**9}], "k": 9})
    fast = client.post("/recommend", content=body, headers={"content-type": "application/json"})
    assert calls == [1]  # FastAPI's route holds the original function, not this spy
    slow = client.post(
        "/recommend", content=body, headers={"content-type": "application/json; charset=utf-8"}
    )
    assert calls == [1]
    assert fast.status_code == slow.status_code == 200
    assert fast.headers["content-type"] == slow.headers["content-type"] == "application/json"
    a, b = fast.json(), slow.json()
    assert a.pop("latency_ms") > 0 and b.pop("latency_ms") > 0
    assert a == b and a["unknown_items"] == [10**9] and len(a["items"]) == 9
    schema = RecommendResponse.model_validate_json(fast.content)
    assert schema.model_dump(exclude={"latency_ms"}) == a
    # a request the fast path cannot answer is the framework's, with the body replayed
    bad = client.post("/recommend", content=body.replace('"k": 9', '"k": 99'),
                      headers={"content-type": "application/json"})  # fmt: skip
    assert bad.status_code == 422 and "at most 20" in bad.json()["message"] and calls == [1, 1]


def test_an_error_on_the_fast_path_is_the_json_500(artifact, monkeypatch):
    with TestClient(create_app(Settings(artifact=artifact)), raise_server_exceptions=False) as c:

        def boom(*args, **kwargs):
            raise RuntimeError("secret internals")

        monkeypatch.setattr(c.app.state.artifact, "recommend_timed", boom)
        r = c.post("/recommend", json={"history": []})
        assert r.status_code == 500 and r.json() == {"message": "internal server error"}
        text = c.get("/metrics").text
        assert counter(text, "lsan_http_exceptions_total", route="/recommend") == 1
        assert counter(text, "lsan_http_requests_total", route="/recommend", status="500") == 1


def test_apps_have_their_own_settings_and_registries(artifact, monkeypatch):
    monkeypatch.setenv("LSAN_ARTIFACT", str(artifact))
    monkeypatch.setenv("LSAN_MAX_K", "5")
    monkeypatch.setenv("LSAN_THREADS", "2")
    a, b = create_app(), create_app(Settings(artifact=artifact, max_k=500))
    assert a.state.metrics.registry is not b.state.metrics.registry
    with TestClient(a) as ca, TestClient(b) as cb:
        got = ca.get("/metadata").json()
        assert got["limits"]["k_max"] == 5 and got["threads"] == 2
        assert cb.get("/metadata").json()["limits"]["k_max"] == 20  # never above the top-K
        assert ca.post("/recommend", json={"history": [], "k": 6}).status_code == 422
        assert counter(cb.get("/metrics").text, "lsan_http_requests_total", route="/recommend") == 0


def test_not_ready_before_the_lifespan(artifact):
    c = TestClient(create_app(Settings(artifact=artifact)))  # no `with`: the model never loads
    assert c.get("/health").status_code == 200
    r = c.get("/ready")
    assert r.status_code == 503 and r.json()["status"] == "loading"
    r = c.post("/recommend", json={"history": []})
    assert r.status_code == 503 and "not loaded" in r.json()["message"]


def test_unexpected_error_is_json_500_without_traceback(artifact):
    app = create_app(Settings(artifact=artifact))

    def boom() -> None:
        raise RuntimeError("secret internals")

    app.add_api_route("/boom", boom)
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.get("/boom")
        assert r.status_code == 500 and r.json() == {"message": "internal server error"}
        assert "secret" not in r.text and "Traceback" not in r.text
        text = c.get("/metrics").text
        assert counter(text, "lsan_http_exceptions_total", route="/boom") == 1
        assert counter(text, "lsan_http_requests_total", route="/boom", status="500") == 1


# ---------------------------------------------------------------- bad input


def _json(body: str) -> dict:
    return {"content": body.encode(), "headers": {"content-type": "application/json"}}


OK = {"item_id": 2, "timestamp": T0}
BAD = [
    # (case, method, path, request kwargs, status, text in the message)
    ("k as string", "post", "/recommend", {"json": {"history": [], "k": "10"}}, 422, "k"),
    ("k zero", "post", "/recommend", {"json": {"history": [], "k": 0}}, 422, "k"),
    ("k negative", "post", "/recommend", {"json": {"history": [], "k": -3}}, 422, "k"),
    ("k float", "post", "/recommend", {"json": {"history": [], "k": 2.5}}, 422, "k"),
    ("k bool", "post", "/recommend", {"json": {"history": [], "k": True}}, 422, "k"),
    ("k above top-K", "post", "/recommend", {"json": {"history": [], "k": 21}}, 422, "at most 20"),
    ("k huge", "post", "/recommend", {"json": {"history": [], "k": 10**30}}, 422, "at most 20"),
    ("exclude_seen string", "post", "/recommend", {"json": {"history": [], "exclude_seen": "no"}}, 422, "exclude_seen"),
    ("item_id string", "post", "/recommend", {"json": {"history": [{"item_id": "2"}]}}, 422, "history[0].item_id"),
    ("item_id float", "post", "/recommend", {"json": {"history": [{"item_id": 2.0}]}}, 422, "integer"),
    ("item_id fraction", "post", "/recommend", {"json": {"history": [{"item_id": 2.5}]}}, 422, "integer"),
    ("item_id negative", "post", "/recommend", {"json": {"history": [{"item_id": -1}]}}, 422, "item_id"),
    ("item_id beyond int64", "post", "/recommend", {"json": {"history": [{"item_id": 2**64}]}}, 422, "item_id"),
    ("item_id missing", "post", "/recommend", {"json": {"history": [{"timestamp": T0}]}}, 422, "Field required"),
    ("timestamp NaN", "post", "/recommend", _json('{"history": [{"item_id": 2, "timestamp": NaN}]}'), 422, "finite"),
    ("timestamp Infinity", "post", "/recommend", _json('{"history": [{"item_id": 2, "timestamp": Infinity}]}'), 422, "finite"),
    ("timestamp -Infinity", "post", "/recommend", _json('{"history": [{"item_id": 2, "timestamp": -Infinity}]}'), 422, "timestamp"),
    ("k NaN", "post", "/recommend", _json('{"history": [], "k": NaN}'), 422, "k"),
    ("timestamp negative", "post", "/recommend", {"json": {"history": [{"item_id": 2, "timestamp": -5}]}}, 422, "greater than or equal to 0"),
    ("timestamp far future", "post", "/recommend", {"json": {"history": [{"item_id": 2, "timestamp": 1e20}]}}, 422, "timestamp"),
    ("timestamp string", "post", "/recommend", {"json": {"history": [{"item_id": 2, "timestamp": "today"}]}}, 422, "timestamp"),
    ("duplicate, no timestamps", "post", "/recommend", {"json": {"history": [{"item_id": 7}, {"item_id": 3}, {"item_id": 7}]}}, 422, "duplicate entry: item_id 7 with timestamp None at positions 0 and 2"),
    ("duplicate, same timestamp", "post", "/recommend", {"json": {"history": [OK, OK]}}, 422, "duplicate entry: item_id 2"),
    ("newest first", "post", "/recommend", {"json": {"history": [{"item_id": 2, "timestamp": T0}, {"item_id": 3, "timestamp": T0 - 1}]}}, 422, "oldest first"),
    ("at before the history", "post", "/recommend", {"json": {"history": [{"item_id": 2, "timestamp": T0}], "at": T0 - 1}}, 422, "is earlier than the history's last timestamp"),
    ("at before the last given time", "post", "/recommend", {"json": {"history": [{"item_id": 2, "timestamp": T0 - 5}, {"item_id": 3, "timestamp": T0}, {"item_id": 4}], "at": T0 - 1}}, 422, f"last timestamp ({float(T0)})"),
    ("at string", "post", "/recommend", {"json": {"history": [], "at": "now"}}, 422, "at"),
    ("at negative", "post", "/recommend", {"json": {"history": [], "at": -1}}, 422, "at"),
    ("at NaN", "post", "/recommend", _json('{"history": [], "at": NaN}'), 422, "at"),
    ("history too long", "post", "/recommend", {"json": {"history": [{"item_id": i} for i in range(1001)]}}, 422, "at most 1000"),
    ("history not a list", "post", "/recommend", {"json": {"history": {"item_id": 2}}}, 422, "history"),
    ("history missing", "post", "/recommend", {"json": {"k": 5}}, 422, "history: Field required"),
    ("unknown field", "post", "/recommend", {"json": {"history": [], "topk": 5}}, 422, "topk"),
    ("unknown entry field", "post", "/recommend", {"json": {"history": [{"item_id": 2, "when": T0}]}}, 422, "history[0].when"),
    ("body a list", "post", "/recommend", {"json": [OK]}, 422, "body"),
    ("empty body", "post", "/recommend", {}, 422, "body"),
    ("not JSON content type", "post", "/recommend", {"content": b'{"history": []}', "headers": {"content-type": "text/plain"}}, 422, "body"),
    ("malformed JSON", "post", "/recommend", _json('{"history": [{"item_id": 2}'), 400, "malformed JSON"),
    ("lone surrogate key", "post", "/recommend", _json('{"history": [], "\\ud800": 1}'), 422, "invalid request"),
    ("body too large", "post", "/recommend", _json(" " * (1 << 20) + "{}"), 413, "larger than 1048576 bytes"),
    ("batch too large", "post", "/recommend/batch", {"json": {"requests": [{"history": []}] * 65}}, 422, "at most 64"),
    ("batch empty", "post", "/recommend/batch", {"json": {"requests": []}}, 422, "requests"),
    ("batch bad member", "post", "/recommend/batch", {"json": {"requests": [{"history": []}, {"history": [], "k": 0}]}}, 422, "requests[1].k"),
    ("batch member over limit", "post", "/recommend/batch", {"json": {"requests": [{"history": [], "k": 50}]}}, 422, "requests[0].k: k must be at most 20"),
    ("unknown route", "get", "/recommendations", {}, 404, "Not Found"),
    ("wrong method", "get", "/recommend", {}, 405, "Method Not Allowed"),
    ("wrong method on health", "post", "/health", {}, 405, "Method Not Allowed"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "says"),
    [case[1:] for case in BAD],
    ids=[case[0] for case in BAD],
)
def test_client_mistakes_are_clear_4xx(client, method, path, kwargs, status, says):
    r = client.request(method.upper(), path, **kwargs)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert says in r.json()["message"]


# ---------------------------------------------------------------- schema fuzzing


@pytest.fixture(scope="module")
def api_schema(artifact):
    # its own app: schemathesis runs the lifespan itself, once, in its own event loop
    return schemathesis.openapi.from_asgi("/openapi.json", create_app(Settings(artifact=artifact)))


# schemathesis' pytest integration (`parametrize`, `from_fixture`) fails under pytest 9.2
# (`Function._nodeid`), so its Python API drives Hypothesis directly.
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize("path", ["/recommend", "/recommend/batch"])
def test_fuzzed_requests_never_get_a_5xx(api_schema, path, mode):
    def has_message(response):
        if response.status_code >= 400:
            assert response.json()["message"]

    fuzz_never_5xx(api_schema[path]["POST"], mode, has_message)


# ---------------------------------------------------------------- the device install


def test_the_device_side_imports_no_training_library(tmp_path):
    """`lsan serve`, the server and the runtime need none of torch, pandas, onnx, ... (CI also
    installs `lsan[serve]` alone in a fresh venv and serves from it)."""
    code = ("import sys, lsan.cli, lsan.serving.__main__, lsan.serving.app, lsan.artifact\n"
            "heavy = ('torch', 'pandas', 'sklearn', 'onnx', 'onnxscript', 'matplotlib', 'tqdm')\n"
            "print(sorted(m for m in heavy if m in sys.modules))")  # fmt: skip
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "[]", run.stdout + run.stderr


def test_every_package_ships_under_lsan():
    """No generic top-level name (export, serving, benchmarks) is installed, and no package of
    the checkout is left out of the wheel."""
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"lsan": REPO / "lsan"} | {k: REPO / v for k, v in cfg["package-dir"].items()}
    found = set()
    for name, folder in folders.items():
        for init in folder.rglob("__init__.py"):
            found.add(".".join([name, *init.parent.relative_to(folder).parts]))
    assert set(cfg["packages"]) == found
    assert all(p == "lsan" or p.startswith("lsan.") for p in cfg["packages"])


# ---------------------------------------------------------------- the real server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def start(artifact: Path | str, log: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "LSAN_ARTIFACT": str(artifact)}
    with open(log, "wb") as out:  # a file, not a pipe: a full pipe would block the server
        return subprocess.Popen(
            [sys.executable, "-m", "serving", *args], cwd=REPO, env=env, stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip


@pytest.fixture(scope="module")
def server(artifact, tmp_path_factory):
    port, log = free_port(), tmp_path_factory.mktemp("server") / "server.log"
    proc = start(artifact, log, "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, log)
    yield url, proc
    proc.terminate()
    # uvicorn shuts down gracefully, then re-raises SIGTERM so the exit status shows it
    assert proc.wait(timeout=15) in (0, -signal.SIGTERM), log.read_text()
    assert "Application shutdown complete" in log.read_text()


def test_real_server_over_http(server, catalogue):
    url, _ = server
    with httpx.Client(base_url=url, timeout=10) as c:
        assert c.get("/health").json() == {"status": "ok"}
        body = c.post("/recommend", json={"history": history(catalogue[:5]), "k": 4}).json()
        assert [i["rank"] for i in body["items"]] == [1, 2, 3, 4]
        assert c.get("/metadata").json()["model"] == "lsan"
        r = c.post(
            "/recommend", content=b'{"history": [', headers={"content-type": "application/json"}
        )
        assert r.status_code == 400 and "malformed JSON" in r.json()["message"]
        # a streamed body has no Content-Length: the limit counts the bytes as they arrive
        chunks = (b" " * 65536 for _ in range(20))
        r = c.post("/recommend", content=chunks, headers={"content-type": "application/json"})
        assert r.status_code == 413 and "larger than" in r.json()["message"]
        assert "lsan_http_requests_total" in c.get("/metrics").text


def post_raw(url: str, body: bytes, chunked: bool) -> tuple[int | str, dict]:
    """POST with the standard library, which sends `Connection: close`: a server that answers
    and closes before reading the whole body makes it see a reset, not the answer."""
    data = (body[i : i + 65536] for i in range(0, len(body), 65536)) if chunked else body
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    except (urllib.error.URLError, OSError) as e:
        return type(e).__name__, {}


def test_every_oversize_body_is_a_json_413(server):
    """By Content-Length or chunked, a 100k-entry history or batch: always the JSON 413, never a
    connection reset (the server reads and drops the rest of the body before answering)."""
    url, _ = server
    history_body = {"history": [{"item_id": i, "timestamp": T0 + i} for i in range(100_000)]}
    batch_body = {"requests": [{"history": [{"item_id": 1}]}] * 100_000}
    cases = [("/recommend", json.dumps(history_body).encode()),
             ("/recommend/batch", json.dumps(batch_body).encode())]  # fmt: skip
    for _ in range(2):
        for path, body in cases:
            for chunked in (False, True):
                status, got = post_raw(url + path, body, chunked)
                assert status == 413, (path, chunked, status)
                assert "larger than" in got["message"]
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}


def test_bounded_load_has_no_errors_and_flat_memory(server, catalogue):
    url, proc = server
    rng = random.Random(0)
    bodies = [
        {"history": history(rng.sample(catalogue, rng.randint(0, 40))), "k": rng.randint(1, 20)}
        for _ in range(50)
    ]

    def fire(n: int) -> list[int]:
        with httpx.Client(base_url=url, timeout=30) as c:
            codes = []
            for i in range(n):
                try:
                    codes.append(c.post("/recommend", json=bodies[i % len(bodies)]).status_code)
                except httpx.HTTPError:
                    codes.append(-1)
            return codes

    def load(total: int, threads: int = 4) -> list[int]:
        with ThreadPoolExecutor(threads) as pool:
            return [c for codes in pool.map(fire, [total // threads] * threads) for c in codes]

    assert set(load(100)) == {200}  # warm-up: thread pool and allocator at steady state
    before = rss_kb(proc.pid)
    started = time.perf_counter()
    codes = load(300)
    elapsed = time.perf_counter() - started
    after = rss_kb(proc.pid)
    assert codes.count(200) == 300, {c: codes.count(c) for c in set(codes)}
    assert after - before < 20 * 1024, f"RSS grew {before} -> {after} kB under load"
    text = httpx.get(f"{url}/metrics").text
    ok = counter(text, "lsan_http_requests_total", route="/recommend", method="POST", status="200")
    assert ok >= 400 and elapsed < 60


def test_load_generator_keeps_its_rate_against_the_real_server(server, catalogue):
    """Open loop at 50/s for 2 s on 127.0.0.1: on schedule, no errors, every answer timed."""
    url, proc = server
    port = int(url.rsplit(":", 1)[1])
    rng = random.Random(1)
    bodies = [serve_load.request_bytes("/recommend", {"history": history(rng.sample(catalogue, 8)),
                                                      "k": 5}) for _ in range(20)]  # fmt: skip
    got = serve_load.load(port, bodies * 5, rate=50.0, server_pid=proc.pid)
    assert got["errors"] == 0 and got["ok"] == 100, got["errors_by_kind"]
    assert got["achieved_rate"] == pytest.approx(50, rel=0.05)
    assert got["seconds"] < 10 and got["lateness_ms"]["p50"] < 5
    model, total, client = got["server_model_ms"], got["server_total_ms"], got["client_ms"]
    assert model["n"] == total["n"] == got["server_route_ms"]["n"] == 100
    assert 0 < model["p50"] <= total["p50"] <= client["p50"]
    assert got["server_overhead_ms"]["min"] >= 0  # every answer: model <= total
    assert got["server_cpu_us_per_request"] > 0 and got["client_cpu_us_per_request"] > 0
    missing = serve_load.load(port, [serve_load.request_bytes("/nope", {})] * 10, rate=100.0)
    assert missing["errors_by_kind"] == {"HTTP 404": 10}


def test_load_generator_retires_connections_before_the_server_does(server, catalogue, monkeypatch):
    """A keep-alive connection idle near the server's timeout is not reused (sending on it as
    the server closes it loses the request); a busy one is."""
    url, _ = server
    port = int(url.rsplit(":", 1)[1])
    body = serve_load.request_bytes("/recommend", {"history": history(catalogue[:5]), "k": 5})
    busy = serve_load.load(port, [body] * 40, rate=40.0)
    assert busy["errors"] == 0 and busy["connections_opened"] < 20
    monkeypatch.setattr(serve_load, "IDLE_S", 0.05)  # shorter than the 0.1 s between requests
    sparse = serve_load.load(port, [body] * 8, rate=10.0)
    # the 8 opened before the clock starts, then a new one for each request after the first
    assert sparse["errors"] == 0 and sparse["connections_opened"] >= 8 + 7


def test_serving_benchmark_writes_its_record(artifact, tmp_path):
    argv = [str(artifact), "--rate", "40", "80", "--duration", "1", "--history", "5",
            "--name", "t", "--out", str(tmp_path)]  # fmt: skip
    assert serve_load.main(argv) == 0
    record = json.loads((tmp_path / "t.json").read_text())
    assert [p["target_rate"] for p in record["phases"]] == [40, 80]
    assert all(p["errors"] == 0 and p["ok"] == p["requests"] for p in record["phases"])
    env = record["environment"]
    assert env["command"] == "python -m benchmarks.serve_load " + " ".join(argv)
    assert "commit" in env and env["machine"]["cores"] >= 1
    assert record["bare"]["session_run_ms"]["n"] > 0
    table = (tmp_path / "t.md").read_text()
    assert "| 40 (" in table and "| 80 (" in table


def test_tampered_artifact_stops_startup(artifact, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(artifact, bad)
    data = bytearray((bad / MODEL).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (bad / MODEL).write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="sha256"):
        serve(str(bad), port=free_port())
    with pytest.raises(ArtifactError, match="not an artifact directory"):
        serve(str(tmp_path / "missing"), port=free_port())
    log = tmp_path / "server.log"
    proc = start(bad, log, "--port", str(free_port()))
    assert proc.wait(timeout=60) != 0
    out = log.read_text().strip()
    assert out.startswith("error: ") and "sha256" in out and MODEL in out, out
    assert "Traceback" not in out and len(out.splitlines()) == 1, out
