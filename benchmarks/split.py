"""A request's warm time split at the hidden vector: the encoder's share and the scoring's.

    python -m benchmarks.split --artifact lsan=artifacts/lsan-aheadres-s7-lowbit \\
        --artifact sasrec-1-layer=artifacts/sas1-ahead-s7-lowbit --name split-beauty

Each file's graph is cut at the final layer norm's output, the user's hidden state h: the
encoder (history in, h out) and the scoring (h and the excluded items in, top-K out: the
product over the item table, the exclusion scatter, the top-K) become two graphs of their own
(`onnx.utils.Extractor`), checked to give the whole graph's top-K. All three are timed warm, in
turns of `--block` calls (batch 1, full history, 1 thread). Models over the same item table
share the scoring: its time bounds how much faster than another any encoder can make a file,
which is what "2x faster than the fastest SASRec" asks of LSAN's. Writes NAME.json (command,
git commit, machine, every artifact's medians and node counts) and prints the table.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx.utils import Extractor

from lsan.artifact import session
from lsan.benchmarks.env import environment, write_record
from lsan.benchmarks.latency import interleaved, request_feeds
from lsan.benchmarks.rotation import artifact_flags, read_artifacts
from lsan.tables import markdown_table

TOP = ["top_items", "top_scores"]


def hidden_name(model: onnx.ModelProto) -> str:
    """The output of the graph's last LayerNormalization: h, where the encoder ends."""
    norms = [n.output[0] for n in model.graph.node if n.op_type == "LayerNormalization"]
    if not norms:
        raise ValueError("no LayerNormalization in the graph: nowhere to cut it at h")
    return norms[-1]


def halves(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
    """The graph's encoder and scoring as sessions with their feeds, and the node counts; the
    scoring half is checked against the whole graph's top-K on these feeds (one run of the
    whole graph with h as an extra output gives both h and that top-K)."""
    model = onnx.load(path)
    h = hidden_name(model)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(h))
    hv, *want = session(probe.SerializeToString()).run([h, *TOP], feeds)
    dims: list[str | int] = ["batch", *hv.shape[1:]]
    model.graph.value_info.append(
        onnx.helper.make_tensor_value_info(h, onnx.TensorProto.FLOAT, dims)
    )
    cut = Extractor(model)
    history = [i.name for i in model.graph.input if i.name != "exclude"]
    parts = {"encoder": cut.extract_model(history, [h]),
             "scoring": cut.extract_model([h, "exclude"], TOP)}  # fmt: skip
    inputs = {"encoder": {k: feeds[k] for k in history},
              "scoring": {h: hv, "exclude": feeds["exclude"]}}  # fmt: skip
    sessions = {
        name: (session(g.SerializeToString()), [o.name for o in g.graph.output], inputs[name])
        for name, g in parts.items()
    }
    got = sessions["scoring"][0].run(TOP, inputs["scoring"])
    if not (np.array_equal(got[0], want[0]) and np.allclose(got[1], want[1])):
        raise ValueError(f"{path}: the scoring half does not give the whole graph's top-K")
    nodes = {"whole": len(model.graph.node)} | {k: len(g.graph.node) for k, g in parts.items()}
    return {"sessions": sessions, "nodes": nodes}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.split",
                                 description=__doc__.splitlines()[0])  # fmt: skip
    artifact_flags(ap, "split", "an exported artifact folder; repeat for every file to split")
    ap.add_argument("--runs", type=int, default=3, help="interleaved runs, each of --repeats")
    ap.add_argument("--repeats", type=int, default=3000, help="timed calls of each graph a run")
    ap.add_argument("--block", type=int, default=20, help="calls of one graph per turn")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.repeats < 3 or args.block < 1:
        ap.error("--runs and --block must be at least 1, --repeats at least 3")
    folders, arts = read_artifacts(args.artifact, ap)
    cut: dict[str, dict[str, Any]] = {}
    for key, a in arts.items():
        x = request_feeds(a.meta.info, batch=1, length=a.meta.info.max_len)
        try:
            cut[key] = halves(folders[key] / "model.onnx", x)
        except ValueError as e:
            ap.error(str(e))
        # the whole graph: the verified artifact's own session (same options as the halves')
        cut[key]["sessions"] = {"whole": (a.session, TOP, x)} | cut[key]["sessions"]
    calls = [(key, part, s) for key, c in cut.items() for part, s in c["sessions"].items()]
    fns = [lambda s=s: s[0].run(s[1], s[2]) for _, _, s in calls]
    runs: list[dict[str, dict[str, float]]] = []
    for _ in range(args.runs):
        times = interleaved(fns, warmup=50, repeats=args.repeats, budget_s=60.0, block=args.block)
        run: dict[str, dict[str, float]] = {key: {} for key in cut}
        for (key, part, _), t in zip(calls, times, strict=True):
            run[key][part] = float(np.median(t)) * 1000
        runs.append(run)
    table = []
    for key, c in cut.items():
        row: dict[str, Any] = {"artifact": key, "nodes": c["nodes"]}
        for part in ("whole", "encoder", "scoring"):
            p50 = [r[key][part] for r in runs]
            row |= {f"{part}_p50_min": min(p50), f"{part}_p50_max": max(p50)}
        share = [r[key]["scoring"] / r[key]["whole"] for r in runs]
        table.append(row | {"scoring_share_min": min(share), "scoring_share_max": max(share)})

    def span(lo: float, hi: float, fmt: str) -> str:
        return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{lo:{fmt}}-{hi:{fmt}}"

    shown = [{"artifact": r["artifact"]} | {
        f"{part} p50 ms": span(r[f"{part}_p50_min"], r[f"{part}_p50_max"], ".4f")
        for part in ("whole", "encoder", "scoring")
    } | {
        "scoring share": span(r["scoring_share_min"], r["scoring_share_max"], ".0%"),
        "nodes whole / encoder / scoring": "{whole} / {encoder} / {scoring}".format(**r["nodes"]),
    } for r in table]  # fmt: skip
    print(markdown_table(shown, list(shown[0])))
    print(f"p50 of {len(times[0])} calls of each graph per run, min-max over {args.runs} runs")
    command = shlex.join(["python", "-m", "benchmarks.split", *(argv or sys.argv[1:])])
    write_record({"environment": environment(command), "folders": {k: str(v) for k, v in folders.items()},
                  "runs": runs, "table": table}, Path(args.out) / f"{args.name}.json")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
