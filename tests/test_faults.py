"""Faults the artifact contract must survive: an export interrupted at every stage or killed,
whatever already lies in --out, every artifact file and metadata field corrupted, and batches
that must never change an answer, for every format the server offers."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, train_tiny
from fastapi.testclient import TestClient

from lsan import artifact
from lsan.artifact import MANIFEST, META, MODEL, TABLES, ArtifactError, Tables, read
from lsan.export import ExportError, place
from lsan.export.export import export
from lsan.export.quantize import FORMATS
from lsan.serving.app import create_app
from lsan.serving.runtime import load_artifact
from lsan.serving.settings import Settings

QUIET = {"log": lambda *_: None}
FAST = {"quant": "fp32", "k": 20, "evaluate_data": False, **QUIET}


class Boom(Exception):
    """Raised by the test hook at one export stage."""


@pytest.fixture(scope="module")
def ck(small_ds, tmp_path_factory) -> Path:
    return train_tiny(
        "sasrec", {"dim": 16, "layers": 1}, small_ds, tmp_path_factory.mktemp("ck") / "sasrec"
    )


@pytest.fixture(scope="module")
def good(ck, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("good") / "art"
    export(ck, out, **FAST)
    return out


@pytest.fixture(scope="module")
def every_format(ck, small_ds, tmp_path_factory) -> dict[str, Path]:
    """Every format the export offers, each as its own artifact, from one export."""
    root = tmp_path_factory.mktemp("formats")
    export(ck, root / "shipped", k=20, ds=small_ds, force=True, every_format=root / "art",
           formats=FORMATS, **QUIET)  # fmt: skip
    return {fmt: root / f"art-{fmt}" for fmt in FORMATS}


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


# ---------------------------------------------------------------- export never loses anything


@pytest.mark.parametrize("stage", ["graph", "format:fp32", "write", "publish"])
def test_interrupted_replacement_keeps_the_old_artifact(ck, good, tmp_path, stage):
    out = tmp_path / "art"
    shutil.copytree(good, out)
    before = files_of(out)

    def hook(at: str) -> None:
        if at == stage:
            raise Boom(at)

    with pytest.raises(Boom):
        export(ck, out, hook=hook, **FAST)
    assert files_of(out) == before and read(out)
    assert leftovers(tmp_path) == []


def test_ctrl_c_inside_the_library_leaves_nothing(ck, tmp_path):
    def hook(at: str) -> None:
        if at == "format:fp32":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        export(ck, tmp_path / "art", hook=hook, **FAST)
    assert list(tmp_path.iterdir()) == []


def test_crash_between_the_two_renames_puts_the_old_artifact_back(ck, good, tmp_path, monkeypatch):
    """Where the atomic exchange is unavailable the old folder is parked for a moment."""
    monkeypatch.setattr(place, "_exchange", lambda a, b: False)
    out = tmp_path / "art"
    shutil.copytree(good, out)
    before = files_of(out)

    def hook(at: str) -> None:
        if at == "swap":
            raise Boom(at)

    with pytest.raises(Boom):
        export(ck, out, hook=hook, **FAST)
    assert files_of(out) == before and leftovers(tmp_path) == []
    meta = export(ck, out, **{**FAST, "k": 10})  # and without a crash the fallback replaces it
    assert read(out).meta == meta and meta.contract.k == 10 and leftovers(tmp_path) == []


def test_killed_export_is_cleaned_up_and_the_old_artifact_restored(ck, good, tmp_path):
    """SIGKILL between the two renames: no finally runs; the next export repairs it."""
    out = tmp_path / "art"
    shutil.copytree(good, out)
    before = files_of(out)
    script = (
        "import os, signal, sys\n"
        "from lsan.export import place\n"
        "from lsan.export.export import export\n"
        "place._exchange = lambda a, b: False\n"
        "def hook(at):\n"
        "    if at == 'swap':\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "export(sys.argv[1], sys.argv[2], quant='fp32', k=20, evaluate_data=False, hook=hook,\n"
        "       log=lambda *a: None)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(ck), str(out)], cwd=REPO,
                          capture_output=True, timeout=300)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert not out.exists()  # killed with the old artifact parked and the new one staged
    left = leftovers(tmp_path)
    assert any(".old-" in n for n in left) and any(".export-" in n for n in left), left
    said: list[str] = []
    place.clean_stale(out, said.append)
    assert files_of(out) == before and read(out) and leftovers(tmp_path) == []
    assert any("restored" in s for s in said) and any("killed" in s for s in said)


@pytest.mark.parametrize(("sig", "status", "word"), [(signal.SIGINT, 130, "interrupted"),
                                                     (signal.SIGTERM, 143, "terminated")])  # fmt: skip
def test_signal_during_export_is_one_line_and_leaves_nothing(ck, tmp_path, sig, status, word):
    out = tmp_path / "art"
    cmd = [sys.executable, "export/export.py", str(ck), "--out", str(out), "--quant", "fp32",
           "--no-eval", "--k", "20"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while not list(tmp_path.glob(".art.export-*")):  # staging has begun
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == status, lines
    assert len(lines) == 1 and lines[0].startswith(word), lines
    assert list(tmp_path.iterdir()) == []


def test_signal_python_cannot_raise_from_is_still_one_line(tmp_path):
    """A signal landing in a __del__ (or a weakref callback during an import, as it once did in
    CI) cannot raise there: Python would print "Exception ignored in ..." and a traceback. The
    export records it, says nothing there, and the next stage's check raises it: one line."""
    script = (
        "import signal, sys\n"
        "import lsan.export.export as E\n"
        "class Dropped:\n"
        "    def __del__(self):\n"
        "        signal.raise_signal(signal.SIGINT)\n"
        "def export(*args, hook, **kw):\n"
        "    Dropped()\n"
        "    hook('next stage')\n"
        "    print('the recorded interrupt was not raised', file=sys.stderr)\n"
        "E.export = export\n"
        "sys.exit(E.main([sys.argv[1], '--out', sys.argv[2], '--no-eval']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "ck"), str(tmp_path / "art")],
                          cwd=REPO, capture_output=True, timeout=120)  # fmt: skip
    lines = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 130, lines
    assert lines == ["interrupted: no partial artifact left behind"], lines


