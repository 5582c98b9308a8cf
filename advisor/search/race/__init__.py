"""The race that decides a time-to-loss recommendation (docs/method.md, "The race
and its verdict").

- `noise`: the gradient noise scale, from a noise trial of the user's configuration;
- `plan`: what phi predicts per global batch, which batches race, each racer's learning rate;
- `run`: the racers, each in a fresh trial process, stopped once they can no longer win;
- `verdict`: time each racer to the baseline's loss, and choose.
"""
