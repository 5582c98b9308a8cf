"""`--memory-budget`: what it accepts, what it covers, and a tune whose own configuration does
not fit it (`advisor.memory`, the walk in `advisor.search.staging`)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from advisor.knobs import TrialConfig
from advisor.memory import MemoryBudget
from advisor.results import GpuInfo, HardwareProfile
from advisor.search.memory import GLIBC_NOTE, budget_summary, memory_limit
from advisor.settings import TuneSettings
from tests.conftest import TINY, advisor_here
from tests.scripted_runner import ScriptedRunner, scripted_tune

HOST = HardwareProfile(
    cpu_model="x", cores=2, memory_bytes=24 * 2**30, cpu_capability="AVX2", cpu_bf16=False,
    python_version="3.11", torch_version="2.13.0",
    gpus=(GpuInfo(name="A100", memory_bytes=80 * 2**30, capability="8.0", bf16=True),),
)  # fmt: skip


@pytest.mark.parametrize(
    ("given", "size", "share"),
    [
        ("2GiB", 2 * 2**30, None),
        ("512 MB", 512 * 10**6, None),
        ("1.5g", int(1.5e9), None),
        (3 * 2**30, 3 * 2**30, None),
        ("0.8", None, 0.8),
        ("80%", None, 0.8),
        (1, None, 1.0),
    ],
)
def test_a_budget_is_bytes_with_a_unit_or_a_share_of_the_device(given, size, share):
    budget = TuneSettings(spec="a.py:f", memory_budget=given).memory_budget
    assert budget is not None and budget.bytes == size and budget.fraction == share


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("abc", "give bytes with a unit (2GiB, 512MB) or a share"),
        ("2", "under 1 MiB: give a unit, e.g. 2GiB"),
        ("12 kb", "under 1 MiB: no training fits in it"),
        ("150%", "within (0, 1]"),
        ("2 parsecs", "is not a memory budget"),
    ],
)
def test_a_budget_that_is_neither_says_what_would_be(given, says):
    with pytest.raises(ValidationError, match=r"memory budget|1 MiB|\(0, 1\]") as raised:
        TuneSettings(spec="a.py:f", memory_budget=given)
    assert says in str(raised.value)


def test_a_share_is_of_the_gpu_on_cuda_and_of_the_host_on_cpu_and_none_keeps_the_headroom():
    share = MemoryBudget.model_validate("50%")
    on_gpu = memory_limit(share, 0.1, TrialConfig(device="cuda", batch_size=8), HOST)
    assert (on_gpu.bytes, on_gpu.where) == (40 * 2**30, "GPU")
    on_host = memory_limit(share, 0.1, TrialConfig(batch_size=8), HOST)
    assert (on_host.bytes, on_host.where) == (12 * 2**30, "host")
    assert on_host.problem(13 * 2**30) == "peak host memory 13.0 GiB > budget 12.0 GiB"
    headroom = memory_limit(None, 0.1, TrialConfig(device="cuda", batch_size=8), HOST)
    assert headroom.bytes == int(0.9 * 80 * 2**30) and not headroom.budget
    assert "leaves less than 10% of 80.0 GiB free" in (headroom.problem(79 * 2**30) or "")


def test_a_bad_budget_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    completed = advisor_here(
        "tune", f"{TINY}:factory", "--out", str(tmp_path), "--memory-budget", "lots"
    )
    assert completed.returncode == 2 and "Traceback" not in completed.stderr
    assert "memory_budget" in completed.stderr and "is not a memory budget" in completed.stderr


def _activation_heavy(config: TrialConfig) -> int:
    """activation_heavy's peak: 16 MiB of activations per sample of the micro-batch on top of
    the process's own, each rank's adding up on the host; accumulation only repeats it."""
    return (400 + 16 * config.batch_size) * 2**20 * config.world_size


def test_a_tune_whose_own_configuration_does_not_fit_keeps_its_batch_within_the_budget(tmp_path):
    """Batch 32 of 16 MiB activations per sample, a budget between the peaks of micro-batches
    16 and 32: the baseline is over it, said so, and the walk from it splits the batch by
    accumulation; the recommendation keeps global batch 32 and its re-runs stay within."""
    small, large = (_activation_heavy(TrialConfig(batch_size=batch)) for batch in (16, 32))
    budget = (small + large) // 2
    settings = TuneSettings(
        spec=f"{TINY}:factory", out=tmp_path / "tune", trials=5, trial_seconds=0.5,
        race_seconds=0, memory_budget=budget, confirm_max_repeats=3,
    )  # fmt: skip
    # samples/s grows with the micro-batch: what does not fit would be the fastest
    result = scripted_tune(settings, ScriptedRunner(peak=_activation_heavy))

    rec = result.recommendation
    baseline = next(t for t in result.trials if t.role == "baseline")
    assert baseline.infeasible_reason is not None and "> budget" in baseline.infeasible_reason
    assert rec.config.global_batch_size == 32 and rec.config.batch_size < 32
    assert rec.memory_budget is not None and rec.memory_budget.baseline_over
    assert "your configuration among them" in rec.memory_budget.statement
    assert rec.baseline_samples_per_s is None  # it ran, but what does not fit is no baseline
    assert [w.kind for w in rec.warnings if w.kind.startswith("baseline")] == [
        "baseline-over-budget"
    ]
    reruns = [t for t in result.confirmations if t.result.config == rec.config]
    assert reruns and all((t.result.peak_memory_bytes or 0) <= budget for t in reruns)
    report = (tmp_path / "tune" / "report.md").read_text()
    assert "**Memory:** memory budget" in report and "your configuration among them" in report
    assert "(your configuration does not fit the memory budget, so no speed-up" in report
    assert "> **Note:** your configuration does not fit the memory budget: no speed-up" in report


def _ran(number: int, config: TrialConfig, rate: float, peak_mib: int, role: str = "search"):
    from advisor.results import TrialRecord, TrialResult

    result = TrialResult(
        config=config, status="ok", samples_per_s=rate, peak_memory_bytes=peak_mib * 2**20
    )
    limit = 1024 * 2**20
    reason = "peak host memory > budget" if peak_mib * 2**20 > limit else None
    return TrialRecord(number=number, role=role, result=result, infeasible_reason=reason)


def test_the_summary_names_what_went_over_and_what_checkpointing_bought():
    budget = MemoryBudget.model_validate("1GiB")
    trials = [
        _ran(0, TrialConfig(batch_size=32), 100.0, 1500, role="baseline"),
        _ran(1, TrialConfig(batch_size=8, accumulation_steps=4), 80.0, 700),
        _ran(2, TrialConfig(batch_size=32, activation_checkpointing="Block"), 120.0, 900),
        _ran(3, TrialConfig(batch_size=16, accumulation_steps=2), 90.0, 1100),
    ]
    mimalloc = HOST.model_copy(update={"allocator": "mimalloc"})
    summary = budget_summary(budget, 0.1, trials, mimalloc, global_batch=32)
    assert summary is not None and summary.baseline_over
    assert [number for number, _ in summary.over] == [0, 3]
    assert summary.statement == (
        "memory budget 1.0 GiB (the trial's processes together): 2 of 4 configurations that ran "
        "went over it (peaks 1.07 GiB to 1.46 GiB); your configuration among them, at 1.46 GiB. "
        "checkpointing: micro-batch 8 → 32 within 1.0 GiB, 1.50x samples/s at global batch 32"
    )
    # Under glibc's malloc the peaks understate what checkpointing saves, and the summary says
    # so; where nothing was checkpointed there is nothing to qualify.
    under_glibc = budget_summary(budget, 0.1, trials, HOST, global_batch=32)
    assert under_glibc is not None
    assert under_glibc.statement == f"{summary.statement} ({GLIBC_NOTE})"
    unchecked = budget_summary(budget, 0.1, trials[:2], HOST, global_batch=32)
    assert unchecked is not None and "glibc" not in unchecked.statement
    slower = [
        *trials[:2],
        _ran(2, TrialConfig(batch_size=32, activation_checkpointing="Block"), 60.0, 900),
    ]
    said = budget_summary(budget, 0.1, slower, mimalloc, global_batch=32)
    assert said is not None and "checkpointing did not pay: micro-batch 8 → 32" in said.statement
    assert budget_summary(None, 0.1, trials, HOST, global_batch=32) is None
    smaller = budget_summary(budget, 0.1, slower, mimalloc, global_batch=16)  # the race's choice
    assert smaller is not None and smaller.statement.endswith("at global batch 32")  # yours


def test_on_cpu_ranks_are_known_not_to_fit_where_one_process_did_not():
    """The ranks' peaks add up on the host: two DDP or FSDP ranks at a micro-batch need at least
    one process's memory at it, so they are not run where that went over; smaller micro-batches,
    other knobs and a GPU's own memory are no inference."""
    from advisor.search.checks import known_out_of_memory

    over = _ran(3, TrialConfig(batch_size=16), 10.0, peak_mib=1500)
    sharded = TrialConfig(batch_size=32, parallel_mode="fsdp", world_size=2)
    assert known_out_of_memory(sharded, [over]) == (
        "batch 32 needs at least the memory of batch 16 in one process, whose peak host memory "
        "> budget in trial 3"
    )
    ddp = TrialConfig(batch_size=16, parallel_mode="ddp", world_size=2, accumulation_steps=2)
    assert known_out_of_memory(ddp, [over]) is not None
    assert known_out_of_memory(sharded.model_copy(update={"batch_size": 8}), [over]) is None
    checkpointed = sharded.model_copy(update={"activation_checkpointing": "Block"})
    assert known_out_of_memory(checkpointed, [over]) is None
    on_gpus = _ran(3, TrialConfig(device="cuda", batch_size=16), 10.0, peak_mib=1500)
    assert known_out_of_memory(sharded.model_copy(update={"device": "cuda"}), [on_gpus]) is None