def test_out_must_be_absent_empty_or_an_artifact(ck, good, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match="not an artifact.*--force"):
        export(ck, out, **FAST)
    assert files_of(out) == {"notes.txt": b"mine"}
    a_file = tmp_path / "file"
    a_file.write_text("mine too")
    with pytest.raises(ExportError, match="is a file"):
        export(ck, a_file, **FAST)
    # an artifact with a file added is not an artifact any more: refused too
    extra = tmp_path / "extra"
    shutil.copytree(good, extra)
    (extra / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match="not an artifact"):
        export(ck, extra, **FAST)
    assert (extra / "notes.txt").read_text() == "mine"
    # an empty folder is fine
    (tmp_path / "empty").mkdir()
    meta = export(ck, tmp_path / "empty", **FAST)
    assert read(tmp_path / "empty").meta == meta


def test_force_moves_what_was_there_aside(ck, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    meta = export(ck, out, force=True, **FAST)
    assert read(out).meta == meta
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("mine.replaced-")]
    assert len(aside) == 1 and (aside[0] / "notes.txt").read_text() == "mine"


def test_out_in_or_around_the_checkpoint_is_always_refused(ck, tmp_path):
    before = files_of(ck)
    for out in (ck, ck / "artifact", ck.parent, ck / ".." / ck.name):
        with pytest.raises(ExportError, match="checkpoint"):
            export(ck, out, force=True, **FAST)
    assert files_of(ck) == before


