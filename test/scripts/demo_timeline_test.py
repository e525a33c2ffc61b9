#!/usr/bin/env python3
"""scripts/demo_timeline.py: the predicted-against-measured gain of each
switch a gain decided (issue 35, an honest demo), from decision events and
the controller's `generations` table, and the wait on a decision."""
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "..", "..", "scripts")
sys.path.insert(0, SCRIPTS)
import demo_timeline  # noqa: E402


def decision(verdict, trigger, generation, old, new):
    return {"kind": "decision", "message": f"{verdict} ({trigger}): ...",
            "decision": {"verdict": verdict, "trigger": trigger,
                         "generation": str(generation),
                         "old_throughput": old, "new_throughput": new}}


class GainsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.db = os.path.join(self.dir.name, "controller.db")
        c = sqlite3.connect(self.db)
        c.execute("create table generations (generation integer, "
                  "measured_iteration_s real)")
        c.executemany("insert into generations values (?, ?)",
                      [(1, 4.0), (2, 2.5), (3, 0.0)])
        c.commit()
        c.close()

    def tearDown(self):
        self.dir.cleanup()

    def test_each_measured_switch_beside_its_prediction(self):
        events = [
            decision("keep", "replan (corrections moved ...)", 0, 0.25, 0.25),
            decision("switch", "join d", 2, 0.25, 0.35),
            # Forced (old 0), and generation 3 not measured: left out.
            decision("switch", "drain a", 3, 0.0, 0.3),
        ]
        rows = demo_timeline.gains(
            events, demo_timeline.measured_iteration_s(self.db))
        self.assertEqual(len(rows), 1)
        g, trigger, predicted, measured, ok = rows[0]
        self.assertEqual((g, trigger), (2, "join d"))
        self.assertAlmostEqual(predicted, 1.4)
        self.assertAlmostEqual(measured, 1.6)
        # 1.4 / 1.6 = 0.875: within 25%.
        self.assertTrue(ok)
        rows = demo_timeline.gains(
            [decision("switch", "join d", 2, 0.25, 0.26)],
            demo_timeline.measured_iteration_s(self.db))
        # 1.04 / 1.6 = 0.65: not within 25%.
        self.assertFalse(rows[0][4])

    def test_wait_returns_the_decision_it_was_asked_for(self):
        events = os.path.join(self.dir.name, "events.jsonl")
        with open(events, "w") as f:
            f.write(json.dumps({"kind": "decision",
                                "message": "keep (join d): the new plan is "
                                           "the current plan"}) + "\n")
        out = subprocess.run(
            [sys.executable, os.path.join(SCRIPTS, "demo_timeline.py"), "wait",
             events, "--decision", "join d", "--timeout", "5"],
            capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout,
                         "keep (join d): the new plan is the current plan\n")
        out = subprocess.run(
            [sys.executable, os.path.join(SCRIPTS, "demo_timeline.py"), "wait",
             events, "--decision", "join e", "--timeout", "0.3"],
            capture_output=True, text=True)
        self.assertEqual(out.returncode, 1)
        self.assertIn('waiting for a decision on "join e"', out.stderr)

    def test_wait_returns_the_first_fit(self):
        events = os.path.join(self.dir.name, "events.jsonl")
        with open(events, "w") as f:
            f.write(json.dumps({"kind": "decision", "message": "first plan"})
                    + "\n")
        wait = [sys.executable, os.path.join(SCRIPTS, "demo_timeline.py"),
                "wait", events, "--calibration", "--timeout", "0.3"]
        out = subprocess.run(wait, capture_output=True, text=True)
        self.assertEqual(out.returncode, 1)
        self.assertIn("waiting for the first fit of the corrections",
                      out.stderr)
        with open(events, "a") as f:
            f.write(json.dumps({"kind": "calibration",
                                "message": "corrections compute_scale A6000 "
                                           "1.130"}) + "\n")
        out = subprocess.run(wait, capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout, "corrections compute_scale A6000 1.130\n")


if __name__ == "__main__":
    unittest.main()
