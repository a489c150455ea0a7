"""The server's shared state: settings, the engine once loaded, the worker, the metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config import EngineConfig, SamplingParams, SpecConfig
from .metrics import Metrics
from .schemas import ApiError

MAX_BODY_BYTES = 10 * 1024 * 1024


@dataclass(slots=True)
class ServerSettings:
    """The command line, checked: the models to load, the engine's and speculation's configs
    (built from the flags once), and what the HTTP layer needs."""

    model: str
    model_draft: str | None = None
    engine: EngineConfig = field(default_factory=EngineConfig)
    spec: SpecConfig = field(default_factory=lambda: SpecConfig(types=["none"]))
    warmup: bool = True
    alias: str | None = None
    api_key: str | None = None
    timeout: float = 600.0  # seconds a request may take, queue + generation (and body read)
    max_queue: int = 4  # requests waiting for a slot beyond which the server answers 503
    max_body_bytes: int = MAX_BODY_BYTES
    # the server's sampling flags (--temp, --top-k, --top-p, --min-p, --seed, -n, --stop,
    # --ignore-eos): every request's defaults for the fields it does not send
    sampling: SamplingParams = field(default_factory=SamplingParams)
    slots_endpoint: bool = True  # --no-slots turns GET /slots off, as llama-server
    tags: list[str] = field(default_factory=list)  # --tags, reported by GET /v1/models
    metrics_endpoint: bool = False  # --metrics turns GET /metrics on, as llama-server
    embeddings: bool = False  # --embedding: serve /v1/embeddings and /embedding(s)
    pooling: str = "last"  # --pooling: how an embedding pools the hidden states
    cors_origins: list[str] = field(default_factory=lambda: ["*"])  # --cors-origins
    slot_save_path: str | None = None  # --slot-save-path: where slot files go
    mmproj: str | None = None  # --mmproj: the target's image encoder (models/vision.py)
    media_path: str | None = None  # --media-path: where file:// images are read from
    chat_template: str | None = None  # --chat-template(-file): replaces the model's
    reasoning: str = "auto"  # --reasoning: on | off | auto (the template's own default)
    verbose: bool = False  # -v: answers carry "__verbose" (the prompt and the raw result)
    ui: bool = True  # the web page at / (--no-ui turns it off, as llama-server's)
    tools: list[str] = field(default_factory=list)  # --tools: the agent tools (agent_tools.py)
    tools_runtime: str | None = None  # --tools-runtime: where they run (agent_io.py)
    ui_mcp_proxy: bool = False  # --ui-mcp-proxy: GET/POST /cors-proxy (corsproxy.py)


@dataclass(slots=True)
class ServerState:
    settings: ServerSettings
    metrics: Metrics = field(default_factory=Metrics)
    engine: object | None = None  # tandem.engine.Engine once loaded
    worker: object | None = None  # tandem.server.worker.Worker once loaded
    status: str = "loading"  # loading | ready | error
    model_path: str = ""
    draft_path: str | None = None
    created: int = 0  # unix time the models were ready (OpenAI's "created")
    tools: object | None = None  # agent_tools.Toolbox with --tools, else /tools answers 403

    @property
    def model_name(self) -> str:
        return min(self.aliases) if self.aliases else self.model_path or self.settings.model

    @property
    def aliases(self) -> list[str]:
        """--alias a,b,c: every name the model answers to (llama-server's)."""
        return sorted({a.strip() for a in (self.settings.alias or "").split(",") if a.strip()})

    def ready(self):
        """(engine, worker), or a 503 while the models are loading."""
        if self.status != "ready":
            raise ApiError(503, "Loading model" if self.status == "loading" else
                           "the model failed to load; see the server log")
        return self.engine, self.worker
