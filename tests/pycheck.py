"""PASS/FAIL lines for the Python-side tests (tests/*_test.py), counted by tests/run.sh."""
import sys


class Checks:
    def __init__(self):
        self.failed = 0

    def case(self, name, ok, why=""):
        if ok:
            print(f"PASS {name}")
        else:
            self.failed += 1
            print(f"FAIL {name}: {why}")
        sys.stdout.flush()
