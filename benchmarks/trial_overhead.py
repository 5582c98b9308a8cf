"""Per-trial overhead: what a trial costs beyond its timed window, with and without the launcher.

    python benchmarks/trial_overhead.py [--spec examples/mlp.py:factory] [--repeats 5]

Runs the baseline configuration of a factory, and its two-rank DDP version, as real isolated
trials, interleaved: forked from advisor's pre-imported launcher (the default) and in a fresh
interpreter (`TrialLaunch(preloaded=False)`, how trials started before). Reports per trial:
start-up (parent's launch to the end of the first training step: interpreter, imports, factory
build, first step), warm-up, the timed window, and the wall time the parent saw.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from advisor.knobs import TrialConfig
from advisor.trial.runner import TrialLaunch, run_trial

RESULTS = Path(__file__).parent / "results"
LAYOUTS = {
    "one process": TrialConfig(batch_size=32),
    "ddp-2": TrialConfig(batch_size=32, parallel_mode="ddp", world_size=2),
}
FIELDS = ("startup_s", "warmup_s", "window_s", "wall_s", "overhead_s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="examples/mlp.py:factory")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--trial-seconds", type=float, default=1.0)
    args = parser.parse_args()
    launches = {
        start: TrialLaunch(
            spec=args.spec,
            cwd=Path.cwd(),
            warmup_steps=3,
            trial_seconds=args.trial_seconds,
            timeout_s=300,
            preloaded=start == "launcher",
        )
        for start in ("fresh interpreter", "launcher")
    }
    rows: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as logs:
        run_trial(launches["launcher"], LAYOUTS["one process"], Path(logs) / "up.log")  # start it
        for index in range(args.repeats):
            for start, launch in launches.items():
                for layout, config in LAYOUTS.items():
                    result = run_trial(launch, config, Path(logs) / f"{index}.log")
                    row = {field: getattr(result, field, None) for field in FIELDS[:-1]}
                    row["overhead_s"] = (result.wall_s or 0) - (result.window_s or 0)
                    rows.setdefault(f"{start}, {layout}", []).append(row)
    summary = {
        key: {field: statistics.median(row[field] for row in runs) for field in FIELDS}
        for key, runs in rows.items()
    }
    print(_markdown(summary, args))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "trial_overhead.json").write_text(
        json.dumps({"spec": args.spec, "trials": rows, "median": summary}, indent=2)
    )


def _markdown(summary: dict[str, dict[str, float]], args: argparse.Namespace) -> str:
    lines = [
        f"{args.spec}, {args.trial_seconds:g} s windows, median of {args.repeats}:",
        "",
        "| trial start | start-up (s) | warm-up (s) | window (s) | wall (s) | overhead (s) |",
        "|---|---|---|---|---|---|",
    ]
    for key, median in summary.items():
        lines.append(f"| {key} | " + " | ".join(f"{median[f]:.2f}" for f in FIELDS) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
