"""Whether DDP beats one process depends on the other knobs: measure both at a few settings.

    python benchmarks/parallel_modes.py [--spec examples/mlp.py:factory] [--world-size 2]

Runs the same trials advisor runs (fresh child processes, warm-up, timed window), one process
against DDP with `--world-size` ranks, at a small and a large batch, interleaved, and prints the
median samples/s of each and the DDP / one-process ratio.
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
SETTINGS = {
    "batch 16, fp32": {"batch_size": 16},
    "batch 1024, accumulation 4, bf16": {
        "batch_size": 1024,
        "accumulation_steps": 4,
        "amp": "bf16",
    },
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="examples/mlp.py:factory")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    launch = TrialLaunch(
        spec=args.spec, cwd=Path.cwd(), warmup_steps=3, trial_seconds=args.seconds, timeout_s=300
    )
    layouts = {
        "one process": {},
        f"ddp-{args.world_size}": {"parallel_mode": "ddp", "world_size": args.world_size},
    }
    rates: dict[str, dict[str, list[float]]] = {s: {lay: [] for lay in layouts} for s in SETTINGS}
    with tempfile.TemporaryDirectory() as logs:
        for _ in range(args.repeats):
            for setting, knobs in SETTINGS.items():
                for layout, parallel in layouts.items():
                    config = TrialConfig(**knobs, **parallel)
                    result = ProcessRunner(launch).run(
                        WindowOrder(config=config), Path(logs) / "trial.log"
                    )
                    if result.samples_per_s is None:
                        raise SystemExit(f"{setting}, {layout}: {result.status}: {result.reason}")
                    rates[setting][layout].append(result.samples_per_s)
                    print(f"{setting:34} {layout:12} {result.samples_per_s:>10,.0f} samples/s")
    print()
    single, ddp = layouts
    for setting, by_layout in rates.items():
        medians = {layout: statistics.median(values) for layout, values in by_layout.items()}
        ratio = medians[ddp] / medians[single]
        print(
            f"{setting:34} one process {medians[single]:>9,.0f}  {ddp} {medians[ddp]:>9,.0f}"
            f"  ratio {ratio:.2f}x"
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "parallel_modes.json").write_text(
        json.dumps({"spec": args.spec, "samples_per_s": rates}, indent=2)
    )


if __name__ == "__main__":
    main()
