"""HTTP server that simulates the edge device: an ONNX artifact's recommendations over FastAPI.

Routes: POST /recommend, POST /recommend/batch, GET /health (liveness), GET /ready (503 until the
model is loaded and warmed up), GET /metadata (what was shipped and how it was verified, without
the id tables), GET /metrics (Prometheus text, from a registry owned by the app, so several
apps in one process do not collide), GET /items (catalogue search and lookup, paginated) and
GET / (the page to try the model: one self-contained file, page.html, that calls the
routes above; nothing is fetched from anywhere else, its Content-Security-Policy says so).

`create_app()` reads `Settings` (env `LSAN_*`) when called. The artifact is loaded and verified
whole (lsan.artifact.read) in the lifespan, so a missing, tampered or inconsistent artifact stops
startup and a server that reports ready can answer; `serve()` loads it before uvicorn starts so
the failure is one clean line. Recommendation routes are plain `def`: FastAPI runs them
in its thread pool and they share one onnxruntime session, which is safe to run concurrently.
An ordinary valid POST /recommend skips the framework (FastRecommend: the route's own
validation and function, in the event loop; measured, see its docstring), and the routes return
their JSON bytes themselves, so FastAPI does not validate the answer a second time. Every
response has a `Server-Timing` header: `total` ms in the app and, on recommendations, the
`model` ms of it.

Errors are JSON `{"message": ..., "errors": [...]}`: 400 malformed JSON, 404 unknown route, 405
wrong method, 413 body too large, 422 an invalid field or a limit (history length, k, batch
size), 503 not ready. Anything unexpected is a 500 with a generic message and no traceback.

Batches: the requests are grouped by `exclude_seen` (it changes the model input) and each group
goes to the runtime at the group's largest k (one onnxruntime call, or one per history for a
batch-dependent format); every answer is then cut to its own k, which is exact because the
runtime's top-K is sorted best first. A history gets the same answer alone and in any batch.
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import json
import logging
import statistics
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import uvicorn
from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from pydantic import ValidationError
from pydantic_core import to_json
from starlette.datastructures import State
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lsan.serving.catalogue import Catalogue
from lsan.serving.runtime import Artifact, Result, load_artifact
from lsan.serving.schemas import (
    BatchRequest,
    BatchResponse,
    CatalogueItem,
    ErrorResponse,
    Health,
    ItemPage,
    ItemQuery,
    Limits,
    Metadata,
    Ready,
    RecommendRequest,
    RecommendResponse,
    Warmup,
)
from lsan.serving.settings import Settings

log = logging.getLogger("uvicorn.error")  # uvicorn configures this one, so startup lines show

DRAIN_BYTES = 64 << 20  # an oversize body is read and dropped up to this much before the 413
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# the page may run its own inline script and style and talk to this server, nothing else
PAGE_POLICY = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
               "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
               "frame-ancestors 'none'")  # fmt: skip
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": why}
    for code, why in [
        (400, "malformed JSON"),
        (413, "request body too large"),
        (422, "invalid field or limit exceeded"),
        (503, "model not loaded yet"),
    ]
}


# ---------------------------------------------------------------- metrics


@dataclass
class Metrics:
    registry: CollectorRegistry
    requests: Counter
    latency: Histogram
    exceptions: Counter
    recommendations: Counter
    unknown_items: Counter
    ready: Gauge
    children: dict[tuple[Any, tuple[str, ...]], Any] = field(default_factory=dict)

    def child(self, metric: Any, *values: str) -> Any:
        """`metric.labels(*values)`, made once: prometheus_client checks the values and takes a
        lock on every `labels` call, a few microseconds on each request's path. Label values
        are bounded (route templates, statuses, exception names), so the cache is too."""
        key = (metric, values)
        found = self.children.get(key)
        if found is None:
            found = self.children[key] = metric.labels(*values)
        return found


def new_metrics() -> Metrics:
    r = CollectorRegistry()
    return Metrics(
        registry=r,
        requests=Counter("lsan_http_requests", "HTTP requests by method, route and status",
                         ["method", "route", "status"], registry=r),
        latency=Histogram("lsan_http_request_duration_seconds", "HTTP request latency",
                          ["method", "route"], buckets=LATENCY_BUCKETS, registry=r),
        exceptions=Counter("lsan_http_exceptions", "Unexpected errors (answered 500) by route",
                           ["route", "exception"], registry=r),
        recommendations=Counter("lsan_recommendations", "Histories answered, by fallback",
                                ["fallback"], registry=r),
        unknown_items=Counter("lsan_unknown_items", "History entries skipped: unknown item id",
                              registry=r),
        ready=Gauge("lsan_model_ready", "1 once the model is loaded and warmed up", registry=r),
    )  # fmt: skip


def _route(scope: Scope) -> str:
    """The matched route's template (bounded label values); 'unmatched' for unknown paths."""
    return getattr(scope.get("route"), "path", None) or "unmatched"


