"""Tunefleet's workload protocol for Python, without dependencies.

A workload reports its epochs (and, when asked, its steps) on standard
output and, in a pipelined study with ``[pipeline] control = true``, reads
the agent's settings (a thread count) between epochs. This module does both
as docs/PROTOCOL.md says (``pip install ./python`` from the repository)::

    import tunefleet

    trial = tunefleet.Trial()
    for epoch in range(1, epochs + 1):
        for batch in batches:
            trial.step()                      # a step line, only when asked
            train(batch, threads=trial.threads)
        trial.epoch(epoch, loss=loss, accuracy=acc,
                    checkpoint=save(epoch), last=epoch == epochs)
    trial.final(accuracy=acc)

``trial.threads`` is the thread count to use now: ``TUNEFLEET_THREADS``,
else ``OMP_NUM_THREADS``, else 1 at start, then whatever the agent sets.
"""

import json
import math
import os
import sys
from typing import Any, Dict, Mapping, Optional, Set, TextIO

#: Longest control line read (bytes without the newline); longer ones are ignored.
MAX_LINE = 4096
#: Largest thread count a control line may set.
MAX_THREADS = 1024


def _first_threads(env: Mapping[str, str]) -> int:
    for name in ("TUNEFLEET_THREADS", "OMP_NUM_THREADS"):
        value = env.get(name, "").strip()
        if value.isdecimal() and 1 <= int(value) <= MAX_THREADS:
            return int(value)
    return 1


class Trial:
    """One trial's side of the protocol: epoch, step and final lines on
    ``out``, control lines from ``control`` (standard input by default)."""

    def __init__(
        self,
        env: Optional[Mapping[str, str]] = None,
        out: Optional[TextIO] = None,
        control: Optional[TextIO] = None,
        err: Optional[TextIO] = None,
    ) -> None:
        env = os.environ if env is None else env
        self._out = sys.stdout if out is None else out
        self._control = sys.stdin if control is None else control
        self._err = sys.stderr if err is None else err
        self.steered = env.get("TUNEFLEET_CONTROL") == "stdin"
        self.steps_wanted = env.get("TUNEFLEET_STEPS") == "1"
        self.threads = _first_threads(env)
        self._step = 0
        self._reported: Set[str] = set()

    def _emit(self, record: Dict[str, Any]) -> None:
        self._out.write(json.dumps(record, separators=(",", ":")) + "\n")
        # Unflushed, the line would sit in a buffer while the workload waits
        # for the agent's answer to it: both sides would wait for ever.
        self._out.flush()

    @staticmethod
    def _metrics(metrics: Mapping[str, Any]) -> Dict[str, float]:
        """Finite numbers only: the agent drops anything else (and JSON has no NaN)."""
        kept: Dict[str, float] = {}
        for name, value in metrics.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if isinstance(value, float) and not math.isfinite(value):
                continue
            kept[name] = value
        return kept

    def step(self) -> None:
        """One training step done: a step line when the agent asked for
        them (``TUNEFLEET_STEPS=1``, probe windows counted in steps)."""
        self._step += 1
        if self.steps_wanted:
            self._emit({"event": "step", "step": self._step})

    def epoch(self, epoch: int, last: bool = False, checkpoint: Optional[object] = None, **metrics: float) -> int:
        """Epoch ``epoch`` done with these metrics; ``checkpoint`` names
        where its state was saved (a moved trial resumes from it). Unless
        it is the ``last`` one, the agent's next setting is read and
        applied. Returns the thread count for the next epoch."""
        record: Dict[str, Any] = {"event": "epoch", "epoch": int(epoch)}
        record.update(self._metrics(metrics))
        record["threads"] = self.threads
        if checkpoint is not None:
            record["checkpoint"] = str(checkpoint)
        self._emit(record)
        if self.steered and not last:
            self._read_control()
        return self.threads

    def final(self, **metrics: float) -> None:
        """The trial's final metrics (else those of its last epoch count)."""
        record: Dict[str, Any] = {"event": "final"}
        record.update(self._metrics(metrics))
        self._emit(record)

    def _report(self, key: str, message: str) -> None:
        if key not in self._reported:
            self._reported.add(key)
            self._err.write("control: " + message + "\n")
            self._err.flush()

    def _read_control(self) -> None:
        try:
            line = self._control.readline(MAX_LINE + 2)
        except (OSError, ValueError) as e:
            self._report("read error", "read error, steering ends: %s" % e)
            self.steered = False
            return
        if line == "":
            # End of file: nobody steers any more.
            self.steered = False
            return
        if not line.endswith("\n") and len(line) > MAX_LINE:
            # Too long: skip the rest of it, and ignore it whole.
            while True:
                rest = self._control.readline(MAX_LINE + 2)
                if rest == "" or rest.endswith("\n"):
                    break
            self._report("too long", "a line longer than %d bytes ignored" % MAX_LINE)
            return
        for word in line.split():
            key, sep, value = word.partition("=")
            if not sep or not key:
                self._report("malformed " + word, "malformed setting %r ignored" % word)
            elif key == "threads":
                if value.isdecimal() and 1 <= int(value) <= MAX_THREADS:
                    self.threads = int(value)
                else:
                    self._report("malformed " + word, "threads=%s out of range (1 to %d): ignored" % (value, MAX_THREADS))
            else:
                self._report("unknown " + key, "unknown key %r ignored" % key)
