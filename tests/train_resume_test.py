#!/usr/bin/python3
"""The demo-model trainer resumes where it stopped (issue 26 item 5, tools/train/train.py):
a run of 3 steps over two phases (dense 2, sparse 1) on the demo config
with random tokens, batch 1 x 32, one process, against the same run stopped with
--stop-at-step 1 (status 3), resumed and stopped again at 2 (the phase boundary), then
resumed to the end: the final weights, optimizer step and evaluation record are identical
bit for bit, and a killed save never leaves a half-written state.pt (save goes through
state.pt.tmp). Prints PASS / FAIL lines. About a minute of CPU (four torch start-ups); several on a busy machine.

Also (issue 24 item 6, in this process, a few seconds): the export of a vision state whose language
model was trained (vision_export.py after vision_train.py --train-lm) on models/demo: one tensor of
each release format moved off its released values and one trained tensor left where it was; every
tensor of the base file outside the moved ones keeps its bytes, the moved ones decode to the
trained values in their format (v41.py's torch fake quantizers, the ones the training computes
with, an implementation independent of export.py's NumPy encoders), the tower to its BF16 values,
and a state trained on another file is refused.

Also (issue 26 item 5: training continued from the committed model when a sitting's state was
lost): train.py --init-release models/demo --release-phase sparse starts at the sparse phase
from the release's decoded values (one step at learning rate 0 leaves every weight but the
routing biases, which the balancing moves by 1e-3, exactly load_release's); its export put
beside models/demo's tower by dspark_swap.py merge --part text holds the export's bytes for
every text tensor and the base's for every tower tensor, check --part text accepts it and
refuses a file whose tower changed."""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TRAIN = os.path.join(ROOT, "tools", "train", "train.py")
sys.path.insert(0, os.path.join(ROOT, "tools", "train"))


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
        vision_export_roundtrip(tmp)
        release_continuation(tmp, data)
    return 0


def release_continuation(tmp, data):
    import json
    import v41
    import export
    import dspark_swap
    from vision_export import read_raw
    base = os.path.join(ROOT, "models", "demo")
    out = os.path.join(tmp, "cont")
    rc, log = run(out, data, ["--init-release", base, "--release-phase", "sparse", "--lr", "0"])
    case("release_phase_sparse_starts", rc == 0 and "sparse phase from step 2" in log, "status %d: %s" % (rc, log[-400:]))
    st = torch.load(os.path.join(out, "state.pt"))
    with open(os.path.join(base, "config.json")) as f:
        model = v41.V41(json.load(f))
    rel = export.load_release(model, base)
    moved = sorted(k for k in rel if not torch.equal(rel[k], st["model"][k]))
    biases = [k for k in moved if k.endswith("ffn.bias")]
    step = max((st["model"][k] - rel[k]).abs().max().item() for k in biases) if biases else 0.0
    case("release_phase_sparse_from_release", st["step"] == 3 and moved == biases and abs(step - 1e-3) < 1e-6,
         "step %r; changed beyond the routing biases: %s; bias step %g" % (st["step"], sorted(set(moved) - set(biases))[:4], step))
    exp = os.path.join(tmp, "cont-export")
    os.makedirs(exp)
    with open(os.path.join(base, "config.json")) as f, open(os.path.join(exp, "config.json"), "w") as g:
        g.write(f.read())
    argv = sys.argv
    try:
        sys.argv = ["export.py", "--state", os.path.join(out, "state.pt"), "--out", exp,
                    "--released", os.path.join(exp, "released.pt")]
        export.main()
        merged = os.path.join(tmp, "merged.safetensors")
        sys.argv = ["dspark_swap.py", "merge", "--part", "text", "--base", os.path.join(base, "model.safetensors"),
                    "--drafter", os.path.join(exp, "model.safetensors"), "--out", merged]
        dspark_swap.main()
        rb, re_, rm = (read_raw(os.path.join(base, "model.safetensors")), read_raw(os.path.join(exp, "model.safetensors")),
                       read_raw(merged))
        wrong = [n for n in rm if not np.array_equal(rm[n][2], (rb if dspark_swap.is_tower(n) else re_)[n][2])]
        n_tower = sum(dspark_swap.is_tower(n) for n in rm)
        case("merge_text_bytes", set(rm) == set(rb) and not wrong and n_tower > 0 and len(re_) == len(rm) - n_tower,
             "%d tensors with the wrong bytes (first %s), %d tower tensors" % (len(wrong), wrong[:3], n_tower))

        def check(new):
            sys.argv = ["dspark_swap.py", "check", "--part", "text", "--old", os.path.join(base, "model.safetensors"),
                        "--new", new]
            try:
                dspark_swap.main()
            except SystemExit as e:
                return e.code
            return None
        case("check_text_accepts", check(merged) == 0, "check --part text refused the merge")
        raw = bytearray(open(merged, "rb").read())
        hdr = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
        a = hdr["vision.norm.weight"]["data_offsets"][0] + 8 + int.from_bytes(raw[:8], "little")
        raw[a] ^= 1
        bad = os.path.join(tmp, "bad-tower.safetensors")
        open(bad, "wb").write(raw)
        case("check_text_refuses_tower_change", check(bad) == 1, "a changed tower byte was accepted")
    finally:
        sys.argv = argv


