"""`lsan` command line: thin subcommands that parse flags into configs and call the library.

Every user mistake (unknown dataset or model, missing files, bad --set, an unloadable checkpoint
or data file) ends as one `error: <path or setting>: <reason>` line on stderr and exit status 2;
`lsan --debug ...` adds the traceback. Warnings (e.g. uninformative categories) are one
`warning: ...` line each.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import pickle
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any

from lsan.config import (
    ConfigError,
    DataConfig,
    RunConfig,
    merge,
    override,
    parse_sets,
    read_config_file,
)
from lsan.tables import markdown_table

# lsan.checkpoint (torch) and lsan.data (pandas) are imported where used: `lsan serve` runs on
# the device install, which has neither.


def load_dataset(*args: Any, **kwargs: Any) -> Any:
    """lsan.data.prepare.load_dataset, imported when first needed (it brings pandas)."""
    from lsan.data.prepare import load_dataset as load

    return load(*args, **kwargs)


def load_configured(data: Any, data_dir: str = "", cache_dir: str = "") -> Any:
    """lsan.data.prepare.load_configured, imported when first needed (as load_dataset)."""
    from lsan.data.prepare import load_configured as load

    return load(data, data_dir, cache_dir)


METRIC_COLUMNS = ["HR@5", "NDCG@5", "HR@10", "NDCG@10", "HR@20", "NDCG@20", "MRR@10"]


def build_run(
    dataset: str | None = None,
    model: str | None = None,
    config_file: str | None = None,
    sets: list[str] | None = None,
    **flags: Any,
) -> RunConfig:
    """defaults -> config file -> --set -> explicit flags (dataset, model, data_dir, device, ...)."""
    from lsan.data.prepare import DATASETS
    from lsan.models import model_config

    tree = read_config_file(config_file) if config_file else {}
    tree = merge(tree, parse_sets(sets or []))
    if dataset:
        tree.setdefault("data", {})["dataset"] = dataset
    if model:
        tree["model_name"] = model
    for key, section in (("data_dir", "data"), ("cache_dir", "data"), ("device", "train"),
                         ("teacher", "train"), ("init", "train")):  # fmt: skip
        if flags.get(key):
            tree.setdefault(section, {})[key] = flags[key]
    model_values = tree.pop("model", {})
    if not isinstance(model_values, dict):
        raise ConfigError(
            "'model' must be a section of model settings (use model_name for the name)"
        )
    name = str(tree.pop("model_name", RunConfig.model_name))
    run = override(RunConfig(model_name=name), tree)
    run = dataclasses.replace(run, model=model_config(name, model_values))
    if run.data.dataset not in DATASETS:
        raise ConfigError(
            f"data.dataset: unknown dataset '{run.data.dataset}' (known: {', '.join(DATASETS)})"
        )
    return run


def metrics_rows(results: dict[str, dict[str, Any]], split: str = "test") -> list[dict[str, Any]]:
    rows = []
    for name, res in results.items():
        row: dict[str, Any] = {"model": name, **res[split]}
        row["params"] = res.get("parameters", 0)
        row["s/epoch"] = res.get("seconds_per_epoch", 0.0)
        rows.append(row)
    return rows


# ---------------------------------------------------------------- subcommands


def cmd_data_stats(args: argparse.Namespace) -> int:
    from lsan.data.prepare import DATASETS, dataset_stats
    from lsan.data.readers import DataError

    names = DATASETS if args.dataset == "all" else [args.dataset]
    rows = []
    for name in names:
        try:
            ds = load_dataset(name, args.data_dir, args.cache_dir, args.min_count)
        except DataError as exc:
            if args.dataset != "all":
                raise
            print(f"skipped {name}: {exc}", file=sys.stderr)
            continue
        rows.append(
            ds.stats | dataset_stats(ds)
            if args.json
            else dataset_stats(ds) | {"k-core rounds": ds.stats["filter_rounds"]}
        )
    if args.json:
        print(json.dumps(rows if args.dataset == "all" else rows[0], indent=2))
    else:
        cols = ["dataset", "users", "items", "interactions", "avg_length", "density",
                "categories", "largest category", "time_slots", "slot_rule", "k-core rounds"]  # fmt: skip
        for r in rows:
            r["density"] = f"{100 * r['density']:.3f}%"
            share = r["largest_category_share"]
            r["largest category"] = "–" if share is None else f"{100 * share:.1f}%"
        print(markdown_table(rows, cols))
    return 0


def cmd_data_download(args: argparse.Namespace) -> int:
    from lsan.data.download import download
    from lsan.data.prepare import data_root

    target = download(
        args.dataset, data_root(args.data_dir), url=args.url, md5=args.md5, mirror=args.mirror
    )
    print(f"{args.dataset} ready in {target}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from lsan.train import train

    run = build_run(args.dataset, args.model, args.config, args.set,
                    data_dir=args.data_dir, cache_dir=args.cache_dir, device=args.device,
                    teacher=",".join(args.teacher), init=args.init)  # fmt: skip
    if run.data.dataset.startswith("synthetic") and args.data_dir:
        # a config without a [data] section trains on the generated data: say so before the
        # minutes of training, not after, to whoever pointed --data-dir at a real dataset
        print(f"note: training on the generated '{run.data.dataset}' data; --data-dir is not "
              "read (name a dataset with --dataset or data.dataset)", file=sys.stderr)  # fmt: skip
    result = train(
        run, args.out, resume=args.resume, progress=not args.quiet, command=args.command_line
    )
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun rank 0 alone reports
        return 0
    print(
        markdown_table(
            metrics_rows({run.model_name: result}), ["model", *METRIC_COLUMNS, "params", "s/epoch"]
        )
    )
    print(f"checkpoint: {args.out} (best epoch {result['best_epoch']} of {result['epochs']})")
    return 0


def _checkpoint_ranks(path: str, args: argparse.Namespace, device, ds=None):
    """A checkpoint's model, run config, dataset and every user's target rank on args.split.

    `ds` is reused when given (several checkpoints of one dataset); the checkpoint must have been
    trained on the dataset as it is now (same items, categories and time slots)."""
    from lsan.checkpoint import CheckpointError, load_model, recorded_slot_rule
    from lsan.evaluate import rank_users

    model, run, info = load_model(path, device)
    data = run.data
    if ds is None:
        ds = load_configured(data, args.data_dir, args.cache_dir)
    else:  # the same users and items; the time slots by this checkpoint's rule
        from lsan.data.prepare import with_slot_rule

        ds = with_slot_rule(ds, data.slot_rule)
    have = {"items": ds.num_items, "categories": ds.num_categories, "time slots": ds.num_slots}
    want = {
        "items": info.num_items,
        "categories": info.num_categories,
        "time slots": info.num_slots,
    }
    if ds.name != data.dataset:
        raise CheckpointError(
            f"{path}: trained on '{data.dataset}', compared on '{ds.name}': a paired comparison "
            "needs the same users"
        )
    rule = recorded_slot_rule(path)
    if rule and rule != ds.slot_rule:  # hour and gap have as many slots
        raise CheckpointError(
            f"{Path(path) / 'dataset.json'}: trained on time slots by the rule {rule!r}, "
            f"evaluated on {ds.slot_rule!r}"
        )
    for what in have:
        if have[what] != want[what]:
            raise CheckpointError(
                f"{Path(path) / 'config.json'}: dataset '{ds.name}' now has "
                f"{have[what]} {what}, the checkpoint was trained on {want[what]}"
            )
    ecfg = dataclasses.replace(run.eval, mask_seen=not args.no_mask_seen)
    return run, ecfg, ds, rank_users(model, ds, args.split, info.max_len, ecfg, device)


def _recipe_ranks(spec: str, args: argparse.Namespace, device, ds=None):
    """`_checkpoint_ranks` of a checkpoint, or of several of one recipe joined by commas (its
    seeds, say): the paths, the model name(s), the first's eval config, the dataset, and the
    ranks, (users,) for one checkpoint, (checkpoints, users) for several (lsan.paired pools
    them user by user)."""
    import numpy as np

    from lsan.checkpoint import CheckpointError

    paths = [spec] if Path(spec).exists() else [p for p in spec.split(",") if p]
    if not paths:
        raise CheckpointError(f"{spec!r} names no checkpoint")
    names, cfgs, ranks = [], [], []
    for path in paths:
        run, cfg, ds, r = _checkpoint_ranks(path, args, device, ds)
        names.append(run.model_name)
        cfgs.append(cfg)
        ranks.append(r)
    model = "+".join(dict.fromkeys(names))  # each name once, in order
    return paths, model, cfgs[0], ds, ranks[0] if len(ranks) == 1 else np.stack(ranks)


def cmd_evaluate(args: argparse.Namespace) -> int:
    from lsan.evaluate import summarise
    from lsan.paired import paired
    from lsan.train import resolve_device

    device = resolve_device(args.device)
    paths, model, ecfg, ds, ranks = _recipe_ranks(args.checkpoint, args, device)
    metrics = summarise(ranks, ecfg)
    out = {"checkpoint": str(args.checkpoint), "checkpoints": paths, "model": model,
           "dataset": ds.name, "split": args.split, "mask_seen": ecfg.mask_seen,
           **metrics}  # fmt: skip
    rows = [{"checkpoint": str(args.checkpoint), "model": model, **metrics}]
    against = []
    all_ranks = [ranks]
    for other in args.against or []:
        opaths, omodel, ocfg, _, oranks = _recipe_ranks(other, args, device, ds)
        all_ranks.append(oranks)
        d = paired(ranks, oranks, k=10)
        om = summarise(oranks, ocfg)
        against.append({"checkpoint": other, "checkpoints": opaths, "model": omodel,
                        "NDCG@10": om["NDCG@10"], "first_minus_this_ndcg10": d.as_dict()})  # fmt: skip
        rows.append({"checkpoint": other, "model": omodel, **om,
                     "first minus this, NDCG@10 [95% CI]": d.describe()})  # fmt: skip
    if against:
        out["against"] = against
    parts = []
    if args.segments:
        from lsan.segments import segment_rows, segments

        parts = segment_rows(segments(ds, args.split), all_ranks)  # in the order of the table
        out["segments"] = parts
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        cols = ["checkpoint", "model", *METRIC_COLUMNS, "users"]
        if against:
            cols.append("first minus this, NDCG@10 [95% CI]")
        print(markdown_table(rows, cols if against else cols[1:]))
        print(f"{ds.name} {args.split} split, full ranking, mask_seen={ecfg.mask_seen}")
        if against:
            print("differences are paired over the same users: mean, 95% bootstrap interval, "
                  "paired t-test p-value (lsan/paired.py)")  # fmt: skip
        if any(r.ndim == 2 for r in all_ranks):
            print("a row of comma-joined checkpoints: their means, each user's NDCG@10 averaged "
                  "over them before pairing")  # fmt: skip
        if parts:
            print(_segments_table(parts, len(all_ranks)))
    return 0


def _segments_table(parts: list[dict], rankers: int) -> str:
    """`lsan evaluate --segments` as a markdown table: NDCG@10 by checkpoint number (1 the
    first, as listed above) and the first's paired difference from each other one."""
    from lsan.paired import shown

    rows = []
    for p in parts:
        row = {"partition": p["partition"], "segment": p["segment"],
               "users": f"{p['users']:,} ({p['share']:.1%})"}  # fmt: skip
        for i, v in enumerate(p["ndcg"], 1):
            row[f"NDCG@10 #{i}"] = f"{v:.4f}"
        for i, d in enumerate(p["first_minus"], 2):
            row[f"#1 minus #{i}"] = shown(d)
        rows.append(row)
    cols = ["partition", "segment", "users", *(f"NDCG@10 #{i}" for i in range(1, rankers + 1)),
            *(f"#1 minus #{i}" for i in range(2, rankers + 1))]  # fmt: skip
    return "\nby segment of the users (lsan/segments.py):\n" + markdown_table(rows, cols)


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job: prepare data, train the models, evaluate, print the side-by-side table."""
    from lsan.models import model_config
    from lsan.train import train

    out = Path(args.out)
    results = {}
    for model in args.models:
        print(f"== training {model} on {args.dataset}", flush=True)
        # model.* settings go to the models that have such a field (pop has none)
        fields = {f.name for f in dataclasses.fields(model_config(model))}
        own = [s for s in args.set if not s.startswith("model.") or s[6:].split("=")[0] in fields]
        sets = [f"train.epochs={args.epochs}", *own]
        run = build_run(args.dataset, model, None, sets, data_dir=args.data_dir, device=args.device)
        results[model] = train(run, out / model, progress=not args.quiet, command=args.command_line)
    rows = metrics_rows(results)
    columns = ["model", *METRIC_COLUMNS, "params", "s/epoch"]
    if not args.no_export:
        from lsan.export.export import export

        logging.getLogger().setLevel(logging.ERROR)  # onnxruntime.quantization's advice on stderr
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)

        columns += ["artifact", "artifact bytes", "artifact NDCG@10", "p50 ms"]
        (out / "artifacts").mkdir(exist_ok=True)
        for row in rows:
            if row["model"] == "pop":
                continue
            print(f"== exporting {row['model']}", flush=True)
            # beside the checkpoints, not inside them (the exporter refuses that)
            meta = export(out / row["model"], out / "artifacts" / row["model"], log=lambda *_: None,
                          data_dir=args.data_dir)  # fmt: skip
            chosen = meta.parity[meta.quantization]
            row.update({"artifact": meta.quantization, "artifact bytes": meta.artifact_bytes,
                        "artifact NDCG@10": (meta.test_metrics or {}).get("NDCG@10"),
                        "p50 ms": chosen.latency_ms_b1})  # fmt: skip
    table = markdown_table(rows, columns)
    print(f"\n{args.dataset}: test split, leave-one-out, full ranking, seen items masked\n{table}")
    (out / "results.md").write_text(table + "\n")
    neural = [out / r["model"] for r in rows if r["model"] != "pop"]
    if not args.no_bench and neural:
        from lsan.benchmarks.run import main as bench_main

        print("== quick benchmark (size, memory, latency, catalogue scaling)", flush=True)
        argv = ["--checkpoints", *map(str, neural), "--name", "demo", "--quick", "--out", str(out / "bench"),
                "--data-dir", args.data_dir]  # fmt: skip
        if bench_main([*argv, "--quiet"]) != 0:
            return 1
        print((out / "bench" / "demo.md").read_text())
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from lsan.checkpoint import CheckpointError
    from lsan.report import collect, write_report

    rows = collect([Path(p) for p in args.checkpoints], args.reference)
    if not rows:
        raise CheckpointError("no finished checkpoint (with metrics.json) among the given paths")
    jpath, mpath = write_report(rows, args.name, Path(args.out), args.command_line)
    print(mpath.read_text())
    print(f"wrote {jpath} and {mpath}")
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    """Attention sparsity, rank and locality of checkpoints, with pictures (lsan.analysis)."""
    from lsan.analysis.attention import AnalysisConfig, analyze
    from lsan.analysis.report import write_report
    from lsan.train import resolve_device

    cfg = AnalysisConfig(users=args.users, seed=args.seed, sigma=args.sigma, split=args.split)
    results = analyze([Path(p) for p in args.checkpoints], cfg, resolve_device(args.device),
                      args.data_dir, args.cache_dir, progress=not args.quiet)  # fmt: skip
    jpath, mpath = write_report(results, cfg, Path(args.out), args.command_line)
    print(mpath.read_text())
    print(f"wrote {jpath}, {mpath} and the pictures in {args.out}")
    return 0


def _named_runs(args: argparse.Namespace) -> dict[str, RunConfig]:
    """`--models a b key=model` with `--set key:setting=value` for one run only."""
    runs = {}
    for spec in args.models:
        key, _, name = spec.partition("=")
        name = name or key
        own = [s.split(":", 1)[1] for s in args.set if s.split("=", 1)[0].startswith(f"{key}:")]
        common = [s for s in args.set if ":" not in s.split("=", 1)[0]]
        runs[key] = build_run(args.dataset, name, args.config, [*common, *own],
                              data_dir=args.data_dir, cache_dir=args.cache_dir,
                              device=args.device)  # fmt: skip
    unknown = {s.split(":", 1)[0] for s in args.set if ":" in s.split("=", 1)[0]} - set(runs)
    if unknown:
        raise ConfigError(f"--set for runs not in --models: {', '.join(sorted(unknown))}")
    return runs


def cmd_compare(args: argparse.Namespace) -> int:
    from lsan.compare import compare

    runs = _named_runs(args)
    name = args.name or f"compare-{args.dataset}"
    out = Path(args.out or f"runs/{name}")
    table, jpath = compare(
        runs, out, name, Path(args.results), args.command_line, progress=not args.quiet
    )
    print(table)
    print(f"wrote {jpath} and {jpath.with_suffix('.md')}; checkpoints in {out}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from lsan.tune import read_space, tune_run

    space = read_space(args.space)
    if args.trials < 1:
        raise ConfigError("--trials must be at least 1")
    run = build_run(args.dataset, args.model, args.config, args.set,
                    data_dir=args.data_dir, cache_dir=args.cache_dir, device=args.device)  # fmt: skip
    ds = load_configured(run.data)
    out = Path(args.out or f"runs/tune-{args.dataset}-{args.model}")
    summary = tune_run(run, space, args.trials, out, ds, args.address, args.command_line,
                       progress=not args.quiet)  # fmt: skip
    print((out / "trials.md").read_text())
    print(f"best: {summary['best_params']}")
    best = summary["best"]
    print(markdown_table(metrics_rows({args.model: best}), ["model", *METRIC_COLUMNS, "params"]))
    print(f"wrote {out / 'trials.md'}, {out / 'best.json'}; best checkpoint in {out / 'best'}")
    return 0


# ---------------------------------------------------------------- parser


def _data_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data-dir", default="", help="raw datasets root (default $LSAN_DATA_DIR or ./data)"
    )
    p.add_argument(
        "--cache-dir",
        default="",
        help="prepared-data cache (default $LSAN_CACHE_DIR or ~/.cache/lsan)",
    )


def parser() -> argparse.ArgumentParser:
    from lsan.data.prepare import DATASETS
    from lsan.data.readers import REAL_DATASETS
    from lsan.models import MODELS

    ap = argparse.ArgumentParser(prog="lsan", description=__doc__.splitlines()[0])
    ap.add_argument("--debug", action="store_true",
                    help="show the traceback of an error (accepted anywhere on the line)")  # fmt: skip
    sub = ap.add_subparsers(dest="command", required=True)

    data = sub.add_parser("data", help="dataset statistics and downloads")
    dsub = data.add_subparsers(dest="data_command", required=True)
    st = dsub.add_parser("stats", help="the dataset table (users, items, interactions, ...)")
    st.add_argument("--dataset", required=True, choices=[*DATASETS, "all"])
    st.add_argument("--min-count", type=int, default=DataConfig.min_count)
    st.add_argument("--json", action="store_true")
    _data_flags(st)
    st.set_defaults(func=cmd_data_stats)
    dl = dsub.add_parser(
        "download",
        help="fetch a real dataset from its source, checked and laid out for the readers",
    )
    dl.add_argument("dataset", choices=list(REAL_DATASETS))
    dl.add_argument("--url", default=None, help="MovieLens: zip URL (default: GroupLens')")
    dl.add_argument(
        "--md5", default=None, help="MovieLens: md5 of that zip (default: GroupLens' published sum)"
    )
    dl.add_argument("--mirror", default=None, metavar="BASE_URL",
                    help="base URL holding the files in the data-dir layout "
                         "(e.g. BASE_URL/beauty/s3rec/Beauty.txt) instead of the sources")  # fmt: skip
    _data_flags(dl)
    dl.set_defaults(func=cmd_data_download)

    tr = sub.add_parser("train", help="train a model into a checkpoint directory")
    tr.add_argument("--dataset", default=None, choices=DATASETS)
    tr.add_argument("--model", default=None, choices=list(MODELS))
    tr.add_argument(
        "--config", default=None, help="JSON or TOML file with data/model/train/eval sections"
    )
    tr.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override one setting, e.g. train.lr=3e-4 model.dim=128 (repeatable)")  # fmt: skip
    tr.add_argument("--out", required=True, help="checkpoint directory")
    tr.add_argument("--device", default="", help="auto, cpu, cuda or cuda:N (default auto)")
    tr.add_argument("--resume", action="store_true", help="continue from --out's trainer_state.pt")
    tr.add_argument("--teacher", action="append", default=[], metavar="CKPT",
                    help="distil from this trained checkpoint (train.kd_weight, train.kd_temperature);"
                         " repeat for an ensemble of teachers")  # fmt: skip
    tr.add_argument("--init", default="", metavar="CKPT",
                    help="start from this checkpoint's weights where names and shapes match (train.init)")  # fmt: skip
    tr.add_argument("--quiet", action="store_true", help="no progress output")
    _data_flags(tr)
    tr.set_defaults(func=cmd_train)

    ev = sub.add_parser("evaluate", help="full-ranking metrics of a checkpoint")
    ev.add_argument("checkpoint", help="a checkpoint, or several of one recipe joined by commas "
                    "(its seeds): their mean metrics, each user's NDCG@10 averaged over them "
                    "before a paired test (so also for --against)")  # fmt: skip
    ev.add_argument("--split", default="test", choices=["test", "valid"])
    ev.add_argument("--json", action="store_true")
    ev.add_argument(
        "--no-mask-seen", action="store_true", help="keep already-seen items in the ranking"
    )
    ev.add_argument("--device", default="auto")
    ev.add_argument("--against", action="append", metavar="CKPT",
                    help="also evaluate CKPT (repeat) on the same users and test the first "
                    "checkpoint's NDCG@10 minus CKPT's user by user: mean, 95%% bootstrap "
                    "interval, paired t-test p-value")  # fmt: skip
    ev.add_argument("--segments", action="store_true",
                    help="also NDCG@10 (and with --against the paired differences) by segment of "
                    "the users: history length, target popularity, time to the target, same "
                    "category as the last item (lsan/segments.py)")  # fmt: skip
    _data_flags(ev)
    ev.set_defaults(func=cmd_evaluate)

    rp = sub.add_parser("report", help="collect checkpoints into a results table (JSON + markdown)")
    rp.add_argument("checkpoints", nargs="+")
    rp.add_argument("--name", required=True, help="results file stem, e.g. models-beauty")
    rp.add_argument("--out", default="benchmarks/results")
    rp.add_argument("--reference", default="sasrec", help="model the ratios are relative to")
    rp.set_defaults(func=cmd_report)

    from lsan.analysis.attention import AnalysisConfig as An

    an = sub.add_parser("analyze", help="attention sparsity, rank, locality and pictures")
    an.add_argument("checkpoints", nargs="+", help="checkpoint directories (lsan train --out)")
    an.add_argument("--out", required=True, help="folder for analysis.json/.md and the PNGs")
    an.add_argument("--users", type=int, default=An.users, help="users sampled (seeded)")
    an.add_argument("--seed", type=int, default=An.seed, help="seeds the users and the rank noise")
    an.add_argument("--sigma", type=float, default=An.sigma, help="std of the rank noise (eq. 7)")
    an.add_argument("--split", default=An.split, choices=["valid", "test"])
    an.add_argument("--device", default="auto")
    an.add_argument("--quiet", action="store_true", help="no progress output")
    _data_flags(an)
    an.set_defaults(func=cmd_analyze)

    cp = sub.add_parser("compare", help="train several models and tabulate them (AR vs AE)")
    cp.add_argument("--dataset", required=True, choices=DATASETS)
    cp.add_argument("--models", nargs="+", required=True, metavar="MODEL|KEY=MODEL",
                    help="models to train; KEY=MODEL names a run, e.g. lsan-ae=lsan")  # fmt: skip
    cp.add_argument("--config", default=None, help="JSON or TOML file applied to every run")
    cp.add_argument("--set", action="append", default=[], metavar="[KEY:]SETTING=VALUE",
                    help="override for every run, or for run KEY only (repeatable)")  # fmt: skip
    cp.add_argument("--out", default="", help="checkpoints root (default runs/<name>)")
    cp.add_argument("--name", default="", help="results file stem (default compare-<dataset>)")
    cp.add_argument("--results", default="benchmarks/results", help="where the tables go")
    cp.add_argument("--device", default="")
    cp.add_argument("--quiet", action="store_true")
    _data_flags(cp)
    cp.set_defaults(func=cmd_compare)

    tu = sub.add_parser("tune", help="hyper-parameter search with ASHA on Ray Tune")
    tu.add_argument("--dataset", required=True, choices=DATASETS)
    tu.add_argument("--model", required=True, choices=list(MODELS))
    tu.add_argument("--space", required=True, help="TOML search space (see lsan/tune.py)")
    tu.add_argument("--trials", type=int, default=8, help="samples (x the grid, if any)")
    tu.add_argument("--address", default="", help="existing Ray cluster (default: local Ray)")
    tu.add_argument("--config", default=None)
    tu.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    tu.add_argument("--out", default="", help="default runs/tune-<dataset>-<model>")
    tu.add_argument("--device", default="")
    tu.add_argument("--quiet", action="store_true")
    _data_flags(tu)
    tu.set_defaults(func=cmd_tune)

    sub.add_parser("serve", help="HTTP server on an artifact (see `lsan serve -h`)", add_help=False)
    sub.add_parser(
        "bench", help="size, memory and latency benchmarks (see `lsan bench -h`)", add_help=False
    )
    sub.add_parser(
        "export", help="checkpoint -> verified ONNX artifact (see `lsan export -h`)", add_help=False
    )

    de = sub.add_parser("demo", help="the main job end to end on one dataset, offline")
    de.add_argument("--dataset", default="synthetic", choices=DATASETS)
    de.add_argument("--models", nargs="+", default=["pop", "sasrec", "lsan"], choices=list(MODELS))
    de.add_argument("--epochs", type=int, default=20)
    de.add_argument("--set", action="append", default=["model.dim=64"], metavar="KEY=VALUE")
    de.add_argument(
        "--no-export", action="store_true", help="stop after training (no ONNX artifacts)"
    )
    de.add_argument("--no-bench", action="store_true", help="skip the quick benchmark")
    de.add_argument("--out", default="runs/demo")
    de.add_argument("--device", default="")
    de.add_argument("--data-dir", default="")
    de.add_argument("--quiet", action="store_true")
    de.set_defaults(func=cmd_demo)
    return ap


# what an unusable input raises; anything else is a bug, still one line without --debug
def user_errors() -> tuple[type[Exception], ...]:
    """The errors that are the user's: one line, no traceback."""
    from lsan.checkpoint import CheckpointError
    from lsan.data.readers import DataError

    return (ConfigError, DataError, CheckpointError, ValueError, OSError, pickle.UnpicklingError)


