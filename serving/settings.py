"""Server settings: environment variables prefixed `LSAN_` (e.g. `LSAN_ARTIFACT=artifacts/lsan`).

Built by `create_app()` when it is called, never at import, so tests and the CLI can pass their own.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from lsan.artifact import DEFAULT_K


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LSAN_", frozen=True)

    artifact: Path  # artifact directory (metadata.json + model.onnx) written by export/export.py
    threads: int = Field(default=1, ge=1, le=256)  # onnxruntime intra-op threads; 1 = a phone core
    max_history: int = Field(default=1000, ge=1)  # most history entries accepted in one request
    max_k: int = Field(
        default=DEFAULT_K, ge=1
    )  # largest k served; also capped by the artifact's top-K
    max_batch: int = Field(default=64, ge=1)  # most histories in one /recommend/batch call
    max_body_bytes: int = Field(default=1 << 20, ge=1)  # larger request bodies get 413
    host: str = "127.0.0.1"  # interface `serve` binds to
    port: int = Field(default=8000, ge=0, le=65535)  # TCP port `serve` listens on (0: any free)
    access_log: bool = False  # one log line per request (uvicorn's); off: it costs CPU per request
