#!/usr/bin/env python3
"""Trains the ds41 demo model (a small V4.1, models/demo/config.json) on the token files written
by corpus.py, on the CPU with Debian's python3-torch.

Phases (each a number of optimizer steps; the whole run is seeded and resumable):
  dense   backbone, FP32, attention over every visible compressed entry; the indexers learn
          from the KL term (DeepSeek's dense warm-up of the lightning indexer)
  sparse  backbone, FP32, the inference rule: sliding window + the indexer's top-k entries
  qat     quantization-aware fine-tuning: release weight formats and simulated activation /
          cache quantization (straight-through), lower learning rate
  dspark  the DSpark stages on the frozen (quantized) backbone: block drafts with noise tokens,
          cross-entropy to the text and KL to the backbone, confidence head on acceptance

    python3 tools/train/train.py --data build/demo-data --out build/demo-train \
        --dense 300 --sparse 2200 --qat 300 --dspark 500

Resumable: --resume continues from OUT/state.pt (the model, the optimizer, the step, both random
streams), so a run stopped anywhere (killed, or --stop-after-minutes / --stop-at-step, which save
and exit with status 3) continues to the result an uninterrupted run gives
(tests/train_resume_test.py checks it bit for bit); make train-demo resumes by default.

Writes OUT/state.pt (every --save-every steps and at the end of each phase), OUT/log.jsonl
(one line per logged step) and OUT/eval.json (held-out losses: FP32, post-training quantized
= PTQ, after QAT). export.py turns OUT/state.pt into the release checkpoint."""

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import v41  # noqa: E402

PHASES = ("dense", "sparse", "qat", "dspark")


def load_tokens(path):
    return np.fromfile(path, dtype="<u2").astype(np.int64)


class Data:
    def __init__(self, data_dir, model_dir, T, B, seed):
        self.train = load_tokens(os.path.join(data_dir, "train.bin"))
        self.held = load_tokens(os.path.join(data_dir, "heldout.bin"))
        hc = os.path.join(data_dir, "heldout_chat.bin")
        self.held_chat = load_tokens(hc) if os.path.exists(hc) else None
        self.T, self.B = T, B
        self.rng = np.random.default_rng(seed)
        self.token_map = np.fromfile(os.path.join(model_dir, "engram_token_map.i32"), dtype="<i4").astype(np.int64)

    def windows(self, stream, offsets):
        T = self.T
        w = np.stack([stream[o:o + T + 1] for o in offsets])
        w[:, 0] = 0                 # every window starts with BOS (llama.cpp's perplexity rule)
        return w

    def batch(self):
        off = self.rng.integers(0, len(self.train) - self.T - 2, size=self.B)
        return self.windows(self.train, off)

    def eval_windows(self, stream, n):
        """n fixed, evenly spaced, non-overlapping windows of the held-out stream."""
        step = max(self.T + 1, (len(stream) - self.T - 2) // n)
        off = [i * step for i in range(n) if i * step + self.T + 1 <= len(stream)]
        return self.windows(stream, off)


def eng_ids(model, data, tokens):
    if model.engram_consts is None:
        return None
    pad = int(data.token_map[model.cfg["engram_pad_id"]])
    return torch.from_numpy(v41.engram_ids(model.engram_consts, data.token_map, tokens, pad))


def lm_loss(model, data, w, c):
    x = w[:, :-1]
    logits, kl, _ = model(torch.from_numpy(x), eng_ids(model, data, x), c)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.from_numpy(w[:, 1:]).reshape(-1))
    return loss, kl


@torch.no_grad()
def evaluate(model, data, c, n=48, stream=None):
    model.eval()
    w = data.eval_windows(data.held if stream is None else stream, n)
    tot, cnt = 0.0, 0
    for i in range(0, len(w), 8):
        loss, _ = lm_loss(model, data, w[i:i + 8], c)
        k = w[i:i + 8].shape[0] * (w.shape[1] - 1)
        tot += loss.item() * k
        cnt += k
    model.train()
    return tot / cnt


