"""The results review's findings 1, 4, 5 and 7: a stopped worker pool cannot hang the process at
exit; files a user puts inside a results folder's subfolders, or adds while a run runs, are never
deleted; ``schedlab plot`` lists its files before they are there."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from schedlab import cli
from schedlab.cli import main
from schedlab.errors import ConfigError
from schedlab.results import folder
from schedlab.results.folder import MANIFEST, StagedFolder, record_entries, replace_problem
from test_results_folder import copy_of, snapshot

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "experiments" / "quickstart.toml"


def run_no_plots(out: Path) -> int:
    return main(["run", str(QUICKSTART), "--no-plots", "--out", str(out)])


# -- finding 1: a stop cannot leave the pool's manager thread blocked --------------------------------------

# A pool with one worker busy; half a result in the result pipe (a header announcing 1 MB, then
# 100 bytes: what a worker stopped partway through sending a large result leaves), which the
# manager thread starts reading; then close(now=True), as on Ctrl-C. Run in a process of its own
# (with a timeout): a thread left blocked makes that process hang at exit.
HALF_WRITTEN = textwrap.dedent("""
    import os, struct, sys, time
    from schedlab.study import executor as ex

    ex.MANAGER_JOIN_S = 1.0
    executor = ex.ProcessExecutor(2)
    pool = executor._pool
    future = pool.submit(time.sleep, 120)
    while not future.running():
        time.sleep(0.01)
    manager = pool._executor_manager_thread
    writer = pool._result_queue._writer
    if sys.argv[1] == "held":
        os.dup(writer.fileno())  # another holder of the write end: the read never ends
    os.write(writer.fileno(), struct.pack("!i", 1_000_000) + b"x" * 100)
    executor.close(now=True)
    manager.join(20 if sys.argv[1] == "plain" else 0.1)
    print("manager alive:", manager.is_alive(), flush=True)
