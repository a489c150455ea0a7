"""`tandem serve --replicas N`: one Tandem engine per replica on Ray Serve (an optional extra,
`pip install -e '.[cluster]'`), behind one HTTP ingress and a router that keeps a
conversation on the replica holding its cached prefix.

    settings.py   --replicas and --ray, checked before Ray starts (no Ray import)
    affinity.py   the routing rule: longest cached prefix in tokens, sessions, two choices
    router.py     that rule as Ray Serve's RequestRouter (choose_replicas)
    replica.py    the engine deployment: the server's own FastAPI app, called in-process
    ingress.py    the HTTP ingress: forwards every route, answers the fleet's /health, /metrics
    board.py      the actor the replicas report to (counters, queue depth, KV use, answers)
    sharedpool.py the suffix pool across replicas, through the board
    launch.py     Ray started or joined, the checks, the application deployed, shut down

The server imports this package only when --replicas is given (server/cli.py).
"""