def draft_loss(model, data, w, c, n_pos, w_ce=0.5, w_kl=0.5):
    """DSpark: drafts at n_pos random positions P per window; returns (loss, accuracy per
    draft position, confidence BCE). w_ce / w_kl weigh the cross-entropy to the text and the KL
    to the frozen backbone."""
    cfg = model.cfg
    bs = cfg["dspark_block_size"]
    x = w[:, :-1]
    B, T = x.shape
    xt = torch.from_numpy(x)
    with torch.no_grad():
        logits_t, _, mh = model(xt, eng_ids(model, data, x), c, want_aux=True)
    hi = T - bs - 1                     # positions P with P+1+bs <= T-1 inside the window
    P = torch.from_numpy(np.sort(data.rng.integers(1, hi, size=(B, n_pos)), axis=1))
    logits, conf = model.draft(xt, mh, P, c)
    bidx = torch.arange(B)[:, None, None]
    kk = torch.arange(bs)[None, None, :]
    tgt = torch.from_numpy(w)[bidx, P[:, :, None] + 2 + kk]                 # t_{P+2+k}
    tprob = F.softmax(logits_t[bidx, P[:, :, None] + 1 + kk], dim=-1)        # target at P+1+k
    lp = F.log_softmax(logits, dim=-1)
    ce = F.nll_loss(lp.reshape(-1, lp.shape[-1]), tgt.reshape(-1))
    kl = (tprob * (torch.log(tprob.clamp(min=1e-12)) - lp)).sum(-1).mean()
    target_greedy = logits_t[bidx, P[:, :, None] + 1 + kk].argmax(-1)
    hit = (logits.argmax(-1) == target_greedy).float()
    bce = F.binary_cross_entropy_with_logits(conf, hit)
    return w_ce * ce + w_kl * kl + 0.2 * bce, hit.mean(dim=(0, 1)), bce


def allreduce_grads(dist, opt, model, phase, n):
    """Average the gradients (one flat buffer) and sum the experts' loads over the workers, so
    every worker takes the same optimizer step and the same balancing update."""
    ps = [p for g in opt.param_groups for p in g["params"] if p.requires_grad]
    for p in ps:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in ps])
    dist.all_reduce(flat)
    flat /= n
    o = 0
    for p in ps:
        k = p.numel()
        p.grad.copy_(flat[o:o + k].view_as(p))
        o += k
    blocks = model.blocks[model.nL:] if phase == "dspark" else model.blocks[:model.nL]
    loads = torch.stack([b.ffn.load if b.ffn.load is not None else torch.zeros(b.ffn.E) for b in blocks])
    dist.all_reduce(loads)
    for b, l in zip(blocks, loads):
        b.ffn.load = l


def phase_of(step, args):
    ends = np.cumsum([args.dense, args.sparse, args.qat, args.dspark])
    for name, end in zip(PHASES, ends):
        if step < end:
            return name, step - (end - getattr(args, name)), getattr(args, name)
    return None, 0, 0


def ctx_for(phase):
    if phase == "dense":
        return v41.Ctx(sim=False, wq=False, sparse=False, want_kl=True)
    if phase == "sparse":
        return v41.Ctx(sim=False, wq=False, sparse=True, want_kl=True)
    return v41.Ctx(sim=True, wq=True, sparse=True, want_kl=(phase == "qat"))


def lr_at(phase, i, n, args):
    if phase in ("dense", "sparse"):
        tot = args.dense + args.sparse
        s = i + (args.dense if phase == "sparse" else 0)
        if s < args.warmup:
            return args.lr * (s + 1) / args.warmup
        prog = (s - args.warmup) / max(1, tot - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * prog)))
    base = args.lr * (0.1 if phase == "qat" else 0.5)
    return base * (0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi * i / max(1, n))))


def make_opt(model, phase, args):
    params = model.draft_params() if phase == "dspark" else model.backbone_params()
    return torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)


def save(path, model, opt, step, data, phase, evals):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "phase": phase,
                "rng": data.rng.bit_generator.state, "torch_rng": torch.get_rng_state(), "evals": evals}, tmp)
    os.replace(tmp, path)


