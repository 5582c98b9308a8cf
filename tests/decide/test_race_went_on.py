"""The race goes on for its finalists where it kept the user's global batch: racers answered
in-process (`ScriptedRunner`) save their state and go on from it; the rule for when it goes on,
on described racers. That a real racer saves and loads its training state is
tests/trial/test_racer_state.py's."""

from pathlib import Path

import optuna

from advisor.decide.race.extend import go_on, going_on, why_not_go_on
from advisor.decide.race.plan import RacePlan, lr_rule
from advisor.decide.race.run import run_race
from advisor.decide.race.verdict import decide_race
from advisor.knobs import TrialConfig
from advisor.report.verdicts import race_verdict
from advisor.results import LrPlan, RaceCurve, RacePoint, Racer, TrialResult
from advisor.search.context import SearchContext
from advisor.search.records import StudyKey, read_racers
from advisor.settings import TuneSettings
from advisor.trial.orders import RaceOrder
from tests.decide.test_race import big_batch_loses
from tests.scripted_runner import ScriptedRunner, scripted_context
from tests.search.interrupts import StopAfterFirstRacer

SMALL = TrialConfig(batch_size=8)
BIG = TrialConfig(batch_size=256)
RACE_S = 1.5


class SavingRunner(ScriptedRunner):
    """A scripted runner whose racers save their state and go on from it, as a trial child does
    (advisor.trial.child.racer_state): a first race writes a file at `RaceOrder.state`; one that
    `continues` a curve needs that file, keeps the curve's points and adds those of the order's
    evaluation grid past its last one, the loss falling on from where it stopped."""

    def _race(self, order: RaceOrder) -> TrialResult:
        if order.continues is None:
            if order.state is not None:
                Path(order.state).write_bytes(b"")
            return super()._race(order)
        assert order.state is not None and Path(order.state).exists(), "no state to go on from"
        # The whole curve from the start on the order's grid; the part past its last point is
        # the part that goes on.
        result = super()._race(order.model_copy(update={"target": None}))
        assert result.race is not None
        last = order.continues.points[-1]
        points = list(order.continues.points)
        for point in (p for p in result.race.points if p.seconds > last.seconds):
            points.append(point)
            if order.target is not None and point.loss <= order.target:
                break
        curve = result.race.model_copy(update={"points": tuple(points)})
        return result.model_copy(update={"race": curve})


def _context(tmp_path: Path, progress: StopAfterFirstRacer) -> tuple[SearchContext, SavingRunner]:
    settings = TuneSettings(
        spec="train.py:task",
        race_seconds=RACE_S,
        race_continue=2.0,
        max_world_size=1,
        out=tmp_path,
    )
    scripted = big_batch_loses()
    runner = SavingRunner(rate=scripted.rate, loss=scripted.loss)
    return scripted_context(settings, runner, tmp_path, progress=progress), runner


def _never_stop() -> StopAfterFirstRacer:
    progress = StopAfterFirstRacer()
    progress.started.append("(never stop)")
    return progress


