"""pytest plugin for running llama.cpp's server suite against Tandem (see run.sh).

The suite's session fixture first starts every model preset once to download its model;
here nothing is downloaded (the shim maps every model to a local file) and one preset is a
multi-model router Tandem does not have, so that warm-up is skipped. No test is changed.
"""


def pytest_configure(config):
    import utils  # the suite's own module, on sys.path through its rootdir

    utils.ServerPreset.load_all = staticmethod(lambda: None)
