"""The artifact directory, defined once: what export writes and the device reads (no torch).

    DIR/model.onnx     the graph: items, cats, slots, exclude (int64) -> top_items, top_scores, scores
    DIR/tables.npz     the catalogue as compressed integer arrays: raw id (as differences) and
                       category of every item index, popular item indices for cold starts, and
                       optionally every item's title (UTF-8 bytes, one line per item index)
    DIR/metadata.json  ArtifactMeta: model, dataset, contract, format, export checks, sizes
    DIR/manifest.json  bytes and sha256 of each of the three files above

`write()` writes a directory. `read()` is the one way to open one: it checks the manifest
against every file, parses the metadata strictly, checks every field against the tables, the
graph (its inputs, outputs and the properties export embedded in it) and each other, and runs
one probe batch. An artifact that reads is one the server can answer from; anything else is an
ArtifactError of one line naming the file and the field.
"""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lsan.data.slots import NUM_SLOTS, UNKNOWN
from lsan.digest import file_digest
from lsan.info import DataInfo

SCHEMA_VERSION = 2  # 1: model.onnx + metadata.json with JSON id lists and no manifest
INPUTS = ("items", "cats", "slots", "exclude")  # int64 (B, T) x 3, left-padded; int64 (B, E)
OUTPUTS = ("top_items", "top_scores", "scores")  # int64 (B, K), float32 (B, K), float32 (B, |V|+1)
# the top-K an export computes and the largest k a server answers by default: 20 covers the
# reported cut-offs (HR/NDCG@5/10/20) and a top-100 costs onnxruntime ~47 us of a ~0.2 ms answer
DEFAULT_K = 20
NEG = -1e9  # the graph's score of excluded and padding items (the models' additive-mask value)
MODEL, TABLES, META, MANIFEST = "model.onnx", "tables.npz", "metadata.json", "manifest.json"
TABLE_NAMES = ("raw_item_ids", "item_category", "popular_items")
# in tables.npz the raw ids are stored as differences of consecutive entries (sorted catalogues,
# the usual case, then compress to almost nothing), each array in its narrowest integer type
STORED_NAMES = ("raw_item_ids_diff", "item_category", "popular_items")
# optional: the titles of items 0..|V| (0 padding: ""), "\n"-joined UTF-8 as uint8; an artifact
# of a dataset without names (or of an older lsan) has no such array
TITLES = "item_titles_utf8"
BATCH_ATOL = 1e-6  # a row's scores alone and inside a batch may differ by at most this


class ArtifactError(RuntimeError):
    """The artifact directory is missing, incomplete, inconsistent or has been tampered with."""


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, protected_namespaces=())


class Contract(Strict):
    inputs: list[str] = Field(default_factory=lambda: list(INPUTS))  # graph input names, in order
    outputs: list[str] = Field(default_factory=lambda: list(OUTPUTS))  # graph output names
    k: int = Field(ge=1)  # top-K computed in the graph (the server's largest k)
    max_len: int = Field(ge=1)  # positions the graph reads; longer histories keep the most recent
    opset: int = Field(ge=1)


class Check(Strict):
    """Export-time verification of one format (None: not measured)."""

    # model.onnx of this format as verified, before export embeds the contract's properties
    # (a few hundred bytes more; the shipped file's size is ArtifactMeta.model_onnx_bytes)
    bytes: int | None = None
    max_abs_score_diff: float | None = None  # against PyTorch on a fixed batch
    top10_identical: bool | None = None
    top10_overlap: float | None = None
    batch_invariant: bool | None = None  # a row's answer does not depend on the rest of a batch
    batch_max_abs_diff: float | None = None
    latency_ms_b1: float | None = None  # median, batch 1, full history, 1 thread
    test: dict[str, float] | None = None  # HR/NDCG@10/20 of this file on the test split
    ndcg10_rel_drop: float | None = None  # relative to PyTorch's test NDCG@10
    ops: dict[str, int] = Field(default_factory=dict)  # counts of the ops quantization touches
    error: str | None = None  # why the format could not be produced


class Source(Strict):
    checkpoint: str  # the checkpoint folder's name: never a path of the exporting machine
    model_pt_sha256: str
    versions: dict[str, str]  # torch, onnx, onnxruntime of the export


