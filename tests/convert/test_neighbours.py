"""Downloads in the script's own modules: found through its imports, in the file beside it."""

from __future__ import annotations

from pathlib import Path

from accelify.transform.neighbours import fetching_imports

DOWNLOADER = """
import urllib.request

def _get(url, dest):
    urllib.request.urlretrieve(url, dest)

def dataset(root):
    _get("https://example.org/x", root)
    return root

def mnist(root):
    return MNIST(root, download=True)

def labels(root):
    return open(root).read()
"""


def _script(tmp_path: Path) -> str:
    script = tmp_path / "train.py"
    script.write_text("")
    return str(script)


def test_functions_that_fetch_directly_or_through_another_are_found(tmp_path: Path) -> None:
    (tmp_path / "data.py").write_text(DOWNLOADER)
    imports = {"dataset": "data.dataset", "mnist": "data.mnist", "labels": "data.labels",
               "torch": "torch"}  # fmt: skip
    assert fetching_imports(_script(tmp_path), imports) == {"data.dataset", "data.mnist"}


def test_packages_and_relative_imports_resolve_beside_the_script(tmp_path: Path) -> None:
    (tmp_path / "utils").mkdir()
    (tmp_path / "utils" / "__init__.py").write_text(DOWNLOADER)
    imports = {"d": ".utils.dataset", "l": "utils.labels"}
    assert fetching_imports(_script(tmp_path), imports) == {".utils.dataset"}


def test_missing_or_broken_modules_and_unsaved_sources_tell_nothing(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("def dataset(:\n")
    imports = {"a": "broken.dataset", "b": "absent.dataset"}
    assert fetching_imports(_script(tmp_path), imports) == frozenset()
    (tmp_path / "data.py").write_text(DOWNLOADER)
    assert fetching_imports("<string>", {"d": "data.dataset"}) == frozenset()
