#!/usr/bin/python3
"""The demo-model trainer resumes where it stopped (issue 26 item 5, tools/train/train.py):
a run of 3 steps over two phases (dense 2, sparse 1) on the demo config
with random tokens, batch 1 x 32, one process, against the same run stopped with
--stop-at-step 1 (status 3), resumed and stopped again at 2 (the phase boundary), then
resumed to the end: the final weights, optimizer step and evaluation record are identical
bit for bit, and a killed save never leaves a half-written state.pt (save goes through
state.pt.tmp). Prints PASS / FAIL lines. About a minute of CPU (four torch start-ups); several on a busy machine."""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TRAIN = os.path.join(ROOT, "tools", "train", "train.py")


def case(name, ok, why=""):
    print(("PASS %s" % name) if ok else ("FAIL %s: %s" % (name, why)), flush=True)
    return ok


def run(out, data, extra, timeout=600):
    cmd = [sys.executable, TRAIN, "--data", data, "--out", out, "--model-dir", os.path.join(ROOT, "models", "demo"),
           "--dense", "2", "--sparse", "1", "--qat", "0", "--dspark", "0", "--batch", "1", "--ctx", "32",
           "--procs", "1", "--save-every", "100", "--warmup", "1", "--eval-every", "1000"] + extra
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def main():
    with tempfile.TemporaryDirectory(prefix="ds41-train-resume.") as tmp:
        data = os.path.join(tmp, "data")
        os.makedirs(data)
        rng = np.random.default_rng(7)
        # random ids of the demo vocabulary: enough windows of 33 tokens for training and evaluation
        rng.integers(3, 4000, size=20000).astype("<u2").tofile(os.path.join(data, "train.bin"))
        rng.integers(3, 4000, size=4000).astype("<u2").tofile(os.path.join(data, "heldout.bin"))
        a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
        rc, log = run(a, data, [])
        if not case("train_uninterrupted", rc == 0 and os.path.exists(os.path.join(a, "state.pt")), "status %d: %s" % (rc, log[-600:])):
            return 1
        rc1, log1 = run(b, data, ["--stop-at-step", "1"])
        case("train_stop_status", rc1 == 3 and "stopped at step 1 of 3" in log1, "status %d: %s" % (rc1, log1[-400:]))
        s1 = torch.load(os.path.join(b, "state.pt"))
        case("train_stop_saved_step", s1["step"] == 1 and s1["phase"] == "dense", "step %r phase %r" % (s1["step"], s1["phase"]))
        rc2, log2 = run(b, data, ["--resume", "--stop-at-step", "2"])
        case("train_resume_stop_again", rc2 == 3 and "resumed at step 1 (dense)" in log2 and "stopped at step 2" in log2,
             "status %d: %s" % (rc2, log2[-400:]))
        rc3, log3 = run(b, data, ["--resume"])
        case("train_resume_finish", rc3 == 0 and "resumed at step 2 (dense)" in log3, "status %d: %s" % (rc3, log3[-400:]))
        sa, sb = torch.load(os.path.join(a, "state.pt")), torch.load(os.path.join(b, "state.pt"))
        ma, mb = sa["model"], sb["model"]
        diff = [k for k in ma if k not in mb or not torch.equal(ma[k], mb[k])]
        case("train_resume_same_weights", not diff and len(ma) == len(mb),
             "%d of %d tensors differ (first %s)" % (len(diff), len(ma), diff[:3]))
        case("train_resume_same_record", sa["step"] == sb["step"] == 3 and sa["evals"] == sb["evals"],
             "steps %r %r evals %r %r" % (sa["step"], sb["step"], sa["evals"], sb["evals"]))
        case("train_no_tmp_left", not os.path.exists(os.path.join(b, "state.pt.tmp")), "state.pt.tmp left behind")
    return 0


if __name__ == "__main__":
    sys.exit(main())