class ArtifactMeta(Strict):
    schema_version: int
    model: str
    hyperparameters: dict[str, Any]  # the model's config
    dataset: str
    dataset_stats: dict[str, Any]
    info: DataInfo
    category_names: list[str]  # name of each category id (0 padding, 1 unknown)
    time_slot_rule: str  # lsan.data.slots: "hour", "weekday", "gap", "ahead" or "none"
    contract: Contract
    quantization: str  # the shipped format
    batch_invariant: bool  # False: the runtime answers a batch row by row
    parity: dict[str, Check]  # every format measured at export
    verification_problems: list[str]  # checks the shipped format failed (written with --force)
    test_metrics: dict[str, float] | None  # this file, onnxruntime, test split
    test_metrics_pytorch: dict[str, float] | None
    source: Source
    model_onnx_bytes: int
    artifact_bytes: int  # every file of the directory, manifest included


class FileEntry(Strict):
    bytes: int = Field(ge=0)
    sha256: str


class Manifest(Strict):
    schema_version: int
    files: dict[str, FileEntry]


@dataclass(frozen=True)
class Tables:
    raw_item_ids: np.ndarray  # (|V|+1,) raw id of each item index; index 0 is padding
    item_category: np.ndarray  # (|V|+1,) category id of each item index; 0 for padding
    popular_items: np.ndarray  # (P,) item indices, most popular first (the cold-start answer)
    item_titles: list[str] | None = None  # (|V|+1,) title of each item index ("" none, 0 padding)


@dataclass
class Artifact:
    """An artifact that passed read(): its folder, metadata, tables and onnxruntime session."""

    path: Path
    manifest: Manifest
    meta: ArtifactMeta
    tables: Tables
    session: ort.InferenceSession


# ---------------------------------------------------------------- onnxruntime


def session(path: str | Path | bytes, threads: int = 1) -> ort.InferenceSession:
    """One CPU session of a file (or a serialized model); `threads` intra-op threads (1 = one
    phone core). Thread-safe to run."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    model = path if isinstance(path, bytes) else str(path)
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def feeds(items, cats, slots, exclude) -> dict[str, np.ndarray]:
    """The graph's inputs by name, as contiguous int64 arrays."""
    arrays = (items, cats, slots, exclude)
    return {
        n: np.ascontiguousarray(np.asarray(a), dtype=np.int64)
        for n, a in zip(INPUTS, arrays, strict=True)
    }


def tables_digest(tables: Tables) -> str:
    """sha256 of the tables' values (as little-endian int64, whatever dtype stores them), and of
    the titles when there are any (so a table without titles keeps its digest)."""
    h = hashlib.sha256()
    for name in TABLE_NAMES:
        h.update(name.encode() + np.asarray(getattr(tables, name), dtype="<i8").tobytes())
    if tables.item_titles is not None:
        h.update(b"item_titles" + "\n".join(tables.item_titles).encode())
    return h.hexdigest()


def graph_properties(meta: ArtifactMeta, tables: Tables) -> dict[str, str]:
    """What export embeds in model.onnx, so the graph itself vouches for the metadata and the
    tables (a reordered id map would otherwise pass every other check and answer wrong ids)."""
    return {"lsan.schema_version": str(meta.schema_version), "lsan.model": meta.model,
            "lsan.dataset": meta.dataset, "lsan.quantization": meta.quantization,
            "lsan.k": str(meta.contract.k), "lsan.max_len": str(meta.contract.max_len),
            "lsan.num_items": str(meta.info.num_items),
            "lsan.time_slot_rule": meta.time_slot_rule,
            "lsan.tables_sha256": tables_digest(tables)}  # fmt: skip


# ---------------------------------------------------------------- write


def smallest_int(a: np.ndarray) -> np.ndarray:
    """The same integers in the narrowest signed type that holds them (fewer bytes shipped)."""
    a = np.asarray(a, dtype=np.int64)
    lo, hi = (int(a.min()), int(a.max())) if a.size else (0, 0)
    for t in (np.int8, np.int16, np.int32):
        if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max:
            return a.astype(t)
    return a


