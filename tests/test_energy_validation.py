"""The README's energy figures, recomputed from the shipped measurements (experiments/data/energy):
the fitted shares are what tools/derive_roofline.py derives, the A6000 pulses land where the
README says, and its ML.ENERGY summary is what tools/validate_energy.py prints."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import derive_roofline  # noqa: E402
import energy_data  # noqa: E402
import validate_energy  # noqa: E402

from schedlab_plugins.power.fits import FITS  # noqa: E402
from schedlab_plugins.power.utilisation import DERIVATION  # noqa: E402


def test_the_shipped_defaults_are_what_the_derivation_prints():
    derived = derive_roofline.derive_power()
    assert {k: derived[k] for k in DERIVATION} == DERIVATION
    for name, fit in derived["fits"].items():
        assert FITS[name]["points"] == fit["points"] and FITS[name]["by"] == fit["by"]


def test_output_lengths_read_off_the_log_add_up_to_its_token_counts():
    import csv

    for tp in (1, 2):
        requests = energy_data.pulse_requests(tp)
        with open(energy_data.DATA / "llmservingsim-power" / f"vllm_log_tp{tp}.csv") as fh:
            logged = sum(float(r["generation_tput"]) for r in csv.DictReader(fh))
        assert len(requests) == 30
        assert sum(r["output_tokens"] for r in requests) == pytest.approx(logged, rel=0.01)


@pytest.fixture(scope="module")
def pulses(tmp_path_factory):
    return validate_energy.pulses(tmp_path_factory.mktemp("pulses"))


@pytest.mark.parametrize("tp", [1, 2])
def test_a6000_pulses_as_the_readme_says(pulses, tp):
    report = pulses[tp]["timed"]
    for window in report["windows"]:
        bound = 0.05 if window["window"].startswith("pulse") else 0.09  # the gaps: see the README
        assert abs(window["error"]) <= bound, window
    assert abs(report["energy_error"]) <= 0.03


def test_the_readme_shows_what_the_validation_prints(pulses):
    text = validate_energy.markdown(pulses, validate_energy.sweeps())
    readme = (ROOT / "README.md").read_text()
    for line in text.splitlines():
        if line.startswith(("| 1 |", "| 2 |", "Held out:")):
            assert line in readme, f"README is missing: {line}"
