"""The server's shared state: settings, the engine once loaded, the worker, the metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from .metrics import Metrics
from .schemas import ApiError
from .settings import ServerSettings


@dataclass(slots=True)
class ServerState:
    settings: ServerSettings
    metrics: Metrics = field(default_factory=Metrics)
    engine: object | None = None  # tandem.engine.Engine once loaded
    worker: object | None = None  # tandem.server.worker.Worker once loaded
    status: str = "loading"  # loading | ready | sleeping (--sleep-idle-seconds) | error
    model_path: str = ""
    draft_path: str | None = None
    created: int = 0  # unix time the models were ready (OpenAI's "created")
    tools: object | None = None  # agent.tools.Toolbox with --tools, else /tools answers 403
    memory_plan: object | None = None  # tandem.memory.MemoryPlan, printed before loading
    sleeper: object | None = None  # tandem.server.sleep.Sleeper with --sleep-idle-seconds
    # while sleeping, what /props and /models said before (sleep.py): {"props", "models"}
    snapshot: dict | None = None

    @property
    def model_name(self) -> str:
        return min(self.aliases) if self.aliases else self.model_path or self.settings.model

    @property
    def aliases(self) -> list[str]:
        """--alias a,b,c: every name the model answers to (llama-server's)."""
        return sorted({a.strip() for a in (self.settings.alias or "").split(",") if a.strip()})

    def ready(self):
        """(engine, worker), or a 503 while the models are loading."""
        engine, worker = self.engine, self.worker  # (read before the status: sleep.py)
        if self.status != "ready" or engine is None:
            self.alive()
            raise ApiError(503, "Loading model")
        return engine, worker

    def alive(self) -> None:
        """/health's test: loaded, awake or asleep; a 503 while loading or after a failure."""
        if self.status not in ("ready", "sleeping"):
            raise ApiError(503, "Loading model" if self.status == "loading" else
                           "the model failed to load; see the server log")

    def asleep(self) -> dict | None:
        """What /props and /models said before the model went to sleep, while it sleeps."""
        return self.snapshot if self.status == "sleeping" else None
