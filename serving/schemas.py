"""Request and response bodies of the HTTP server.

Requests are strict (no "5" for 5, no 5.0 for an item id, no true for 1) and reject unknown
fields, so a client's mistake is a 422 naming the field rather than a silently different request.
Limits that depend on the settings or the artifact (history length, k, batch size) are checked by
the routes, with the same error shape.
"""

from __future__ import annotations

import operator
import re
from typing import Annotated, Literal, NotRequired

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
    with_config,
)
from pydantic_core import PydanticCustomError
from typing_extensions import TypedDict  # pydantic reads only this one on Python < 3.12

from lsan.artifact import ArtifactMeta, FileEntry

INT64_MAX = 2**63 - 1
MAX_TIMESTAMP = 253_402_300_799  # 9999-12-31T23:59:59Z: anything later is not a unix time


@with_config(ConfigDict(strict=True, extra="forbid"))
class HistoryEntry(TypedDict):
    """One interaction. A typed dict, not a model: pydantic validates the same rules, and 50
    entries took 17 us instead of 34 as models (half of the server's validation of a Beauty
    request; benchmarks/serve_load.py)."""

    item_id: Annotated[int, Field(ge=0, le=INT64_MAX, description="raw item id, as in the dataset")]
    timestamp: NotRequired[
        Annotated[
            float | None,
            Field(
                ge=0,
                le=MAX_TIMESTAMP,
                allow_inf_nan=False,
                description="unix time in seconds (UTC); missing means the time slot is unknown",
            ),
        ]
    ]


class RecommendRequest(BaseModel):
    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "history": [
                        {"item_id": 12, "timestamp": 1700000000},
                        {"item_id": 40, "timestamp": 1700003600},
                    ],
                    "k": 10,
                    "exclude_seen": True,
                }
            ]
        },
    )

    history: list[HistoryEntry] = Field(
        description="the user's interactions, oldest first; only the most recent max_len are used"
    )
    k: int = Field(10, ge=1, description="number of items to return (at most the server's k max)")
    exclude_seen: bool = Field(True, description="never recommend an item of the history")
    at: float | None = Field(
        None, ge=0, le=MAX_TIMESTAMP, allow_inf_nan=False,
        description="unix time of the request in seconds (UTC), no earlier than the history's "
        "last timestamp; missing: the server's clock. Read only by an artifact whose time rule "
        "is 'ahead' (the time until the request is its last entry's context)",
    )  # fmt: skip

    @model_validator(mode="after")
    def _asked_after_the_history(self) -> RecommendRequest:
        """A request's time is no earlier than its history's last timestamp."""
        if self.at is not None:
            # the history's times never go backwards (_one_timeline), so the last given one is
            # the latest: found from the end, one entry in the usual case
            last = next((e["timestamp"] for e in reversed(self.history)
                         if e.get("timestamp") is not None), None)  # fmt: skip
            if last is not None and last > self.at:
                raise PydanticCustomError(
                    "request_before_history",
                    "at ({at}) is earlier than the history's last timestamp ({last})",
                    {"at": str(self.at), "last": str(last)},
                )
        return self

    @field_validator("history")
    @classmethod
    def _one_timeline(cls, history: list[HistoryEntry]) -> list[HistoryEntry]:
        """No entry twice, and timestamps never go backwards (a newest-first list is refused,
        since truncation keeps the end of the list as the most recent)."""
        times = [entry.get("timestamp") for entry in history]
        if None not in times and all(map(operator.lt, times, times[1:])):
            return history  # the usual case (strictly increasing times: no entry twice), fast
        seen: dict[tuple[int, float | None], int] = {}
        last: tuple[int, float] | None = None
        ids = [entry["item_id"] for entry in history]
        for pos, key in enumerate(zip(ids, times, strict=True)):
            if key in seen:
                raise PydanticCustomError(
                    "duplicate_entry",
                    "duplicate entry: item_id {item_id} with timestamp {timestamp} at positions "
                    "{first} and {second}",
                    {"item_id": key[0], "timestamp": str(key[1]),
                     "first": seen[key], "second": pos},
                )  # fmt: skip
            seen[key] = pos
            if key[1] is not None:
                if last is not None and key[1] < last[1]:
                    raise PydanticCustomError(
                        "history_order",
                        "history must be oldest first: timestamp at position {second} is earlier "
                        "than at position {first}",
                        {"first": last[0], "second": pos},
                    )
                last = (pos, key[1])
        return history


class BatchRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    requests: list[RecommendRequest] = Field(
        min_length=1, description="several recommend bodies, answered in order"
    )


class Recommendation(BaseModel):
    item_id: int = Field(description="raw item id")
    score: float = Field(description="model score (0 for the popularity fallback)")
    rank: int = Field(ge=1, description="1 = best")


class RecommendResponse(BaseModel):
    items: list[Recommendation]
    model: str = Field(description="model name of the artifact")
    unknown_items: list[int] = Field(description="raw ids of the history not in the catalogue")
    latency_ms: float = Field(description="server-side time to answer (for a batch: the batch's)")
    fallback: Literal["popular"] | None = Field(
        description="why the answer is not personalised: 'popular' for an empty or all-unknown "
        "history"
    )


class BatchResponse(BaseModel):
    results: list[RecommendResponse]
    model: str
    latency_ms: float


class ErrorDetail(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ErrorResponse(BaseModel):
    message: str = Field(description="what went wrong, in one line")
    errors: list[ErrorDetail] | None = Field(None, description="one entry per invalid field")


def _decimal(value: object) -> object:
    """A query value is text: only plain decimal digits read as an integer (no "5.0", "1e3")."""
    if isinstance(value, str) and not re.fullmatch(r"-?[0-9]{1,30}", value):
        raise PydanticCustomError("int_parsing", "Input should be an integer in decimal digits")
    return value


QueryInt = Annotated[int, BeforeValidator(_decimal)]
MAX_PAGE = 100  # most items in one /items answer, and most ids in one lookup


class ItemQuery(BaseModel):
    """GET /items: search (q) or look up (ids), one page at a time. Unknown parameters are
    refused like unknown body fields."""

    model_config = ConfigDict(extra="forbid")

    q: str = Field("", max_length=100, description="raw id (or its first digits), words of the "
                   "title or of the category name; empty: the whole catalogue, most popular first")  # fmt: skip
    ids: list[Annotated[QueryInt, Field(ge=0, le=INT64_MAX)]] = Field(
        default_factory=list, max_length=MAX_PAGE,
        description="raw ids to look up instead of a search (repeat the parameter), answered in order",
    )  # fmt: skip
    offset: QueryInt = Field(0, ge=0, le=INT64_MAX, description="matches to skip")
    limit: QueryInt = Field(20, ge=1, le=MAX_PAGE, description="most items in the answer")

    @model_validator(mode="after")
    def _one_mode(self) -> ItemQuery:
        if self.q and self.ids:
            raise PydanticCustomError("one_mode", "give q (a search) or ids (a lookup), not both")
        return self


class CatalogueItem(BaseModel):
    item_id: int = Field(description="raw item id")
    title: str | None = Field(description="the dataset's title; null when the artifact has none")
    category: str | None = Field(description="category name; null when unknown")


class ItemPage(BaseModel):
    items: list[CatalogueItem]
    total: int = Field(description="items matching the search (for a lookup: ids found)")
    offset: int
    next_offset: int | None = Field(description="offset of the next page; null on the last")
    unknown_items: list[int] = Field(description="looked-up raw ids not in the catalogue")
    titles: bool = Field(description="whether the artifact carries item titles")


class Warmup(BaseModel):
    requests: int = Field(description="full-length requests run at startup, the first included")
    first_ms: float = Field(description="the first one (graph initialisation)")
    p50_ms: float = Field(description="median of the others: a full-length history at k max "
                          "through the runtime, without HTTP")  # fmt: skip


class Health(BaseModel):
    status: Literal["ok"]


class Ready(BaseModel):
    status: Literal["ready", "loading"]
    model: str | None = None


class Limits(BaseModel):
    k_max: int
    max_history: int
    max_batch: int
    max_body_bytes: int


class Metadata(ArtifactMeta):
    """What is served: the artifact's metadata exactly as exported (lsan.artifact.ArtifactMeta:
    model, dataset, contract, format, export checks, test metrics, sizes), plus this server's
    own settings. The id tables stay out."""

    files: dict[str, FileEntry] = Field(description="the manifest: bytes and sha256 of each file")
    threads: int = Field(description="onnxruntime intra-op threads of this server")
    limits: Limits = Field(description="this server's limits (k_max: never above contract.k)")
    item_titles: bool = Field(description="whether the artifact carries item titles")
    warmup: Warmup = Field(description="the startup warm-up's timings")
