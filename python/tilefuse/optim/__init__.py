"""Optimizers with torch.optim's interface whose step is a few multi-tensor
launches of a fusion written in the DSL (adam.py, sgd.py, lion.py: copy
one to write your own)."""

from ._optimizer import Optimizer
from .adam import Adam, AdamW
from .lion import Lion
from .sgd import SGD

__all__ = ["Adam", "AdamW", "Lion", "Optimizer", "SGD"]
