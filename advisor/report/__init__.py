"""What a tune hands the user: pure functions of its stored results.

- `outcome`: the `Recommendation` (confirmed or provisional) and its efficiency;
- `analysis`: what the trials show about single knobs and the bottleneck;
- `render`: report.md, report.html and trials.csv;
- `plots`: the HTML report's figures;
- `codegen`: train.py and launch.sh;
- `templating`: the Jinja2 environment of `templates/`.
"""
