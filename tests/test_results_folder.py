"""Results folders: written whole or not at all, with the usual permissions, an index.html,
and runs that end cleanly on Ctrl-C and SIGTERM."""

from __future__ import annotations

import base64
import errno
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
from study_case import LONG_RUN as LONG

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "experiments" / "quickstart.toml"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if p.name.startswith(".") and p.name.endswith((".tmp", ".old"))]


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
    assert (out / "plots").is_dir()
    assert main(["run", str(QUICKSTART), "--no-plots", "--out", str(out)]) == 0
    assert not (out / "plots").exists()
    assert {p.name for p in out.iterdir()} == {"summary.txt", "summary.json", "summary.csv", "requests.csv",
                                               "timeline.csv", "config.json", "timings.json", "index.html",
                                               ".schedlab-results"}
    assert leftovers(tmp_path) == []


def test_an_empty_folder_is_used_and_a_new_one_made(tmp_path):
    (tmp_path / "empty").mkdir()
    assert main(["run", str(QUICKSTART), "--no-plots", "--out", str(tmp_path / "empty")]) == 0
    assert main(["run", str(QUICKSTART), "--no-plots", "--out", str(tmp_path / "a" / "b" / "new")]) == 0
    assert (tmp_path / "empty" / "summary.json").is_file() and (tmp_path / "a" / "b" / "new" / "index.html").is_file()




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


def test_plot_command_keeps_the_experiment_files_tables_and_description(previous, tmp_path):
    """Determinism review s79: schedlab plot redrew index.html without the experiment's description and its
    "experiment file's tables" section, which the folder keeps nowhere else: the redrawn page is the page."""
    out = copy_of(previous, tmp_path)
    before = (out / "index.html").read_text()
    assert '<pre id="experiment-settings">' in before
    assert main(["plot", str(out)]) == 0
    assert (out / "index.html").read_text() == before


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


# -- what --out may replace (the manifest) ----------------------------------------------------------------


PREVIOUS_ENTRIES = ["config.json", "index.html", "plots", "requests.csv", "summary.csv", "summary.json", "summary.txt",
                    "timeline.csv", "timings.json"]


def test_a_results_folder_lists_what_schedlab_wrote(previous):
    manifest = json.loads((previous / ".schedlab-results").read_text())
    assert manifest["entries"] == PREVIOUS_ENTRIES


def test_a_folder_with_a_stray_summary_json_is_not_emptied(tmp_path, capsys):
    """Before: an empty summary.json was enough for --out to delete the project around it."""
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "summary.json").write_text("")
    (proj / "src" / "main.py").write_text("print(1)\n")
    (proj / "thesis.tex").write_text("thesis\n")
    before = snapshot(proj)
    assert main(["run", str(QUICKSTART), "--no-plots", "--out", str(proj)]) == 2
    err = capsys.readouterr().err
    assert err == (f"schedlab: error: --out {proj}: is a folder with other files in it (not one schedlab wrote: no "
                   ".schedlab-results, nor an index.html or summary.json of schedlab's); a run replaces its results "
                   "folder whole, so name a new or empty folder\n")
    assert snapshot(proj) == before and leftovers(tmp_path) == []


def test_a_hunt_does_not_empty_a_folder_with_a_stray_summary_json(tmp_path, capsys):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "summary.json").write_text("")
    (proj / "thesis.tex").write_text("thesis\n")
    assert main(["hunt", str(ROOT / "experiments" / "hunt" / "chunked_ttft.toml"), "--out", str(proj)]) == 2
    assert "is a folder with other files in it" in capsys.readouterr().err
    assert sorted(p.name for p in proj.iterdir()) == ["summary.json", "thesis.tex"]


