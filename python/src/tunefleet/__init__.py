"""Tunefleet from Python: a workload's side of the protocol
(:class:`Trial`), a study's trials read from a store (:func:`load`), and a
client of ``tunefleet serve``'s HTTP API (:class:`Client`), through which a
sampler of your own drives a study (:func:`drive`)."""

from .client import FINAL, ApiError, Ask, Client, access_file, drive, optuna_distributions
from .results import ExportError, Study, TrialRecord, load
from .trial import MAX_LINE, MAX_THREADS, Trial

__all__ = [
    "FINAL",
    "ApiError",
    "Ask",
    "Client",
    "ExportError",
    "MAX_LINE",
    "MAX_THREADS",
    "Study",
    "Trial",
    "TrialRecord",
    "access_file",
    "drive",
    "load",
    "optuna_distributions",
]
__version__ = "0.6.0"