class MetricsMiddleware:
    """Counts every request by route template and status and times it, 4xx and 5xx included.

    Every response also says its time in a `Server-Timing` header: `total` runs from the request
    reaching the app (uvicorn has parsed it) to the response's start, and the recommendation
    routes put the model's own time (`model`, the onnxruntime runs) before it, so a client sees
    the server's overhead (total - model) on every answer.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": server_timing(message.get("headers", []), start)}
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        except Exception as exc:
            status = 500
            self.metrics.child(self.metrics.exceptions, _route(scope), type(exc).__name__).inc()
            raise
        finally:
            route, method = _route(scope), scope["method"]
            self.metrics.child(self.metrics.requests, method, route, str(status)).inc()
            self.metrics.child(self.metrics.latency, method, route).observe(
                time.perf_counter() - start
            )


def server_timing(
    headers: Sequence[tuple[bytes, bytes]], start: float
) -> list[tuple[bytes, bytes]]:
    """The response headers with `total;dur=<ms since start>` appended to Server-Timing."""
    total = b"total;dur=%.3f" % ((time.perf_counter() - start) * 1000)
    out = list(headers)
    for i, (name, value) in enumerate(out):
        if name.lower() == b"server-timing":
            out[i] = (name, value + b", " + total)
            return out
    out.append((b"server-timing", total))
    return out


# ---------------------------------------------------------------- request body limit


class BodyLimitMiddleware:
    """413 for a body over `limit` bytes, by Content-Length or by counting a streamed body.

    The error is raised when the route reads the body, so it goes through the app's exception
    handlers (same JSON shape) and the metrics see the route it was meant for. Before raising,
    the rest of the body is read and dropped (up to DRAIN_BYTES): a server that answers and
    closes while the client is still sending makes the client see a connection reset instead of
    the 413.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        received, more = 0, True

        async def too_large() -> HTTPException:
            nonlocal received, more
            while more and received <= DRAIN_BYTES:
                message = await receive()
                received += len(message.get("body", b""))
                more = message["type"] == "http.request" and message.get("more_body", False)
            return HTTPException(413, f"request body larger than {self.limit} bytes")

        async def limited() -> Message:
            nonlocal received, more
            if declared.isdigit() and int(declared) > self.limit:
                raise await too_large()
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                more = message.get("more_body", False)
                if received > self.limit:
                    raise await too_large()
            return message

        await self.app(scope, limited, send)


# ---------------------------------------------------------------- errors


class ErrorJSON(JSONResponse):
    """ASCII-escaped JSON: an error message may quote a client's string (a field name), and a
    lone surrogate in it must not turn a 422 into an encoding failure."""

    def render(self, content: Any) -> bytes:
        return json.dumps(
            content, ensure_ascii=True, allow_nan=False, separators=(",", ":")
        ).encode("ascii")


def _where(loc: Sequence[str | int]) -> str:
    """('body', 'history', 2, 'timestamp') -> 'history[2].timestamp'."""
    out = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out or "body"


