"""Knowledge distillation and data-driven codes: what a compact student takes from a teacher.

The on-device recipes that keep accuracy while shrinking 10-30x (OD-Rec, EODRec) train the small
model against a strong one. Here a teacher is any trained causal checkpoint (`lsan train
--teacher CKPT`); the student's loss at every non-padding position is

    (1 - w) CE(student, next item) + w T^2 KL(softmax(teacher / T) || softmax(student / T))

over the full catalogue (w = `train.kd_weight`, default 0.5; T = `train.kd_temperature`,
default 1.0; the padding column is masked on both sides). Several teachers (`--teacher A
--teacher B`, stored as `train.teacher = "A,B"`) teach as one: the normalised geometric mean of
their distributions at temperature T (an ensemble of two SASRec sizes is more accurate than
either). The teacher runs in eval mode under no_grad and is held outside the module tree, so
it is never in the optimizer, the state dict or DDP's buckets. Its checkpoint path and the
sha256 of its model.pt are recorded in the student's config.json (`train.teacher`,
`train.teacher_sha256`) and metrics.json; a resumed run refuses a teacher whose digest changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lsan.data.batching import SeqTensors
from lsan.digest import file_digest
from lsan.models import DataInfo
from lsan.models.codes import assign, teacher_vectors
from lsan.models.item_tables import CodeTable, FullTable, LowBitTable, training_scores
from lsan.models.layers import PAD, mask_padding
from lsan.models.objectives import is_autoencoding, uses_users


class TeacherError(ValueError):
    """The teacher cannot teach this student."""


def slot_tensors(model: nn.Module) -> list[str]:
    """State-dict names of `model`'s time-slot embeddings (LSAN's context; most models have none)."""
    return [f"{name}.weight" for name, m in model.named_modules()
            if isinstance(m, nn.Embedding) and name.split(".")[-1] == "slot"]  # fmt: skip


def load_teacher(
    path: str, info: DataInfo, device: torch.device, expected_sha256: str = "", slot_rule: str = ""
) -> tuple[nn.Module, str, str]:
    """The frozen teacher of checkpoint `path`, the digest of its model.pt and its model name;
    a teacher that reads time slots must read them by the student's `slot_rule` (if given)."""
    from lsan.checkpoint import CheckpointError, load_model, recorded_slot_rule

    try:
        teacher, run, t_info = load_model(path, device)
    except CheckpointError as exc:
        raise TeacherError(f"teacher {path}: {exc}") from None
    digest = file_digest(Path(path) / "model.pt")
    if expected_sha256 and digest != expected_sha256:
        raise TeacherError(
            f"teacher {path}: model.pt changed since this run started (sha256 {digest[:12]}... "
            f"!= recorded {expected_sha256[:12]}...); resume with the same teacher"
        )
    if t_info.num_items != info.num_items:
        raise TeacherError(
            f"teacher {path} has {t_info.num_items} items, the student's data {info.num_items}"
        )
    if t_info.max_len < info.max_len:
        raise TeacherError(
            f"teacher {path} reads {t_info.max_len} positions, fewer than {info.max_len}"
        )
    # dataset.json holds the whole id map: read only for a teacher that reads slots
    if slot_rule and slot_tensors(teacher) and (theirs := recorded_slot_rule(path)) != slot_rule:
        raise TeacherError(
            f"teacher {path} reads time slots by the rule {theirs!r}, the student's data by "
            f"{slot_rule!r}: train the student with --set data.slot_rule={theirs or 'auto'}"
        )
    if is_autoencoding(teacher) or uses_users(teacher):
        raise TeacherError(
            f"teacher {path} ({run.model_name}) must be a causal sequence model without user ids: "
            "distillation matches next-item distributions at every position"
        )
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher.eval(), digest, run.model_name


class Teachers:
    """One or more frozen teachers read as one next-item distribution (not an nn.Module: the
    student's optimizer, state dict and DDP never see them)."""

    def __init__(self, members: list[nn.Module]):
        # Any: every member is a causal model with forward (hidden states) and item_scores
        self.members: list[Any] = members

    def to(self, device: torch.device) -> Teachers:
        self.members = [m.to(device) for m in self.members]
        return self

    def single(self, what: str) -> nn.Module:
        """The one teacher that `what` (a setting that copies a teacher's weights) needs."""
        if len(self.members) != 1:
            raise TeacherError(f"{what} needs one teacher, not {len(self.members)}")
        return self.members[0]

    @torch.no_grad()
    def log_probs(self, b: SeqTensors, keep: Tensor, temperature: float) -> Tensor:
        """log softmax(teacher / T) at the kept positions (P, |V|+1); for several teachers the
        normalised mean of their log-probabilities (the geometric mean of the distributions)."""
        logs = []
        for m in self.members:
            t = mask_padding(m.item_scores(m(b.items, b.cats, b.slots)[keep]).float())
            logs.append(F.log_softmax(t / temperature, dim=-1))
        if len(logs) == 1:
            return logs[0]
        return F.log_softmax(torch.stack(logs).mean(0), dim=-1)


def load_teachers(
    spec: str, info: DataInfo, device: torch.device, expected_sha256: str = "", slot_rule: str = ""
) -> tuple[Teachers, str, str]:
    """The teachers of `spec` (checkpoint directories separated by ","), their digests and
    model names joined the same way; `expected_sha256` (as recorded) must match if given."""
    paths = [p.strip() for p in spec.split(",") if p.strip()]
    if not paths:
        raise TeacherError(f"train.teacher {spec!r} names no checkpoint")
    expected = expected_sha256.split(",") if expected_sha256 else [""] * len(paths)
    if len(expected) != len(paths):
        raise TeacherError(
            f"train.teacher names {len(paths)} checkpoints, the run recorded {len(expected)}; "
            "resume with the same teachers"
        )
    loaded = [load_teacher(p, info, device, e, slot_rule)
              for p, e in zip(paths, expected, strict=True)]  # fmt: skip
    return (
        Teachers([t for t, _, _ in loaded]),
        ",".join(d for _, d, _ in loaded),
        ",".join(n for _, _, n in loaded),
    )


