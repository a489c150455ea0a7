"""The HTTP server (`tandem serve`): llama.cpp's /completion, /health, /props, /slots and
/metrics, and OpenAI's /v1/completions, /v1/chat/completions and /v1/models.

    cli.py      flags, listening socket, background loading          (add_arguments, run)
    app.py      the FastAPI app, llama.cpp's endpoints, API key and body-size guard
    oai.py      the OpenAI-compatible endpoints
    schemas.py  request bodies (pydantic) and the error shape (ApiError)
    prepare.py  body -> engine Request: tokens, sampling, per-request speculation, limits
    jobs.py     submit a request, wait for it or stream it; cancel when the client leaves
    worker.py   the one thread that owns the Engine: admit, step (batched), hand out results
    results.py  llama.cpp's result, slot and settings dicts
    metrics.py  Prometheus metrics with llama-server's names under a tandem: prefix
"""