async def validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
    bad_json = next((e for e in exc.errors() if e["type"] == "json_invalid"), None)
    if bad_json is not None:
        why = bad_json.get("ctx", {}).get("error", "cannot be parsed")
        message = f"malformed JSON body: {why} (at character {bad_json['loc'][-1]})"
        return ErrorJSON({"message": message, "errors": errors[:1]}, status_code=400)
    shown = "; ".join(f"{_where(e['loc'])}: {e['msg']}" for e in errors[:5])
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return ErrorJSON({"message": f"invalid request: {shown}{more}", "errors": errors[:50]}, 422)


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = str(exc.detail)
    if exc.status_code in (404, 405):
        message = f"{message}: {request.method} {request.url.path}"
    return ErrorJSON({"message": message}, status_code=exc.status_code, headers=exc.headers)


async def internal_error(request: Request, exc: Exception) -> Response:
    # Starlette re-raises the exception after this response, so the server logs the traceback.
    return ErrorJSON({"message": "internal server error"}, status_code=500)


# ---------------------------------------------------------------- dependencies


async def get_artifact(request: Request) -> Artifact:
    if not getattr(request.app.state, "ready", False):
        raise HTTPException(503, "model not loaded yet")
    return request.app.state.artifact


async def get_limits(request: Request) -> Limits:
    return request.app.state.limits


async def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


ArtifactDep = Annotated[Artifact, Depends(get_artifact)]
LimitsDep = Annotated[Limits, Depends(get_limits)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]


async def get_catalogue(request: Request, artifact: ArtifactDep) -> Catalogue:
    return request.app.state.catalogue  # built with the artifact, so ready means it is there


CatalogueDep = Annotated[Catalogue, Depends(get_catalogue)]


# ---------------------------------------------------------------- recommendation


def check_limits(req: RecommendRequest, limits: Limits, loc: tuple[str | int, ...]) -> list[dict]:
    """The limits that depend on settings and artifact, as validation errors (none: valid)."""
    errors = []
    if len(req.history) > limits.max_history:
        errors.append({"type": "too_long", "loc": (*loc, "history"),
                       "msg": f"history has {len(req.history)} entries, at most "
                              f"{limits.max_history} are accepted"})  # fmt: skip
    if req.k > limits.k_max:
        errors.append({"type": "less_than_equal", "loc": (*loc, "k"),
                       "msg": f"k must be at most {limits.k_max} (this server's k max)"})  # fmt: skip
    return errors


def answer(
    req: RecommendRequest, result: Result, artifact: Artifact, latency_ms: float, metrics: Metrics
) -> dict[str, Any]:
    """One history's answer: RecommendResponse's fields, in its order, as plain data."""
    # the runtime already excluded seen items and dropped masked fillers; a batch group ran at
    # its largest k, so cut to this request's own k
    kept = result.items[: req.k]
    metrics.child(metrics.recommendations, result.fallback or "none").inc()
    if result.unknown_items:
        metrics.unknown_items.inc(len(result.unknown_items))
    return {
        "items": [{"item_id": i, "score": s, "rank": r} for r, (i, s) in enumerate(kept, 1)],
        "model": artifact.model,
        "unknown_items": result.unknown_items,
        "latency_ms": round(latency_ms, 3),
        "fallback": result.fallback,
    }


def answered(content: dict[str, Any], model_s: float) -> Response:
    """The answer as JSON bytes, with the model's time in Server-Timing.

    The routes build their answers from the runtime's own ints and floats and declare the
    response model for the schema, so FastAPI's validation of the returned object (a second
    trip through the thread pool for a plain `def` route) is skipped; pydantic's serializer
    writes the same bytes (NaN as null).
    """
    return Response(to_json(content, inf_nan_mode="null"), media_type="application/json",
                    headers={"server-timing": f"model;dur={model_s * 1000:.3f}"})  # fmt: skip


