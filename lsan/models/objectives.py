"""Training objectives shared by every sequence model: AR next item, AE Cloze, and the losses.

AE or AR is one switch, a model's attention mode (../shared/papers/causal-self-attentive-*.txt):
- `causal` attention is auto-regressive (AR, SASRec): the item at t+1 is predicted from items
  <= t, at every position;
- `bidirectional` or `local` attention is auto-encoding (AE, BERT4Rec): each item of the training
  sequence is replaced by a [MASK] token with probability `mask_prob` (at least one per sequence)
  and predicted from both sides (Cloze). A bidirectional model trained on the next item would
  see its own target, so the switch always carries the objective with it. At inference an AE
  model gets the history shifted left by one with [MASK] appended, and predicts that position.
The [MASK] token is item id |V|+1; its category is UNKNOWN (the category would give the item
away) and its time slot is the last known one. Models turn it into a learned vector
(`with_mask_token`), so no embedding table grows and AR checkpoints stay unchanged.

Losses, chosen by `train.loss`: `ce` full-softmax cross-entropy over the catalogue (default);
`bpr` pairwise -log sigmoid(s_pos - s_neg) averaged over `train.negatives` uniform negatives
(1 = classic BPR); `sampled` softmax over the positive and `train.negatives` uniform negatives
(accidental hits masked), for catalogues where a full softmax does not fit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lsan.data.batching import SeqTensors
from lsan.data.slots import UNKNOWN
from lsan.models.layers import NEG, PAD

LOSSES = ("ce", "bpr", "sampled")


def is_autoencoding(model: Any) -> bool:
    """True for models trained with Cloze (non-causal attention)."""
    return getattr(getattr(model, "cfg", None), "attention", "causal") != "causal"


def uses_users(model: Any) -> bool:
    """True for models with user embeddings (they take `users=` in forward/loss/score_all)."""
    return bool(getattr(model, "uses_users", False))


def require_users(name: str, num_users: int) -> None:
    """Models with a user embedding table cannot be built without a user count."""
    if num_users < 1:
        raise ValueError(f"{name} needs DataInfo.num_users > 0 (it has a user embedding table)")


def mask_token(model: Any) -> int:
    return int(model.info.num_items) + 1


def with_mask_token(
    embed: Callable[[Tensor], Tensor], items: Tensor, vector: Tensor, mask: int
) -> Tensor:
    """embed(items) with every [MASK] position replaced by `vector` (broadcast over extra dims)."""
    is_mask = items == mask
    x = embed(items.masked_fill(is_mask, PAD))
    return torch.where(is_mask.view(*is_mask.shape, *[1] * (x.dim() - items.dim())), vector, x)


def cloze_batch(b: SeqTensors, prob: float, mask: int) -> SeqTensors:
    """A Cloze training batch from a next-item batch (uses the global torch RNG).

    The sequence is the whole training part, the inputs plus the last target (the last max_len
    of them); each real item is masked with probability `prob`, and a row with none masked
    masks its last item, which is also the inference task. A masked position gets category
    UNKNOWN and the previous position's time slot, as the appended [MASK] does at inference.
    """
    assert b.targets is not None and b.next_cats is not None and b.next_slots is not None
    t = b.items.shape[1]
    seq = torch.cat([b.items, b.targets[:, -1:]], dim=1)[:, -t:]
    cats = torch.cat([b.cats, b.next_cats[:, -1:]], dim=1)[:, -t:]
    slots = torch.cat([b.slots, b.next_slots[:, -1:]], dim=1)[:, -t:]
    real = seq != PAD
    chosen = (torch.rand(seq.shape, device=seq.device) < prob) & real
    none = ~chosen.any(1) & real[:, -1]
    chosen[:, -1] |= none
    previous = torch.cat([slots[:, :1], slots[:, :-1]], dim=1)
    return SeqTensors(
        items=seq.masked_fill(chosen, mask),
        cats=cats.masked_fill(chosen, UNKNOWN),
        slots=torch.where(chosen, previous, slots),
        targets=seq.masked_fill(~chosen, PAD),
        users=b.users,
    )


def inference_inputs(
    model: Any, items: Tensor, cats: Tensor, slots: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """What the model reads to score the next item: the history, or for AE history + [MASK].

    The AE input grows by one position, dropping the oldest item only at the model's max_len
    (by slicing, so an exported graph does the same at every length).
    """
    if not is_autoencoding(model):
        return items, cats, slots
    n = int(model.info.max_len)
    m = torch.full_like(items[:, :1], mask_token(model))
    return (
        torch.cat([items, m], dim=1)[:, -n:],
        torch.cat([cats, torch.full_like(cats[:, :1], UNKNOWN)], dim=1)[:, -n:],
        torch.cat([slots, slots[:, -1:]], dim=1)[:, -n:],
    )


def sampled_negatives(positives: Tensor, num_items: int, k: int) -> Tensor:
    """(N, k) uniform item ids in 1..num_items."""
    return torch.randint(1, num_items + 1, (positives.shape[0], k), device=positives.device)


def sampled_loss(kind: str, scores: Tensor, positives: Tensor, negatives: Tensor) -> Tensor:
    """BPR or sampled softmax from scores (N, 1 + k) of [positive, negatives...]."""
    hit = negatives == positives[:, None]  # accidental hits are not negatives
    pos, neg = scores[:, :1], scores[:, 1:]
    if kind == "bpr":
        pair = -F.logsigmoid(pos - neg)
        keep = (~hit).to(pair.dtype)
        return (pair * keep).sum() / keep.sum().clamp(min=1.0)
    if kind == "sampled":
        logits = torch.cat([pos, neg.masked_fill(hit, NEG)], dim=1)
        return F.cross_entropy(logits, torch.zeros_like(positives))
    raise ValueError(f"unknown loss {kind!r} (known: {', '.join(LOSSES)})")


def batch_loss(model: Any, b: SeqTensors, loss: str = "ce", negatives: int = 100) -> Tensor:
    """The training loss of one batch: Cloze for AE models, next item for AR; `loss` as above."""
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r} (known: {', '.join(LOSSES)})")
    if loss != "ce" and negatives < 1:
        raise ValueError(f"train.negatives must be at least 1 for loss {loss}, got {negatives}")
    if is_autoencoding(model):
        b = cloze_batch(b, float(model.cfg.mask_prob), mask_token(model))
    kw = {"users": b.users} if uses_users(model) else {}
    assert b.targets is not None
    if loss == "ce":
        return model.loss(b.items, b.cats, b.slots, b.targets, **kw)
    hidden = model(b.items, b.cats, b.slots, **kw)
    keep = b.targets != PAD
    positives = b.targets[keep]
    negs = sampled_negatives(positives, model.info.num_items, negatives)
    ids = torch.cat([positives[:, None], negs], dim=1)
    return sampled_loss(loss, model.score_items(hidden[keep], ids), positives, negs)
