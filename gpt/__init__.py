"""A small, readable GPT for studying the transformer block."""

from .config import GPTConfig, TrainConfig, UserError
from .model import GPT

__all__ = ["GPT", "GPTConfig", "TrainConfig", "UserError"]
