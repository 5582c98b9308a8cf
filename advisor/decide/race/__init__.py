"""The race that decides a time-to-loss recommendation (docs/method.md, "The race
and its verdict").

- `plan`: each racer's role and learning rate, for the batches the noise scale sends to race;
- `run`: the racers, each in a fresh trial, stopped once they can no longer win;
- `verdict`: time each racer to the baseline's loss, and choose;
- `extend`: where the race kept your global batch, its finalists go on to a longer horizon;
- `schedule`: `--schedule auto`: phi along a long run, stages by goodput, the schedule race.
"""
