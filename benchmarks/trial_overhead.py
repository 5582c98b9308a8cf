"""Per-trial overhead: what a trial costs beyond its timed window.

    python benchmarks/trial_overhead.py [--spec examples/mlp.py:factory] [--repeats 5]

Runs the baseline configuration of a factory as real isolated trials and reports, per trial:
start-up (process start to the end of the first training step: interpreter, torch import,
factory build, first step), warm-up, the timed window, and the wall time the parent saw.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from advisor.config import TrialConfig
from advisor.trial.runner import TrialLaunch, run_trial

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="examples/mlp.py:factory")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--trial-seconds", type=float, default=3.0)
    args = parser.parse_args()
    launch = TrialLaunch(
        spec=args.spec,
        cwd=Path.cwd(),
        warmup_steps=3,
        trial_seconds=args.trial_seconds,
        timeout_s=300,
    )
    rows = []
    with tempfile.TemporaryDirectory() as logs:
        for index in range(args.repeats):
            result = run_trial(launch, TrialConfig(batch_size=32), Path(logs) / f"{index}.log")
            rows.append(
                {
                    "startup_s": result.startup_s,
                    "warmup_s": result.warmup_s,
                    "window_s": result.window_s,
                    "wall_s": result.wall_s,
                    "overhead_s": result.wall_s - result.window_s,
                    "samples_per_s": result.samples_per_s,
                }
            )
            print(", ".join(f"{k} {v:,.2f}" for k, v in rows[-1].items()))
    summary = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
    print("median: " + ", ".join(f"{k} {v:,.2f}" for k, v in summary.items()))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "trial_overhead.json").write_text(
        json.dumps({"spec": args.spec, "trials": rows, "median": summary}, indent=2)
    )


if __name__ == "__main__":
    main()
