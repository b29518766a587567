"""`lsan tune`: adaptive hyper-parameter search on Ray Tune with ASHA early termination.

Every trial is one ordinary training run (the same trainer, data and validation protocol) that
reports validation NDCG@10 after each epoch; ASHA (asynchronous successive halving) stops the
trials that trail their peers at the same epoch, so the budget goes to promising ones. Ray runs
locally by default (one CPU per trial) and on an existing cluster unchanged with `--address`
(the prepared dataset travels through Ray's object store; trial checkpoints are written under
--out, so use a path every node shares). The best trial's configuration is saved and trained
again with the full budget (its own epochs and early stopping) into <out>/best.

The space file (TOML) holds settings for the search and one table of parameters, each a dotted
run setting with a constant or one distribution:

    max_epochs = 30          # epochs per trial at most (ASHA's max_t)
    grace_period = 2         # epochs every trial gets before it can be stopped
    reduction_factor = 3     # ASHA keeps the best 1/reduction_factor at each rung
    scheduler = "asha"       # or "fifo": no early termination

    [params]
    "model.dim" = { choice = [32, 64, 128] }
    "model.dropout" = { uniform = [0.1, 0.9] }
    "train.lr" = { loguniform = [1e-4, 1e-2] }
    "model.layers" = { randint = [1, 4] }          # 1..3, upper bound exclusive
    "model.mask_prob" = { grid = [0.2, 0.4, 0.6] } # every value, in every sample
    "model.heads" = 2                               # a constant

Grid search is the `grid` option: Ray expands every grid, and `--trials N` repeats the whole
grid N times (with the random parameters drawn anew each time).
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lsan.config import ConfigError, RunConfig, merge, override, parse_sets, to_dict
from lsan.tables import markdown_table

METRIC = "NDCG@10"
DISTRIBUTIONS = ("choice", "uniform", "loguniform", "randint", "grid")


@dataclass(frozen=True)
class SearchSpace:
    params: dict[str, Any] = field(default_factory=dict)  # dotted key -> constant or {dist: args}
    max_epochs: int = 30
    grace_period: int = 2
    reduction_factor: int = 3
    scheduler: str = "asha"


def read_space(path: str | Path) -> SearchSpace:
    """Parse and validate a space file; every mistake is a ConfigError naming the key."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"space file not found: {p}")
    try:
        tree = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"cannot parse space file {p}: {exc}") from None
    params = tree.pop("params", None)
    if not isinstance(params, dict) or not params:
        raise ConfigError(f"space file {p} needs a [params] table with at least one parameter")
    for key, spec in params.items():
        if isinstance(spec, dict):
            if len(spec) != 1 or next(iter(spec)) not in DISTRIBUTIONS:
                raise ConfigError(
                    f"{key}: give exactly one of {', '.join(DISTRIBUTIONS)}, got {spec}"
                )
            (dist, args), = spec.items()  # fmt: skip
            if not isinstance(args, list) or not args:
                raise ConfigError(f"{key}: {dist} expects a list of values")
            if dist in ("uniform", "loguniform", "randint") and len(args) != 2:
                raise ConfigError(f"{key}: {dist} expects [low, high]")
    try:
        space = override(SearchSpace(params=params), tree)
    except ConfigError as exc:
        raise ConfigError(f"space file {p}: {exc}") from None
    if space.scheduler not in ("asha", "fifo"):
        raise ConfigError(f"scheduler must be asha or fifo, got '{space.scheduler}'")
    return space


def ray_space(space: SearchSpace) -> dict[str, Any]:
    """The params as Ray Tune search-space objects (keys stay dotted)."""
    from ray import tune

    make = {
        "choice": lambda a: tune.choice(a),
        "uniform": lambda a: tune.uniform(*a),
        "loguniform": lambda a: tune.loguniform(*a),
        "randint": lambda a: tune.randint(*a),
        "grid": lambda a: tune.grid_search(a),
    }
    out = {}
    for key, spec in space.params.items():
        if isinstance(spec, dict):
            (dist, args), = spec.items()  # fmt: skip
            out[key] = make[dist](args)
        else:
            out[key] = spec
    return out


def apply(base: RunConfig, params: dict[str, Any]) -> RunConfig:
    """The base run with dotted `params` applied (the same coercion as --set)."""
    from lsan.models import model_config

    tree = parse_sets([f"{k}={v}" for k, v in params.items()])
    model_values = merge(_model_values(base), tree.pop("model", {}))
    run = override(replace(base, model=None), tree)
    return replace(run, model=model_config(run.model_name, model_values))


