"""Node 0's rendezvous store, in a process of its own for the whole tune (the tuning process never
imports torch): `python -m advisor.trial.child.store_host PORT NNODES`.

It binds a c10d `TCPStore` at PORT (the port of `--rdzv-endpoint`) and tells its parent, one
JSON line each: `{"ready": PORT}` (or `{"error": why}`), `{"joined": K, "hardware": {...}}` as
node K posts its probed hardware, and `{"gone": why}` once a joined node's beat stands still for
`SILENCE_S`; it raises node 0's own beat meanwhile. On its stdin the parent may send `{"refuse":
why}` (the nodes are told to stop with that line) and `{"end": how}` (`finished`, or why not).
When its stdin closes, or its parent dies, it marks the tune done, gives the other nodes
`LINGER_S` to read it, and exits."""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from datetime import timedelta

import torch.distributed as dist

from advisor.trial.child.nodes import BeatWatch
from advisor.trial.nodes import BEAT_S, DONE, REFUSED, beat_key, hardware_key

__all__ = ["main"]

LINGER_S = 3 * BEAT_S  # the other nodes look for `done` every beat


def main(argv: list[str]) -> int:
    """Host the store at PORT for NNODES machines until the parent is done."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; it closes our stdin
    port, nnodes = int(argv[0]), int(argv[1])
    try:
        store = dist.TCPStore(
            "0.0.0.0", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
        )
    except (RuntimeError, OSError) as exc:
        _send({"error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__})
        return 1
    _send({"ready": port})
    ended = _serve(store, nnodes, os.getppid())
    store.set(DONE, ended)
    time.sleep(LINGER_S)
    return 0


def _serve(store: dist.TCPStore, nnodes: int, parent: int) -> str:
    """Report joins and silences until the parent closes stdin or dies; how the tune ended."""
    waiting, watch = set(range(1, nnodes)), None
    ended = "node 0's tune process exited"
    while os.getppid() == parent:
        store.add(beat_key(0), 1)  # node 0 is here: the others' trials watch it
        ready, _, _ = select.select([sys.stdin], [], [], BEAT_S)
        if ready:
            line = sys.stdin.readline()
            if not line:
                return ended
            message = json.loads(line)
            if "refuse" in message:
                store.set(REFUSED, message["refuse"])
            ended = message.get("end", ended)
        for node in sorted(waiting):
            if store.check([hardware_key(node)]):
                hardware = json.loads(store.get(hardware_key(node)))
                _send({"joined": node, "hardware": hardware})
                waiting.discard(node)
        if not waiting and watch is None:
            watch = BeatWatch(store, range(1, nnodes))
        if watch is not None and (why := watch.silent()) is not None:
            _send({"gone": why, "node": 0 if watch.gone_node is None else watch.gone_node})
    return ended


def _send(message: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
