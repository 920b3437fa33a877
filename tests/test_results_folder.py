"""Results folders: written whole or not at all, with the usual permissions, an index.html,
and runs that end cleanly on Ctrl-C and SIGTERM."""

from __future__ import annotations

import base64
import html
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from schedlab.cli import main
from schedlab.results.folder import GENERATOR_TAG

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "experiments" / "quickstart.toml"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if p.name.startswith(".") and p.name.endswith((".tmp", ".old"))]


@pytest.fixture(scope="module")
def previous(tmp_path_factory):
    """A complete results folder of the quickstart, plots included."""
    out = tmp_path_factory.mktemp("prev") / "results"
    assert main(["run", str(QUICKSTART), "--out", str(out)]) == 0
    return out


def copy_of(previous: Path, tmp_path: Path) -> Path:
    out = tmp_path / "results"
    shutil.copytree(previous, out)
    return out


# -- written whole ----------------------------------------------------------------------------------


def test_a_run_failing_while_writing_leaves_the_previous_folder_untouched(previous, tmp_path, capsys, monkeypatch):
    """The json report writes its five files, then a report fails: before, the folder then held
    the new summaries beside the previous run's plots (a mixed folder)."""
    out = copy_of(previous, tmp_path)
    before = snapshot(out)
    (tmp_path / "failing_report.py").write_text(textwrap.dedent("""
        import schedlab
        from schedlab.errors import ConfigError

        class Failing:
            def write(self, results, out_dir):
                raise ConfigError("failing report: disk quota exceeded")

        @schedlab.hookimpl
        def schedlab_register_reports(register):
            register("failing", Failing, help="fails after the others wrote")
        """))
    text = QUICKSTART.read_text().replace('name = "quickstart"', 'name = "quickstart"\nplugins = ["failing_report"]\n'
                                                                 'reports = ["json", "failing"]')
    (tmp_path / "data").mkdir()
    shutil.copy(ROOT / "experiments" / "data" / "requests.json", tmp_path / "data" / "requests.json")
    (tmp_path / "exp.toml").write_text(text.replace("max_num_seqs = 16", "max_num_seqs = 8"))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert main(["run", str(tmp_path / "exp.toml"), "--out", str(out)]) == 2
    finally:
        sys.modules.pop("failing_report", None)
    assert "disk quota exceeded" in capsys.readouterr().err
    assert snapshot(out) == before
    assert leftovers(tmp_path) == []


def test_a_new_run_replaces_the_whole_folder(previous, tmp_path):
    """Files of the previous run that the new one does not write (its plots) do not linger."""
    out = copy_of(previous, tmp_path)
    (out / "notes-from-last-time.txt").write_text("stale")
    assert (out / "plots").is_dir()
    assert main(["run", str(QUICKSTART), "--no-plots", "--out", str(out)]) == 0
    assert not (out / "plots").exists() and not (out / "notes-from-last-time.txt").exists()
    assert {p.name for p in out.iterdir()} == {"summary.txt", "summary.json", "summary.csv", "requests.csv",
                                               "timeline.csv", "config.json", "timings.json", "index.html"}
    assert leftovers(tmp_path) == []


def test_an_empty_folder_is_used_and_a_new_one_made(tmp_path):
    (tmp_path / "empty").mkdir()
    assert main(["run", str(QUICKSTART), "--no-plots", "--out", str(tmp_path / "empty")]) == 0
    assert main(["run", str(QUICKSTART), "--no-plots", "--out", str(tmp_path / "a" / "b" / "new")]) == 0
    assert (tmp_path / "empty" / "summary.json").is_file() and (tmp_path / "a" / "b" / "new" / "index.html").is_file()


LONG = """
[experiment]
name = "long"
reports = ["table", "json"]

[workload]
kind = "synthetic"
num_requests = 3000000
prompt = {dist = "fixed", value = 100}
output = {dist = "fixed", value = 50}
arrival = "poisson"
rate = 60
"""


