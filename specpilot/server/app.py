"""create_app: the FastAPI application of `specpilot serve` over one SpecEngine.

Routes: POST /v1/completions, POST /v1/chat/completions (Completions), GET /v1/models, GET /health,
GET /metrics. The engine loop starts with the app (its caches allocated before the first request) and, on
shutdown (uvicorn's, after SIGTERM: new connections refused, in-flight responses finished), drains what it
still holds and stops; an engine in a process of its own (engine_process.RemoteEngine) is closed after it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from specpilot.engine.engine import DEFAULT_MODEL_LEN, SpecEngine
from specpilot.server.completions import Completions
from specpilot.server.config import ServerConfig
from specpilot.server.encoder import PromptEncoder
from specpilot.server.engine_loop import EngineLoop
from specpilot.server.engine_process import RemoteEngine
from specpilot.server.errors import install_handlers
from specpilot.server.metrics import ServerMetrics
from specpilot.server.protocol import ChatCompletionRequest, CompletionRequest

log = logging.getLogger("specpilot.server")


def max_model_len(engine: SpecEngine) -> int:
    """Prompt + completion tokens one request may take: the engine's max_model_len, else what it sizes a slot for
    by default. Longer than the model's context is refused."""
    context = engine.runner.config.max_position_embeddings
    length = engine.config.max_model_len
    length = min(context, DEFAULT_MODEL_LEN) if length is None else length
    if not 1 < length <= context:
        raise ValueError(f"--max-model-len {length}: must be in 2..{context} (the model's context)")
    return length


def create_app(engine: SpecEngine | RemoteEngine, tokenizer, config: ServerConfig) -> FastAPI:
    length = max_model_len(engine)
    metrics = ServerMetrics(config.model_name)
    loop = EngineLoop(engine, metrics)
    encoder = PromptEncoder(tokenizer, engine.runner.config.vocab_size, config.chat_template)
    completions = Completions(loop, encoder, config, length)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await asyncio.to_thread(loop.start)
        log.info("engine ready: model %s, %d slots of %d tokens, up to %d more requests queued",
                 config.model_name, engine.scheduler.num_slots, length, config.max_waiting)
        yield
        held = loop.held  # uvicorn has let the responses in flight finish: normally none is left
        await asyncio.to_thread(loop.stop)
        if isinstance(engine, RemoteEngine):
            await asyncio.to_thread(engine.close)
        log.info("engine stopped (%d requests were still held at shutdown, now drained); %d requests finished "
                 "since start", held, loop.finished)

    app = FastAPI(title="specpilot", lifespan=lifespan)
    app.state.engine_loop, app.state.metrics, app.state.config = loop, metrics, config
    install_handlers(app)

    @app.post("/v1/completions")
    async def create_completion(body: CompletionRequest, request: Request):
        return await completions.completion(body, request)

    @app.post("/v1/chat/completions")
    async def create_chat_completion(body: ChatCompletionRequest, request: Request):
        return await completions.chat(body, request)

    @app.get("/v1/models")
    async def models():
        card = {"id": config.model_name, "object": "model", "created": created, "owned_by": "specpilot",
                "max_model_len": length}
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health():
        if loop.alive and not loop.stopping:
            return {"status": "ok"}
        reason = loop.reason or "shutting down"
        return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503)

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app
