"""The engine: requests in slots, one packed target pass per step (engine.py), what goes into
each pass (scheduler.py), the slots' caches (caches.py), the pass itself (batch.py)."""

from .engine import Engine
from .scheduler import Scheduler, StepPlan
from .sequence import Request, Sequence

__all__ = ["Engine", "Request", "Scheduler", "Sequence", "StepPlan"]
