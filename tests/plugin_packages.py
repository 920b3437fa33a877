"""Throwaway plugin modules and fake installed packages, for the tests of plugin loading; the
one-line CLI error those tests expect."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

#: Two small requests for an inline workload file (``reqs.json``).
REQUESTS = '[{"prompt_tokens": 4, "output_tokens": 3}, {"prompt_tokens": 6, "output_tokens": 2}]'


@pytest.fixture
def modules():
    """Names of the throwaway modules a test imports; forgotten afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        sys.modules.pop(name, None)


def write_module(folder: Path, name: str, text: str, modules: list[str]) -> None:
    """``folder/<name>.py`` holding ``text``; forgotten after the test (the ``modules`` fixture)."""
    (folder / f"{name}.py").write_text(text)
    modules.append(name)


def make_dist(root: Path, package: str, version: str, entry_points: dict[str, str]) -> None:
    """A fake installed distribution: what ``pip install`` leaves in site-packages."""
    dist = root / f"{package.replace('-', '_')}-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (dist / "entry_points.txt").write_text(f"[schedlab]\n{lines}")


def one_line(code: int, err: str) -> str:
    """Exit 2, no traceback, and one ``schedlab: error:`` line (the last, returned without its
    prefix); besides it stderr holds at most the run's opening line."""
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = err.strip().split("\n")
    assert lines[-1].startswith("schedlab: error: "), err
    assert all(line.startswith("schedlab: ") and "run(s)" in line for line in lines[:-1]), err
    return lines[-1][len("schedlab: error: "):]
