"""The command line: exit codes, messages without tracebacks, files written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from schedlab.cli import main

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "experiments" / "quickstart.toml"


def test_run_writes_summary_requests_and_config(tmp_path, capsys):
    out = tmp_path / "qs"
    assert main(["run", str(QUICKSTART), "--out", str(out), "--no-plots"]) == 0
    table = capsys.readouterr().out
    assert "static" in table and "continuous" in table and "ttft_ms.p99" in table
    summary = json.loads((out / "summary.json").read_text())
    runs = {r["name"]: r for s in summary["studies"] for r in s["runs"]}
    assert set(runs) == {"static", "continuous"}
    assert runs["continuous"]["metrics"]["throughput_tps"] > runs["static"]["metrics"]["throughput_tps"]
    rows = (out / "requests.csv").read_text().strip().split("\n")
    assert len(rows) == 1 + 2 * 100
    assert json.loads((out / "config.json").read_text())["static"]["scheduler"] == {"kind": "static", "batch_size": 16}
    assert not list(out.glob(".*tmp"))


def test_errors_are_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('[workload]\nkind = "fil"\n')
    assert main(["run", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("schedlab: error: ") and "unknown workload 'fil'" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()
    assert main(["run", str(tmp_path / "missing.toml")]) == 2
    assert "no such experiment file" in capsys.readouterr().err


def test_validate_and_plugins(capsys):
    assert main(["validate", str(ROOT / "experiments" / "lab.toml")]) == 0
    assert "OK" in capsys.readouterr().out
    assert main(["plugins", "-v"]) == 0
    listing = capsys.readouterr().out
    for name in ("static", "continuous", "linear", "paged", "file", "closed_loop", "lab"):
        assert f"  {name} " in listing
    assert "max_num_seqs = 256" in listing


def test_capacity_command(capsys):
    assert main(["capacity", "--model", "llama-3-8b", "--gpu", "a100-80gb", "--avg-tokens", "1000",
                 "--p99-tokens", "8000"]) == 0
    text = capsys.readouterr().out
    assert "128" in text and "KiB" in text
    assert main(["capacity", "--model", "llama-9", "--gpu", "a100-80gb"]) == 2
    assert "llama-3-8b" in capsys.readouterr().err


def test_installed_console_script_runs():
    done = subprocess.run([sys.executable, "-m", "schedlab.cli", "validate", str(QUICKSTART)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_python_dash_m_schedlab_is_the_command():
    done = subprocess.run([sys.executable, "-m", "schedlab", "validate", str(QUICKSTART)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{QUICKSTART}: OK (2 run entries")
    done = subprocess.run([sys.executable, "-m", "schedlab", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "usage: schedlab" in done.stdout


def test_plugins_verbose_prints_defaults_as_toml(capsys):
    """Factory defaults printed as ``Factory(factory=<class 'dict'>, ...)`` before."""
    assert main(["plugins", "-v"]) == 0
    listing = capsys.readouterr().out
    assert "Factory(" not in listing and "<class" not in listing and "<function" not in listing
    assert "      overlays = {}  " in listing             # attrs.Factory(dict)
    assert '      policy = "fcfs"  ' in listing            # text quoted as in TOML
    assert "      prefix_caching = false  " in listing     # TOML booleans
    assert '      columns = ["finished", "ttft_ms.p50"' in listing
    assert "      num_blocks = (unset)  " in listing and "      path = (required)  " in listing


def test_set_can_target_one_run(tmp_path, capsys):
    from schedlab.study.experiment import load

    exp = load(QUICKSTART, ["runs.static.scheduler.batch_size=4", "workload.limit=50"])
    tables = {s.name: s.base.tables for s in exp.studies}
    assert tables["static"]["scheduler"] == {"kind": "static", "batch_size": 4}
    assert tables["continuous"]["scheduler"] == {"kind": "continuous", "max_num_seqs": 16}
    assert tables["static"]["workload"]["limit"] == tables["continuous"]["workload"]["limit"] == 50
    out = tmp_path / "o"
    assert main(["run", str(QUICKSTART), "--no-plots", "--out", str(out),
                 "--set", "runs.continuous.scheduler.max_num_seqs=2"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["continuous"]["scheduler"]["max_num_seqs"] == 2 and config["static"]["scheduler"]["batch_size"] == 16
    capsys.readouterr()


@pytest.mark.parametrize("assignment, message", [
    ("runs.nope.scheduler.batch_size=4", "no run named 'nope' in"),
    ("runs.static.batch_size=4", "write runs.<run name>.<table>.<key>"),
    ("runs.static.name=other", "write runs.<run name>.<table>.<key>"),   # (seed, engine, replicas: settable)
    ("runs.static.replicas=0", "[[runs]] 'static': replicas must be a whole number from 1"),
    ("runs.static.scheduler.batch_sise=4", "[[runs]] 'static' [scheduler]: unknown key 'batch_sise'"),
])
def test_set_for_one_run_explains_mistakes(capsys, assignment, message):
    assert main(["validate", str(QUICKSTART), "--set", assignment]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_reader_that_stops_early_ends_the_command_quietly():
    """`schedlab plugins -v | head -1` printed a BrokenPipeError traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "schedlab", "plugins", "-v"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout.readline()
    proc.stdout.close()  # the reader goes away, as head does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == ""


