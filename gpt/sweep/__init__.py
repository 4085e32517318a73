"""Ablation sweeps: run a grid of settings over several seeds, then report what changed.

    python train.py --config shakespeare_char_cpu --sweep residual=true,false --seeds=3 --out_dir=DIR
    python -m gpt.sweep report DIR

Each run is its own `python train.py` process writing to DIR/<setting>__seed=<n>/, so runs are
isolated, can go side by side (--jobs), and a sweep started again skips finished runs and
resumes interrupted ones. The report reads only DIR/sweep.json and the run folders' config.json,
metrics.jsonl and result.json.

grid.py makes the runs (tune.py those of a tuned sweep: tuning runs, then runs at each setting's
chosen value), runner.py runs them (submit.py and job.py as submitit jobs, --launcher=slurm;
submitted.py and status.py follow those jobs), report.py reads what they wrote (with stats.py,
compute.py and comparisons.py) and plots.py and study_plots.py draw it.
"""
