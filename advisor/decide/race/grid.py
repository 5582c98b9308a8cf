"""The sample counts every racer of a race is evaluated at (docs/method.md, "One grid for all").

A racer judged on a coarser grid than another reads its crossing of the target later, by linear
interpolation over a convex curve: a bias for whoever is evaluated more finely. So every racer
of a race, in every replicate, is evaluated at the same sample counts: a geometric grid, each
count `GRID_STEP` times the one before, so each crossing is resolved to the same share of the
samples wherever it falls. A racer evaluates at its first optimizer step at or past each count
(a larger global batch cannot be evaluated between its steps). The grid starts at `GRID_START`
of the samples the user's configuration trains on in the race time (no racer reaches the
target 30 times sooner in samples; from 1/8, examples/mlp.py's racers all crossed at the first
count: its loss levels off at a tenth of the race) and reaches as far as the fastest racer
could train in that time, with room to spare (`GRID_SLACK`: the machine may run faster than
its re-runs did; a racer stops at the grid's end).
"""

from __future__ import annotations

import math

__all__ = ["GRID_STEP", "sample_grid"]

GRID_STEP = 1.1  # each count of the grid over the one before
GRID_START = 1 / 32  # of the samples the baseline trains on in the race time: the first count
GRID_SLACK = 4.0  # of the samples the fastest racer is expected to train on in the race time


def sample_grid(unit: int, baseline_samples: float, most_samples: float) -> tuple[int, ...]:
    """Ascending sample counts, whole multiples of `unit` (the smallest global batch), from
    `GRID_START` of `baseline_samples` to `most_samples` x `GRID_SLACK`, each about
    `GRID_STEP` times the one before."""
    unit = max(unit, 1)
    first = max(unit, math.ceil(baseline_samples * GRID_START / unit) * unit)
    end = max(most_samples * GRID_SLACK, first)
    grid, exact = [first], float(first)
    while grid[-1] < end:
        exact *= GRID_STEP
        grid.append(max(grid[-1] + unit, round(exact / unit) * unit))
    return tuple(grid)