def pairs(req: RecommendRequest) -> list[tuple[int, float | None]]:
    return [(e["item_id"], e.get("timestamp")) for e in req.history]


def recommend(
    body: RecommendRequest, artifact: ArtifactDep, limits: LimitsDep, metrics: MetricsDep
) -> Response:
    """Top-k raw item ids for one history (oldest first)."""
    start = time.perf_counter()
    if errors := check_limits(body, limits, ("body",)):
        raise RequestValidationError(errors)
    results, model_s = artifact.recommend_timed(
        [pairs(body)], k=body.k, exclude_seen=body.exclude_seen, at=[body.at]
    )
    content = answer(body, results[0], artifact, (time.perf_counter() - start) * 1000, metrics)
    return answered(content, model_s)


def recommend_batch(
    body: BatchRequest, artifact: ArtifactDep, limits: LimitsDep, metrics: MetricsDep
) -> Response:
    """Several histories in one call, each answered as it would be alone."""
    start = time.perf_counter()
    reqs = body.requests
    errors: list[dict] = []
    if len(reqs) > limits.max_batch:
        errors.append({"type": "too_long", "loc": ("body", "requests"),
                       "msg": f"batch has {len(reqs)} requests, at most {limits.max_batch} "
                              "are accepted"})  # fmt: skip
    else:
        for i, req in enumerate(reqs):
            errors += check_limits(req, limits, ("body", "requests", i))
    if errors:
        raise RequestValidationError(errors)
    results: list[Result | None] = [None] * len(reqs)
    model_s = 0.0
    for exclude in (True, False):
        group = [i for i, r in enumerate(reqs) if r.exclude_seen is exclude]
        if group:
            k = max(reqs[i].k for i in group)
            out, s = artifact.recommend_timed(
                [pairs(reqs[i]) for i in group], k=k, exclude_seen=exclude,
                at=[reqs[i].at for i in group],
            )  # fmt: skip
            model_s += s
            for i, res in zip(group, out, strict=True):
                results[i] = res
    ms = (time.perf_counter() - start) * 1000
    return answered({
        "results": [answer(r, res, artifact, ms, metrics) for r, res in zip(reqs, results, strict=True) if res is not None],
        "model": artifact.model,
        "latency_ms": round(ms, 3),
    }, model_s)  # fmt: skip


# ---------------------------------------------------------------- the fast path


class FastRecommend:
    """POST /recommend without the framework's per-request machinery, for an ordinary valid
    request; everything else goes to FastAPI as before.

    Measured on Beauty (benchmarks/serve_load.py, docs/serving.md): FastAPI's routing,
    dependency solving and body handling and the thread-pool round trip of a plain `def` route
    cost more than the model itself. So for a ready server and a body of `application/json`
    with a Content-Length within the limit, this middleware reads the body, validates it with
    the route's own model and calls the route's own function in the event loop: one history is
    bounded work (at most max_len positions reach the model, well under a millisecond), about
    what the thread-pool round trip alone costs. Anything else (not ready, another content
    type, a streamed or oversize body, malformed or invalid JSON, a limit) is handed on with the
    body replayed, so every error is the framework's, exactly as before; /recommend/batch (up to
    max_batch histories) stays a plain `def` route in the thread pool.
    """

    def __init__(self, app: ASGIApp, state: State, route: APIRoute, limit: int) -> None:
        self.app, self.state, self.route, self.limit = app, state, route, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        artifact = getattr(self.state, "artifact", None) if self.state.ready else None
        if (scope["type"] != "http" or scope["path"] != self.route.path
                or scope["method"] != "POST" or scope.get("root_path") or artifact is None):  # fmt: skip
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        length = headers.get(b"content-length", b"")
        if (headers.get(b"content-type") != b"application/json" or not length.isdigit()
                or int(length) > self.limit):  # fmt: skip
            await self.app(scope, receive, send)
            return
        scope["route"] = self.route  # the metrics' label, as the router sets it
        messages: list[Message] = []
        body = b""
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":  # the client left: the framework sees it
                break
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        response = None
        if message["type"] == "http.request" and len(body) <= self.limit:
            with contextlib.suppress(ValidationError, RequestValidationError):
                req = RecommendRequest.model_validate_json(body)
                response = recommend(req, artifact, self.state.limits, self.state.metrics)
        if response is None:

            async def replay() -> Message:
                return messages.pop(0) if messages else await receive()

            await self.app(scope, replay, send)
            return
        await response(scope, receive, send)


