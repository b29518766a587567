"""Scoring through a tied item table, shared by the models whose output layer is their input one.

A mixin (one level, no state of its own): the model defines `item_emb`, an item table of
lsan.models.item_tables (a full table or a compressed one), and a forward that returns hidden
states (B, T, D); this supplies the rest of the shared model API.
"""

from __future__ import annotations

from typing import Any

import torch

from lsan.models.item_tables import training_scores
from lsan.models.layers import mask_padding, next_item_loss
from lsan.models.objectives import inference_inputs


class TiedScores:
    item_emb: Any  # an item table of lsan.models.item_tables

    def item_scores(self, h: torch.Tensor) -> torch.Tensor:
        """Scores of every item for hidden states h (..., D) -> (..., |V|+1)."""
        return self.item_emb.scores(h)

    def score_items(self, h: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Scores of given items: h (N, D), ids (N, K) -> (N, K) (the sampled losses)."""
        return self.item_emb.score_ids(h, ids)

    def loss(self, items, cats, slots, targets) -> torch.Tensor:
        mode = getattr(getattr(self, "cfg", None), "train_scores", "matrix")
        score = training_scores(self.item_emb, mode)
        return next_item_loss(self(items, cats, slots), targets, score)  # type: ignore[operator]

    def score_all(self, items, cats=None, slots=None) -> torch.Tensor:
        """Next-item scores after the last position: (B, |V|+1), padding column = NEG."""
        if cats is None or slots is None:
            cats = slots = torch.zeros_like(items)
        h = self(*inference_inputs(self, items, cats, slots), last_only=True)[:, -1]  # type: ignore[operator]
        scores = self.item_scores(h)
        return mask_padding(scores)
