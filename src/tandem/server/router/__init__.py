"""Router mode (llama-server's "using multiple models"): `tandem serve --models-dir DIR` or
`--models-preset FILE.ini` with no --model serves many models, one child `tandem serve` each.

    settings.py  the router's flags (--models-dir, --models-preset, --models-max, --models-autoload,
                 -hf: a preset repo of the hub)
    catalog.py   the models it may load: llama-server's cache, a directory's files and the
                 preset's sections, each an `Entry` (id, first GGUF, shards, projector, flags)
    hfcache.py   llama-server's cache of downloaded models (the hub's layout), read offline
    hub.py       downloads from the Hugging Face hub into that cache (huggingface_hub), removals
    downloads.py POST /models, DELETE /models, a preset's models fetched before they load
    children.py  one child `tandem serve` per loaded model on a loopback port: its command line,
                 start, readiness, stop
    models.py    the models' states, the queue of requests waiting for one, the LRU eviction at
                 --models-max, the memory plan before a load, the events of /models/sse
    app.py       the router's HTTP API: /models, /models/load|unload|sse, /props, /health, the
                 page; every other request forwarded to its model's child
    drafts.py    GET /models/drafts: the page's draft picker (each other model judged as a draft)
    main.py      `tandem serve` in router mode: checks the catalog, listens, serves
"""
