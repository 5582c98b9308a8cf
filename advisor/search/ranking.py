"""What the search ranks configurations by: goodput under the time-to-loss objective.

A global batch B needs about (phi + B) / (phi + B0) times the samples of the user's batch B0 to
reach a loss (`advisor.search.noise`), so a configuration approaches the user's loss at its
samples/s over that ratio: its goodput (AdaptDL's throughput x statistical efficiency). The
ratio is taken at the end of phi's interval that favours the batch, since phi grows as training
goes on: the search measures every batch that might win, and the race decides. Without a noise
scale (before it is measured, where it failed, under `--objective throughput`) the ratio is 1
and goodput is samples/s.
"""

from __future__ import annotations

from dataclasses import dataclass

import optuna

from advisor.noise_scale import optimistic_ratio
from advisor.results import NoiseScale
from advisor.search.context import SearchContext
from advisor.search.noise import measure_noise_scale

__all__ = ["Ranking", "measure_ranking", "ranks_by_goodput"]


@dataclass(frozen=True)
class Ranking:
    """The user's global batch `batch0` and the noise scale measured at it, if any."""

    batch0: int
    noise: NoiseScale | None = None

    def samples_ratio(self, batch: int) -> float:
        """The samples global batch `batch` needs relative to `batch0`, at phi's favourable end."""
        return optimistic_ratio(self.noise, self.batch0, batch)


def ranks_by_goodput(context: SearchContext) -> bool:
    """Whether the search ranks by goodput: the time-to-loss objective with a race between
    global batches (its noise scale measured before the search goes beyond the user's batch)."""
    settings = context.settings
    return (
        settings.objective == "time-to-loss"
        and settings.race_seconds > 0
        and context.space.global_batch_size is None
    )


def measure_ranking(study: optuna.Study, context: SearchContext) -> Ranking:
    """The ranking by goodput: the noise scale of the user's configuration, measured once (a
    resumed study keeps its figure); where it fails, samples/s ranks, as before it."""
    baseline = context.space.baseline
    context.progress.stage(
        "measuring the gradient noise scale of your configuration: it says which larger "
        "global batches can reach your loss sooner"
    )
    noise = measure_noise_scale(study, context, baseline)
    return Ranking(baseline.global_batch_size, noise if noise and noise.value else None)
