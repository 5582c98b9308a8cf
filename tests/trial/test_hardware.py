"""The probe times low precision against fp32, and the space leaves out what cannot pay off.

The real probe runs in a child process with bf16 simulated (benchmarks/simulate): slow, as on a
CPU without native bf16, or as fast as fp32, so both kinds of machine are covered on any CPU.
"""

from __future__ import annotations

import json

import pytest

from advisor.knobs import SLOW_PRECISION
from advisor.results import HardwareProfile
from advisor.search.space import build_space
from advisor.settings import TuneSettings
from advisor.trial.parent import hardware
from advisor.trial.parent.hardware import probe_isolated
from tests.conftest import CPU_PROFILE, ROOT
from tests.search.test_space import TASK


@pytest.fixture(autouse=True)
def _probe_for_real(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ADVISOR_PROBE_CACHE", raising=False)


def _probe_with(monkeypatch: pytest.MonkeyPatch, bf16: str):
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "benchmarks" / "simulate"))
    monkeypatch.setenv("ADVISOR_SIMULATE_BF16", bf16)
    return probe_isolated()


def test_probe_fixes_amp_off_where_bf16_is_slower_and_says_the_measured_rates(monkeypatch):
    """Measured with the simulated slow-down: amp is fixed off, with the rates; naming it in
    --knobs searches it anyway."""
    hardware = _probe_with(monkeypatch, "slow:20")
    peaks = hardware.cpu_peak_flops
    assert peaks["bf16"] < SLOW_PRECISION * peaks["fp32"]

    space = build_space(TuneSettings(spec="a.py:f", device="cpu"), hardware, TASK)

    assert "amp" not in space.domains
    amp = next(knob for knob in space.fixed if knob.name == "amp")
    assert amp.value == "off"
    assert f"{peaks['bf16'] / 1e9:,.1f} GFLOP/s" in amp.reason
    assert f"against {peaks['fp32'] / 1e9:,.1f} for fp32" in amp.reason
    assert "--knobs classic,amp" in amp.reason
    named = TuneSettings(spec="a.py:f", device="cpu", knobs="classic,amp")
    assert build_space(named, hardware, TASK).domains["amp"] == ("off", "bf16")


def test_bf16_as_fast_as_fp32_stays_in_the_search(monkeypatch):
    hardware = _probe_with(monkeypatch, "fp32")
    assert hardware.cpu_peak_flops["bf16"] >= SLOW_PRECISION * hardware.cpu_peak_flops["fp32"]

    space = build_space(TuneSettings(spec="a.py:f", device="cpu"), hardware, TASK)

    assert space.domains["amp"] == ("off", "bf16")


def test_the_probe_runs_as_a_fork_of_the_launcher_or_else_in_a_fresh_interpreter(monkeypatch):
    forked = probe_isolated()  # the launcher's fork: torch already imported
    monkeypatch.setenv("ADVISOR_TEST_LATIN1", "caf\udce9")  # no UTF-8: the orders' JSON cannot
    fresh = probe_isolated()  # carry it, so a fresh interpreter probes instead
    assert forked.model_dump(exclude={"cpu_peak_flops"}) == fresh.model_dump(
        exclude={"cpu_peak_flops"}
    )
    assert set(forked.cpu_peak_flops) == set(fresh.cpu_peak_flops) == {"fp32", "bf16"}
    assert all(
        rate > 0 for rate in (*forked.cpu_peak_flops.values(), *fresh.cpu_peak_flops.values())
    )


def test_a_cached_probe_serves_the_same_conditions_and_only_them(monkeypatch, tmp_path):
    """The cache alone: each probe it cannot serve is counted, and names the probe it was."""
    probes: list[str] = []

    def probe() -> HardwareProfile:
        probes.append(f"probe {len(probes) + 1}")
        return CPU_PROFILE.model_copy(update={"cpu_model": probes[-1]})

    monkeypatch.setattr(hardware, "_probe", probe)
    cache = tmp_path / "probe.json"
    monkeypatch.setenv("ADVISOR_PROBE_CACHE", str(cache))
    probed = probe_isolated()
    (_, stored), *_ = json.loads(cache.read_text()).items()
    assert HardwareProfile.model_validate(stored) == probed
    assert probe_isolated() == probed and probes == ["probe 1"]  # served without probing

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # shapes the peaks: probed anew, both kept
    assert probe_isolated().cpu_model == "probe 2"
    assert len(json.loads(cache.read_text())) == 2
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert probe_isolated().cpu_model == "probe 1"
    cache.write_text("not json")
    assert probe_isolated().cpu_model == "probe 3"