def student_scores(model: Any):
    """The student's full-catalogue scores (P, D) -> (P, |V|+1) on its fast training layout."""
    table = getattr(model, "item_emb", None)
    mode = getattr(getattr(model, "cfg", None), "train_scores", "matrix")
    if table is None or isinstance(table, FullTable) or not hasattr(table, "num_ids"):
        return model.item_scores
    score = training_scores(table, mode)
    return lambda h: score(h)[:, : table.num_ids]


def distill_loss(
    model: nn.Module, teacher: Teachers, b: SeqTensors, weight: float, temperature: float
) -> Tensor:
    """(1 - w) CE + w T^2 KL(teacher || student) at the batch's non-padding positions."""
    if is_autoencoding(model):
        raise TeacherError("distillation needs a causal (next-item) student")
    assert b.targets is not None
    keep = b.targets != PAD
    s = student_scores(model)(model(b.items, b.cats, b.slots)[keep])
    s = mask_padding(s)  # padding is never a target
    ce = F.cross_entropy(s, b.targets[keep])
    if weight == 0.0:
        return ce
    log_t = teacher.log_probs(b, keep, temperature)
    log_s = F.log_softmax(s.float() / temperature, dim=-1)
    kd = F.kl_div(log_s, log_t, log_target=True, reduction="batchmean") * temperature**2
    return (1 - weight) * ce + weight * kd


def init_from_teacher(model: nn.Module, teacher: nn.Module) -> list[str]:
    """Copy the teacher's tensors whose names and shapes match (never the item table).

    A student with the teacher's encoder (say SASRec D=64 over a codebook table) then starts
    where the teacher ended, less the table's compression error, and distillation only has to
    repair that: a few epochs instead of a full training run.
    """
    own = model.state_dict()
    taken = [k for k, v in teacher.state_dict().items()
             if k in own and own[k].shape == v.shape and not k.startswith("item_emb.")]  # fmt: skip
    model.load_state_dict({**own, **{k: teacher.state_dict()[k] for k in taken}})
    return taken


def init_from_checkpoint(model: nn.Module, path: str, slot_rule: str = "") -> dict[str, Any]:
    """Start `model` from checkpoint `path`'s best weights where names and shapes match; its
    time-slot embeddings only if it read slots by the same rule as `slot_rule` (if given): hour
    and gap both have 26 slots, which mean different things.

    Unlike `teacher_init` the item table is taken too: a low-bit student (`model.bits`) starts
    from a trained float model of its own D and only learns to live on the grid. Buffers that
    describe the student's own layout (a low-bit table's row widths) are never taken. From a
    low-bit checkpoint of the same widths the row steps are kept as it evaluated them (with
    `model.refresh_steps=false` and the table held, the grid stays exactly the source's: a
    later stage such as an output bias fitted alone starts from the same model); otherwise
    they are chosen for the weights just taken.
    """
    from lsan.checkpoint import CheckpointError, load_model, recorded_slot_rule

    try:
        source, run, _ = load_model(path)
    except CheckpointError as exc:
        raise TeacherError(f"train.init {path}: {exc}") from None
    own = model.state_dict()
    theirs = source.state_dict()
    theirs_rule = recorded_slot_rule(path) if slot_rule and slot_tensors(model) else slot_rule
    skipped = slot_tensors(model) if theirs_rule != slot_rule else []
    taken = [k for k, v in theirs.items()
             if k in own and own[k].shape == v.shape and not k.endswith("row_bits")
             and k not in skipped]  # fmt: skip
    if not taken:
        raise TeacherError(f"train.init {path} ({run.model_name}) shares no tensor with this model")
    model.load_state_dict({**own, **{k: theirs[k].to(own[k].device) for k in taken}})
    table = getattr(model, "item_emb", None)
    widths = theirs.get("item_emb.row_bits")
    same_grid = (
        "item_emb.row_exps" in taken and widths is not None
        and torch.equal(widths.cpu(), own["item_emb.row_bits"].cpu())
    )  # fmt: skip
    if isinstance(table, LowBitTable) and not same_grid:
        table.refresh()  # steps for the weights just taken
    record = {"path": path, "sha256": file_digest(Path(path) / "model.pt"),
              "tensors": len(taken), "of": len(own)}  # fmt: skip
    if skipped:
        record["not_taken"] = f"{', '.join(skipped)}: trained by slot rule {theirs_rule!r}"
    return record


def prepare_codes(
    model: nn.Module, counts: np.ndarray, teacher: Teachers | None, seed: int
) -> dict[str, Any]:
    """Set a table's data-driven layout: a `codes` table's codes, a low-bit table's hot rows
    (no-op for other tables); a summary for metrics.json."""
    table = getattr(model, "item_emb", None)
    if isinstance(table, LowBitTable):
        hot = table.assign_hot(counts) if table.hot_rows else 0
        return {"bits": table.bits, "hot_rows": hot, "hot_bits": table.hot_bits if hot else None}
    if not isinstance(table, CodeTable):
        return {}
    cfg: Any = model.cfg
    vectors = None
    if teacher is not None and cfg.codes_from == "teacher":
        vectors = teacher_vectors(teacher.single("model.codes_from=teacher"))
    summary = assign(table, cfg.codes_from, cfg.own_rows, counts, vectors, seed)
    return {"source": cfg.codes_from, "books": table.sizes, **summary}
