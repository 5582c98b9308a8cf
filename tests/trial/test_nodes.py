"""Trials over two machines, played by two "nodes" on 127.0.0.1: node 0 hosts the rendezvous
store and posts each trial; node 1 serves it from a thread with a runner of its own."""

import threading
from pathlib import Path

import pytest

from advisor.errors import NodeLostError
from advisor.knobs import TrialConfig
from advisor.trial.child.hardware import probe
from advisor.trial.nodes import Rendezvous
from advisor.trial.orders import ReferenceOrder, WindowOrder
from advisor.trial.parent.nodes import NodeHost, hardware_difference, serve, still_useful
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch
from tests.conftest import ROOT, TINY, free_port

pytestmark = pytest.mark.slow
SPEC = f"{TINY}:small_blocks"


def _launch(preloaded: bool) -> TrialLaunch:
    return TrialLaunch(
        spec=SPEC, cwd=ROOT, warmup_steps=2, trial_seconds=0.5, timeout_s=90, preloaded=preloaded
    )


def _where(node: int, port: int) -> Rendezvous:
    return Rendezvous(nnodes=2, node_rank=node, host="127.0.0.1", port=port, join_timeout_s=60)


class _Node1:
    """Node 1's `serve` in a thread (a fresh interpreter per trial: node 0 owns the launcher)."""

    def __init__(self, port: int, logs: Path) -> None:
        self.said: list[str] = []
        self.outcome: list[object] = []
        hardware = probe()
        runner = ProcessRunner(_launch(preloaded=False))

        def run() -> None:
            try:
                served = serve(_where(1, port), hardware, runner, logs, self.said.append)
                self.outcome.append(served)
            except Exception as exc:  # what serve ended with
                self.outcome.append(exc)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()


def test_a_trial_over_two_nodes_trains_the_steps_of_one_node_with_as_many_ranks(tmp_path):
    port = free_port()
    with NodeHost(_where(0, port)) as host:
        node1 = _Node1(port, tmp_path / "node1")
        joined = host.wait_for_nodes()
        assert list(joined) == [1]
        assert hardware_difference(1, joined[1], joined[1]) is None
        runner = ProcessRunner(_launch(preloaded=True), nodes=host)
        two_nodes = TrialConfig(batch_size=8, parallel_mode="ddp", world_size=2, nnodes=2)
        spanning = runner.run(ReferenceOrder(config=two_nodes), tmp_path / "two.log")
        window = runner.run(WindowOrder(config=two_nodes), tmp_path / "window.log")
    node1.thread.join(timeout=30)
    one_node = two_nodes.model_copy(update={"nnodes": 1})
    alone = ProcessRunner(_launch(preloaded=True)).run(
        ReferenceOrder(config=one_node), tmp_path / "one.log"
    )
    assert spanning.status == "ok", spanning.reason
    assert len(spanning.early_losses) >= 2
    assert spanning.early_losses == alone.early_losses
    assert window.status == "ok", window.reason
    assert [rank.rank for rank in window.ranks] == [0, 1]
    assert window.samples_per_s == window.samples_measured / window.window_s
    assert node1.outcome == [2]  # both trials served, then node 0 said done
    assert len(node1.said) == 3 and node1.said[1].startswith("trial 1: ")


def test_a_node_that_never_joins_is_named_in_one_line():
    where = _where(0, free_port()).model_copy(update={"join_timeout_s": 1.0})
    with NodeHost(where) as host, pytest.raises(NodeLostError, match="node 1 did not join"):
        host.wait_for_nodes()


def test_a_machine_unlike_node_0_is_refused_with_what_differs():
    ours = probe()
    theirs = ours.model_copy(update={"cores": ours.cores * 2})
    why = hardware_difference(1, theirs, ours)
    assert why is not None and why.startswith(
        f"node 1 is not a machine like node 0 (cores {ours.cores * 2} against {ours.cores})"
    )


class _Heard:
    """Node 0's hearing of the other machines, scripted: which are gone."""

    def __init__(self, gone: dict[int, str]) -> None:
        self.rendezvous = _where(0, 1)
        self._gone = gone

    def gone(self, wait_s: float = 0.0) -> dict[int, str]:
        return still_useful(self._gone)


def test_a_machine_gone_fails_what_spans_it_and_ends_the_tune_where_nothing_is_left(tmp_path):
    three = TrialConfig(batch_size=8, parallel_mode="ddp", world_size=3, nnodes=3)
    runner = ProcessRunner(_launch(preloaded=True), nodes=_Heard({2: "node 2 stopped answering"}))
    failed = runner.run(WindowOrder(config=three), tmp_path / "three.log")
    assert failed.status == "crashed"
    assert failed.reason == "node 2 stopped answering: a layout over 3 machines cannot run"
    runner.nodes = _Heard({1: "node 1 stopped answering after 20 s"})
    with pytest.raises(NodeLostError, match="node 1 stopped answering after 20 s: no trial"):
        runner.run(WindowOrder(config=TrialConfig(batch_size=8)), tmp_path / "one.log")
