"""A tune over several machines, from each machine's side (`advisor.trial.nodes`).

Node 0: `NodeHost` starts the rendezvous store's process (`advisor.trial.child.store_host`),
waits for the other nodes to join with their probed hardware, and hears when one goes silent.
Every other node: `serve` joins node 0's store, beats, and runs its part of each trial node 0
posts, until node 0 says the tune is done (exit 0), refuses it, or stops answering
(`NodeLostError`). Nothing here imports torch at module level; `serve` does when it starts, as
the trial processes do.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from advisor.errors import NodeLostError, SettingsError
from advisor.results import HardwareProfile
from advisor.trial.nodes import (
    BEAT_S,
    DONE,
    FINISHED,
    REFUSED,
    NodeOrder,
    Rendezvous,
    beat_key,
    hardware_key,
    order_key,
    report_key,
)
from advisor.trial.parent.environment import child_env
from advisor.trial.parent.lines import JsonLines, end_helper

if TYPE_CHECKING:
    import torch.distributed as dist

    from advisor.trial.parent.runner import ProcessRunner

__all__ = ["NodeHost", "hardware_difference", "serve", "still_useful"]

STORE_HOST = "advisor.trial.child.store_host"
READY_TIMEOUT_S = 120.0  # the store process imports torch first
ORDER_POLL_S = 0.2


class NodeHost:
    """Node 0's rendezvous store, in its own process for the whole tune, and what it hears."""

    def __init__(self, rendezvous: Rendezvous) -> None:
        self.rendezvous = rendezvous
        self._process = subprocess.Popen(
            [sys.executable, "-m", STORE_HOST, str(rendezvous.port), str(rendezvous.nnodes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # the terminal's Ctrl-C is the tune's to handle
            env=child_env(),
        )
        assert self._process.stdout is not None
        self._lines = JsonLines(self._process.stdout)
        self._gone: dict[int, str] = {}  # machines heard gone, and how
        ready = self._read(READY_TIMEOUT_S)
        if ready is None or "ready" not in ready:
            why = (ready or {}).get("error", "it did not start")
            self.close()
            raise SettingsError(
                f"cannot host the rendezvous store on port {rendezvous.port} ({why}): give "
                "--rdzv-endpoint a port that is free on this machine"
            )

    def __enter__(self) -> NodeHost:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: object, tb: object) -> None:
        if kind is None:
            self.close(FINISHED)
        else:
            self.close("it was interrupted" if kind is KeyboardInterrupt else f"{error}")

    def wait_for_nodes(self) -> dict[int, HardwareProfile]:
        """Each other node's probed hardware, once all joined; `NodeLostError` if some did not
        within the join timeout."""
        where = self.rendezvous
        joined: dict[int, HardwareProfile] = {}
        deadline = time.monotonic() + where.join_timeout_s
        while len(joined) < where.nnodes - 1:
            message = self._read(max(0.0, deadline - time.monotonic()))
            if message is None:
                missing = ", ".join(str(n) for n in range(1, where.nnodes) if n not in joined)
                raise NodeLostError(
                    f"node {missing} did not join {where.endpoint} within "
                    f"{where.join_timeout_s:g} s: start the same advisor tune command with "
                    f"--node-rank {missing.split(',')[0]} on each other machine"
                )
            if "joined" in message:
                joined[message["joined"]] = HardwareProfile.model_validate(message["hardware"])
        return joined

    def join(self, hardware: HardwareProfile, say: Callable[[str], None]) -> None:
        """Wait for the other machines; refuse them all where one is unlike this one."""
        where = self.rendezvous
        say(f"waiting for {where.nnodes - 1} more machines to join {where.endpoint}")
        for node, theirs in self.wait_for_nodes().items():
            if (why := hardware_difference(node, theirs, hardware)) is not None:
                self.refuse(why)
                raise SettingsError(why)

    def refuse(self, why: str) -> None:
        """Tell the other nodes to stop, with `why`."""
        self._send({"refuse": why})

    def gone(self, wait_s: float = 0.0) -> dict[int, str]:
        """The machines heard gone, and how (listening `wait_s` for one). Node 1 gone, nothing
        over several machines can run: `NodeLostError`."""
        deadline = time.monotonic() + wait_s
        while not self._gone:
            if self._read(max(0.0, deadline - time.monotonic())) is None:
                break
        return still_useful(self._gone)

    def _read(self, timeout_s: float) -> dict[str, Any] | None:
        try:
            message = self._lines.read(timeout_s)
        except EOFError:
            self._gone.setdefault(0, "node 0's rendezvous store exited")
            return None
        if message is not None and "gone" in message:
            self._gone[int(message["node"])] = message["gone"]
        return message

    def _send(self, message: dict[str, str]) -> None:
        stdin = self._process.stdin
        assert stdin is not None
        with contextlib.suppress(OSError):
            stdin.write((json.dumps(message) + "\n").encode())
            stdin.flush()

    def close(self, ended: str = FINISHED) -> None:
        """Mark the tune done, `ended` saying how (the other nodes exit), and stop the store."""
        self._send({"end": ended})
        end_helper(self._process, timeout_s=10)  # it lingers for the others to read `done`


def still_useful(gone: dict[int, str]) -> dict[int, str]:
    """The machines gone, where layouts over the others can still run; `NodeLostError` where
    none can: every layout over machines spans nodes 0 and 1."""
    if 0 in gone or 1 in gone:
        why = gone.get(1) or gone[0]
        raise NodeLostError(f"{why}: no trial over several machines can run")
    return dict(gone)


def hardware_difference(node: int, theirs: HardwareProfile, ours: HardwareProfile) -> str | None:
    """Why node `node` is not a machine like node 0 (one line), or None: the study's machine
    rule (`advisor.search.study.bind_study`), across machines."""
    fields = {
        "CPU": (theirs.cpu_model, ours.cpu_model),
        "cores": (theirs.cores, ours.cores),
        "memory (GiB)": (round(theirs.memory_bytes / 2**30), round(ours.memory_bytes / 2**30)),
        "torch": (theirs.torch_version, ours.torch_version),
        "GPUs": ([g.name for g in theirs.gpus], [g.name for g in ours.gpus]),
    }
    differ = [f"{name} {a} against {b}" for name, (a, b) in fields.items() if a != b]
    if not differ:
        return None
    return (
        f"node {node} is not a machine like node 0 ({'; '.join(differ)}): a layout measured "
        "over unlike machines runs at the slowest one's pace; tune on identical machines"
    )


# --- another node ------------------------------------------------------------------------------
def serve(
    rendezvous: Rendezvous,
    hardware: HardwareProfile,
    runner: ProcessRunner,
    logs: Path,
    say: Callable[[str], None],
) -> int:
    """Serve node 0's tune from this machine: join, beat, run this machine's part of every trial
    node 0 posts; the number of trials served once node 0 is done. `NodeLostError` when node 0
    stops answering, `SettingsError` when it refuses this machine."""
    from advisor.trial.child import nodes as store_ops  # torch, as a trial process

    node = rendezvous.node_rank
    timeout = timedelta(seconds=rendezvous.join_timeout_s)
    try:
        store = store_ops.connect(rendezvous.host, rendezvous.port, timeout)
        store.set(hardware_key(node), hardware.model_dump_json())
    except (RuntimeError, OSError):
        raise NodeLostError(
            f"node 0's rendezvous store at {rendezvous.endpoint} did not answer within "
            f"{rendezvous.join_timeout_s:g} s: start the same command with --node-rank 0 on the "
            "machine at that address, and check that this one can reach it"
        ) from None
    say(f"node {node} joined {rendezvous.endpoint}; node 0 searches")
    beat = _Beat(rendezvous)
    served = 0
    try:
        for number, order in _orders(store, rendezvous):
            config = order.request.config
            if config.nnodes <= node or order.request.node is None:
                continue  # a trial over fewer machines
            part = order.request.node.model_copy(update={"node_rank": node})
            result = runner.serve(
                order.request.model_copy(update={"node": part}), logs / f"node{node}-{number}.log"
            )
            try:
                if not store.check([report_key(part.key, node)]):  # it died before reporting
                    store_ops.post_report(store, part, store_ops.failed_part(part, result))
            except (RuntimeError, OSError):
                raise _node_0_gone(rendezvous) from None
            served += 1
            say(f"trial {number}: {config.label()}: {result.status}")
    finally:
        beat.stop()
    return served


def _orders(store: dist.Store, rendezvous: Rendezvous) -> Iterator[tuple[int, NodeOrder]]:
    """Node 0's trials, by number, until it marks the tune done."""
    number = 1
    while True:
        try:
            if store.check([order_key(number)]):
                yield number, NodeOrder.model_validate_json(store.get(order_key(number)))
                number += 1
                continue
            if store.check([REFUSED]):
                raise SettingsError(store.get(REFUSED).decode())
            if store.check([DONE]):
                if (ended := store.get(DONE).decode()) != FINISHED:
                    raise NodeLostError(
                        f"node 0's tune ended unfinished ({ended}): start the same commands on "
                        "every machine to resume it"
                    )
                return
        except (RuntimeError, OSError):  # the store is gone: so is node 0
            raise _node_0_gone(rendezvous) from None
        time.sleep(ORDER_POLL_S)


def _node_0_gone(rendezvous: Rendezvous) -> NodeLostError:
    return NodeLostError(
        f"node 0 ({rendezvous.endpoint}) stopped answering: its tune ended or its machine is "
        "gone; what it measured is in its study"
    )


class _Beat:
    """This node's beat: a counter in node 0's store raised every `BEAT_S` from a thread with
    a connection of its own, so that a long trial never looks like a machine gone."""

    def __init__(self, rendezvous: Rendezvous) -> None:
        from advisor.trial.child.nodes import connect

        self._store = connect(rendezvous.host, rendezvous.port)
        self._key = beat_key(rendezvous.node_rank)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-beat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(BEAT_S):
            try:
                self._store.add(self._key, 1)
            except (RuntimeError, OSError):
                return  # node 0 is gone: the order loop says so

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=2 * BEAT_S)
