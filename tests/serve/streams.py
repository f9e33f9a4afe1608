"""N concurrent streamed completions against a running `ds41 serve`; each stream's token ids
(logprobs with return_tokens_as_token_ids) and text must equal `ds41 run` alone (text: its ids
decoded at once by `ds41 tokenize --decode`) with the same
prompt ids, seed and sampling (the server's kernels: pass --exact to both or to neither).
Prompts of different lengths make prefill chunks and decode rows mix in the server's steps.
With --spec X among the extra arguments (the server's --spec), sampled streams are compared
with `ds41 run --spec X` (the same draft lengths consume the random stream the same way) and,
in exact mode, greedy ones with `ds41 run --spec off` (exact greedy speculation is plain
decoding).
  streams.py PORT API_KEY DS41 CKPT CTX N [--exact] [-t T] [--spec X]"""
import json, random, subprocess, sys, threading, http.client

port, key, ds41, ck, ctx, n = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])
extra = sys.argv[7:]
tag = "exact" if "--exact" in extra else "fast"
if "--spec" in extra:
    tag += "_spec_" + extra[extra.index("--spec") + 1].replace(":", "")
rng = random.Random(41)
jobs = []
for i in range(n):
    L = rng.choice([3, 9, 17, 33, 50, 71])
    jobs.append({"ids": [rng.randrange(13, 500) for _ in range(L)], "seed": 1000 + i, "max": rng.choice([6, 12, 20]),
                 "temp": [0.0, 0.8, 1.0][i % 3], "top_k": [0, 0, 40][i % 3], "top_p": [1.0, 0.9, 1.0][i % 3]})
results = [None] * n

def stream(i):
    j = jobs[i]
    body = {"prompt": j["ids"], "max_tokens": j["max"], "seed": j["seed"], "temperature": j["temp"], "top_k": j["top_k"],
            "top_p": j["top_p"], "stream": True, "logprobs": 0, "return_tokens_as_token_ids": True, "ignore_eos": True,
            "skip_special_tokens": False}
    try:
        c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=120)
        c.request("POST", "/v1/completions", json.dumps(body), {"Authorization": "Bearer " + key, "Content-Type": "application/json"})
        r = c.getresponse()
        ids, text, done = [], "", False
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            ch = json.loads(line[6:])["choices"][0]
            text += ch["text"]
            if ch.get("logprobs"):
                ids += [int(t.split(":")[1]) for t in ch["logprobs"]["tokens"]]
        results[i] = (r.status, ids, text, done)
    except Exception as e:
        results[i] = ("error", str(e), "", False)

th = [threading.Thread(target=stream, args=(i,)) for i in range(n)]
for t in th:
    t.start()
for t in th:
    t.join()
bad = []
for i, j in enumerate(jobs):
    args = [ds41, "run", "-m", ck, "--prompt-ids", ",".join(map(str, j["ids"])), "-n", str(j["max"]), "--seed", str(j["seed"]),
            "--temp", str(j["temp"]), "--top-k", str(j["top_k"]), "--top-p", str(j["top_p"]), "-c", ctx, "--json",
            "--ignore-eos", "--top-logprobs", "0"] + extra
    if "--spec" in extra and "--exact" in extra and j["temp"] == 0.0:
        k = args.index("--spec")
        args[k + 1] = "off"
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode:
        bad.append("%d: ds41 run failed: %s" % (i, out.stderr.strip()[-200:]))
        continue
    lines = [json.loads(l) for l in out.stdout.splitlines()][:-1]
    want_ids = [o["id"] for o in lines]
    # the text of all ids decoded at once (a stream's last incomplete character is flushed)
    # bytes, decoded without newline translation (text=True would turn a generated \r into \n)
    want_text = subprocess.run([ds41, "tokenize", "-m", ck, "--decode", ",".join(map(str, want_ids))],
                               capture_output=True).stdout.decode("utf-8", errors="replace")
    st, ids, text, done = results[i]
    if st != 200 or not done or ids != want_ids or text != want_text:
        bad.append("%d: status %s done %s ids %s vs %s text %r vs %r" % (i, st, done, ids, want_ids, text, want_text))
print(("PASS streams_%d_%s_equal_run" % (n, tag)) if not bad else ("FAIL streams_%d_%s_equal_run: %s" % (n, tag, "; ".join(bad)[:1500])))