def check(base: RunConfig, space: SearchSpace) -> None:
    """Fail before starting Ray on settings no trial could use (unknown keys, wrong types)."""
    for key, spec in space.params.items():
        values = next(iter(spec.values())) if isinstance(spec, dict) else [spec]
        if isinstance(spec, dict) and "loguniform" in spec and min(values) <= 0:
            raise ConfigError(f"{key}: loguniform bounds must be positive, got {values}")
        for value in values:
            apply(base, {key: value})


def _model_values(run: RunConfig) -> dict[str, Any]:
    return to_dict(run.model) if run.model is not None else {}


def _trial(params: dict[str, Any], base: RunConfig, ds: Any, root: str, max_epochs: int) -> None:
    """One Ray trial: train with `params`, report validation NDCG@10 after every epoch."""
    from ray import tune

    from lsan.train import train

    run = apply(base, params)
    run = replace(run, train=replace(run.train, epochs=max_epochs, threads=1))
    out = Path(root) / tune.get_context().get_trial_id()

    def report(record: dict[str, Any]) -> None:
        if "valid" in record:
            tune.report({METRIC: record["valid"][METRIC], "epoch": record["epoch"]})

    train(run, out, progress=False, ds=ds, on_epoch=report)


def tune_run(
    base: RunConfig, space: SearchSpace, trials: int, out: Path, ds: Any, address: str = "",
    command: str = "", progress: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """Search, save the best config, retrain it in full; returns the summary (also summary.json)."""
    try:
        import ray
        from ray import tune
        from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
        from ray.tune.search.basic_variant import BasicVariantGenerator
    except ImportError:
        raise ConfigError("lsan tune needs Ray Tune: pip install -e '.[tune]'") from None
    from lsan.train import train

    check(base, space)
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = not ray.is_initialized()
    if started:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, log_to_driver=False)
    if space.scheduler == "asha":
        scheduler: Any = ASHAScheduler(
            time_attr="epoch", max_t=space.max_epochs, grace_period=space.grace_period,
            reduction_factor=space.reduction_factor,
        )  # fmt: skip
    else:
        scheduler = FIFOScheduler()
    trainable = tune.with_resources(
        tune.with_parameters(
            _trial, base=base, ds=ds, root=str(out / "trials"), max_epochs=space.max_epochs
        ),
        {"cpu": 1},
    )
    tuner = tune.Tuner(
        trainable,
        param_space=ray_space(space),
        tune_config=tune.TuneConfig(
            metric=METRIC,
            mode="max",
            scheduler=scheduler,
            num_samples=trials,
            search_alg=BasicVariantGenerator(
                random_state=base.train.seed
            ),  # train.seed: same draws
        ),
        run_config=tune.RunConfig(
            name="search", storage_path=str(out / "ray"), verbose=1 if progress else 0
        ),
    )
    try:
        results = tuner.fit()
    finally:
        if started:
            ray.shutdown()
    rows = []
    for r in (results[i] for i in range(len(results))):
        if r.metrics is None or r.config is None:
            continue
        df = r.metrics_dataframe
        best = float(df[METRIC].max()) if df is not None and METRIC in df else float("nan")
        rows.append({
            "trial": r.metrics.get("trial_id", ""),
            **{k: r.config[k] for k in space.params},
            f"best valid {METRIC}": best,
            "epochs": int(r.metrics.get("epoch", 0)),
            "error": "yes" if r.error else "",
        })  # fmt: skip
    ok = [row for row in rows if row[f"best valid {METRIC}"] == row[f"best valid {METRIC}"]]
    if not ok:
        raise RuntimeError(f"no trial finished an epoch; see the Ray logs in {out / 'ray'}")
    ok.sort(key=lambda row: -row[f"best valid {METRIC}"])
    rows = ok + [row for row in rows if row not in ok]  # failed trials last
    best_params = {k: ok[0][k] for k in space.params}
    best_run = apply(base, best_params)
    (out / "best.json").write_text(
        json.dumps({"params": best_params, "run": to_dict(best_run)}, indent=2, default=str)
    )
    columns = ["trial", *space.params, f"best valid {METRIC}", "epochs", "error"]
    (out / "trials.md").write_text(markdown_table(rows, columns) + "\n")
    (out / "trials.json").write_text(json.dumps(rows, indent=2, default=str))
    final = train(best_run, out / "best", progress=progress, ds=ds, command=command)
    summary = {"best_params": best_params, "trials": len(rows), "best": final, "command": command}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary
