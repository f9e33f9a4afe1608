#!/usr/bin/env python3
"""Decode isolation under a mixed load (docs/pd.md): S streams decode (short prompts, streamed,
greedy) while L long prompts arrive one after another; prints the inter-token latency p50/p99 of
the streams' tokens generated while long prompts were in flight, and the long prompts' TTFT.
  pd_mixload.py PORT [STREAMS] [STREAM_TOKENS] [LONG] [LONG_LEN] [VOCAB]
One JSON line on stdout. Not a test: a measurement tool (numbers depend on the machine)."""
import json
import random
import sys
import threading
import time
import urllib.request

port = int(sys.argv[1])
S = int(sys.argv[2]) if len(sys.argv) > 2 else 2
ST = int(sys.argv[3]) if len(sys.argv) > 3 else 150
L = int(sys.argv[4]) if len(sys.argv) > 4 else 3
LL = int(sys.argv[5]) if len(sys.argv) > 5 else 3000
V = int(sys.argv[6]) if len(sys.argv) > 6 else 4000
r = random.Random(1)
itl, ttft, busy = [], [], []   # busy: [start, end] of each long prompt's prefill (to its first token)
lock = threading.Lock()


def post(body):
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=600)


def stream(i):
    body = {"prompt": [r.randrange(3, V) for _ in range(40)], "max_tokens": ST, "temperature": 0, "stream": True,
            "ignore_eos": True}
    last = None
    ts = []
    with post(body) as resp:
        for line in resp:
            if line.startswith(b"data: {"):
                t = time.monotonic()
                if last is not None:
                    ts.append((last, t))
                last = t
    with lock:
        itl.extend(ts)


def long_prompt(i):
    body = {"prompt": [r.randrange(3, V) for _ in range(LL)], "max_tokens": 1, "temperature": 0}
    t0 = time.monotonic()
    with post(body) as resp:
        resp.read()
    t1 = time.monotonic()
    with lock:
        ttft.append(t1 - t0)
        busy.append((t0, t1))


ss = [threading.Thread(target=stream, args=(i,)) for i in range(S)]
for t in ss:
    t.start()
time.sleep(0.5)
for i in range(L):
    long_prompt(i)
for t in ss:
    t.join()


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p / 100 * len(v)))] if v else float("nan")


during = [b - a for a, b in itl if any(s <= b and a <= e for s, e in busy)]
allg = [b - a for a, b in itl]
print(json.dumps({"itl_during_long_p50_ms": round(1e3 * pct(during, 50), 2), "itl_during_long_p99_ms": round(1e3 * pct(during, 99), 2),
                  "itl_during_long_max_ms": round(1e3 * max(during), 2) if during else None,
                  "itl_all_p50_ms": round(1e3 * pct(allg, 50), 2), "itl_all_p99_ms": round(1e3 * pct(allg, 99), 2),
                  "n_itl_during": len(during), "ttft_long_s": [round(x, 3) for x in ttft]}))
