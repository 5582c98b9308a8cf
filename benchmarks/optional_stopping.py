"""Optional stopping: does a search window that may end "clearly below the best" bias a tie?

    python benchmarks/optional_stopping.py [--repeats 6] [--trial-seconds 2]

A search trial's window checks every 50 ms, from an eighth of its time on, whether the 95 %
interval of its mean step time lies above the best trial's (advisor.trial.child.window); checked
that often, with no correction for the repeated looks, a configuration exactly as fast as the best
could be called slower by chance, and its value read low. For each configuration below:
  1. its true rate: the median of `--repeats` whole trials (warm-up, then a whole window);
  2. interleaved, `--repeats` times each: a search trial with no best to beat (it ends once
     precise), a search trial whose best is its own true rate (a tie), and one whose best is
     10 % slower than it (it should never be called slower).
Prints and writes (benchmarks/results/optional_stopping.json) how often each way ended "below
the best", and its median rate over the true rate.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from advisor.knobs import TrialConfig
from advisor.trial.orders import WindowOrder
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch

RESULTS = Path(__file__).parent / "results"
CASES = (
    ("examples/cnn.py:factory", TrialConfig(batch_size=32)),
    ("examples/data_bound.py:factory", TrialConfig(batch_size=32)),
    ("examples/data_bound.py:factory", TrialConfig(batch_size=512)),
    (
        "examples/data_bound.py:factory",
        TrialConfig(batch_size=512, num_workers=1, parallel_mode="ddp", world_size=2),
    ),
)
# way: the best it must beat, as a multiple of the configuration's true rate (None: no best)
WAYS = {"precise": None, "tie": 1.0, "10 % faster": 0.9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--trial-seconds", type=float, default=2.0)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as logs:
        for spec, config in CASES:
            launch = TrialLaunch(
                spec=spec, cwd=Path.cwd(), warmup_steps=3, trial_seconds=args.trial_seconds,
                timeout_s=300,
            )  # fmt: skip
            rows.append(_case(launch, config, args.repeats, Path(logs)))
            print(json.dumps(rows[-1]))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "optional_stopping.json").write_text(json.dumps(rows, indent=2))


def _case(launch: TrialLaunch, config: TrialConfig, repeats: int, logs: Path) -> dict:
    log = logs / "trial.log"
    whole = [
        _rate(ProcessRunner(launch).run(WindowOrder(config=config, whole_cycles=True), log))
        for _ in range(repeats)
    ]
    truth = statistics.median(whole)
    runs: dict[str, list[tuple[float, bool]]] = {way: [] for way in WAYS}
    for _ in range(repeats):
        for way, fraction in WAYS.items():
            beat = None if fraction is None else fraction * truth
            result = ProcessRunner(launch).run(
                WindowOrder(config=config, precise_window=True, beat_samples_per_s=beat), log
            )
            runs[way].append((_rate(result), result.below_best))
    return {
        "spec": launch.spec,
        "config": config.label(),
        "true_samples_per_s": truth,
        "whole_spread": (min(whole) / truth, max(whole) / truth),
        **{
            way: {
                "ended_below_best": sum(below for _, below in runs[way]),
                "of": repeats,
                "median_over_true": statistics.median(rate for rate, _ in runs[way]) / truth,
                "below_best_over_true": [rate / truth for rate, below in runs[way] if below],
            }
            for way in WAYS
        },
    }


def _rate(result) -> float:  # type: ignore[no-untyped-def]
    if result.samples_per_s is None:
        raise SystemExit(f"{result.config.label()} measured nothing: {result.reason}")
    return result.samples_per_s


if __name__ == "__main__":
    main()
