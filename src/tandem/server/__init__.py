"""The HTTP server (`tandem serve`): llama.cpp's and OpenAI's inference API.

    cli.py       parse the flags, build the settings, listen, load the models behind it, run
    settings.py  every setting of the server on its field (flag, aliases, LLAMA_ARG_*, default)
    envargs.py   llama-server's LLAMA_ARG_* variables as command-line words
    app.py       the FastAPI app: the routers below, the API key and body-size guard
    props.py, completion.py, slots.py, oai.py, embeddings.py, rerank.py   the endpoints
    experimental.py  /tools and /cors-proxy (the optional tandem.agent package), 403 when off
    page/        the web page at /
    schemas.py   request bodies (pydantic) and the error shape (ApiError)
    prepare.py   body -> engine Request: tokens, sampling, per-request speculation, limits
    jobs.py      submit a request, wait for it or stream it; cancel when the client leaves
    worker.py    the one thread that owns the Engine: admit, step (batched), hand out results
    results.py   llama.cpp's result, slot and settings dicts
    metrics.py   Prometheus metrics with llama-server's names under a tandem: prefix
"""