def test_stale_temporary_folders_of_dead_exports_are_removed(ck, good, tmp_path):
    out = tmp_path / "art"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    (tmp_path / f".art.export-{dead}-abc").mkdir()
    (tmp_path / f".art.export-{os.getpid()}-live").mkdir()  # a live export's: kept
    said: list[str] = []
    export(ck, out, **{**FAST, "log": said.append})
    assert leftovers(tmp_path) == [f".art.export-{os.getpid()}-live"]
    assert any("killed" in s for s in said)


# ---------------------------------------------------------------- every file, every field


def update_manifest(folder: Path, name: str) -> None:
    """What a careful attacker does after editing a file: fix its size and sha256."""
    m = json.loads((folder / MANIFEST).read_text())
    data = (folder / name).read_bytes()
    m["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / MANIFEST).write_text(json.dumps(m))


def edit_json(folder: Path, change) -> None:
    doc = json.loads((folder / META).read_text())
    doc = change(doc)
    (folder / META).write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())
    update_manifest(folder, META)


def rewrite(folder: Path, meta_update: dict | None = None, tables: dict | None = None) -> None:
    """A consistent rewrite (sizes, manifest and all) with some fields or tables changed."""
    opened = read(folder)
    meta = opened.meta.model_copy(update=meta_update or {})
    t = opened.tables
    new = Tables(**{n: (tables or {}).get(n, getattr(t, n)) for n in artifact.TABLE_NAMES})
    artifact.write(folder, meta, new)


def flip_byte(folder: Path, name: str) -> None:
    data = bytearray((folder / name).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / name).write_bytes(bytes(data))