def test_plugins_v_lists_a_text_settings_choices(capsys):
    """A tuner looked for the values of policy and preemption; only the error messages had them."""
    assert main(["plugins", "-v"]) == 0
    out = capsys.readouterr().out
    continuous = out[out.index("  continuous "):]
    assert '      preemption = "recompute"  one of "recompute", "swap": what a preemption does' in continuous
    assert '      policy = "fcfs"  one of "fcfs", "priority", "sjf", "lof": waiting order' in continuous


def test_a_run_whose_reader_stops_early_still_writes_its_results(tmp_path):
    """`schedlab run ... | true` threw the whole run away, blaming the built-in table report for
    a BrokenPipeError (exit 2)."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "schedlab", "run", str(QUICKSTART), "--no-plots", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader goes away before the table is printed
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141, err
    assert "Traceback" not in err and "error" not in err
    assert (out / "summary.json").exists() and (out / "summary.txt").exists()


@pytest.mark.parametrize("command", [["validate", str(QUICKSTART)], ["plugins"]])
def test_a_closed_stdout_is_one_line_not_a_traceback(command):
    """`schedlab validate exp.toml >&-` printed an AttributeError traceback (exit 1)."""
    proc = subprocess.run(["sh", "-c", 'exec "$0" -m schedlab "$@" >&-', sys.executable, *command],
                          stderr=subprocess.PIPE, timeout=300)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and err == "schedlab: error: could not write to the standard output (it is closed)\n"


def test_a_run_with_a_closed_stdout_writes_its_results(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(["sh", "-c", 'exec "$0" -m schedlab "$@" >&-', sys.executable, "run", str(QUICKSTART),
                           "--no-plots", "--out", str(out)], stderr=subprocess.PIPE, timeout=300)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and err.endswith(
        "schedlab: error: could not write to the standard output (it is closed); what went to files is written\n")
    assert (out / "summary.json").exists()


@pytest.mark.parametrize("command", ["run", "hunt"])
@pytest.mark.parametrize("options, message", [
    (["--jobs", "0"], "--jobs must be a whole number >= 1, got 0"),
    (["--address", "auto"], "--address is for --backend ray"),
    (["--out", ""], "--out: names no folder (an empty path); leave --out out for results/<experiment name>"),
])
def test_options_no_executor_takes_are_refused_before_anything_is_read_or_made(tmp_path, capsys, command, options,
                                                                                message):
    """They were checked after the experiment loaded and its banner printed, with --out's parent
    folders made; an empty --out wrote to (and replaced) results/<name>."""
    file = str(ROOT / "experiments" / "hunt" / "chunked_ttft.toml") if command == "hunt" else str(QUICKSTART)
    out = ["--out", str(tmp_path / "a" / "b")] if "--out" not in options else []
    assert main([command, file, *out, *options]) == 2
    assert capsys.readouterr().err == f"schedlab: error: {message}\n"
    assert not (tmp_path / "a").exists()


def test_no_plots_and_report_plots_together_are_refused(tmp_path, capsys):
    """--no-plots dropped the plots --report asked for, without a word."""
    assert main(["run", str(QUICKSTART), "--no-plots", "--report", "plots", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == ("schedlab: error: --no-plots and --report plots: one skips the plots the other "
                                       "asks for; give one\n")
    assert not (tmp_path / "o").exists()


def test_a_compare_report_with_nothing_to_compare_says_so(tmp_path, capsys):
    assert main(["run", str(QUICKSTART), "--no-plots", "--report", "compare", "--out", str(tmp_path / "o")]) == 0
    assert ("schedlab: compare report: no run replays a measured run (a vllm_log or vllm_bench workload) or has a "
            "[target]; compare.txt not written\n") in capsys.readouterr().err
    assert not (tmp_path / "o" / "compare.txt").exists()


def test_a_ray_address_where_nothing_answers_is_refused_at_once():
    """ray.init retried 127.0.0.1:1 for minutes, printing Ray's warnings (the command hung)."""
    import socket

    from schedlab.errors import ConfigError
    from schedlab.study.ray_backend import _check_reachable

    with socket.socket() as bound:  # a port of ours that does not listen: the connection is refused
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
            with pytest.raises(ConfigError, match=rf"^--address {address}: cannot connect to a Ray cluster: nothing "
                                                  r"answers there \("):
                _check_reachable(address)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        _check_reachable(f"127.0.0.1:{listening.getsockname()[1]}")  # answers: Ray is asked
    _check_reachable("auto")
    _check_reachable(None)


def test_version_and_a_missing_command_say_so_once(capsys):
    import schedlab

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"schedlab {schedlab.__version__}"
    with pytest.raises(SystemExit) as done:
        main([])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.startswith("schedlab: error: the following arguments are required")
