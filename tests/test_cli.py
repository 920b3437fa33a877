"""The command line: exit codes, messages without tracebacks, files written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


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