@pytest.mark.parametrize("added, shown", [
    (["notes.txt", "src/"], "notes.txt, src"),
    (["e.txt", "a.txt", "d/", "c.txt", "b.txt"], "a.txt, b.txt, c.txt and 2 more"),
])
def test_files_added_to_a_results_folder_are_not_deleted(previous, tmp_path, capsys, added, shown):
    """Before: notes written into a results folder went with it at the next run."""
    out = copy_of(previous, tmp_path)
    for name in added:
        if name.endswith("/"):
            (out / name / "kept.py").parent.mkdir()
            (out / name / "kept.py").write_text("x")
        else:
            (out / name).write_text("mine")
    before = snapshot(out)
    assert main(["run", str(QUICKSTART), "--no-plots", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"schedlab: error: --out {out}: holds files schedlab did not write ({shown}); "
                                       "a run replaces its results folder whole, so move them or name another "
                                       "folder\n")
    assert snapshot(out) == before and leftovers(tmp_path) == []


@pytest.mark.parametrize("litter", [".DS_Store", ".summary.json.k3j_x9a2.tmp"])
def test_browser_litter_and_an_interrupted_write_do_not_block_a_run(previous, tmp_path, litter):
    out = copy_of(previous, tmp_path)
    (out / litter).write_text("x")
    assert main(["run", str(QUICKSTART), "--no-plots", "--out", str(out)]) == 0
    assert not (out / litter).exists() and not (out / "plots").exists()


def _older(previous: Path, tmp_path: Path, keep: str) -> Path:
    """A results folder as a schedlab without manifests wrote it, reduced to ``keep``'s marker."""
    out = copy_of(previous, tmp_path)
    (out / ".schedlab-results").unlink()
    if keep == "summary.json":
        (out / "index.html").unlink()
    elif keep == "index.html":
        (out / "summary.json").unlink()
    elif keep == "hunt.json":  # a hunt's folder: no index.html, no summary.json
        (out / "index.html").unlink()
        (out / "summary.json").unlink()
        (out / "hunt.json").write_text(json.dumps({"goal": "maximise x", "objective": "x", "search": {}}))
    return out


@pytest.mark.parametrize("keep", ["summary.json", "index.html", "hunt.json"])
def test_folders_written_before_manifests_are_still_replaced(previous, tmp_path, keep):
    out = _older(previous, tmp_path, keep)
    (out / "notes.txt").write_text("older folders had no manifest to tell")
    assert main(["run", str(QUICKSTART), "--no-plots", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [".schedlab-results"] + [n for n in PREVIOUS_ENTRIES if n != "plots"])


@pytest.mark.parametrize("summary", ["", "{}", '{"experiment": "x", "studies": [{"name": "a"}]}'])
def test_an_older_folder_needs_a_summary_json_schedlab_wrote(previous, tmp_path, capsys, summary):
    out = _older(previous, tmp_path, "summary.json")
    (out / "summary.json").write_text(summary)
    assert main(["run", str(QUICKSTART), "--no-plots", "--out", str(out)]) == 2
    assert "is a folder with other files in it" in capsys.readouterr().err
    assert (out / "requests.csv").read_bytes() == (previous / "requests.csv").read_bytes()


# -- --out must not hold what the run reads ---------------------------------------------------------------


def _results_holding_the_experiment(previous: Path, tmp_path: Path) -> Path:
    """A results folder with the experiment and its requests in it, listed as if schedlab wrote
    them (as a hunt writes counterexample.toml and counterexample.jsonl)."""
    from schedlab.results.folder import record_entries

    out = copy_of(previous, tmp_path)
    shutil.copy(QUICKSTART, out / "exp.toml")
    shutil.copy(ROOT / "experiments" / "data" / "requests.json", out / "requests.json")
    record_entries(out, ["exp.toml", "requests.json"])
    return out


@pytest.mark.parametrize("command", [
    ["run", "results/exp.toml", "--set", 'workload.path="requests.json"'],
    ["run", "exp.toml", "--set", 'workload.path="results/requests.json"'],
    ["run", "sweep.toml"],  # one sweep point reads the request file in the folder
])
def test_a_run_does_not_replace_the_folder_holding_its_inputs(previous, tmp_path, capsys, monkeypatch, command):
    """Before: replaying a hunt's counterexample into the hunt's folder deleted the counterexample."""
    out = _results_holding_the_experiment(previous, tmp_path)
    shutil.copy(QUICKSTART, tmp_path / "exp.toml")
    shutil.copy(ROOT / "experiments" / "data" / "requests.json", tmp_path / "requests.json")
    (tmp_path / "sweep.toml").write_text(QUICKSTART.read_text().replace(
        "[workload]", '[sweep]\n"workload.path" = ["requests.json", "results/requests.json"]\n\n[workload]'))
    before = snapshot(out)
    monkeypatch.chdir(tmp_path)
    assert main(command + ["--no-plots", "--out", "results"]) == 2
    read = command[1] if command[1].startswith("results/") else "results/requests.json"
    assert capsys.readouterr().err == (f"schedlab: error: --out results: holds {read}, which this run reads; a run "
                                       "replaces its results folder whole, so name another folder\n")
    assert snapshot(out) == before and leftovers(tmp_path) == []


def test_a_plan_whose_space_reads_a_file_in_the_folder_does_not_replace_it(previous, tmp_path, capsys, monkeypatch):
    """A [plan.space] value is read as a [sweep]'s is: the plan replayed results/requests.json and
    replaced the folder holding it (review s81 badinput, finding 2)."""
    out = _results_holding_the_experiment(previous, tmp_path)
    (tmp_path / "plan.toml").write_text(textwrap.dedent("""
        [experiment]
        name = "plan"
        [workload]
        kind = "file"
        path = "results/requests.json"
        [cost_model]
        kind = "roofline"
        model = "llama-3-8b"
        [kv_cache]
        model = "llama-3-8b"
        [slo]
        ttft_ms = 1000
        [plan]
        constraints = ["slo.attainment >= 0.5"]
        gpus = {a100-80gb = 1}
        max_instances = 2
        """).replace('path = "results/requests.json"', 'path = "requests.json"'))
    shutil.copy(ROOT / "experiments" / "data" / "requests.json", tmp_path / "requests.json")
    before = snapshot(out)
    monkeypatch.chdir(tmp_path)
    for extra in (["--set", 'plan.space={"workload.path" = ["results/requests.json"]}'],):
        assert main(["run", "plan.toml", *extra, "--no-plots", "--out", "results"]) == 2
        assert capsys.readouterr().err.endswith("schedlab: error: --out results: holds results/requests.json, which "
                                                "this run reads; a run replaces its results folder whole, so name "
                                                "another folder\n")
    assert snapshot(out) == before and leftovers(tmp_path) == []


def test_the_same_run_into_another_folder_and_the_folder_itself_are_fine(previous, tmp_path, monkeypatch):
    """The check above refuses only what the run reads: the inputs themselves are usable."""
    _results_holding_the_experiment(previous, tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "results/exp.toml", "--set", 'workload.path="requests.json"', "--no-plots",
                 "--out", "again"]) == 0
    assert json.loads(Path("again/summary.json").read_text())["experiment"] == "quickstart"


def test_a_hunt_does_not_replace_the_folder_holding_its_file(previous, tmp_path, capsys, monkeypatch):
    out = copy_of(previous, tmp_path)
    shutil.copy(ROOT / "experiments" / "hunt" / "chunked_ttft.toml", out / "hunt.toml")
    monkeypatch.chdir(tmp_path)
    assert main(["hunt", "results/hunt.toml", "--out", "results"]) == 2
    assert capsys.readouterr().err == ("schedlab: error: --out results: holds results/hunt.toml, which this run "
                                       "reads; a run replaces its results folder whole, so name another folder\n")
    assert (out / "hunt.toml").is_file()


# -- a symbolic link as --out ------------------------------------------------------------------------------


@pytest.mark.parametrize("existing", [True, False])
def test_a_linked_out_is_written_through(previous, tmp_path, existing):
    """Before: the link was replaced by a real folder, on the link's file system."""
    big = tmp_path / "bigdisk"
    big.mkdir()
    if existing:
        copy_of(previous, big)
    (tmp_path / "link").symlink_to(Path("bigdisk") / "results")
    assert main(["run", str(QUICKSTART), "--no-plots", "--out", str(tmp_path / "link")]) == 0
    assert (tmp_path / "link").is_symlink() and os.readlink(tmp_path / "link") == "bigdisk/results"
    assert sorted(p.name for p in (big / "results").iterdir()) == sorted(
        [".schedlab-results"] + [n for n in PREVIOUS_ENTRIES if n != "plots"])
    assert leftovers(tmp_path) == [] and leftovers(big) == []


def test_a_linked_out_holding_foreign_files_is_refused(tmp_path, capsys):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "thesis.tex").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    assert main(["run", str(QUICKSTART), "--no-plots", "--out", str(tmp_path / "link")]) == 2
    assert "is a folder with other files in it" in capsys.readouterr().err
    assert (tmp_path / "link").is_symlink() and (tmp_path / "elsewhere" / "thesis.tex").read_text() == "x"


