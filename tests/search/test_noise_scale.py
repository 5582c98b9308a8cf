"""The gradient noise scale estimator against a problem where B_simple has a closed form."""

import pytest
import torch

from advisor.noise_scale import estimate_noise_scale, samples_ratio

DIMENSIONS = 10
NOISE_VARIANCE = 2.0


def _linear_regression_norms(
    micro_batch: int, micro_steps: int, steps: int, seed: int = 0
) -> tuple[list[float], list[float], float]:
    """Squared gradient norms of ½(w·x - y)² at a fixed w: each step's first micro-batch, and the
    mean over its `micro_steps` micro-batches (what gradient accumulation yields).

    With x ~ N(0, I_d), y = w*·x + ε, ε ~ N(0, σ²) and δ = w - w*: G = δ and
    tr(Σ) = E[r² |x|²] - |δ|² = |δ|²(d + 1) + σ² d, so B_simple = d + 1 + σ² d / |δ|².
    """
    generator = torch.Generator().manual_seed(seed)
    delta = torch.randn(DIMENSIONS, generator=generator, dtype=torch.float64)
    delta /= delta.norm()  # |δ| = 1
    small, big = [], []
    for _ in range(steps):
        gradients = []
        for _ in range(micro_steps):
            x = torch.randn(micro_batch, DIMENSIONS, generator=generator, dtype=torch.float64)
            noise = torch.randn(micro_batch, generator=generator, dtype=torch.float64)
            residual = x @ delta - NOISE_VARIANCE**0.5 * noise
            gradients.append((residual[:, None] * x).mean(dim=0))
        small.append(float(gradients[0].square().sum()))
        big.append(float(torch.stack(gradients).mean(dim=0).square().sum()))
    truth = DIMENSIONS + 1 + NOISE_VARIANCE * DIMENSIONS
    return small, big, truth


@pytest.mark.parametrize(("micro_batch", "micro_steps"), [(8, 4), (16, 8), (32, 2)])
def test_recovers_the_closed_form_noise_scale_within_a_quarter(micro_batch, micro_steps):
    small, big, truth = _linear_regression_norms(micro_batch, micro_steps, steps=1000)
    estimate = estimate_noise_scale(small, big, micro_batch, micro_batch * micro_steps)
    assert estimate.value == pytest.approx(truth, rel=0.25)
    assert estimate.low < truth < estimate.high  # the 95 % interval covers it
    assert estimate.gradient_sq == pytest.approx(1.0, rel=0.25)  # |δ|² = 1


def test_more_steps_narrow_the_interval():
    narrow = estimate_noise_scale(*_linear_regression_norms(8, 4, steps=800)[:2], 8, 32)
    wide = estimate_noise_scale(*_linear_regression_norms(8, 4, steps=50)[:2], 8, 32)
    assert narrow.high - narrow.low < wide.high - wide.low


def test_pure_noise_has_no_noise_scale_to_state():
    """At the optimum (δ = 0) the gradient is noise alone: |G|² is about 0 and may come out
    negative; then no value is stated."""
    generator = torch.Generator().manual_seed(1)
    small, big = [], []
    for _ in range(200):
        grads = torch.randn(4, DIMENSIONS, generator=generator, dtype=torch.float64) / 8**0.5
        small.append(float(grads[0].square().sum()))
        big.append(float(grads.mean(dim=0).square().sum()))
    estimate = estimate_noise_scale(small, big, 8, 32)
    assert estimate.value is None or estimate.low == 0.0


def test_a_big_batch_norm_above_the_small_one_states_no_noise_scale():
    estimate = estimate_noise_scale([1.0, 1.01, 0.99], [1.05, 1.06, 1.04], 8, 32)
    assert estimate.trace_sigma < 0 and estimate.value is None and estimate.low is None


def test_samples_ratio_follows_the_empirical_model():
    assert samples_ratio(100.0, 32, 32) == 1.0
    assert samples_ratio(100.0, 32, 4096) == pytest.approx(4196 / 132)  # far past B_simple
    assert samples_ratio(1e9, 32, 4096) == pytest.approx(1.0, rel=1e-5)  # far below it


def test_bad_batch_pairs_are_rejected():
    with pytest.raises(ValueError, match="must exceed"):
        estimate_noise_scale([1.0, 2.0], [1.0, 2.0], 32, 32)
    with pytest.raises(ValueError, match="same number"):
        estimate_noise_scale([1.0], [1.0], 8, 32)
