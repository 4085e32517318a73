"""A small, readable GPT for studying the transformer block."""

from .config import GPTConfig, TrainConfig, UserError

__all__ = ["GPT", "GPTConfig", "TrainConfig", "UserError"]


def __getattr__(name: str):
    # GPT, and torch with it, loads on first use, so `python -m gpt.sweep` and the other module
    # commands start with nothing slow imported and can take a Ctrl-C from their first line on
    if name == "GPT":
        from .model import GPT
        return GPT
    raise AttributeError(f"module 'gpt' has no attribute {name!r}")
