"""--replicas and --ray: the fleet's two settings, on their fields as every other flag
(config.flag), checked before Ray is imported or started."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..config import flag
from ..errors import TandemError

INSTALL = "pip install 'tandem[cluster]' (or pip install -e '.[cluster]' in a checkout)"
# a measurement's baseline, not a user's setting: TANDEM_FLEET_ROUTER=pow2 deploys the engines
# behind Ray Serve's own default router (power of two choices on queue length, blind to
# prefixes and sessions) instead of the prefix router (experiments/fleet_goals.py)
ROUTERS = ("prefix", "pow2")


def router_choice() -> str:
    """The engines' router, from TANDEM_FLEET_ROUTER (default: prefix)."""
    name = os.environ.get("TANDEM_FLEET_ROUTER", "prefix") or "prefix"
    if name not in ROUTERS:
        raise TandemError(f"TANDEM_FLEET_ROUTER={name}: give one of {', '.join(ROUTERS)}")
    return name


@dataclass(slots=True)
class FleetSettings:
    replicas: int | None = field(default=None, metadata=flag(
        "--replicas", type=int, metavar="N",
        help="serve with N engine replicas on Ray Serve behind one HTTP ingress, each with "
             "--threads threads (CPUs reserved in Ray); a conversation goes back to the "
             "replica holding its prefix (docs/cluster.md; needs the cluster extra)"))
    ray: str = field(default="local", metadata=flag(
        "--ray", type=str, metavar="ADDRESS",
        help="with --replicas: 'local' starts a Ray instance on 127.0.0.1 for this server "
             "alone; 'auto' joins the cluster `ray start` runs here; host:port joins that "
             "cluster's head"))

    def __post_init__(self) -> None:
        if self.replicas is None:
            if self.ray != "local":
                raise TandemError(f"--ray {self.ray}: only with --replicas N")
            return
        if self.replicas < 1:
            raise TandemError(f"--replicas must be >= 1, got {self.replicas}")
        if not self.ray or self.ray.strip() != self.ray:
            raise TandemError(f"--ray {self.ray!r}: give local, auto or host:port")