def write(folder: Path, meta: ArtifactMeta, tables: Tables) -> ArtifactMeta:
    """Complete `folder` (which already holds model.onnx) into an artifact; returns the meta
    with its sizes filled in. Not atomic by itself: export writes into a temporary folder."""
    raw = np.asarray(tables.raw_item_ids, dtype=np.int64)
    arrays: dict[str, Any] = {
        "raw_item_ids_diff": smallest_int(np.diff(raw, prepend=0)),
        "item_category": smallest_int(tables.item_category),
        "popular_items": smallest_int(tables.popular_items),
    }
    if tables.item_titles is not None:
        if any("\n" in t for t in tables.item_titles):
            raise ValueError("an item title holds a line break")
        arrays[TITLES] = np.frombuffer("\n".join(tables.item_titles).encode(), dtype=np.uint8)
    np.savez_compressed(folder / TABLES, **arrays)
    files = {n: FileEntry(bytes=(folder / n).stat().st_size, sha256=file_digest(folder / n))
             for n in (MODEL, TABLES)}  # fmt: skip
    total = -1
    while True:  # the total includes metadata.json and manifest.json, whose sizes hold digits of it
        meta = meta.model_copy(update={"model_onnx_bytes": files[MODEL].bytes,
                                       "artifact_bytes": total})  # fmt: skip
        (folder / META).write_text(meta.model_dump_json())  # compact: it ships to the device
        entries = {**files, META: FileEntry(bytes=(folder / META).stat().st_size,
                                            sha256=file_digest(folder / META))}  # fmt: skip
        manifest = Manifest(schema_version=SCHEMA_VERSION, files=entries)
        (folder / MANIFEST).write_text(manifest.model_dump_json(indent=2))
        measured = sum(e.bytes for e in entries.values()) + (folder / MANIFEST).stat().st_size
        if measured == total:
            return meta
        total = measured


# ---------------------------------------------------------------- read


def _validated(model: type[Strict], path: Path) -> Any:
    try:
        return model.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        e = exc.errors(include_url=False)[0]
        where = ".".join(map(str, e["loc"])) or "the document"
        raise ArtifactError(f"{path}: {where}: {e['msg']}") from None


def is_artifact(folder: Path) -> bool:
    """Is `folder` an artifact export wrote: a manifest listing exactly the files there?"""
    try:
        manifest = Manifest.model_validate_json((folder / MANIFEST).read_bytes())
        present = {p.name for p in folder.iterdir()}
    except (OSError, ValidationError):
        return False
    return present == {*manifest.files, MANIFEST}


def check_files(folder: Path) -> Manifest:
    """The manifest matches the folder: the expected files, no others, each size and sha256."""
    if not (folder / MANIFEST).is_file():
        older = " (made by an older lsan? export it again)" if (folder / META).is_file() else ""
        raise ArtifactError(f"{folder} is not an artifact directory (no {MANIFEST}){older}")
    manifest = _validated(Manifest, folder / MANIFEST)
    if manifest.schema_version != SCHEMA_VERSION:
        raise ArtifactError(f"{folder / MANIFEST}: schema_version {manifest.schema_version}, "
                            f"this lsan reads {SCHEMA_VERSION}: export it again")  # fmt: skip
    if set(manifest.files) != {MODEL, TABLES, META}:
        raise ArtifactError(f"{folder / MANIFEST}: files must be {MODEL}, {TABLES}, {META}")
    extra = sorted({p.name for p in folder.iterdir()} - {*manifest.files, MANIFEST})
    if extra:
        raise ArtifactError(f"{folder}: {', '.join(extra)} not in {MANIFEST}")
    for name, entry in manifest.files.items():
        path = folder / name
        if not path.is_file():
            raise ArtifactError(f"{path}: listed in {MANIFEST} but missing")
        if path.stat().st_size != entry.bytes or file_digest(path) != entry.sha256:
            raise ArtifactError(
                f"{path}: size or sha256 differs from {MANIFEST} (changed or corrupt)"
            )
    return manifest


def distinct(a: np.ndarray) -> bool:
    s = np.sort(a)  # (np.unique would cost a device 2 MB of resident memory here)
    return not bool((s[1:] == s[:-1]).any())


