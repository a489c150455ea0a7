"""pytest plugin for running llama.cpp's server suite against Tandem (see run.sh).

The suite's session fixture first starts every model preset once to download its model;
here nothing is downloaded (the shim maps every model to a local file) and one preset is a
multi-model router Tandem does not have, so that warm-up is skipped. The test images it
downloads from the hub (tinygemma3's cat and truck) are replaced by local ones, the suite's own
tools/mtmd/test-1.jpeg and a mirrored copy of it (another image): no machine here reaches the
hub. No test is changed.
"""
import os


def _local_images():
    """The hub's test images -> bytes of local stand-ins (two different images: run.sh writes
    the mirrored copy with Tandem's Pillow; this venv has none)."""
    mtmd = os.path.join(os.getcwd(), "..", "..", "mtmd")
    paths = {"91_cat.png": os.path.join(mtmd, "test-1.jpeg"),
             "11_truck.png": os.path.join(os.getcwd(), "tmp", "stand-in-truck.png")}
    out = {}
    for name, path in paths.items():
        with open(path, "rb") as f:
            out[name] = f.read()
    return out


def pytest_configure(config):
    import requests
    import utils  # the suite's own module, on sys.path through its rootdir

    utils.ServerPreset.load_all = staticmethod(lambda: None)
    images, get = _local_images(), requests.get

    def local_get(url, *a, **kw):
        name = url.rsplit("/", 1)[-1]
        if "huggingface.co" in url and name in images:
            r = requests.models.Response()
            r.status_code, r._content, r.url = 200, images[name], url
            return r
        return get(url, *a, **kw)

    requests.get = local_get
