#!/usr/bin/env python3
"""Sends prompts to a ds41 server concurrently and prints one JSON line per prompt with what
must not depend on where the prompt was prefilled: the choices (text, finish reason and the
logprobs of every generated token with its alternatives, which ds41 prints with 17 significant
digits, so equal lines mean equal logits bits in the chosen and top entries) and the usage.
  client.py PORT PROMPTS.json [MAX_TOKENS] [extra request JSON]
PROMPTS.json: a list of id lists. Exit status 1 when a request fails (the reply is printed)."""
import json
import sys
import threading
import urllib.error
import urllib.request

port, prompts = int(sys.argv[1]), json.load(open(sys.argv[2]))
max_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 12
extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
out = [None] * len(prompts)


def run(i):
    body = {"prompt": prompts[i], "max_tokens": max_tokens, "temperature": 0, "logprobs": 3}
    body.update(extra)
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            j = json.load(r)
            out[i] = json.dumps({"choices": j["choices"], "usage": j["usage"]}, sort_keys=True)
    except urllib.error.HTTPError as e:
        out[i] = "HTTP %d %s" % (e.code, e.read().decode(errors="replace"))
    except Exception as e:  # noqa: BLE001 - reported as the result
        out[i] = "ERROR %s" % e


ts = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
for t in ts:
    t.start()
for t in ts:
    t.join()
bad = 0
for o in out:
    print(o)
    bad += not o.startswith("{")
sys.exit(1 if bad else 0)