def read_tables(path: Path, info: DataInfo) -> Tables:
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {n: np.asarray(npz[n]) for n in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise ArtifactError(f"{path}: not a readable .npz ({exc})") from None
    if set(arrays) - {TITLES} != set(STORED_NAMES):
        raise ArtifactError(f"{path}: arrays must be {', '.join(STORED_NAMES)} (and optionally "
                            f"{TITLES}), found {sorted(arrays)}")  # fmt: skip
    for name, a in arrays.items():
        if a.ndim != 1 or a.dtype.kind not in "iu":
            raise ArtifactError(f"{path}: {name} must be a 1-D integer array")
    n = info.num_items
    titles = None
    if TITLES in arrays:
        if arrays[TITLES].dtype != np.uint8:
            raise ArtifactError(f"{path}: {TITLES} must be uint8 (UTF-8 bytes)")
        try:
            titles = arrays[TITLES].tobytes().decode("utf-8").split("\n")
        except UnicodeDecodeError:
            raise ArtifactError(f"{path}: {TITLES} is not valid UTF-8") from None
        if len(titles) != n + 1 or titles[0] != "":
            raise ArtifactError(f"{path}: {TITLES} holds {len(titles)} titles, info.num_items "
                                f"+ 1 = {n + 1} (the first, padding's, empty)")  # fmt: skip
    t = Tables(raw_item_ids=np.cumsum(arrays["raw_item_ids_diff"], dtype=np.int64),
               item_category=arrays["item_category"].astype(np.int64),
               popular_items=arrays["popular_items"].astype(np.int64),
               item_titles=titles)  # fmt: skip
    for name in ("raw_item_ids", "item_category"):
        if len(getattr(t, name)) != n + 1:
            raise ArtifactError(f"{path}: {name} has {len(getattr(t, name))} entries, "
                                f"info.num_items + 1 = {n + 1}")  # fmt: skip
    real = t.raw_item_ids[1:]
    if (real < 0).any() or not distinct(real):
        raise ArtifactError(f"{path}: raw_item_ids must be distinct and non-negative")
    cats = t.item_category
    if cats[0] != 0 or (cats[1:] < UNKNOWN).any() or (cats >= info.num_categories).any():
        raise ArtifactError(f"{path}: item_category out of range 1..{info.num_categories - 1}")
    pop = t.popular_items
    if not len(pop) or (pop < 1).any() or (pop > n).any() or not distinct(pop):
        raise ArtifactError(f"{path}: popular_items must be distinct item indices in 1..{n}")
    return t


def check_fields(meta: ArtifactMeta, path: Path) -> None:
    """The metadata's fields agree with each other and with this version of the contract."""
    info, c = meta.info, meta.contract

    def need(ok: bool, field: str, why: str) -> None:
        if not ok:
            raise ArtifactError(f"{path}: {field}: {why}")

    need(meta.schema_version == SCHEMA_VERSION, "schema_version",
         f"{meta.schema_version}, this lsan reads {SCHEMA_VERSION}")  # fmt: skip
    need(tuple(c.inputs) == INPUTS, "contract.inputs", f"must be {list(INPUTS)}")
    need(tuple(c.outputs) == OUTPUTS, "contract.outputs", f"must be {list(OUTPUTS)}")
    need(info.num_items >= 1, "info.num_items", "must be at least 1")
    need(
        c.max_len == info.max_len, "contract.max_len", f"{c.max_len} != info.max_len {info.max_len}"
    )
    need(c.k <= info.num_items, "contract.k", f"{c.k} > info.num_items {info.num_items}")
    need(meta.time_slot_rule in NUM_SLOTS, "time_slot_rule", f"must be one of {list(NUM_SLOTS)}")
    need(info.num_slots == NUM_SLOTS.get(meta.time_slot_rule), "info.num_slots",
         f"{info.num_slots} does not fit rule {meta.time_slot_rule!r}")  # fmt: skip
    need(len(meta.category_names) == info.num_categories, "category_names",
         f"{len(meta.category_names)} names for info.num_categories {info.num_categories}")  # fmt: skip
    shipped = meta.parity.get(meta.quantization)
    need(shipped is not None and shipped.error is None, "quantization",
         f"{meta.quantization!r} has no successful entry in parity")  # fmt: skip
    claimed = shipped.batch_invariant if shipped else None
    need(claimed in (None, meta.batch_invariant), "batch_invariant", "differs from parity")


def check_graph(sess: ort.InferenceSession, meta: ArtifactMeta, tables: Tables, path: Path) -> None:
    """The graph's inputs, outputs and embedded properties are the ones the metadata and the
    tables describe."""
    k, n = meta.contract.k, meta.info.num_items
    ins, outs = sess.get_inputs(), sess.get_outputs()
    if [i.name for i in ins] != list(INPUTS) or any(i.type != "tensor(int64)" for i in ins):
        raise ArtifactError(
            f"{path}: inputs {[(i.name, i.type) for i in ins]} are not the contract's"
        )
    want = {"top_items": ("tensor(int64)", k), "top_scores": ("tensor(float)", k),
            "scores": ("tensor(float)", n + 1)}  # fmt: skip
    if [o.name for o in outs] != list(OUTPUTS):
        raise ArtifactError(f"{path}: outputs {[o.name for o in outs]} are not {list(OUTPUTS)}")
    for o in outs:
        typ, width = want[o.name]
        static = o.shape[1] if len(o.shape) == 2 and isinstance(o.shape[1], int) else width
        if o.type != typ or static != width:
            raise ArtifactError(f"{path}: output {o.name} is {o.type} {o.shape}, the metadata "
                                f"says {typ} (batch, {width})")  # fmt: skip
    props = sess.get_modelmeta().custom_metadata_map
    for key, value in graph_properties(meta, tables).items():
        if props.get(key) != value:
            field = key.removeprefix("lsan.")
            if field == "tables_sha256":
                raise ArtifactError(f"{path.parent / TABLES}: the tables' values differ from the "
                                    "ones the graph was exported with")  # fmt: skip
            raise ArtifactError(f"{path.parent / META}: {field} is {value!r}, the graph was "
                                f"exported with {props.get(key)!r}")  # fmt: skip


def probe(sess: ort.InferenceSession, meta: ArtifactMeta, tables: Tables) -> float:
    """Run a few full-length histories as one batch and one by one; returns the largest score
    difference between the two (raises if the outputs are not what the contract promises)."""
    n, t, k = meta.info.num_items, meta.info.max_len, meta.contract.k
    rows = 2
    items = (np.arange(rows * t).reshape(rows, t) * 7919) % n + 1  # spread over the catalogue
    x = feeds(items, tables.item_category[items], np.full_like(items, UNKNOWN), items)
    top, top_scores, scores = sess.run(list(OUTPUTS), x)
    if top.shape != (rows, k) or top_scores.shape != (rows, k) or scores.shape != (rows, n + 1):
        raise ValueError(f"output shapes {top.shape}, {top_scores.shape}, {scores.shape}")
    if (top < 0).any() or (top > n).any() or not np.isfinite(scores).all():
        raise ValueError("item indices out of range or scores not finite")
    single = [sess.run(["scores"], {name: v[r : r + 1] for name, v in x.items()})[0][0]
              for r in range(rows)]  # fmt: skip
    return float(np.abs(np.stack(single) - scores).max())


def read(folder: str | Path, threads: int = 1) -> Artifact:
    """Open and verify the artifact in `folder` (see the module docstring)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ArtifactError(f"{folder} is not an artifact directory (not a folder)")
    manifest = check_files(folder)
    meta: ArtifactMeta = _validated(ArtifactMeta, folder / META)
    check_fields(meta, folder / META)
    tables = read_tables(folder / TABLES, meta.info)
    try:
        sess = session(folder / MODEL, threads)
    except Exception as exc:  # onnxruntime raises its own types (InvalidProtobuf, Fail, ...)
        raise ArtifactError(f"{folder / MODEL}: onnxruntime cannot load it: "
                            f"{str(exc).splitlines()[0][:300]}") from None  # fmt: skip
    check_graph(sess, meta, tables, folder / MODEL)
    try:
        diff = probe(sess, meta, tables)
    except Exception as exc:  # onnxruntime's own types, or a contract violation above
        raise ArtifactError(f"{folder / MODEL}: a full-length probe batch failed: "
                            f"{str(exc).splitlines()[0][:300]}") from None  # fmt: skip
    if meta.batch_invariant and diff > BATCH_ATOL:
        raise ArtifactError(f"{folder / META}: batch_invariant is true, but a row's scores inside "
                            f"a batch differ from its scores alone by {diff:.2e}")  # fmt: skip
    model_bytes = (folder / MODEL).stat().st_size
    total = sum(p.stat().st_size for p in folder.iterdir())
    if meta.model_onnx_bytes != model_bytes:
        raise ArtifactError(f"{folder / META}: model_onnx_bytes is {meta.model_onnx_bytes}, "
                            f"{MODEL} has {model_bytes}")  # fmt: skip
    if meta.artifact_bytes != total:
        raise ArtifactError(f"{folder / META}: artifact_bytes is {meta.artifact_bytes}, the files "
                            f"add up to {total}")  # fmt: skip
    return Artifact(folder, manifest, meta, tables, sess)