@pytest.mark.parametrize("signals, later, status, word", [
    ((signal.SIGINT,), (), 130, "interrupted"),
    ((signal.SIGINT, signal.SIGINT), (), 130, "interrupted"),      # a second Ctrl-C at once
    ((signal.SIGINT, signal.SIGINT, signal.SIGINT), (), 130, "interrupted"),
    ((signal.SIGINT,), (signal.SIGINT,), 130, "interrupted"),      # ... or while the process exits
    ((signal.SIGTERM,), (), 143, "terminated (SIGTERM)"),
    ((signal.SIGTERM,), (signal.SIGINT, signal.SIGTERM), 143, "terminated (SIGTERM)"),
])
def test_interrupted_run_says_so_in_one_line_and_leaves_the_folder(previous, tmp_path, signals, later, status,
                                                                   word):
    """Before: a second Ctrl-C printed a threading traceback, SIGTERM ended without a word."""
    out = copy_of(previous, tmp_path)
    before = snapshot(out)
    (tmp_path / "long.toml").write_text(LONG)
    proc = subprocess.Popen([sys.executable, "-m", "schedlab", "run", str(tmp_path / "long.toml"), "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()  # printed once the results folder is staged, as the run starts
        assert first == "schedlab: long: 1 run(s)\n", first
        for sig in signals:
            proc.send_signal(sig)
        second = proc.stderr.readline()
        for sig in later:  # after its message: the clean-up is done and the interpreter is exiting
            proc.send_signal(sig)
        err = first + second + proc.stderr.read()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == status, err
    assert err.splitlines() == ["schedlab: long: 1 run(s)",
                                f"schedlab: {word}; no results were written (a previous results folder is left "
                                "as it was)"], err
    assert snapshot(out) == before
    assert leftovers(tmp_path) == []


# -- permissions -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_results_get_the_usual_permissions(tmp_path, umask):
    """mkstemp/mkdtemp create 0600/0700 whatever the umask; results should be like any file."""
    old = os.umask(umask)
    try:
        assert main(["run", str(QUICKSTART), "--out", str(tmp_path / "out")]) == 0
        assert main(["plot", str(tmp_path / "out")]) == 0  # rewrites the plots and index.html in place
    finally:
        os.umask(old)
    paths = [tmp_path / "out", *(tmp_path / "out").rglob("*")]
    assert any(p.suffix == ".png" for p in paths) and any(p.name == "index.html" for p in paths)
    for path in paths:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o777 if path.is_dir() else 0o666) & ~umask, (path, oct(mode))


# -- index.html ----------------------------------------------------------------------------------------------


def embedded_images(page: str) -> dict[str, bytes]:
    return {html.unescape(alt): base64.b64decode(data) for data, alt in
            re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)" alt="([^"]*)">', page)}


def test_index_shows_the_table_the_settings_and_every_plot(previous):
    page = (previous / "index.html").read_text()
    assert GENERATOR_TAG in page
    table = (previous / "summary.txt").read_text()
    assert html.escape(table) in page
    settings = json.loads(html.unescape(re.search(r'<pre id="run-settings">(.*?)</pre>', page, re.S).group(1)))
    assert settings == json.loads((previous / "config.json").read_text())
    assert settings["static"]["scheduler"] == {"kind": "static", "batch_size": 16}
    experiment = json.loads(html.unescape(re.search(r'<pre id="experiment-settings">(.*?)</pre>', page, re.S).group(1)))
    assert experiment["experiment"]["name"] == "quickstart" and len(experiment["runs"]) == 2
    pngs = {p.name: p.read_bytes() for p in (previous / "plots").glob("*.png")}
    assert len(pngs) == 3 and embedded_images(page) == pngs
    for name in ("summary.json", "requests.csv", "plots/latency_cdf.png"):
        assert f'<a href="{name}">' in page
    assert "<script" not in page and 'src="http' not in page  # one page, nothing to fetch


def test_plot_command_rewrites_the_index(previous, tmp_path):
    out = copy_of(previous, tmp_path)
    (out / "index.html").unlink()
    shutil.rmtree(out / "plots")
    assert main(["plot", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert embedded_images(page) == {p.name: p.read_bytes() for p in (out / "plots").glob("*.png")}
    assert html.escape((out / "summary.txt").read_text()) in page


CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(name)), None)
PROBE = """<script>
window.addEventListener("load", () => {
  const images = Array.from(document.images);
  const broken = images.filter(i => !i.complete || i.naturalWidth === 0).map(i => i.alt);
  document.body.setAttribute("data-images", String(images.length));
  document.body.setAttribute("data-broken", broken.join(","));
  document.body.setAttribute("data-table", document.getElementById("summary-table").textContent.length);
});
</script>
"""


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed")
def test_index_renders_in_headless_chromium_with_every_image_loaded(previous, tmp_path):
    """The page opened from the file system in a real browser: every embedded PNG decodes."""
    page = (previous / "index.html").read_text()
    probe = tmp_path / "probe.html"  # the page plus a script reporting what the browser loaded
    probe.write_text(page.replace("</body>", PROBE + "</body>"))
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000", "--dump-dom",
                           probe.as_uri()], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    body = re.search(r"<body[^>]*>", done.stdout).group(0)
    attributes = dict(re.findall(r'data-(\w+)="([^"]*)"', body))
    assert attributes["images"] == str(len(list((previous / "plots").glob("*.png")))) == "3"
    assert attributes["broken"] == ""
    assert int(attributes["table"]) > 100
