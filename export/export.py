"""Checkpoint -> verified ONNX artifact for the device: `python export/export.py CKPT --out DIR`.

The checkpoint's model is exported once to fp32 ONNX (graph.py), converted to each format
(quantize.py) and each is verified (verify.py). `--quant auto` (the default) ships the smallest
format whose test NDCG@10 is within `--max-drop` (relative) of PyTorch's; a failed check refuses
the export (exit 1) unless --force. The artifact (lsan/artifact.py: model.onnx, tables.npz,
metadata.json, manifest.json) is built beside --out, read back whole, then swapped into place
(place.py): what --out held is never lost, and Ctrl-C or SIGTERM leave nothing behind.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from lsan import artifact
from lsan.artifact import ArtifactMeta, Check
from lsan.checkpoint import CheckpointError, load_model
from lsan.data.prepare import SeqDataset, data_root, load_configured, with_slot_rule
from lsan.data.readers import DataError, read_titles
from lsan.export import ExportError, place
from lsan.export.graph import OPSET, embed_properties, export_fp32
from lsan.export.lowbit import NEEDS_BITS, freeze
from lsan.export.quantize import (
    ALL_FORMATS,
    AUTO_FORMATS,
    TABLE_FORMATS,
    calibration_feeds,
    convert,
    quantized_ops,
)
from lsan.export.record import artifact_tables, describe, describe_artifact
from lsan.export.verify import choose, pytorch_metrics, verify
from lsan.models.objectives import uses_users


def export(
    ckpt: str | Path, out: str | Path, quant: str = "auto", k: int = artifact.DEFAULT_K, max_drop: float = 0.02,
    force: bool = False, data_dir: str = "", cache_dir: str = "", evaluate_data: bool = True,
    log: Callable[..., None] = print, ds: SeqDataset | None = None,
    formats: tuple[str, ...] = AUTO_FORMATS, every_format: Path | None = None,
    hook: Callable[[str], None] = lambda stage: None,
) -> ArtifactMeta:  # fmt: skip
    """Export checkpoint `ckpt` to artifact directory `out`; returns its metadata.

    `ds` replaces loading the checkpoint's dataset for the test metrics (tests pass one).
    `formats` are the candidates `quant="auto"` tries; with `every_format`, each one that could
    be produced is also written as its own artifact `<every_format>-<format>` (the benchmarks
    measure them all from one export). `hook(stage)` is called as each stage starts (tests
    interrupt it there): graph, format:<name>, write, publish, and swap inside publish.
    """
    ckpt, out = Path(ckpt), Path(out)
    if quant != "auto" and quant not in ALL_FORMATS:
        raise ExportError(f"unknown quantization {quant!r} (known: auto, {', '.join(ALL_FORMATS)})")
    place.check_out(out, ckpt, force)
    model, run, info = load_model(ckpt)
    if uses_users(model):
        raise ExportError(
            f"model '{run.model_name}' scores with a user embedding, but the ONNX contract has no "
            "user id (items, cats, slots only); serve it from PyTorch or export a sequence model"
        )
    table = freeze(model)  # a low-bit table: its quantized values, as trained and evaluated
    if quant in TABLE_FORMATS and table is None:
        raise ExportError(f"--quant {quant} {NEEDS_BITS}; {ckpt}'s table has no bits")
    if k < 1 or k > info.num_items:
        raise ExportError(f"--k must be in 1..{info.num_items}")
    dataset = json.loads((ckpt / "dataset.json").read_text())
    if evaluate_data and ds is None:
        ds = load_configured(run.data, data_dir, cache_dir)
    ds = with_slot_rule(ds, run.data.slot_rule) if evaluate_data and ds is not None else None
    if ds is not None and ds.slot_rule != dataset["slot_rule"]:  # hour and gap: as many slots
        raise ExportError(
            f"{ckpt}: trained on time slots by the rule {dataset['slot_rule']!r}, the data to "
            f"check it on has {ds.slot_rule!r}"
        )
    torch_test = pytorch_metrics(model, run, info, ds) if ds is not None else None
    tried = list(formats) if quant == "auto" else [quant]
    if quant == "auto" and table is not None:
        tried += [f for f in TABLE_FORMATS if f not in tried]
    # item titles ship with the artifact when the dataset's own files name the items
    titles = read_titles(dataset["name"], data_root(data_dir or run.data.data_dir))
    place.clean_stale(out, log)

    with place.staging(out) as tmp:
        hook("graph")
        log(f"exporting {run.model_name} to ONNX (opset {OPSET})")
        export_fp32(model, info, tmp / "reference.onnx", k)
        calibration = calibration_feeds(ds, info) if "int8-static" in tried else []
        candidates: dict[str, Check] = {}
        for fmt in tried:
            hook(f"format:{fmt}")
            path = tmp / f"{fmt}.onnx"
            try:
                convert(tmp / "reference.onnx", path, fmt, calibration, table)
                c = verify(model, path, info, ds, torch_test, k)
                candidates[fmt] = c.model_copy(update={"ops": quantized_ops(path)})
            except Exception as exc:  # a format that cannot be produced is reported, not fatal
                candidates[fmt] = Check(
                    error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                )
            log(describe(fmt, candidates[fmt]))
        chosen, problems = choose(candidates, quant, max_drop)
        if problems and not force:
            raise ExportError(
                "verification failed: " + "; ".join(problems) + " (use --force to write anyway)"
            )

        def build(fmt: str, problems: list[str], dest: Path, checks: dict) -> ArtifactMeta:
            hook("write")
            folder = tmp / f"artifact-{fmt}"
            folder.mkdir()
            shutil.copyfile(tmp / f"{fmt}.onnx", folder / artifact.MODEL)
            meta = describe_artifact(run, info, dataset, fmt, checks, torch_test, k, problems, ckpt)
            tables = artifact_tables(dataset, info, titles=titles)
            embed_properties(folder / artifact.MODEL, artifact.graph_properties(meta, tables))
            meta = artifact.write(folder, meta, tables)
            try:  # read back whole, exactly as the device will
                artifact.read(folder)
            except artifact.ArtifactError as exc:
                raise ExportError(f"the written artifact does not read back: {exc}") from None
            hook("publish")
            place.publish(folder, dest, force, log, hook)
            return meta

        meta = build(chosen, problems, out, candidates)
        if every_format is not None:  # each records what `--quant fmt` would: the same bytes
            for fmt, c in candidates.items():
                if c.error is None:
                    dest = every_format.with_name(f"{every_format.name}-{fmt}")
                    build(fmt, choose({fmt: c}, fmt, max_drop)[1], dest, {fmt: c})
    log(f"artifact: {out} ({chosen}, {meta.artifact_bytes:,} bytes in all)")
    return meta


# ---------------------------------------------------------------- command line


class Terminated(BaseException):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so the temporary folder is removed."""


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="lsan export", description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", help="checkpoint directory written by `lsan train`")
    ap.add_argument(
        "--out", required=True, help="artifact directory to write (absent, empty, or an artifact)"
    )
    ap.add_argument("--quant", default="auto", choices=["auto", *ALL_FORMATS])
    ap.add_argument(
        "--k",
        type=int,
        default=artifact.DEFAULT_K,
        help=f"top-K computed in the graph, the largest k the server answers (default {artifact.DEFAULT_K})",
    )
    ap.add_argument(
        "--max-drop",
        type=float,
        default=0.02,
        help="max relative NDCG@10 drop for a quantized format",
    )
    ap.add_argument(
        "--force",
        action="store_true",
        help="write even if a check fails; move a non-artifact --out aside",
    )
    ap.add_argument(
        "--no-eval", action="store_true", help="skip the test-split metrics (no dataset needed)"
    )
    ap.add_argument("--data-dir", default="")
    ap.add_argument("--cache-dir", default="")
    return ap  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.getLogger().setLevel(logging.ERROR)  # onnxruntime.quantization's advice on stderr
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)

    received: list[int] = []  # a library may swallow the raise; every stage checks again

    def raise_for(signum: int) -> None:
        raise KeyboardInterrupt if signum == signal.SIGINT else Terminated

    def terminate(signum, frame):
        received.append(signum)
        raise_for(signum)

    def check(stage: str) -> None:
        if received:
            raise_for(received[0])

    unraisable = sys.unraisablehook

    def quiet_interrupt(u) -> None:
        # a signal that lands in code Python cannot raise from (a weakref or GC callback, a
        # __del__) would print "Exception ignored in ..." and a traceback; `received` holds it
        # and the next stage's check raises it, so only the one line below reaches the user
        if not (received and isinstance(u.exc_value, (KeyboardInterrupt, Terminated))):
            unraisable(u)

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, terminate) if main_thread else None
    previous_int = signal.signal(signal.SIGINT, terminate) if main_thread else None
    sys.unraisablehook = quiet_interrupt
    try:
        export(args.checkpoint, args.out, args.quant, args.k, args.max_drop, args.force,
               args.data_dir, args.cache_dir, evaluate_data=not args.no_eval, hook=check)  # fmt: skip
    except (ExportError, CheckpointError, DataError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: no partial artifact left behind", file=sys.stderr)
        return 130
    except Terminated:
        print("terminated: no partial artifact left behind", file=sys.stderr)
        return 143
    finally:
        sys.unraisablehook = unraisable
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
