"""Test-suite settings: no Hypothesis deadlines.

CI machines are shared and slow at times; a wall-clock deadline per example would make
property tests fail for reasons unrelated to the code (the project's rule: speed is a
benchmark, never a timed test). Every failure still prints the reproducing example.
"""

from hypothesis import settings

settings.register_profile("schedlab", deadline=None, print_blob=True)
settings.load_profile("schedlab")


import pytest  # noqa: E402


@pytest.fixture
def validated(tmp_path, capsys):
    """``validate(text)``: write ``text`` as an experiment file and run ``schedlab validate`` on it;
    returns (exit code, what it wrote to stderr, the file's path)."""
    from schedlab.cli import main

    def validate(text: str, name: str = "e.toml"):
        path = tmp_path / name
        path.write_text(text)
        code = main(["validate", str(path)])
        return code, capsys.readouterr().err, path

    return validate


@pytest.fixture(scope="module")
def previous(tmp_path_factory):
    """A complete results folder of the quickstart, plots included (results-folder tests copy it)."""
    from pathlib import Path

    from schedlab.cli import main

    out = tmp_path_factory.mktemp("prev") / "results"
    assert main(["run", str(Path(__file__).resolve().parent.parent / "experiments" / "quickstart.toml"),
                 "--out", str(out)]) == 0
    return out
