"""Ablation sweeps (placeholder until the sweep runner lands)."""
from .config import UserError


def run(args, argv):
    raise UserError("sweeps are not available yet")
