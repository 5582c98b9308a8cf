"""Measurement noise: the same configuration measured 5 times, as isolated trials, in one run.

    python benchmarks/measurement_noise.py [--repeats 5] [--trial-seconds 3]

For each example workload, two configurations (the baseline, batch 32, and batch 256 with
bf16 autocast where the CPU has it) are measured `--repeats` times each, interleaved so that
drift of the machine spreads over both. Prints and writes the coefficient of variation of
samples/s (benchmarks/results/measurement_noise.json): the spread a single trial window
carries, which decides how close two configurations can be and still be told apart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from advisor.knobs import TrialConfig
from advisor.trial.probe import probe
from advisor.trial.runner import TrialLaunch, run_trial

RESULTS = Path(__file__).parent / "results"
EXAMPLES = ("examples/mlp.py:factory", "examples/cnn.py:factory", "examples/data_bound.py:factory")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--trial-seconds", type=float, default=3.0)
    parser.add_argument("--specs", nargs="*", default=list(EXAMPLES))
    args = parser.parse_args()
    amp = "bf16" if probe().cpu_bf16 else "off"
    configs = (TrialConfig(batch_size=32), TrialConfig(batch_size=256, amp=amp))
    rows = []
    for spec in args.specs:
        launch = TrialLaunch(
            spec=spec, cwd=Path.cwd(), warmup_steps=3, trial_seconds=args.trial_seconds,
            timeout_s=300,
        )  # fmt: skip
        rates: dict[TrialConfig, list[float]] = {config: [] for config in configs}
        with tempfile.TemporaryDirectory() as logs:
            for index in range(args.repeats):
                for config in configs:
                    result = run_trial(launch, config, Path(logs) / f"{index}.log")
                    rates[config].append(result.samples_per_s or 0.0)
        for config, values in rates.items():
            rows.append(_row(spec, config, values))
            print(_line(rows[-1]))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "measurement_noise.json").write_text(
        json.dumps({"trial_seconds": args.trial_seconds, "rows": rows}, indent=2)
    )


def _row(spec: str, config: TrialConfig, values: list[float]) -> dict[str, object]:
    mean = statistics.fmean(values)
    return {
        "spec": spec,
        "config": config.label(),
        "samples_per_s": values,
        "mean": mean,
        "cv": statistics.stdev(values) / mean if mean and len(values) > 1 else None,
    }


def _line(row: dict[str, object]) -> str:
    values = ", ".join(f"{v:,.0f}" for v in row["samples_per_s"])  # type: ignore[attr-defined]
    return f"{row['spec']:34} {row['config']:32} CV {row['cv']:.1%}  ({values})"


if __name__ == "__main__":
    main()
