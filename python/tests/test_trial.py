"""Tests of tunefleet.Trial, the workload protocol: `pytest python/tests`."""

import io
import json
import unittest

import tunefleet


class Out(io.StringIO):
    """Standard output that counts its flushes."""

    def __init__(self):
        super().__init__()
        self.flushes = 0

    def flush(self):
        self.flushes += 1
        super().flush()


def trial(control="", **env):
    out, err = Out(), io.StringIO()
    t = tunefleet.Trial(env=env, out=out, control=io.StringIO(control), err=err)
    return t, out, err


def lines(out):
    return [json.loads(l) for l in out.getvalue().splitlines()]


class TrialTest(unittest.TestCase):
    def test_epoch_lines_carry_metrics_threads_and_checkpoint_and_are_flushed(self):
        t, out, _ = trial(TUNEFLEET_THREADS="3")
        t.epoch(1, loss=0.5, accuracy=1, name="x", ok=True, bad=float("nan"), checkpoint="/ck/1")
        self.assertEqual(lines(out), [{"event": "epoch", "epoch": 1, "loss": 0.5, "accuracy": 1,
                                       "threads": 3, "checkpoint": "/ck/1"}])
        self.assertEqual(out.flushes, 1, "each line flushed at once")

    def test_unsteered_workloads_never_read(self):
        t, out, _ = trial(control="threads=4\n")
        t.epoch(1, loss=1.0)
        t.epoch(2, loss=0.5)
        self.assertEqual(t.threads, 1)
        self.assertEqual(t._control.read(), "threads=4\n", "nothing read")

    def test_the_line_after_an_epoch_applies_from_the_next_one(self):
        t, out, _ = trial(control="threads=2\n\nthreads=4\n", TUNEFLEET_CONTROL="stdin", OMP_NUM_THREADS="1")
        self.assertEqual(t.epoch(1, loss=1.0), 2)
        self.assertEqual(t.epoch(2, loss=0.9), 2, "an empty line changes nothing")
        t.epoch(3, loss=0.8)
        t.epoch(4, loss=0.7, last=True)
        self.assertEqual([l["threads"] for l in lines(out)], [1, 2, 2, 4])

    def test_the_last_epoch_reads_nothing_and_end_of_file_ends_steering(self):
        t, _, _ = trial(control="threads=2\n", TUNEFLEET_CONTROL="stdin")
        t.epoch(1, last=True)
        self.assertEqual(t.threads, 1)
        t, _, _ = trial(control="", TUNEFLEET_CONTROL="stdin")
        t.epoch(1)
        self.assertFalse(t.steered)
        t.epoch(2)
        self.assertEqual(t.threads, 1)

    def test_bad_settings_are_reported_once_and_the_good_ones_apply(self):
        control = "speed=9 threads=0 junk threads=3\nspeed=1\n"
        t, _, err = trial(control=control, TUNEFLEET_CONTROL="stdin")
        t.epoch(1)
        t.epoch(2)
        self.assertEqual(t.threads, 3)
        text = err.getvalue()
        self.assertEqual(text.count("unknown key 'speed'"), 1, text)
        self.assertIn("threads=0 out of range", text)
        self.assertIn("malformed setting 'junk'", text)

    def test_a_line_too_long_is_ignored_whole(self):
        control = "threads=2 " + "x" * 5000 + "\nthreads=5\n"
        t, _, err = trial(control=control, TUNEFLEET_CONTROL="stdin")
        t.epoch(1)
        self.assertEqual(t.threads, 1)
        self.assertIn("longer than 4096", err.getvalue())
        t.epoch(2)
        self.assertEqual(t.threads, 5, "the next line is read as usual")

    def test_step_lines_only_when_asked_and_final_metrics(self):
        t, out, _ = trial()
        t.step()
        t.final(accuracy=0.9, note="x")
        self.assertEqual(lines(out), [{"event": "final", "accuracy": 0.9}])
        t, out, _ = trial(TUNEFLEET_STEPS="1")
        t.step()
        t.step()
        self.assertEqual(lines(out), [{"event": "step", "step": 1}, {"event": "step", "step": 2}])


if __name__ == "__main__":
    unittest.main()
