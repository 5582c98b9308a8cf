"""What a tune hands the user, rendered from a `TuneResult`: pure functions that decide nothing
and import nothing from `advisor.search` (which decided it all).

- `render`: report.md, report.html and trials.csv;
- `race`: what the reports say about the race, the learning rate and the noise scale;
- `plots`: the HTML report's figures;
- `codegen`: train.py and launch.sh;
- `exports`: the recommendation for HF Trainer, Lightning and accelerate, from the knob table;
- `templating`: the Jinja2 environment of `templates/`.
"""