# ---------------------------------------------------------------- the catalogue and the page


def items(query: Annotated[ItemQuery, Query()], catalogue: CatalogueDep) -> ItemPage:
    """Search the catalogue (q: raw id or its first digits, title or category words; empty: the
    most popular first) or look up raw ids, one page at a time."""
    unknown: list[int] = []
    if query.ids:
        found = catalogue.index(query.ids)
        unknown = [i for i, f in zip(query.ids, found.tolist(), strict=True) if f == 0]
        matches = found[found != 0]
    else:
        matches = catalogue.search(query.q)
    total = len(matches)
    start = min(query.offset, total)
    page = matches[start : start + query.limit]
    end = start + len(page)
    return ItemPage(
        items=[CatalogueItem(**asdict(it)) for it in catalogue.describe(np.asarray(page))],
        total=total, offset=query.offset, next_offset=end if end < total else None,
        unknown_items=unknown, titles=catalogue.has_titles,
    )  # fmt: skip


async def page(request: Request) -> Response:
    """The page to try the model (HTML, CSS and JavaScript in one file, served from here)."""
    return HTMLResponse(request.app.state.page, headers={"content-security-policy": PAGE_POLICY,
                                                         "cache-control": "no-cache"})  # fmt: skip


# ---------------------------------------------------------------- service routes


async def health() -> Health:
    """Liveness: the process answers."""
    return Health(status="ok")


async def ready(request: Request) -> Response:
    """Readiness: 200 once the model is loaded and warmed up, 503 before (and at shutdown)."""
    if getattr(request.app.state, "ready", False):
        body = Ready(status="ready", model=request.app.state.artifact.model)
        return JSONResponse(body.model_dump())
    return JSONResponse(Ready(status="loading").model_dump(), status_code=503)


async def metadata(request: Request, artifact: ArtifactDep) -> Metadata:
    """What is served: model, dataset, sizes, quantization, export checks, test metrics, limits."""
    return request.app.state.metadata


async def metrics_text(metrics: MetricsDep) -> Response:
    """Prometheus text exposition of this app's registry."""
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


def build_metadata(
    artifact: Artifact, settings: Settings, limits: Limits, warmup: Warmup
) -> Metadata:
    return Metadata(**dict(artifact.meta), files=artifact.files, threads=settings.threads,
                    limits=limits, item_titles=artifact.titles is not None, warmup=warmup)  # fmt: skip


# ---------------------------------------------------------------- the app


def release_freed_memory() -> None:
    """Hand the heap pages freed while loading (graph parsing and optimisation, the probe) back
    to the OS: glibc keeps them otherwise, and a device counts resident memory. No-op elsewhere."""
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    t0 = time.perf_counter()
    artifact = app.state.preloaded or load_artifact(settings.artifact, settings.threads)
    app.state.preloaded = None  # ArtifactError above stops startup
    limits = app.state.limits.model_copy(update={"k_max": min(settings.max_k, artifact.k_max)})
    app.state.artifact, app.state.limits = artifact, limits
    app.state.catalogue = Catalogue(artifact)
    times = artifact.warm_up()
    warm = times[0]
    p50 = statistics.median(times[1:]) if len(times) > 1 else warm
    app.state.metadata = build_metadata(artifact, settings, limits, Warmup(
        requests=len(times), first_ms=round(warm * 1000, 3), p50_ms=round(p50 * 1000, 3)))  # fmt: skip
    release_freed_memory()
    app.state.ready = True
    app.state.metrics.ready.set(1)
    meta = artifact.meta
    log.info(
        "serving %s (%s, %s, %d bytes) from %s: loaded in %.0f ms, warm-up %.1f ms, k max %d%s",
        meta.model, meta.dataset, meta.quantization, meta.artifact_bytes, settings.artifact,
        (time.perf_counter() - t0) * 1000, warm * 1000, limits.k_max,
        ", batches answered row by row" if artifact.row_by_row else "",
    )  # fmt: skip
    try:
        yield
    finally:
        app.state.ready = False
        app.state.metrics.ready.set(0)
        app.state.artifact = app.state.catalogue = None


