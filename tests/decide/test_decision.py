"""FLOPs per sample are counted from a real step; the fraction of peak uses the right peak."""

import pytest

from advisor.api import validate
from advisor.decide.recommendation import efficiency
from advisor.knobs import TrialConfig
from advisor.results import GpuInfo
from tests.conftest import CPU_PROFILE, TINY

CPU = CPU_PROFILE.model_copy(update={"cpu_peak_flops": {"fp32": 2e11, "bf16": 8e11}})
A100 = GpuInfo(
    name="A100", memory_bytes=80 * 2**30, capability="8.0", bf16=True,
    peak_flops={"fp32": 1.9e13, "bf16": 2.9e14, "fp16": 2.9e14},
)  # fmt: skip


@pytest.fixture(scope="module")
def task():
    return validate(f"{TINY}:factory").task


def test_flops_per_sample_are_those_of_the_layers_forward_and_backward(task):
    # Linear(8, 16) then Linear(16, 2), 2 FLOPs a multiply-add: forward 256 + 64; backward the
    # weight gradients (256 + 64) and the second layer's input gradient (64); the first layer's
    # input needs none.
    assert task.flops_per_sample == 704


def test_fraction_of_peak_uses_the_dtype_the_step_computes_in(task):
    fp32 = efficiency(TrialConfig(batch_size=32), 1e6, task, CPU)
    assert fp32.dtype == "fp32" and fp32.achieved_flops == 704e6
    assert fp32.fraction_of_peak == pytest.approx(704e6 / 2e11)
    bf16 = efficiency(TrialConfig(batch_size=32, amp="bf16"), 1e6, task, CPU)
    assert bf16.peak_flops == 8e11 and bf16.devices == "2 CPU cores"


def test_every_gpu_a_parallel_mode_uses_counts_toward_the_peak(task):
    four = CPU.model_copy(update={"gpus": (A100,) * 4})
    ddp = TrialConfig(device="cuda", parallel_mode="ddp", world_size=2, batch_size=32, amp="bf16")
    assert efficiency(ddp, 1e6, task, four).peak_flops == 2 * 2.9e14
    dp = TrialConfig(device="cuda", parallel_mode="dp", batch_size=32)
    assert efficiency(dp, 1e6, task, four).peak_flops == 4 * 1.9e13


def test_no_claim_without_a_count_or_a_peak(task):
    uncounted = task.model_copy(update={"flops_per_sample": None})
    assert efficiency(TrialConfig(batch_size=32), 1e6, uncounted, CPU) is None
    assert efficiency(TrialConfig(batch_size=32), 1e6, task, CPU_PROFILE) is None  # no peak
