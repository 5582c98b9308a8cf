"""Time to the baseline's loss: the baseline, the throughput pick and the time-to-loss pick.

    python benchmarks/convergence.py [--specs examples/mlp.py:factory ...] [--seconds 60]

For each example, one `advisor.tune` (objective time-to-loss, which also records the throughput
pick) chooses two configurations: the highest samples/s (trained with your learning rate, as a
throughput tuner would ship it) and the time-to-loss recommendation (with the learning rate it
ships). Then the baseline trains in a fresh process for `--seconds` of training time from the
same initial weights, longer than the tune's race, and each pick for 1.5x that (a pick that
equals the baseline shares its run). The target is the lowest loss the baseline reached; each
row says when the configuration first reached it.
The loss is advisor's race loss (held-out slice, fp32, eval mode). Results:
benchmarks/results/convergence.json and .md.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import advisor
from advisor.convergence import LrPlan, RaceCurve
from advisor.knobs import TrialConfig
from advisor.search.race.verdict import time_to_loss
from advisor.trial.parent.runner import TrialLaunch, run_trial

RESULTS = Path(__file__).parent / "results"
EXAMPLES = ("examples/mlp.py:factory", "examples/teacher.py:factory")
TUNE = {"trials": 12, "trial_seconds": 1.0, "race_seconds": 10.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", nargs="*", default=list(EXAMPLES))
    parser.add_argument("--seconds", type=float, default=60.0, help="training time per run")
    args = parser.parse_args()
    rows = [_example(spec, args.seconds) for spec in args.specs]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "convergence.json").write_text(json.dumps(rows, indent=2))
    table = _markdown(rows, args.seconds)
    (RESULTS / "convergence.md").write_text(table)
    print(table)


def _example(spec: str, seconds: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        rec = advisor.tune(spec, out=Path(out), **TUNE).recommendation
        tune_s = time.perf_counter() - started
        pick = rec.throughput_pick.config if rec.throughput_pick else rec.config
        runs = {
            "baseline": (rec.baseline_config, LrPlan()),
            "throughput pick": (pick, LrPlan()),
            "time-to-loss pick": (rec.config, rec.lr),
        }
        curves = {"baseline": _train(spec, rec.baseline_config, LrPlan(), seconds, Path(out))}
        for name, (config, lr) in list(runs.items())[1:]:
            if (config, lr) == runs["baseline"]:
                curves[name] = curves["baseline"]
            else:
                curves[name] = _train(spec, config, lr, 1.5 * seconds, Path(out))
    target = curves["baseline"].best_loss if curves["baseline"] else None
    return {
        "spec": spec,
        "tune_s": tune_s,
        "target_loss": target,
        "race": rec.race.model_dump(mode="json", exclude={"racers"}) if rec.race else None,
        "racers": [
            {
                "config": r.label,
                "time_to_target_s": r.time_to_target_s,
                "final_loss": r.curve.final_loss if r.curve else r.result.status,
            }
            for r in rec.race.racers
        ]
        if rec.race
        else [],
        "noise_scale": rec.noise_scale.model_dump(mode="json") if rec.noise_scale else None,
        "runs": [
            {
                "name": name,
                "config": config.label(),
                "global_batch": config.global_batch_size,
                "lr": lr.label,
                "seconds_to_target": time_to_loss(curves[name], target)
                if curves[name] and target is not None
                else None,
                "final_loss": curves[name].final_loss if curves[name] else None,
            }
            for name, (config, lr) in runs.items()
        ],
    }


def _train(
    spec: str, config: TrialConfig, lr: LrPlan, seconds: float, out: Path
) -> RaceCurve | None:
    launch = TrialLaunch(
        spec=spec,
        cwd=Path.cwd(),
        warmup_steps=1,
        trial_seconds=seconds,
        timeout_s=3 * seconds + 120,
    )
    result = run_trial(launch, config, out / "run.log", mode="race", lr=lr)
    if result.race is None:
        print(f"{spec} {config.label()}: {result.status} {result.reason}")
    return result.race


def _markdown(rows: list[dict[str, object]], seconds: float) -> str:
    lines = [
        "| example | run | configuration | global batch | lr | "
        f"time to the baseline's {seconds:g}-s loss |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        for run in row["runs"]:  # type: ignore[attr-defined]
            reached = run["seconds_to_target"]
            shown = f"{reached:.1f} s" if reached is not None else f"not in {1.5 * seconds:g} s"
            lines.append(
                f"| {row['spec']} | {run['name']} | {run['config']} | {run['global_batch']} | "
                f"{run['lr']} | {shown} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