# FastAPI's native OpenTelemetry (0.16x) asks the global providers on every request (an ASGI
# call of a Beauty /recommend in process: 293 -> 274 us without it); this server exports no traces
NO_TELEMETRY = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


def create_app(settings: Settings | None = None, artifact: Artifact | None = None) -> FastAPI:
    """A new app (own settings, own metrics registry); the model loads when its lifespan starts
    (or `artifact`, already loaded from settings.artifact, is used)."""
    settings = settings or Settings()  # type: ignore[call-arg]  # artifact comes from LSAN_ARTIFACT
    app = FastAPI(
        **NO_TELEMETRY,
        title="LSAN on-device recommender (simulated edge device)",
        version="1",
        lifespan=lifespan,
        exception_handlers={
            RequestValidationError: validation_error,
            HTTPException: http_error,
            Exception: internal_error,
        },
    )
    app.state.settings, app.state.ready, app.state.metrics = settings, False, new_metrics()
    app.state.preloaded = artifact
    app.state.page = files("lsan.serving").joinpath("page.html").read_bytes()
    app.state.limits = Limits(  # the lifespan lowers k_max to the artifact's top-K
        k_max=settings.max_k, max_history=settings.max_history, max_batch=settings.max_batch,
        max_body_bytes=settings.max_body_bytes,
    )  # fmt: skip
    app.add_api_route("/recommend", recommend, methods=["POST"], responses=ERRORS,
                      response_model=RecommendResponse)  # fmt: skip
    app.add_api_route("/recommend/batch", recommend_batch, methods=["POST"], responses=ERRORS,
                      response_model=BatchResponse)  # fmt: skip
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/ready", ready, methods=["GET"], response_model=Ready,
                      responses={503: {"model": Ready, "description": "not ready yet"}})  # fmt: skip
    app.add_api_route("/metadata", metadata, methods=["GET"], responses={503: ERRORS[503]})
    app.add_api_route("/metrics", metrics_text, methods=["GET"], response_class=Response,
                      responses={200: {"content": {"text/plain": {}}}})  # fmt: skip
    app.add_api_route(
        "/items", items, methods=["GET"], responses={c: ERRORS[c] for c in (422, 503)}
    )
    app.add_api_route("/", page, methods=["GET"], include_in_schema=False)
    route = next(r for r in app.routes if isinstance(r, APIRoute) and r.path == "/recommend")
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes)
    app.add_middleware(FastRecommend, state=app.state, route=route, limit=settings.max_body_bytes)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)  # outermost: sees the 413s
    return app


def run_server(settings: Settings) -> None:
    """Check the artifact (a clean ArtifactError before anything starts), then run uvicorn."""
    artifact = load_artifact(settings.artifact, settings.threads)
    uvicorn.run(create_app(settings, artifact), host=settings.host, port=settings.port,
                access_log=settings.access_log, timeout_graceful_shutdown=5)  # fmt: skip


def serve(artifact: str, host: str = "127.0.0.1", port: int = 8000, threads: int = 1) -> None:
    """`lsan serve`: run the server on `artifact`; raises ArtifactError if it is unusable.

    Limits not given here (max k, history, batch, body size) come from LSAN_* variables.
    """
    run_server(Settings(artifact=Path(artifact), host=host, port=port, threads=threads))
