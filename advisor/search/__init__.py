"""The search: which configurations to measure, and which one wins.

- `space`: the searchable domains on this machine, the fixed knobs and the baseline;
- `study`: the Optuna study that proposes and measures configurations;
- `pruning`: early stopping of search trials far slower than the best;
- `storage`: opening the Optuna storage a study lives in;
- `records`: what advisor stores in a study, and reading it back;
- `selection`: re-measuring the finalists and choosing the winner;
- `checks`: preflight of the task, memory headroom, numerics of knobs that change the maths;
- `context`: what these share while a tune runs.
"""
