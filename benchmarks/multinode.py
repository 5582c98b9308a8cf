"""A tune over two "machines" played by two processes on this host, one core each.

    python benchmarks/multinode.py [--spec examples/mlp.py:factory] [--rounds 1] [-- FLAGS]

Each round starts `advisor tune SPEC --nnodes 2 --node-rank 1` on the second core and the same
command with `--node-rank 0` on the first (a free port on 127.0.0.1 is the rendezvous), each in a
fresh output folder, and records node 0's wall time, both exit codes, the measured trials whose
ranks spanned both machines, the scaling report.md states for them, and the recommendation. It
then checks the per-step losses: the first optimizer steps of DDP over the two machines against
one machine with as many ranks, from the same seed. Loopback between two cores of one host is
no network: these figures say that the machinery works and what it costs, not how DDP scales
over a real one. Results: benchmarks/results/multinode.json and .md.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SHOWN = ("parallel_mode", "world_size", "nnodes", "batch_size", "accumulation_steps", "amp")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _node(rank: int, spec: str, port: int, out: Path, flags: list[str]) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "advisor", "tune", spec, "--nnodes", "2"]
    command += ["--node-rank", str(rank), "--rdzv-endpoint", f"127.0.0.1:{port}"]
    command += ["--out", str(out), "--quiet", *flags]
    core = sorted(os.sched_getaffinity(0))[rank]
    return subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),
    )


def one_round(spec: str, flags: list[str]) -> dict[str, object]:
    """One tune over two machines; what it measured and said."""
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="advisor-multinode-") as scratch:
        out = Path(scratch) / "node0"
        node1 = _node(1, spec, port, Path(scratch) / "node1", flags)
        started = time.monotonic()
        node0 = _node(0, spec, port, out, flags)
        said0, _ = node0.communicate()
        wall_s = time.monotonic() - started
        said1, _ = node1.communicate()
        rows = list(csv.DictReader((out / "trials.csv").open())) if node0.returncode == 0 else []
        report = (out / "report.md").read_text() if (out / "report.md").exists() else ""
        recommendation = json.loads((out / "recommendation.json").read_text() or "{}")
    spanning = [r for r in rows if r["nnodes"] == "2"]
    return {
        "wall_s": round(wall_s, 1),
        "exit_codes": [node0.returncode, node1.returncode],
        "rows": len(rows),
        "spanning_rows": len(spanning),
        "spanning_ok": sum(r["status"] == "ok" for r in spanning),
        "scaling": re.findall(r"\*\*(\S+ over \d+ machines: \d+% of linear scaling)\*\*", report),
        "vs_one_process": re.findall(r"\*\*(\S+x\d+ vs one process: [\d.]+x)\*\*", report),
        "recommended": {k: recommendation.get("config", {}).get(k) for k in SHOWN},
        "time_to_loss": recommendation.get("time_to_loss"),
        "node1_last_line": said1.strip().splitlines()[-1] if said1.strip() else "",
        "node0_tail": said0.strip().splitlines()[-3:],
    }


def same_losses(spec: str) -> dict[str, object]:
    """The first steps' losses of DDP over two machines and over one, from the same seed."""
    from advisor.knobs import TrialConfig
    from advisor.trial.child.hardware import probe
    from advisor.trial.nodes import Rendezvous
    from advisor.trial.orders import ReferenceOrder
    from advisor.trial.parent.nodes import NodeHost, serve
    from advisor.trial.parent.runner import ProcessRunner, TrialLaunch

    port = _free_port()

    def launch(preloaded: bool) -> TrialLaunch:
        return TrialLaunch(
            spec=spec, cwd=ROOT, warmup_steps=2, trial_seconds=1, timeout_s=120, preloaded=preloaded
        )

    def where(node: int) -> Rendezvous:
        return Rendezvous(nnodes=2, node_rank=node, host="127.0.0.1", port=port)

    config = TrialConfig(batch_size=32, parallel_mode="ddp", world_size=2, nnodes=2)
    with tempfile.TemporaryDirectory() as scratch, NodeHost(where(0)) as host:
        logs = Path(scratch)
        runner1 = ProcessRunner(launch(preloaded=False))
        args = (where(1), probe(), runner1, logs, lambda line: None)
        threading.Thread(target=serve, args=args, daemon=True).start()
        host.wait_for_nodes()
        two = ProcessRunner(launch(True), nodes=host).run(ReferenceOrder(config=config), logs / "2")
        alone = config.model_copy(update={"nnodes": 1})
        one = ProcessRunner(launch(True)).run(ReferenceOrder(config=alone), logs / "1")
    return {
        "two_machines": list(two.early_losses),
        "one_machine": list(one.early_losses),
        "equal": two.status == one.status == "ok" and two.early_losses == one.early_losses,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default="examples/mlp.py:factory")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("flags", nargs="*", help="more `advisor tune` flags, after --")
    args = parser.parse_args()
    rounds = [one_round(args.spec, args.flags) for _ in range(args.rounds)]
    result = {"spec": args.spec, "rounds": rounds, "losses": same_losses(args.spec)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "multinode.json").write_text(json.dumps(result, indent=2))
    lines = [f"| {r['wall_s']} s | {r['exit_codes']} | {r['spanning_ok']} of {r['spanning_rows']}"
             f" | {'; '.join(r['vs_one_process'] + r['scaling'])} | {r['time_to_loss']} |"
             for r in rounds]  # fmt: skip
    (RESULTS / "multinode.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