def vision_export_roundtrip(tmp):
    import json
    import v41
    import export
    import vision_export
    import vision_train
    base = os.path.join(ROOT, "models", "demo")
    with open(os.path.join(base, "config.json")) as f:
        model = v41.V41(json.load(f))
    old = export.load_release(model, base)
    # one tensor of each release format (and of each kind of parameter), moved by ~5 % of its scale
    moved = {"blocks.0.attn.wq_a.weight": v41.fp8_tile_dq, "blocks.1.ffn.experts.3.w1.weight": v41.fp4_row_dq,
             "engrams.1.table": v41.e4m3_row_dq, "blocks.2.attn_norm.weight": v41.bf16, "embed": v41.bf16,
             "engrams.3.qk": v41.bf16, "blocks.0.hc_attn.base": lambda w: w}
    g = torch.Generator().manual_seed(24)
    trained = {k: old[k] + 0.05 * old[k].abs().mean() * torch.randn(old[k].shape, generator=g) for k in moved}
    trained["blocks.3.attn.wkv.weight"] = old["blocks.3.attn.wkv.weight"].clone()      # trained, did not move
    torch.manual_seed(3)
    tower = vision_train.Tower(vision_train.VISION, model.cfg["dim"])
    sha = vision_train.file_sha256(os.path.join(base, "model.safetensors"))
    state = os.path.join(tmp, "vision_state.pt")
    out = os.path.join(tmp, "cand")
    torch.save({"tower": tower.state_dict(), "vision": vision_train.VISION, "image_token_id": 16,
                "base_sha256": sha, "lm": trained}, state)
    argv = sys.argv
    try:
        sys.argv = ["vision_export.py", "--state", state, "--base", base, "--out", out]
        vision_export.main()
    finally:
        sys.argv = argv
    raw_old = vision_export.read_raw(os.path.join(base, "model.safetensors"))
    raw_new = vision_export.read_raw(os.path.join(out, "model.safetensors"))
    smap = export.source_map(model)
    moved_names = set()
    for b, (key, kind) in smap.items():
        if key in moved:
            moved_names.update(export.file_names(b, kind))
    # the base's own tower (models/demo has one since make train-vision) is replaced, not kept
    tower_names = ("vision.", "aligner.", "image_")
    kept = [n for n in raw_old if n not in moved_names and not n.startswith(tower_names)]
    same = [n for n in kept if n in raw_new and raw_new[n][:2] == raw_old[n][:2] and
            np.array_equal(raw_new[n][2], raw_old[n][2])]
    case("vision_export_lm_untouched_bytes", len(same) == len(kept) and len(kept) > 700,
         "%d of %d untouched tensors byte-identical (first differing: %s)"
         % (len(same), len(kept), sorted(set(kept) - set(same))[:3]))
    new = export.load_release(model, out)
    bad = []
    for k, fq in moved.items():
        want = fq(trained[k]).reshape(old[k].shape)
        if not torch.equal(new[k], want) or torch.equal(new[k], old[k]):
            bad.append("%s (max |new - trained in format| %g)" % (k, (new[k] - want).abs().max().item()))
    changed = sorted(n for n in moved_names if not np.array_equal(raw_new[n][2], raw_old[n][2]))
    case("vision_export_lm_moved_decode", not bad and len(changed) >= len(moved),
         "%s; %d of %d moved file tensors changed bytes" % (bad, len(changed), len(moved_names)))
    tb = vision_export.read_raw(os.path.join(out, "model.safetensors"))["vision.blocks.1.attn.wqkv.weight"][2]
    tv = (np.frombuffer(tb.tobytes(), dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    tw = tower.state_dict()["blocks.1.wqkv.weight"]
    case("vision_export_tower_bf16", np.array_equal(tv, v41.bf16(tw).numpy().reshape(-1)), "tower weights not their BF16 values")
    torch.save({"tower": tower.state_dict(), "vision": vision_train.VISION, "image_token_id": 16,
                "base_sha256": "0" * 64, "lm": trained}, state)
    try:
        sys.argv = ["vision_export.py", "--state", state, "--base", base, "--out", os.path.join(tmp, "cand2")]
        vision_export.main()
        refused, msg = False, "exported"
    except SystemExit as e:
        refused, msg = "sha256" in str(e) and "--base" in str(e), str(e)
    finally:
        sys.argv = argv
    case("vision_export_other_base_refused", refused, msg)


if __name__ == "__main__":
    sys.exit(main())