def test_a_race_that_kept_your_batch_goes_on_from_where_its_finalists_stopped(tmp_path):
    """Batch 256 loses (exact labels, samples/s flat in the batch): the race keeps 8, then the
    baseline and the nearer of 256's two learning rates go on to twice the race time, each
    from its saved state, and the verdict is decided again there."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/study.db", study_name="race")
    progress = _never_stop()
    context, runner = _context(tmp_path, progress)
    plans = [
        RacePlan("baseline", 0, SMALL, LrPlan(), 1000.0),
        RacePlan("candidate", 1, BIG, LrPlan(), 1000.0),
        RacePlan("candidate", 1, BIG, lr_rule("SGD", 8, 256), 1000.0),
    ]
    race = decide_race(run_race(study, context, plans, states=tmp_path / "states"), RACE_S)
    assert race.racers[race.winner].config == SMALL, race.verdict
    assert why_not_go_on(race, 2.0) is None
    nearest = going_on(race)[-1]
    assert [r.role for r in going_on(race)] == ["baseline", "candidate"]
    started = len(progress.started)
    runner.orders.clear()

    went = go_on(study, context, race)

    assert (went.seconds, went.went_on_from, went.first_race) == (2 * RACE_S, RACE_S, race)
    assert went.racers[went.winner].config == SMALL, went.verdict
    # Each that went on loaded the state its first race saved, and went on from its curve.
    assert [(o.config, o.lr, o.state, o.continues) for o in runner.orders] == [
        (r.config, r.lr, r.state, r.curve) for r in going_on(race)
    ]
    baseline = went.racers[0]
    first = race.racers[0].curve.points
    assert baseline.curve.points[: len(first)] == first
    assert baseline.curve.points[-1].seconds >= 2 * RACE_S
    assert went.target_loss < race.target_loss  # the baseline's lowest over the longer run
    other = next(r for r in went.racers[1:] if r.lr != nearest.lr)
    raced = next(r for r in race.racers[1:] if r.lr == other.lr)
    assert other.curve == raced.curve  # it did not go on
    assert len(progress.started) <= started + 2  # at most the two that went on
    stored = read_racers(study, StudyKey.RACERS_WENT_ON)
    assert [r.role for r in stored] == ["baseline", "candidate"]

    resumed = _never_stop()  # a resumed tune finds them stored, and trains none again
    context, runner = _context(tmp_path, resumed)
    again = go_on(study, context, race)
    assert len(resumed.started) == 1 and again.racers == went.racers
    assert runner.orders == []


def _racer(role: str, config: TrialConfig, losses: list[float], state: Path | None) -> Racer:
    points = tuple(
        RacePoint(seconds=float(i), samples=i * 8, steps=i, loss=loss)
        for i, loss in enumerate(losses)
    )
    result = TrialResult(
        config=config, status="ok", race=RaceCurve(loss_kind="held-out", points=points)
    )
    if state is not None:
        state.write_bytes(b"saved")
    return Racer(
        role=role,  # type: ignore[arg-type]
        config=config,
        lr=LrPlan(),
        race_seconds=len(losses) - 1,
        result=result,
        state=str(state) if state else None,
    )


def test_the_race_goes_on_only_where_it_kept_your_batch_against_another(tmp_path):
    baseline = _racer("baseline", SMALL, [4, 3, 2, 1.5, 1.2, 1.0], tmp_path / "b.pt")
    slower = _racer("candidate", BIG, [4, 3.5, 3, 2.5, 2.0, 1.8], tmp_path / "c.pt")
    sooner = _racer("candidate", BIG, [4, 1.0, 0.5, 0.4, 0.3, 0.2], tmp_path / "d.pt")

    kept = decide_race([baseline, slower], 5)
    assert why_not_go_on(kept, 3.0) is None
    assert "--race-continue 1" in (why_not_go_on(kept, 1.0) or "")
    assert "already" in (why_not_go_on(decide_race([baseline, sooner], 5), 3.0) or "")
    assert "no other global batch" in (why_not_go_on(decide_race([baseline], 5), 3.0) or "")
    Path(baseline.state or "").unlink()  # e.g. a resumed tune whose states were cleaned up
    assert "not saved" in (why_not_go_on(kept, 3.0) or "")


def test_where_the_race_went_on_a_larger_batch_level_with_yours_wins_the_tie():
    """Level at the longer horizon, a larger batch is ahead after it (phi grows as the loss
    falls): it wins once the race went on, never in the first race, and a smaller batch or a
    later one never does."""
    curve = [4, 3, 2, 1.5, 1.2, 1.0]
    baseline = _racer("baseline", SMALL, curve, None)
    level = _racer("candidate", BIG, curve, None)
    later = _racer("candidate", BIG, [4, 3.2, 2.4, 1.8, 1.3, 1.05, 1.0], None)
    smaller = _racer("candidate", TrialConfig(batch_size=4), curve, None)

    first = decide_race([baseline, level], 5)
    went_on = decide_race([baseline, level], 5, went_on=True)

    assert first.racers[first.winner].config == SMALL
    assert went_on.racers[went_on.winner].config == BIG, went_on.verdict
    assert went_on.verdict.kind == "won-level"
    assert "no later than the best at your global batch 8" in race_verdict(went_on)
    for other in (later, smaller):
        kept = decide_race([baseline, other], 6, went_on=True)
        assert kept.racers[kept.winner].config == SMALL, kept.verdict


def test_a_larger_batch_going_on_trains_until_it_can_no_longer_be_level():
    """In the first race a candidate stops once it can no longer beat the pick at your batch by
    the margin; going on, a larger batch trains until the pick's time, where it can still be
    level."""
    from advisor.decide.race.run import _horizon
    from advisor.decide.race.verdict import RACE_MARGIN

    baseline = _racer("baseline", SMALL, [4, 3, 2, 1.5, 1.2, 1.0], None)
    target = 1.0  # the baseline reached it after 5 s
    first = RacePlan("candidate", 1, BIG, LrPlan(), 1000.0)
    going = RacePlan("candidate", 1, BIG, LrPlan(), 1000.0, resumes=baseline)

    assert _horizon(first, [baseline], target, 10) == 5 * (1 - RACE_MARGIN)
    assert _horizon(going, [baseline], target, 10) == 5
