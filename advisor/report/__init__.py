"""What a tune hands the user, rendered from a `TuneResult`: pure functions that decide nothing
and import nothing from `advisor.search` or `advisor.decide` (which decided it all).

- `render`: report.md, report.html and trials.csv;
- `change`: the reports' first line: what to change, from what to what, and what it buys;
- `verdicts`: the race's and the schedule's verdicts, the notes and the bottleneck, in words;
- `race_view`, `schedule_view`: what the reports say about the race, the learning rate, the
  noise scale and the batch-size schedule;
- `plots`: the HTML report's figures;
- `codegen`: train.py and launch.sh;
- `exports`, `fsdp_export`: the recommendation for HF Trainer, Lightning and accelerate, from
  the knob table;
- `templating`: the Jinja2 environment of `templates/`.
"""
