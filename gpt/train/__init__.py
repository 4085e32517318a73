"""Training one model: the loop (loop.py) and what it stands on, one concern a module.

runtime.py   devices, dtypes, memory checks and the torchrun environment
rundir.py    the run folder: guards on out_dir, atomic writes, config.json and command.txt
resume.py    a start afresh or from ckpt.pt, with every random state
setup.py     everything a run needs before its first step
evaluate.py  the mean loss of each split over fixed windows
metrics.py   metrics.jsonl and Weights & Biases
signals.py   Ctrl-C, SIGTERM and SIGHUP as a request to stop after the step
outcome.py   how a run ends: exit statuses, the status a sweep records, a loss as printed
loop.py      train(): setup, then fit (step, evaluate, save) under the learning-rate schedule
"""
