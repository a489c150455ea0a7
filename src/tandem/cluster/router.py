"""affinity.py's rule as Ray Serve's request router (`ray.serve.request_router.RequestRouter`),
selected for the engine deployment with `RequestRouterConfig` (launch.py). It runs in the
ingress's process, inside the handle that calls the replicas, and sees each call's keyword
`route` (an affinity.Route the ingress computed from the request).

Queue depth is this router's own count of requests it sent to a replica and that have not
finished (on_request_routed / on_request_completed); with one ingress that is every request.
"""

from __future__ import annotations

from collections import Counter

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from .affinity import Affinity, Route


class PrefixRouter(RequestRouter):
    def initialize_state(self, slack: int = 2, max_keys: int = 65536) -> None:
        self.affinity = Affinity(slack=slack, max_keys=max_keys)
        self.in_flight: Counter[str] = Counter()

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        order = self.affinity.choose(list(by_id), self.in_flight.__getitem__,
                                     _route(pending_request))
        if pending_request is not None:  # every replica was offered: back off before again
            pending_request.routing_context.should_backoff = True
        ranks = [[by_id[order[0]]], [by_id[r] for r in order[1:]]] if order else []
        return [rank for rank in ranks if rank]

    def on_request_routed(self, pending_request: PendingRequest, replica_id, result) -> None:
        rid = replica_id.unique_id
        self.in_flight[rid] += 1
        self.affinity.record(rid, _route(pending_request))

    def on_request_completed(self, replica_id, internal_request_id: str) -> None:
        rid = replica_id.unique_id
        if self.in_flight[rid] > 0:
            self.in_flight[rid] -= 1

    def on_replica_actor_died(self, replica_id) -> None:
        super().on_replica_actor_died(replica_id)
        self.in_flight.pop(replica_id.unique_id, None)


def _route(pending: PendingRequest | None) -> Route | None:
    route = pending.kwargs.get("route") if pending is not None else None
    return route if isinstance(route, Route) else None
