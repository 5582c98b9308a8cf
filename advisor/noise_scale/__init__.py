"""The gradient noise scale (McCandlish et al. 2018): its estimator from gradient norms at two
batch sizes (`_estimate`, pure arithmetic, shared by the trial child's probes and the search),
and what it predicts per global batch (`_prediction`: samples, time, which batches race)."""

from advisor.noise_scale._estimate import NoiseScaleEstimate, estimate_noise_scale
from advisor.noise_scale._prediction import (
    MAX_RACE_BATCHES,
    noise_track,
    optimistic_ratio,
    predict_batches,
    race_finalists,
    samples_ratio,
)

__all__ = [
    "MAX_RACE_BATCHES",
    "NoiseScaleEstimate",
    "estimate_noise_scale",
    "noise_track",
    "optimistic_ratio",
    "predict_batches",
    "race_finalists",
    "samples_ratio",
]