def corruptions(good: Path, other_k: Path):
    m = read(good).meta
    n = m.info.num_items
    t = read(good).tables
    return [
        # (case, how to corrupt the copy, file named, words in the message)
        ("model bit flip", lambda d: flip_byte(d, MODEL), MODEL, "sha256"),
        ("tables bit flip", lambda d: flip_byte(d, TABLES), TABLES, "sha256"),
        ("metadata bit flip", lambda d: flip_byte(d, META), META, "sha256"),
        ("tables deleted", lambda d: (d / TABLES).unlink(), TABLES, "missing"),
        ("extra file", lambda d: (d / "notes.txt").write_text("x"), "notes.txt", "not in manifest"),
        ("manifest deleted", lambda d: (d / MANIFEST).unlink(), MANIFEST, "no manifest"),
        ("manifest garbage", lambda d: (d / MANIFEST).write_text("{"), MANIFEST, "Invalid JSON"),
        ("manifest lists less", lambda d: (d / MANIFEST).write_text(json.dumps(
            {"schema_version": 2, "files": {}})), MANIFEST, "files must be"),  # fmt: skip
        ("model garbage, sha updated", lambda d: ((d / MODEL).write_bytes(b"not onnx" * 100),
                                                  update_manifest(d, MODEL)), MODEL, "onnxruntime"),  # fmt: skip
        ("another model, sha updated", lambda d: (shutil.copyfile(other_k / MODEL, d / MODEL),
                                                  update_manifest(d, MODEL)), MODEL, "top_items"),  # fmt: skip
        ("tables garbage, sha updated", lambda d: ((d / TABLES).write_bytes(b"PK\x03\x04junk"),
                                                   update_manifest(d, TABLES)), TABLES, "npz"),  # fmt: skip
        ("metadata invalid UTF-8", lambda d: edit_json(d, lambda doc: b'{"model": "\xff"}'), META, "Invalid JSON"),
        ("metadata a JSON list", lambda d: edit_json(d, lambda doc: [doc]), META, "object"),
        ("metadata without model", lambda d: edit_json(d, lambda doc: {k: v for k, v in doc.items() if k != "model"}), META, "model: Field required"),
        ("k as a string", lambda d: edit_json(d, lambda doc: {**doc, "contract": {**doc["contract"], "k": "20"}}), META, "contract.k"),
        ("an unknown field", lambda d: edit_json(d, lambda doc: {**doc, "extra": 1}), META, "extra"),
        ("artifact_bytes wrong", lambda d: edit_json(d, lambda doc: {**doc, "artifact_bytes": doc["artifact_bytes"] + 1}), META, "artifact_bytes"),
        ("contract.max_len wrong", lambda d: rewrite(d, {"contract": m.contract.model_copy(update={"max_len": 13})}), META, "contract.max_len"),
        ("max_len wrong everywhere", lambda d: rewrite(d, {"contract": m.contract.model_copy(update={"max_len": 13}),
                                                          "info": dataclasses.replace(m.info, max_len=13)}), META, "max_len"),  # fmt: skip
        ("contract.k wrong", lambda d: rewrite(d, {"contract": m.contract.model_copy(update={"k": 10})}), MODEL, "top_items"),
        ("k above the catalogue", lambda d: rewrite(d, {"contract": m.contract.model_copy(update={"k": n + 1})}), META, "contract.k"),
        ("contract names", lambda d: rewrite(d, {"contract": m.contract.model_copy(update={"outputs": ["a", "b", "c"]})}), META, "contract.outputs"),
        ("num_items wrong", lambda d: rewrite(d, {"info": dataclasses.replace(m.info, num_items=n - 1)},
                                              {"raw_item_ids": t.raw_item_ids[:-1], "item_category": t.item_category[:-1],
                                               "popular_items": t.popular_items[t.popular_items < n]}), MODEL, "scores"),  # fmt: skip
        ("slot rule wrong", lambda d: rewrite(d, {"time_slot_rule": "weekday"}), META, "info.num_slots"),
        ("slot rule wrong everywhere", lambda d: rewrite(d, {"time_slot_rule": "weekday", "info": dataclasses.replace(m.info, num_slots=9)}), META, "time_slot_rule"),
        ("quantization not measured", lambda d: rewrite(d, {"quantization": "int8"}), META, "quantization"),
        ("model name", lambda d: rewrite(d, {"model": "lsan"}), META, "model"),
        ("schema_version", lambda d: rewrite(d, {"schema_version": 1}), META, "schema_version"),
        ("category names", lambda d: rewrite(d, {"category_names": m.category_names[:-1]}), META, "category_names"),
        ("raw ids reversed", lambda d: rewrite(d, tables={"raw_item_ids": np.concatenate([t.raw_item_ids[:1], t.raw_item_ids[1:][::-1]])}), TABLES, "differ"),
        ("categories shuffled", lambda d: rewrite(d, tables={"item_category": np.concatenate([[0], np.roll(t.item_category[1:], 1)])}), TABLES, "differ"),
        ("raw ids truncated", lambda d: rewrite(d, tables={"raw_item_ids": t.raw_item_ids[:-3]}), TABLES, "raw_item_ids"),
        ("categories truncated", lambda d: rewrite(d, tables={"item_category": t.item_category[:-1]}), TABLES, "item_category"),
        ("raw ids duplicated", lambda d: rewrite(d, tables={"raw_item_ids": np.concatenate([t.raw_item_ids[:2], t.raw_item_ids[1:-1]])}), TABLES, "distinct"),
        ("category out of range", lambda d: rewrite(d, tables={"item_category": np.concatenate([t.item_category[:-1], [m.info.num_categories]])}), TABLES, "item_category"),
        ("popular out of range", lambda d: rewrite(d, tables={"popular_items": np.array([1, 2, n + 5])}), TABLES, "popular_items"),
        ("popular empty", lambda d: rewrite(d, tables={"popular_items": np.array([], dtype=np.int64)}), TABLES, "popular_items"),
        ("tables with an extra array", lambda d: (np.savez(d / TABLES, **{n: t.popular_items for n in artifact.STORED_NAMES}, more=t.popular_items),
                                                  update_manifest(d, TABLES)), TABLES, "arrays must be"),  # fmt: skip
        ("tables of floats", lambda d: (np.savez(d / TABLES, **{n: t.popular_items.astype(float) for n in artifact.STORED_NAMES}),
                                        update_manifest(d, TABLES)), TABLES, "integer"),  # fmt: skip
    ]  # fmt: skip


