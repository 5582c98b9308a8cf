"""Re-measure a recommendation independently and compare with what it claims.

    python benchmarks/remeasure.py reports/data_bound-factory/recommendation.json [--repeats 3]

Runs the recommended configuration and the baseline again as fresh isolated trials (new
processes, after the tuning run is over, the two interleaved) and prints each one's median
samples/s next to the figure in recommendation.json.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from advisor.decide.claims import COVERAGE
from advisor.decide.paired_ratio import paired_ratio
from advisor.knobs import TrialConfig
from advisor.results import Recommendation
from advisor.trial.orders import WindowOrder
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch


def remeasure(
    launch: TrialLaunch, configs: tuple[TrialConfig, TrialConfig], repeats: int
) -> tuple[list[float], list[float]]:
    """samples/s of each of two configurations, `repeats` runs each, interleaved (the order
    alternating) so that a machine that drifts slows both alike."""
    rates: tuple[list[float], list[float]] = ([], [])
    with tempfile.TemporaryDirectory() as logs:
        for index in range(repeats):
            order = (0, 1) if index % 2 == 0 else (1, 0)
            for which in order:
                log = Path(logs) / f"{which}-{index}.log"
                result = ProcessRunner(launch).run(WindowOrder(config=configs[which]), log)
                rates[which].append(result.samples_per_s or 0.0)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recommendation", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trial-seconds", type=float, default=3.0)
    args = parser.parse_args()
    rec = Recommendation.model_validate_json(args.recommendation.read_text())
    launch = TrialLaunch(
        spec=rec.spec,
        cwd=Path(rec.workdir),
        warmup_steps=3,
        trial_seconds=args.trial_seconds,
        timeout_s=600,
    )
    medians = {}
    measured = remeasure(launch, (rec.config, rec.baseline_config), args.repeats)
    for name, config, claim, rates in (
        ("recommended", rec.config, rec.samples_per_s, measured[0]),
        ("baseline", rec.baseline_config, rec.baseline_samples_per_s, measured[1]),
    ):
        medians[name] = statistics.median(rates)
        versus = f", {medians[name] / claim - 1:+.1%} vs the claimed {claim:,.0f}" if claim else ""
        runs = ", ".join(f"{rate:,.0f}" for rate in rates)
        print(f"{name} ({config.label()}): median {medians[name]:,.0f} samples/s [{runs}]{versus}")
    if rec.speedup and medians["baseline"]:
        speedup = paired_speedup(*measured)
        print(f"speed-up re-measured: {speedup:.2f}x (claimed {rec.speedup:.2f}x)")


def paired_speedup(recommended: list[float], baseline: list[float]) -> float:
    """The typical ratio of the runs, pair by pair, as advisor claims it (the Hodges-Lehmann
    estimate on their logs): drift that moves both runs of a pair alike cancels."""
    ratios = [r / b for r, b in zip(recommended, baseline, strict=True) if b and r]
    return paired_ratio(ratios, COVERAGE).typical


if __name__ == "__main__":
    main()
