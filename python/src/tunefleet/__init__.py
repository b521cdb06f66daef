"""Tunefleet from Python: a workload's side of the protocol
(:class:`Trial`) and a study's trials read from a store (:func:`load`)."""

from .results import ExportError, Study, TrialRecord, load
from .trial import MAX_LINE, MAX_THREADS, Trial

__all__ = ["ExportError", "MAX_LINE", "MAX_THREADS", "Study", "Trial", "TrialRecord", "load"]
__version__ = "0.5.0"
