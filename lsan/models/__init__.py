"""Model registry: name -> (model class, config class).

Every model shares one API, which the trainer, the evaluation and the ONNX export rely on:
- `Model(cfg, info)` with `cfg` the model's frozen config dataclass and `info` a `DataInfo`;
- `forward(items, cats, slots) -> (B, T, D)` hidden states for left-padded inputs (B, T);
- `loss(items, cats, slots, targets) -> scalar`, targets (B, T) with PAD where nothing is due;
- `score_all(items, cats, slots) -> (B, |V|+1)` next-item scores, padding column very negative;
- `item_scores(h) -> (..., |V|+1)` and `score_items(h, ids) -> (N, K)`: scores from hidden states
  (the sampled losses of lsan.models.objectives use the second).
Attention models switch AE/AR with `attention` (see lsan.models.objectives). Models with user
embeddings set `uses_users = True` and take `users=` (B,) in forward, loss and score_all. Models
with closed-form statistics set `trainable = False` and define `fit_counts(counts)`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from torch import Tensor, nn

from lsan.config import ConfigError, override
from lsan.models.caser import Caser, CaserConfig
from lsan.models.fpmc import FPMC, FPMCConfig
from lsan.models.gru4rec import GRU4Rec, GRU4RecConfig
from lsan.models.hf import HFConfig, HFRecommender
from lsan.models.info import DataInfo
from lsan.models.lsan import LSAN, LSANConfig
from lsan.models.pop import Pop, PopConfig
from lsan.models.sasrec import SASRec, SASRecConfig
from lsan.models.ssept import SSEPT, SSEPTConfig


class Recommender(Protocol):
    """The API every model shares (what the trainer, evaluation and export call)."""

    def loss(
        self, items: Tensor, cats: Tensor, slots: Tensor, targets: Tensor, **kw: Tensor
    ) -> Tensor: ...
    def score_all(self, items: Tensor, cats: Tensor, slots: Tensor, **kw: Tensor) -> Tensor: ...


# name -> (model class, factory of its default config); variants are the same class with
# different defaults, so `lsan_full` is LSAN with one full |V| x D table.
MODELS: dict[str, tuple[type[nn.Module], Callable[[], Any]]] = {
    "pop": (Pop, PopConfig),
    "sasrec": (SASRec, SASRecConfig),
    "bert4rec": (SASRec, partial(SASRecConfig, attention="bidirectional")),
    "local": (SASRec, partial(SASRecConfig, attention="local")),
    # Hugging Face backbones (optional extra `hf`): AR for GPT-2 / Llama, AE for BERT / ALBERT
    "hf_gpt2": (HFRecommender, partial(HFConfig, backbone="gpt2")),
    "hf_llama": (HFRecommender, partial(HFConfig, backbone="llama")),
    "hf_bert": (HFRecommender, partial(HFConfig, backbone="bert", attention="bidirectional")),
    "hf_albert": (HFRecommender, partial(HFConfig, backbone="albert", attention="bidirectional")),
    "lsan": (LSAN, LSANConfig),
    "lsan_full": (LSAN, partial(LSANConfig, item_table="full", item_weights=False)),
    # classic baselines of the LSAN paper's table, and SSE-PT (caser, fpmc, ssept use user ids)
    "gru4rec": (GRU4Rec, GRU4RecConfig),
    "caser": (Caser, CaserConfig),
    "fpmc": (FPMC, FPMCConfig),
    "ssept": (SSEPT, SSEPTConfig),
}


def model_config(name: str, values: dict[str, Any] | None = None) -> Any:
    """The config dataclass of model `name`, defaults overridden by `values`."""
    if name not in MODELS:
        raise ConfigError(f"unknown model '{name}' (known: {', '.join(MODELS)})")
    return override(MODELS[name][1](), values or {}, prefix="model.")


def build_model(name: str, cfg: Any, info: DataInfo) -> nn.Module:
    if name not in MODELS:
        raise ConfigError(f"unknown model '{name}' (known: {', '.join(MODELS)})")
    if cfg is None or isinstance(cfg, dict):
        cfg = model_config(name, cfg)
    return MODELS[name][0](cfg, info)


__all__ = ["MODELS", "DataInfo", "Recommender", "build_model", "model_config"]
