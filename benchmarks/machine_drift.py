"""Is the noise advisor's, or the machine's? A plain training loop, no advisor, in fresh processes.

    python benchmarks/machine_drift.py [--processes 5] [--windows 6] [--spec SPEC]

Each process trains the example at batch 32 with plain PyTorch and times `--windows`
back-to-back 3-second windows after a 1-second warm-up. The spread within a process and the
spread between processes' medians are printed and written to
benchmarks/results/machine_drift.json. On a VM whose speed shifts in episodes, the second is
much larger than the first, and only interleaved, repeated trials can average it out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results"

LOOP = """
import json, sys, time, torch
sys.path.insert(0, ".")
from advisor.task import build_task
torch.set_flush_denormal(True)
task, _ = build_task(sys.argv[1], __import__("pathlib").Path.cwd())
model, loss_fn = task.model, task.loss_fn
optimizer = torch.optim.AdamW(model.parameters())
loader = torch.utils.data.DataLoader(task.dataset, batch_size=32, shuffle=True, drop_last=True)

def batches():
    while True:
        yield from loader

stream = batches()

def window(seconds):
    samples, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        features, target = next(stream)
        loss_fn(model(features), target).backward()
        optimizer.step()
        optimizer.zero_grad()
        samples += 32
    return samples / (time.perf_counter() - started)

window(1.0)
print(json.dumps([window(3.0) for _ in range(int(sys.argv[2]))]))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--windows", type=int, default=6)
    parser.add_argument("--spec", default="examples/mlp.py:factory")
    args = parser.parse_args()
    runs = []
    for _ in range(args.processes):
        completed = subprocess.run(
            [sys.executable, "-c", LOOP, args.spec, str(args.windows)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        rates = json.loads(completed.stdout)
        runs.append(rates)
        print(", ".join(f"{rate:,.0f}" for rate in rates), f"CV {_cv(rates):.1%}")
    within = statistics.median(_cv(rates) for rates in runs)
    between = _cv([statistics.median(rates) for rates in runs])
    print(f"median CV within a process {within:.1%}; CV of the processes' medians {between:.1%}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "machine_drift.json").write_text(
        json.dumps(
            {"spec": args.spec, "windows": runs, "within": within, "between": between}, indent=2
        )
    )


def _cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values)


if __name__ == "__main__":
    main()