def stop_now(args, step, t_sitting, dist):
    """--stop-at-step / --stop-after-minutes: rank 0's clock decides for every worker."""
    stop = (args.stop_at_step > 0 and step >= args.stop_at_step) or \
        (args.stop_after_minutes > 0 and time.time() - t_sitting >= 60.0 * args.stop_after_minutes)
    if dist is not None and args.stop_after_minutes > 0:
        flag = torch.tensor([1.0 if stop else 0.0])
        dist.broadcast(flag, 0)
        stop = flag.item() > 0
    return stop


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="build/demo-data")
    ap.add_argument("--model-dir", default="models/demo", help="config.json and engram_token_map.i32")
    ap.add_argument("--out", default="build/demo-train")
    for p, d in zip(PHASES, (300, 2200, 300, 500)):
        ap.add_argument("--" + p, type=int, default=d, help="steps of the %s phase (default %d)" % (p, d))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--kl-weight", type=float, default=0.3)
    ap.add_argument("--draft-positions", type=int, default=24)
    ap.add_argument("--seed", type=int, default=41)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--save-every", type=int, default=100)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--stop-after-minutes", type=float, default=0.0,
                    help="save and exit (status 3) after the first step past this much wall time; "
                         "--resume continues (0: no limit)")
    ap.add_argument("--stop-at-step", type=int, default=0,
                    help="save and exit (status 3) once this step is reached; --resume continues (0: none)")
    ap.add_argument("--init-release", metavar="DIR",
                    help="start from a release checkpoint (e.g. models/demo): every tensor decoded from "
                         "DIR/model.safetensors (export.load_release); the run begins at --release-phase")
    ap.add_argument("--release-phase", choices=PHASES[1:], default="dspark",
                    help="with --init-release: the phase the run begins at; dspark (default): the backbone "
                         "frozen as released, only the DSpark stages train; sparse: the backbone trains on "
                         "from the released values (a training continued across sittings whose state was "
                         "lost, from the model that was committed), then qat and dspark as their steps say")
    ap.add_argument("--dspark-minutes", type=float, default=0.0,
                    help="end the dspark phase after this much wall time (its learning-rate schedule then "
                         "runs on elapsed time; --dspark is only the upper bound on steps)")
    ap.add_argument("--draft-ce", type=float, default=0.5, help="dspark loss: weight of the cross-entropy to the text")
    ap.add_argument("--draft-kl", type=float, default=0.5, help="dspark loss: weight of the KL to the backbone")
    ap.add_argument("--procs", type=int, default=2,
                    help="data-parallel worker processes, one thread each (gloo all-reduce); on a busy "
                         "2-core machine two single-threaded workers beat one two-threaded one")
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.procs > 1 and args.rank == 0 and not os.environ.get("DS41_TRAIN_CHILD"):
        import subprocess
        kids = [subprocess.Popen([sys.executable] + sys.argv + ["--rank", str(r)],
                                 env=dict(os.environ, DS41_TRAIN_CHILD="1"),
                                 stdout=subprocess.DEVNULL) for r in range(1, args.procs)]
        os.environ["DS41_TRAIN_CHILD"] = "1"
    dist = None
    if args.procs > 1:
        import torch.distributed as dist
        os.makedirs(args.out, exist_ok=True)
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29541", rank=args.rank, world_size=args.procs)

    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.model_dir, "config.json")) as f:
        doc = json.load(f)
    model = v41.V41(doc)
    data = Data(args.data, args.model_dir, args.ctx, args.batch, args.seed)
    data.rng = np.random.default_rng([args.seed, args.rank])      # each worker its own batches
    state_path = os.path.join(args.out, "state.pt")
    step, evals, phase_loaded = 0, {}, None
    opt = None
    if args.resume and os.path.exists(state_path):
        st = torch.load(state_path)
        model.load_state_dict(st["model"])
        step, evals, phase_loaded = st["step"], st["evals"], st["phase"]
        data.rng.bit_generator.state = st["rng"]
        if args.rank:                  # the saved stream is rank 0's; the others derive theirs
            data.rng = np.random.default_rng([args.seed, args.rank, step])
        torch.set_rng_state(st["torch_rng"])
        opt = make_opt(model, phase_loaded, args)
        opt.load_state_dict(st["opt"])
        print("resumed at step %d (%s)" % (step, phase_loaded), flush=True)
    elif args.init_release:
        import export
        model.load_state_dict(export.load_release(model, args.init_release))
        step = int(np.sum([getattr(args, p) for p in PHASES[:PHASES.index(args.release_phase)]]))
        if args.release_phase == "dspark":
            evals = {"backbone": "release %s" % args.init_release}
        print("initialised from the release in %s; %s phase from step %d" % (args.init_release, args.release_phase, step),
              flush=True)
    total = args.dense + args.sparse + args.qat + args.dspark
    log = open(os.path.join(args.out, "log.jsonl"), "a")
    n_params = sum(p.numel() for p in model.parameters())
    print("model: %.2fM parameters; %d steps of %d x %d tokens" % (n_params / 1e6, total, args.batch, args.ctx), flush=True)
    t0, tok0, step0 = time.time(), 0, step
    t_sitting = time.time()
    cur = phase_loaded
    t_dspark = None
    while step < total:
        phase, i, n = phase_of(step, args)
        if phase == "dspark" and args.dspark_minutes > 0:
            if t_dspark is None:
                t_dspark = time.time()
            # rank 0's clock decides for every worker: progress in [0, 1], stop at 1
            frac = torch.tensor([(time.time() - t_dspark) / (60.0 * args.dspark_minutes)])
            if dist is not None:
                dist.broadcast(frac, 0)
            if frac.item() >= 1.0:
                print("dspark phase: %.1f minutes reached after %d steps" % (args.dspark_minutes, i), flush=True)
                total = step
                break
        if phase != cur:
            if cur in ("sparse",) and "fp32" not in evals:
                evals["fp32"] = evaluate(model, data, ctx_for("sparse"))
                evals["ptq"] = evaluate(model, data, v41.Ctx(sim=True, wq=True, sparse=True))
                print("held-out loss: fp32 %.4f, ptq %.4f" % (evals["fp32"], evals["ptq"]), flush=True)
            if cur == "sparse" and args.rank == 0:
                torch.save(model.state_dict(), os.path.join(args.out, "state_fp32.pt"))
            if cur == "sparse" and dist is not None:
                dist.barrier()
            if cur == "qat" and "qat" not in evals:
                evals["qat"] = evaluate(model, data, ctx_for("qat"))
                print("held-out loss after QAT: %.4f" % evals["qat"], flush=True)
            if phase == "dspark" and "backbone" not in evals:
                # keep the better of post-training quantization and QAT for the release
                if "ptq" in evals and "qat" in evals and evals["ptq"] < evals["qat"]:
                    fp = torch.load(os.path.join(args.out, "state_fp32.pt"))
                    model.load_state_dict({k: v for k, v in fp.items() if not model._is_draft(k)}, strict=False)
                    evals["backbone"] = "ptq"
                else:
                    evals["backbone"] = "qat" if "qat" in evals else "ptq"
                print("release backbone: %s" % evals["backbone"], flush=True)
            if phase == "dspark":
                for prm in model.backbone_params():
                    prm.requires_grad_(False)
            if opt is None or cur is not None:
                opt = make_opt(model, phase, args)
            cur = phase
        c = ctx_for(phase)
        lr = lr_at(phase, i, n, args)
        if phase == "dspark" and args.dspark_minutes > 0:
            lr = lr_at(phase, frac.item() * 1000.0, 1000, args)
        for g in opt.param_groups:
            g["lr"] = lr
        w = data.batch()
        if phase == "dspark":
            loss, acc, bce = draft_loss(model, data, w, c, args.draft_positions, args.draft_ce, args.draft_kl)
            kl = torch.zeros(())
            total_loss = loss
        else:
            loss, kl = lm_loss(model, data, w, c)
            total_loss = loss + args.kl_weight * kl
        opt.zero_grad(set_to_none=True)
        total_loss.backward()
        if dist is not None:
            allreduce_grads(dist, opt, model, phase, args.procs)
        torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], 1.0)
        opt.step()
        if phase != "dspark":
            for b in model.blocks[:model.nL]:
                b.ffn.balance(1e-3)
        else:
            for b in model.blocks[model.nL:]:
                b.ffn.balance(1e-3)
        step += 1
        tok0 += args.batch * args.ctx
        if args.rank != 0:
            if step < total and stop_now(args, step, t_sitting, dist):
                sys.exit(3)
            continue
        if step % args.log_every == 0 or step == total:
            el = time.time() - t0
            tps = tok0 / el
            eta = (total - step) * el / max(1, step - step0)
            if phase == "dspark" and args.dspark_minutes > 0:
                eta = 60.0 * args.dspark_minutes - (time.time() - t_dspark)
            rec = {"step": step, "phase": phase, "loss": round(loss.item(), 4), "kl": round(kl.item(), 4),
                   "lr": lr, "tok_s": round(tps, 1), "elapsed_s": round(el, 1)}
            if phase == "dspark":
                rec["draft_acc"] = [round(a, 3) for a in acc.tolist()]
                rec["conf_bce"] = round(bce.item(), 4)
            if phase != "dspark" and (step % args.eval_every == 0 or step == args.dense + args.sparse + args.qat):
                rec["heldout"] = round(evaluate(model, data, c, n=16), 4)
            log.write(json.dumps(rec) + "\n")
            log.flush()
            print("step %5d/%d %-6s loss %.4f kl %.4f lr %.2e %6.0f tok/s ETA %5.1f min%s" % (
                step, total, phase, loss.item(), kl.item(), lr, tps, eta / 60,
                (" held-out %.4f" % rec["heldout"]) if "heldout" in rec else
                (" acc %s" % rec["draft_acc"] if "draft_acc" in rec else "")), flush=True)
        if step % args.save_every == 0 or step == total or phase_of(step, args)[0] != phase:
            save(state_path, model, opt, step, data, phase, evals)
        if step < total and stop_now(args, step, t_sitting, dist):
            save(state_path, model, opt, step, data, phase, evals)
            print("stopped at step %d of %d; the same command with --resume continues" % (step, total), flush=True)
            sys.exit(3)
    if args.rank != 0:
        return
    if "qat" not in evals and args.qat > 0:
        evals["qat"] = evaluate(model, data, ctx_for("qat"))
    with open(os.path.join(args.out, "eval.json"), "w") as f:
        json.dump(evals, f, indent=1)
    save(state_path, model, opt, step, data, cur, evals)
    try:
        import plot
        plot.plot(os.path.join(args.out, "log.jsonl"), os.path.join(args.out, "loss.png"))
    except ImportError as e:          # matplotlib is only needed for the picture
        print("no loss plot (%s)" % e, flush=True)
    print("done: %s" % json.dumps(evals), flush=True)


if __name__ == "__main__":
    main()
