"""A small, readable GPT for studying the transformer block."""

from .config import GPTConfig, TrainConfig
from .errors import UserError

__all__ = ["GPT", "GPTConfig", "TrainConfig", "UserError", "from_pretrained"]


def __getattr__(name: str):
    # GPT, and torch with it, loads on first use, so `python -m gpt.sweep` and the other module
    # commands start with nothing slow imported and can take a Ctrl-C from their first line on
    if name == "GPT":
        from .model import GPT
        return GPT
    if name == "from_pretrained":
        from .pretrained import from_pretrained
        return from_pretrained
    if name.isidentifier():     # gpt.model and the rest, as importing the package once made them
        import importlib
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "GPT", "from_pretrained"})