@pytest.fixture(scope="module")
def other_k(ck, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("other") / "art"
    export(ck, out, **{**FAST, "k": 10})
    return out


def test_every_corruption_is_refused_in_one_line(good, other_k, tmp_path):
    """Refused with one line naming the file (and the field), never loaded; 0 silent answers."""
    assert read(good)
    for i, (case, corrupt, named, words) in enumerate(corruptions(good, other_k)):
        bad = tmp_path / f"bad{i}"
        shutil.copytree(good, bad)
        corrupt(bad)
        with pytest.raises(ArtifactError) as info:
            load_artifact(bad)
        msg = str(info.value)
        assert "\n" not in msg and named in msg and words in msg, (case, msg)


def test_a_corrupt_artifact_stops_the_server_in_one_line(good, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(good, bad)
    t = read(bad).tables
    rewrite(bad, tables={"popular_items": np.array([1, t.raw_item_ids.size + 10])})
    proc = subprocess.run([sys.executable, "-m", "serving", str(bad), "--port", "0"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1
    assert (
        proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "popular_items" in proc.stderr
    )


# ---------------------------------------------------------------- batching never changes an answer


def test_a_batch_dependent_graph_cannot_claim_to_be_invariant(every_format, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(every_format["int8"], bad)
    m = read(bad).meta
    parity = {**m.parity, "int8": m.parity["int8"].model_copy(update={"batch_invariant": True})}
    rewrite(bad, {"batch_invariant": True, "parity": parity})
    with pytest.raises(ArtifactError, match="batch_invariant is true"):
        load_artifact(bad)


def histories(
    catalogue: list[int], n: int = 14, seed: int = 0
) -> list[list[tuple[int, float | None]]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        ids = rng.choice(catalogue, size=int(rng.integers(1, 30)), replace=False).tolist()
        if i % 5 == 0:
            ids.append(10**9)  # an unknown id
        times = [None if i % 3 == 0 else 1.7e9 + 3600.0 * j for j in range(len(ids))]
        out.append(list(zip(ids, times, strict=True)))
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_batching_never_changes_an_answer(every_format, fmt):
    art = load_artifact(every_format[fmt])
    assert art.meta.quantization == fmt
    if fmt in ("fp32", "int8-static"):
        assert art.meta.batch_invariant
    if fmt == "int8":  # dynamic quantization: one activation scale per batch
        assert not art.meta.batch_invariant and art.row_by_row
    hists = histories([int(r) for r in art.raw_ids[1:]])
    for exclude in (True, False):
        batch = art.recommend(hists, k=20, exclude_seen=exclude)
        for h, got in zip(hists, batch, strict=True):
            (alone,) = art.recommend([h], k=20, exclude_seen=exclude)
            assert [i for i, _ in got.items] == [i for i, _ in alone.items]
            diff = np.abs(np.array([s for _, s in got.items]) - [s for _, s in alone.items])
            assert diff.max(initial=0.0) <= 1e-6, (fmt, diff.max())


def test_http_batch_equals_single_requests_for_int8(every_format):
    """The case that used to differ: /recommend/batch of 14 histories on int8 (dynamic)."""
    with TestClient(create_app(Settings(artifact=every_format["int8"]))) as c:
        art = c.app.state.artifact
        reqs = [{"history": [{"item_id": i, "timestamp": t} if t else {"item_id": i} for i, t in h],
                 "k": 20} for h in histories([int(r) for r in art.raw_ids[1:]])]  # fmt: skip
        got = c.post("/recommend/batch", json={"requests": reqs}).json()["results"]
        for req, g in zip(reqs, got, strict=True):
            alone = c.post("/recommend", json=req).json()
            assert [i["item_id"] for i in g["items"]] == [i["item_id"] for i in alone["items"]]
            assert max((abs(a["score"] - b["score"]) for a, b in zip(g["items"], alone["items"], strict=True)),
                       default=0.0) <= 1e-6  # fmt: skip