# -- a full disk or a read-only file system while writing -----------------------------------------------------


class FullDisk:
    """What ``os.fdopen`` gives on a full disk: every write fails with ENOSPC (as ``write(2)`` does, naming no file)."""

    def __init__(self, fh):
        self.fh = fh

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fh.close()

    def fileno(self):
        return self.fh.fileno()

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")


def fill_the_disk(monkeypatch):
    from schedlab.results import storage

    real = os.fdopen
    monkeypatch.setattr(storage.os, "fdopen", lambda fd, *args, **kw: FullDisk(real(fd, *args, **kw)))


def test_a_full_disk_ends_a_run_with_one_line_and_keeps_the_previous_results(previous, tmp_path, capsys,
                                                                              monkeypatch):
    """Before: a traceback ending in storage.py ``fh.write(data)``."""
    out = copy_of(previous, tmp_path)
    before = snapshot(out)
    fill_the_disk(monkeypatch)
    assert main(["run", str(QUICKSTART), "--jobs", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    # the table report writes first: summary.txt is the first file to fail
    assert err.splitlines()[-1] == (f"schedlab: error: --out {out}: cannot write {out}/summary.txt: No space left "
                                    "on device; no results were written (a previous results folder is left as it "
                                    "was)")
    assert "Traceback" not in err
    assert snapshot(out) == before and leftovers(tmp_path) == []


def test_a_full_disk_while_plotting_leaves_no_half_written_plots(previous, tmp_path, capsys, monkeypatch):
    """Before: a traceback, and an empty plots/ folder left behind."""
    out = copy_of(previous, tmp_path)
    shutil.rmtree(out / "plots")
    before = snapshot(out)
    fill_the_disk(monkeypatch)
    assert main(["plot", str(out)]) == 2
    assert capsys.readouterr().err == (f"schedlab: error: {out}: cannot write {out}/plots/latency_cdf.png: No space "
                                       "left on device; nothing in the folder was changed\n")
    assert snapshot(out) == before
    assert sorted(p.name for p in out.iterdir()) == [".schedlab-results"] + [n for n in PREVIOUS_ENTRIES
                                                                              if n != "plots"]


def test_plotting_on_a_read_only_file_system_says_so(previous, tmp_path, capsys, monkeypatch):
    """Before: ``OSError: [Errno 30] Read-only file system: 'rofs/res/plots'``."""
    from schedlab.results import folder

    out = copy_of(previous, tmp_path)
    before = snapshot(out)

    def read_only(prefix="", suffix="", dir=None):
        raise OSError(errno.EROFS, "Read-only file system", os.path.join(dir, prefix + "x" + suffix))

    monkeypatch.setattr(folder.tempfile, "mkdtemp", read_only)
    assert main(["plot", str(out)]) == 2
    assert capsys.readouterr().err == f"schedlab: error: {out}: cannot write there: Read-only file system\n"
    assert snapshot(out) == before


def test_plot_records_its_files_in_the_manifest(previous, tmp_path):
    """A --no-plots folder plotted later: plots/ is schedlab's, so the next run may replace it."""
    out = tmp_path / "res"
    assert main(["run", str(QUICKSTART), "--no-plots", "--out", str(out)]) == 0
    assert "plots" not in json.loads((out / ".schedlab-results").read_text())["entries"]
    assert main(["plot", str(out)]) == 0
    assert json.loads((out / ".schedlab-results").read_text())["entries"] == PREVIOUS_ENTRIES
    assert main(["run", str(QUICKSTART), "--no-plots", "--out", str(out)]) == 0
    assert not (out / "plots").exists()


def test_a_hunt_file_that_cannot_be_written_is_named(tmp_path, monkeypatch):
    """``write`` on a full disk names no file; the hunt's writer adds it, so the message can say which."""
    from schedlab.hunt.output import write_text

    def full(self, *args, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError) as caught:
        write_text(tmp_path, "hunt.json", "{}")
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(tmp_path / "hunt.json")


def test_a_stop_just_after_the_results_are_in_place_says_they_were_written(previous, tmp_path, capsys, monkeypatch):
    """A Ctrl-C landing after the folder was swapped in (here: while the run tidies up) used to
    say 'no results were written' although they were."""
    import schedlab.results.folder as folder

    real = folder.remove_abandoned

    def interrupted_after_commit(parent, names, suffix=".tmp"):
        if suffix == ".old":  # (called once the new folder is in place)
            raise KeyboardInterrupt
        return real(parent, names, suffix)

    monkeypatch.setattr(folder, "remove_abandoned", interrupted_after_commit)
    out = tmp_path / "results"
    assert main(["run", str(QUICKSTART), "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"schedlab: interrupted, after the results were written to {out}"
    assert (out / "summary.json").is_file() and leftovers(tmp_path) == []