def _warning_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:  # fmt: skip
    print(f"warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    if argv[:1] == ["export"]:  # the exporter owns its flags (also `python export/export.py`)
        from lsan.export.export import main as export_main

        # the exporter reports its errors as one line with status 1; lsan's status for them is 2
        status = export_main(argv[1:])
        return 2 if status == 1 else status
    if argv[:1] == ["serve"]:  # the server owns its flags (also `python -m serving`)
        from lsan.serving.__main__ import main as serve_main

        return serve_main(argv[1:])
    if argv[:1] == [
        "bench"
    ]:  # the benchmark suite owns its flags (also `python -m benchmarks.run`)
        from lsan.benchmarks.run import main as bench_main

        return bench_main(argv[1:])
    try:
        ap = parser()
    except ModuleNotFoundError as exc:  # the device install (lsan[serve]) has only `lsan serve`
        print(f"error: {exc}: this command needs the training install, pip install 'lsan[train]'",
              file=sys.stderr)  # fmt: skip
        return 2
    args = ap.parse_args(argv)
    args.command_line = " ".join(["lsan", *argv])
    with warnings.catch_warnings():
        warnings.showwarning = _warning_line
        try:
            return int(args.func(args))
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        except Exception as exc:  # noqa: BLE001 (the one place every error becomes one line)
            if debug:
                traceback.print_exc()
            text = " ".join(str(exc).split()) or type(exc).__name__
            if isinstance(exc, user_errors()):
                print(f"error: {text}", file=sys.stderr)
            else:
                print(f"error: {type(exc).__name__}: {text} (rerun with --debug for the traceback)",
                      file=sys.stderr)  # fmt: skip
            return 2


if __name__ == "__main__":
    sys.exit(main())