""")


def _half_written(mode: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-c", HALF_WRITTEN, mode], capture_output=True, text=True,
                              timeout=90)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the process did not exit (it hung at exit); it printed {exc.stdout!r}")


def test_close_now_ends_a_manager_thread_reading_a_half_written_result():
    """Before: the manager thread blocked for ever on the rest of the message (this process held a
    copy of the pipe's write end, so no EOF came), and Python's exit joined it for ever."""
    done = _half_written("plain")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "manager alive: False\n"


def test_a_manager_thread_still_blocked_does_not_keep_the_process_from_exiting():
    """The last resort: another process holds a copy of the write end, so the read cannot end;
    the process exits all the same (before: it hung at exit, every stop signal ignored)."""
    done = _half_written("held")
    assert done.stdout == "manager alive: True\n"
    assert done.returncode == 0, done.stderr


# -- finding 7: plot lists its files before moving them in ----------------------------------------------------


@pytest.mark.parametrize("stop", [KeyboardInterrupt, OSError])
def test_plot_stopped_before_index_html_leaves_a_folder_the_next_run_replaces(tmp_path, monkeypatch, capsys, stop):
    """Before: plots/ was in place but not in the manifest, and the next run refused the folder
    ("holds files schedlab did not write (plots)")."""
    out = tmp_path / "res"
    assert run_no_plots(out) == 0

    def fails(*args, **kw):
        raise stop() if stop is KeyboardInterrupt else OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cli.index_page, "write", fails)
    assert main(["plot", str(out)]) == (130 if stop is KeyboardInterrupt else 2)
    monkeypatch.undo()
    assert (out / "plots").is_dir()
    capsys.readouterr()
    assert run_no_plots(out) == 0, capsys.readouterr().err
    assert not (out / "plots").exists()


def test_plot_interrupted_while_moving_its_files_in_leaves_a_folder_the_next_run_replaces(tmp_path, monkeypatch):
    out = tmp_path / "res"
    assert run_no_plots(out) == 0
    real, moved = folder.os.replace, []

    def replace(source, target):
        if f"{folder.STAGED_FILES}." in str(source) and f"{folder.STAGED_FILES}." not in str(target):  # (moved in)
            if moved:
                raise KeyboardInterrupt
            moved.append(target)
        return real(source, target)

    monkeypatch.setattr(folder.os, "replace", replace)
    assert main(["plot", str(out)]) == 130
    monkeypatch.undo()
    assert len(list((out / "plots").iterdir())) == 1
    assert run_no_plots(out) == 0
    assert not (out / "plots").exists()


def test_plot_lists_each_plot_in_the_manifest(tmp_path):
    out = tmp_path / "res"
    assert run_no_plots(out) == 0
    assert main(["plot", str(out)]) == 0
    names, files = folder.read_manifest(out)
    plots = {f"plots/{p.name}" for p in (out / "plots").iterdir()}
    assert "plots" in names and plots and plots <= files and "index.html" in files


# -- finding 5: files added while the run ran ---------------------------------------------------------------


def test_files_added_while_the_run_ran_keep_the_folder_and_the_results_go_beside_it(previous, tmp_path, capsys,
                                                                                     monkeypatch):
    """Before: notes.txt saved into the previous results during the run went with them at the end."""
    out = copy_of(previous, tmp_path)
    before = snapshot(out)
    real = folder.write_manifest

    def meanwhile(staged):  # (called as the run puts its results in place)
        (out / "notes.txt").write_text("written while the run ran")
        real(staged)

    monkeypatch.setattr(folder, "write_manifest", meanwhile)
    assert run_no_plots(out) == 2
    beside = tmp_path / f"results.new-{folder.os.getpid()}"
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"schedlab: error: --out {out}: files schedlab did not write were added to it while the run ran "
        f"(notes.txt), so it is left as it was; the new results are in {beside} instead (move the added files "
        f"out of {out} and the results in, or keep both)")
    assert snapshot(out) == {**before, "notes.txt": b"written while the run ran"}
    assert (beside / "summary.json").is_file() and not (beside / "plots").exists()
    assert replace_problem(beside) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results", beside.name]  # (no staging folder left)


def test_a_file_added_to_a_subfolder_while_the_run_ran_keeps_the_folder(previous, tmp_path):
    out = copy_of(previous, tmp_path)
    with StagedFolder(out) as stage:
        (stage.path / "summary.json").write_text("{}")
        (out / "plots" / "annotated.png").write_bytes(b"mine")
        with pytest.raises(ConfigError, match=r"while the run ran \(plots/annotated.png\)") as caught:
            stage.commit()
    assert stage.beside is not None and str(stage.beside) in str(caught.value)
    assert (out / "plots" / "annotated.png").read_bytes() == b"mine"
    assert (out / "requests.csv").read_bytes() == (previous / "requests.csv").read_bytes()
    assert (stage.beside / "summary.json").read_text() == "{}"


def test_a_folder_made_by_someone_else_while_the_run_ran_is_kept(tmp_path):
    out = tmp_path / "res"
    with StagedFolder(out) as stage:
        (stage.path / "summary.json").write_text("{}")
        out.mkdir()
        (out / "thesis.tex").write_text("x")
        with pytest.raises(ConfigError, match="it now holds other files"):
            stage.commit()
    assert sorted(p.name for p in out.iterdir()) == ["thesis.tex"]
    assert (stage.beside / "summary.json").is_file()


def test_an_unchanged_folder_is_still_replaced(previous, tmp_path):
    out = copy_of(previous, tmp_path)
    with StagedFolder(out) as stage:
        (stage.path / "summary.json").write_text("{}")
        stage.commit()
    assert stage.beside is None and sorted(p.name for p in out.iterdir()) == [MANIFEST, "summary.json"]


# -- finding 4: files inside schedlab's subfolders -------------------------------------------------------------


def test_the_manifest_lists_every_file(previous):
    names, files = folder.read_manifest(previous)
    assert files == {str(p.relative_to(previous)) for p in previous.rglob("*")
                     if p.is_file() and p.name != MANIFEST}
    assert "plots" in names and any(f.startswith("plots/") for f in files)


@pytest.mark.parametrize("added, shown", [
    (["plots/notes.txt"], "plots/notes.txt"),
    (["plots/mine/a.txt", "plots/mine/b.txt"], "plots/mine/a.txt, plots/mine/b.txt"),
    (["notes.txt", "plots/notes.txt"], "notes.txt, plots/notes.txt"),
])
def test_a_file_inside_a_results_subfolder_is_not_deleted(previous, tmp_path, capsys, added, shown):
    """Before: notes.txt at the top was refused, plots/notes.txt deleted without a word."""
    out = copy_of(previous, tmp_path)
    for name in added:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("mine")
    before = snapshot(out)
    assert run_no_plots(out) == 2
    assert capsys.readouterr().err == (f"schedlab: error: --out {out}: holds files schedlab did not write ({shown}); "
                                       "a run replaces its results folder whole, so move them or name another "
                                       "folder\n")
    assert snapshot(out) == before


@pytest.mark.parametrize("litter", ["plots/.DS_Store", "plots/.latency_cdf.png.k3j_x9a2.tmp"])
def test_browser_litter_and_an_interrupted_write_in_a_subfolder_do_not_block_a_run(previous, tmp_path, litter):
    out = copy_of(previous, tmp_path)
    assert (out / "plots" / "latency_cdf.png").is_file()
    (out / litter).write_text("x")
    assert run_no_plots(out) == 0
    assert not (out / "plots").exists()


def _older_manifest(out: Path) -> None:
    """The manifest as an older schedlab wrote it: top-level names only."""
    data = json.loads((out / MANIFEST).read_text())
    del data["files"]
    (out / MANIFEST).write_text(json.dumps(data))


def test_an_older_manifest_of_top_level_names_still_works(previous, tmp_path, capsys):
    out = copy_of(previous, tmp_path)
    _older_manifest(out)
    assert folder.read_manifest(out)[1] is None
    (out / "notes.txt").write_text("mine")
    assert run_no_plots(out) == 2
    assert "holds files schedlab did not write (notes.txt)" in capsys.readouterr().err
    (out / "notes.txt").unlink()
    assert run_no_plots(out) == 0
    assert folder.read_manifest(out)[1] is not None  # (the new folder's manifest lists every file)


def test_recording_into_an_older_manifest_keeps_it_older(previous, tmp_path):
    out = copy_of(previous, tmp_path)
    _older_manifest(out)
    record_entries(out, ["extra/x.png"])
    names, files = folder.read_manifest(out)
    assert "extra" in names and files is None


def test_recording_adds_paths_and_their_top_level_names(tmp_path):
    out = tmp_path / "res"
    assert run_no_plots(out) == 0
    (out / "extra").mkdir()
    (out / "extra" / "x.png").write_bytes(b"x")
    assert "(extra)" in replace_problem(out)
    record_entries(out, [Path("extra") / "x.png"])
    assert replace_problem(out) is None
    (out / "extra" / "y.png").write_bytes(b"y")
    assert "(extra/y.png)" in replace_problem(out)


# -- review results82: --set reports.* is what the folder keeps --------------------------------------------


def test_set_reports_are_saved_so_plot_redraws_the_same_table(tmp_path):
    """The reports ran with ``--set reports.table.columns=...`` but summary.json kept the file's
    [reports] (none), and ``schedlab plot`` redrew index.html with the default columns."""
    out = tmp_path / "res"
    assert main(["run", str(QUICKSTART), "--no-plots", "--out", str(out),
                 "--set", 'reports.table.columns=["finished", "ttft_ms.p99"]']) == 0
    saved = json.loads((out / "summary.json").read_text())["reports"]
    assert saved == {"table": {"columns": ["finished", "ttft_ms.p99"]}}
    page = (out / "summary.txt").read_text()
    assert main(["plot", str(out)]) == 0
    html = (out / "index.html").read_text()
    assert "ttft_ms.p99" in page and "tpot_ms.p50" not in page
    assert "ttft_ms.p99" in html and "tpot_ms.p50" not in html   # (the default columns have it)
