"""Per-trial overhead: what a trial costs beyond its timed window, with and without the launcher.

    python benchmarks/trial_overhead.py [--spec examples/mlp.py:factory] [--repeats 5]

Runs the baseline configuration of a factory, and its two-rank DDP version, as real isolated
trials, the layouts interleaved, the ways to start one after the other: in a fresh interpreter
(`TrialLaunch(preloaded=False)`, how trials started before); forked from advisor's pre-imported
launcher without its import of the installed packages the factory's module imports
(`TrialLaunch(import_ahead=False)`: each trial imports them); and with it (the default).
Reports per trial: start-up (parent's launch to the end of the first training step:
interpreter, imports, factory build, first step), warm-up, the timed window, and the wall time
the parent saw.
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
            preloaded=start != "fresh interpreter",
            import_ahead=start == "launcher",
        )
        for start in ("fresh interpreter", "launcher, packages per trial", "launcher")
    }
    rows: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as logs:
        # start it, importing nothing of the factory's: every fork of it would find what it
        # imported, so the launcher's own imports come last, after all trials without them
        up = launches["launcher, packages per trial"]
        ProcessRunner(up).run(WindowOrder(config=LAYOUTS["one process"]), Path(logs) / "up.log")
        for start, launch in launches.items():
            for index in range(args.repeats):
                for layout, config in LAYOUTS.items():
                    result = ProcessRunner(launch).run(
                        WindowOrder(config=config), Path(logs) / f"{index}.log"
                    )
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
