#!/usr/bin/env python3
"""Concurrent requests for tests/mpi.test.sh (serve under mpiexec).
  mpi_client.py answers PORT [nocache]
                                    8 concurrent /v1/completions (4 streamed, 4 not; greedy with
                                    logprobs and seeded sampling), then 2 repeating the long
                                    prompt (a prefix-cache hit; nocache: a server without a
                                    prefix cache, cached_tokens 0): one line per request with what
                                    must not depend on the process layout (text, finish reason,
                                    logprobs at 17 digits, usage; the stream's chunks joined)
  mpi_client.py whole PORT          a prompt of 256 token ids (two whole blocks), the same again (a
                                    hit on the whole prompt: the restore's replay gives the logits
                                    of its last row) and its first 200 ids (a hit on one block),
                                    one after another, greedy with logprobs; prints the lines as
                                    answers does and expects cached_tokens 0, 256, 128
  mpi_client.py twice PORT          one seeded sampling request, then the same again once the first
                                    ended (under --dp-attention an idle server gives the two to two
                                    ranks in turn: one samples on rank 0, one on its owner); then
                                    the same with a JSON grammar (its owner samples it with the
                                    allowed tokens rank 0 sends ahead of each row):
                                    both lines of each pair (as answers prints them) must be equal
  mpi_client.py processed PORT      8 concurrent requests with logits processors (logit_bias,
                                    frequency / presence / repetition penalties, min_tokens, and
                                    2 with a grammar: a JSON object with seeded sampling, a JSON
                                    schema greedy with logprobs; 2 streamed), then 2 chat
                                    requests with a reasoning budget (thinking_token_budget,
                                    greedy with logprobs and seeded sampling): one line per
                                    request, as answers prints them
  mpi_client.py grammars PORT       requests with a grammar, each twice in a row (under
                                    --dp-attention an idle server gives the two to two ranks in
                                    turn; with --spec the owner verifies the drafts with the
                                    allowed tokens rank 0 sends for each row of a block): a JSON
                                    schema greedy with logprobs, a regex with seeded sampling, a
                                    forced tool call (chat) greedy with logprobs (two system
                                    messages: a repeat would go to the rank whose prefix cache
                                    holds its prompt); one line per request as answers prints
                                    them; the two of each pair must be equal
  mpi_client.py fault PORT PID SIG  8 concurrent requests with long answers; once the streams
                                    are decoding, send SIG (STOP, KILL) to PID (a follower), or
                                    with PID "cmd", run the shell command SIG (a link down); every
                                    request must end with an OpenAI-shaped 503 (the streamed
                                    ones an error event of type service_unavailable) naming
                                    rank 1, or with KILL (hydra kills rank 0 too: the guard
                                    answers) saying that the MPI job ended; prints
                                    one line per request and the seconds from the kill to the
                                    last answer
Exit status 1 when a request did not end as expected."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

LONG = "In the beginning God created the heaven and the earth. " * 12   # > 128 tokens: a cached block


def body(i, max_tokens):
    # one long prompt only: a second one would hit the cache or not depending on timing
    b = {"prompt": [LONG + "And God said", "Telescope, n.", "Tell me a fortune.", "The Jargon File says", "Once upon a time",
                    "Abacus, n.", "And the LORD spake", "A hacker is"][i],
         "max_tokens": max_tokens, "stream": i % 2 == 1}
    if i < 4:
        b.update({"temperature": 0, "logprobs": 2})
    else:
        b.update({"temperature": 0.8, "top_p": 0.9, "seed": 100 + i})
    if b["stream"]:
        b["stream_options"] = {"include_usage": True}
    return b


def post(port, b, on_chunk=None, path="/v1/completions"):
    """(status, parsed reply or list of stream events)."""
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), json.dumps(b).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            if not b.get("stream"):
                return r.status, json.load(r)
            events = []
            for line in r:
                line = line.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                events.append(json.loads(line[6:]))
                if on_chunk:
                    on_chunk()
            return r.status, events
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode(errors="replace") or "null")


def summary(b, st, rep):
    if not b.get("stream"):
        rep = rep if isinstance(rep, dict) else {}
        return {"status": st, "choices": rep.get("choices"), "usage": rep.get("usage"), "error": rep.get("error")}
    # chunk boundaries follow the reader's timing; the tokens, their logprobs and the text do not
    text, fin, usage, err = "", None, None, None
    lps = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    for e in rep:
        if "error" in e:
            err = e["error"]
            continue
        for c in e.get("choices", []):
            text += c.get("text", "")
            for k, v in (c.get("logprobs") or {}).items():
                lps[k] += v
            fin = c.get("finish_reason") or fin
        if e.get("usage"):
            usage = e["usage"]
    return {"status": st, "text": text, "logprobs": lps, "finish": fin, "usage": usage, "error": err}


def run_all(port, bodies, on_chunk=None, path="/v1/completions"):
    out = [None] * len(bodies)

    def one(i):
        try:
            st, rep = post(port, bodies[i], on_chunk, path)
            out[i] = summary(bodies[i], st, rep)
        except Exception as e:  # noqa: BLE001 - reported as the result
            out[i] = {"exception": str(e)}
    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def answers(port, cache=True):
    out = run_all(port, [body(i, 24) for i in range(8)])
    streamed = dict(body(0, 8), stream=True, stream_options={"include_usage": True})
    again = run_all(port, [body(0, 8), streamed])   # the long prompt again: restored from the cache
    bad = 0
    for o in out + again:
        print(json.dumps(o, sort_keys=True))
        bad += o.get("status") != 200 or bool(o.get("error"))
    hits = [o["usage"]["prompt_tokens_details"]["cached_tokens"] for o in again if o.get("usage")]
    if cache and (len(hits) != 2 or min(hits) < 128):
        print("the repeated long prompt was not restored from the prefix cache: cached_tokens %s" % hits)
        bad += 1
    if not cache and hits != [0, 0]:
        print("a server without a prefix cache reported cached tokens: cached_tokens %s" % hits)
        bad += 1
    return 1 if bad else 0


def whole(port):
    ids = [(i * 37 + 11) % 400 + 5 for i in range(256)]
    out = [run_all(port, [{"prompt": p, "max_tokens": 8, "temperature": 0, "logprobs": 2}])[0]
           for p in (ids, ids, ids[:200])]
    for o in out:
        print(json.dumps(o, sort_keys=True))
    hits = [(o.get("usage") or {}).get("prompt_tokens_details", {}).get("cached_tokens") for o in out]
    if hits != [0, 256, 128] or any(o.get("status") != 200 for o in out):
        print("whole-block prompts: cached_tokens %s, expected [0, 256, 128]" % hits)
        return 1
    return 0


def twice(port):
    bad = 0
    plain = {"prompt": "Tell me a fortune.", "max_tokens": 24, "temperature": 0.9, "top_k": 40, "seed": 7}
    # a logits processor (the JSON grammar): its owner samples it with rank 0's allowed tokens
    constrained = dict(plain, response_format={"type": "json_object"}, max_tokens=12)
    for b in (plain, constrained):
        out = [summary(b, *post(port, b)) for _ in range(2)]
        for o in out:
            print(json.dumps(o, sort_keys=True))
        bad += out[0] != out[1] or out[0].get("status") != 200
    return 1 if bad else 0


def processed(port):
    bodies = [
        {"prompt": "Tell me a fortune.", "max_tokens": 24, "temperature": 0, "logprobs": 2, "frequency_penalty": 1.5,
         "presence_penalty": 0.5},
        {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0.9, "top_k": 40, "seed": 11, "repetition_penalty": 1.3,
         "stream": True, "stream_options": {"include_usage": True}},
        {"prompt": "The Jargon File says", "max_tokens": 24, "temperature": 0, "logit_bias": {"100": 6, "262": -100, "1000": 3.5}},
        {"prompt": "A hacker is", "max_tokens": 16, "temperature": 0.8, "seed": 5, "min_tokens": 12, "frequency_penalty": -0.5},
        {"prompt": "Abacus, n.", "max_tokens": 24, "temperature": 0, "repetition_penalty": 1.8, "presence_penalty": 1.0,
         "logprobs": 3, "stream": True, "stream_options": {"include_usage": True}},
        {"prompt": "And the LORD spake", "max_tokens": 24, "temperature": 1.0, "top_p": 0.9, "seed": 21, "frequency_penalty": 2,
         "logit_bias": {"300": 2.25}},
        {"prompt": "Tell me a fortune.", "max_tokens": 16, "temperature": 0.9, "top_k": 40, "seed": 13,
         "response_format": {"type": "json_object"}},
        {"prompt": "Abacus, n.", "max_tokens": 16, "temperature": 0, "logprobs": 2, "presence_penalty": 0.5,
         "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {
             "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}},
    ]
    out = run_all(port, bodies)
    # the owner forces </think> after the budget (LPROC carries it): the demo model does not end
    # its reasoning within 24 tokens by itself
    ask = [{"role": "user", "content": "What does telescope mean?"}]
    think = [{"messages": ask, "max_tokens": 24, "temperature": 0, "logprobs": True, "top_logprobs": 2,
              "chat_template_kwargs": {"thinking": True}, "thinking_token_budget": 5},
             {"messages": ask, "max_tokens": 24, "temperature": 0.9, "top_k": 40, "seed": 3,
              "chat_template_kwargs": {"thinking": True}, "thinking_token_budget": 2}]
    out += run_all(port, think, path="/v1/chat/completions")
    bad = 0
    for o in out[-2:]:
        rt = ((o.get("usage") or {}).get("completion_tokens_details") or {}).get("reasoning_tokens")
        if rt is None or rt > 6:
            print("a reasoning budget of at most 5 tokens gave reasoning_tokens %s" % rt)
            bad += 1
    for o in out:
        print(json.dumps(o, sort_keys=True))
        bad += o.get("status") != 200 or bool(o.get("error"))
    return 1 if bad else 0


def grammars(port):
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}
    reqs = [
        ("/v1/completions", {"prompt": "Abacus, n.", "max_tokens": 16, "temperature": 0, "logprobs": 2,
                             "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {
                                 "type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}},
                                 "required": ["n", "s"]}}}}),
        ("/v1/completions", {"prompt": "Telescope, n.", "max_tokens": 16, "temperature": 0.9, "top_k": 40, "seed": 17,
                             "structured_outputs": {"regex": "[a-z]+( [a-z]+)*\\."}}),
    ]
    bad = 0
    for path, b in reqs:
        out = [summary(b, *post(port, b, path=path)) for _ in range(2)]
        for o in out:
            print(json.dumps(o, sort_keys=True))
        bad += out[0] != out[1] or out[0].get("status") != 200 or bool(out[0].get("error"))
    # the chat prompt (473 tokens) has whole prefix-cache blocks, which would draw the same
    # request to the rank that held it: two system messages, so the two go to the two ranks
    for sysmsg in ("You answer in English.", "You answer in French."):
        b = {"messages": [{"role": "system", "content": sysmsg}, {"role": "user", "content": "What is the weather in Paris tomorrow?"}],
             "max_tokens": 24, "temperature": 0, "logprobs": True, "top_logprobs": 2, "tools": [weather], "tool_choice": "required"}
        o = summary(b, *post(port, b, path="/v1/chat/completions"))
        print(json.dumps(o, sort_keys=True))
        bad += o.get("status") != 200 or bool(o.get("error"))
    return 1 if bad else 0


def fault(port, pid, sig):
    bodies = [body(i, 2000) for i in range(8)]
    for b in bodies:
        b["ignore_eos"] = True
    lock, seen, killed = threading.Lock(), [0], [0.0]

    def on_chunk():
        with lock:
            seen[0] += 1
            if seen[0] == 4 * 3 and not killed[0]:   # every stream is decoding (3 chunks each on average)
                killed[0] = time.monotonic()
                if pid == "cmd":
                    subprocess.run(sig, shell=True, check=False)
                else:
                    os.kill(int(pid), getattr(signal, "SIG" + sig))
    out = run_all(port, bodies, on_chunk)
    end = time.monotonic()
    bad = 0 if killed[0] else 1
    why = "the MPI job ended" if sig == "KILL" else "rank 1"
    kinds = set()
    for b, o in zip(bodies, out):
        e = o.get("error") or {}
        st = o.get("status")
        ok = st == (200 if b["stream"] else 503) and e.get("type") == "service_unavailable" and why in e.get("message", "")
        if sig == "KILL":
            # the guard: a 503 where nothing was sent, an error event on a stream whose 200 and
            # headers had gone out (after its tokens; under load a stream may not have had its
            # first token yet when the kill came: then the event is all it gets)
            ok = e.get("type") == "service_unavailable" and why in e.get("message", "") and (
                st == 503 or (b["stream"] and st == 200))
            kinds.add((b["stream"], st))
        print(json.dumps(o, sort_keys=True)[:400])
        bad += not ok
    if sig == "KILL" and not {(True, 200), (False, 503)} <= kinds:
        print("the guard's two answers were not both seen (a 503 and a stream's error event): %s" % sorted(kinds))
        bad += 1
    print("last answer %.2f s after the kill" % (end - killed[0] if killed[0] else -1))
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1] == "answers":
        sys.exit(answers(int(sys.argv[2]), sys.argv[3:4] != ["nocache"]))
    if sys.argv[1] == "processed":
        sys.exit(processed(int(sys.argv[2])))
    if sys.argv[1] == "whole":
        sys.exit(whole(int(sys.argv[2])))
    if sys.argv[1] == "twice":
        sys.exit(twice(int(sys.argv[2])))
    if sys.argv[1] == "grammars":
        sys.exit(grammars(int(sys.argv[2])))
    sys.exit(fault(int(sys.argv[2]), sys.argv[3], sys.argv[4]))
