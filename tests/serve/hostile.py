"""Malformed and hostile clients against a running `ds41 serve` (started with --api-key KEY,
--max-body 256K, --body-timeout 3, --timeout 5):
- a generated corpus of several hundred bad requests (truncated bodies, invalid UTF-8, deep
  JSON, wrong types and ranges for every request member, bad methods and paths, missing or
  wrong keys, oversized bodies): each answer is a 4xx with an OpenAI error object (on the
  Anthropic Messages routes Anthropic's error object naming the member); the only
  exceptions are framing errors microhttpd answers itself before any handler runs (oversized
  headers, garbage request lines): those must still be a 4xx or a closed connection;
- slow clients (a body trickled byte by byte, headers that never end) are dropped within the
  timeouts while other requests are served;
- clients that vanish mid-stream or while waiting: their sequences are cancelled, and
  /metrics comes back to 0 running, 0 waiting, 0 sessions open;
- the server answers /health and a real completion afterwards.
  hostile.py PORT KEY"""
import json, re, socket, sys, threading, time

port, key = int(sys.argv[1]), sys.argv[2]
AUTH = "Authorization: Bearer %s\r\n" % key
fails = []

def raw(data, timeout=20):
    """Sends bytes, returns (status or None, body bytes)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        buf = b""
        while True:
            try:
                k = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not k:
                break
            buf += k
            m = re.match(rb"HTTP/1\.[01] (\d+)", buf)
            if m and b"\r\n\r\n" in buf:
                head, body = buf.split(b"\r\n\r\n", 1)
                cl = re.search(rb"(?i)content-length: *(\d+)", head)
                if cl and len(body) >= int(cl.group(1)):
                    break
        m = re.match(rb"HTTP/1\.[01] (\d+)", buf)
        if not m:
            return None, buf
        return int(m.group(1)), buf.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in buf else b""
    finally:
        s.close()

def req(method, path, body=b"", auth=True, extra=""):
    if isinstance(body, str):
        body = body.encode()
    head = "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s%sContent-Length: %d\r\n\r\n" % (
        method, path, AUTH if auth else "", extra, len(body))
    return raw(head.encode() + body)

def expect_json_error(name, st, body, lo=400, hi=499):
    try:
        e = json.loads(body)["error"]
        ok = isinstance(e["message"], str) and "type" in e and "param" in e and "code" in e
    except Exception:
        ok = False
    if st is None or not (lo <= st <= hi) or not ok:
        fails.append("%s: status %s body %r" % (name, st, body[:200]))

# ---------------------------------------------------------------- the corpus
good_chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
good_comp = {"prompt": "Hello", "max_tokens": 2}
cases = []   # (name, method, path, body bytes, auth)
def add(name, body, path="/v1/chat/completions", method="POST", auth=True):
    cases.append((name, method, path, body if isinstance(body, bytes) else body.encode(), auth))

bad_values = {
    "temperature": [-1, 3, "hot", [], {}], "top_p": [0, 1.5, -0.1, "x"], "top_k": [-2, 1.5, "x"],
    "min_p": [-0.5, 2, "x"], "n": [0, 17, 1.5, "2", -1], "max_tokens": [-1, "5", 1.5, 10 ** 20, 100000],
    "max_completion_tokens": [-3, "x", 999999], "seed": ["x", 1.5, [1]], "stop": [5, [1], ["a"] * 17, {"a": 1}, ["x" * 2000]],
    "stream": ["yes", 1, []], "stream_options": ["x", 5], "logprobs": ["yes", 5, []], "top_logprobs": [21, -1, "3", 1.5],
    "presence_penalty": [2.5, 5, "x"], "frequency_penalty": [-2.5, -3], "logit_bias": [{"x": 5}, {"1": 101}, {"99999": 1}, "x", 7],
    "min_tokens": [-1, "x", 3], "parallel_tool_calls": ["no", 1],
    "response_format": [{"type": "xml"}, "x", {"type": 5}, {"type": "json_schema"}, {"type": "json_schema", "json_schema": {"schema": {"type": "integer", "minimum": 1}}},
                        {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/$defs/none"}}}, {"type": "json_schema", "json_schema": {"schema": 5}}],
    "guided_regex": [5, "a*?", "(", "\\1"], "guided_choice": [[], "x", [5], [""]], "grammar": [5, "root ::= root", "a ::= \"x\"", "root ::= [z-a]", "root ::= \"a\"{9999}"],
    "guided_json": [5, {"type": "wizard"}, {"oneOf": [{"type": "number"}, {"type": "integer"}]}, "{bad json"],
    "structured_outputs": [5, {}, {"json": 5}, {"regex": "("}, {"choice": [], "regex": "a"}], "best_of": [3, 0], "model": [5, [], {}, "no-such-model"],
    "tools": ["x", [1], [{"type": "function"}], [{"type": "function", "function": {"name": 5}}], {}],
    "tool_choice": ["maybe", 5, {"type": "function"}, {"type": "function", "function": {"name": "f"}}, "required"],
    "chat_template_kwargs": ["x", 5, {"thinking": "yes"}, {"reasoning_effort": "extreme"}],
    "reasoning_effort": [5000, "extreme", [], {}], "ignore_eos": ["x"], "skip_special_tokens": [3],
    "stop_token_ids": ["x", [-1], ["a"], list(range(100))], "user": [5], "echo": ["x"], "repetition_penalty": [0, 2.5, "x"],
    "continue_final_message": ["x", True], "add_generation_prompt": ["x"], "suffix": ["x"],
}
for k, vs in bad_values.items():
    for i, v in enumerate(vs):
        for ep, good in (("/v1/chat/completions", good_chat), ("/v1/completions", good_comp)):
            if ep == "/v1/completions" and k in ("tools", "tool_choice", "chat_template_kwargs", "reasoning_effort",
                                                 "continue_final_message", "add_generation_prompt", "top_logprobs", "response_format",
                                                 "parallel_tool_calls"):
                continue
            if ep == "/v1/chat/completions" and k in ("echo", "suffix"):
                continue
            if ep == "/v1/completions" and k == "logprobs" and v == 5:
                continue   # valid there
            b = dict(good)
            b[k] = v
            if k == "stream_options":
                b["stream"] = False if i == 0 else True
            add("%s_%s_%d" % (ep.split("/")[-1], k, i), json.dumps(b), ep)
bad_messages = ["x", 5, None, {}, [], [1], [{"role": 5}], [{"role": "wizard", "content": "x"}], [{"content": "x"}],
                [{"role": "user", "content": 5}],
                [{"role": "user", "content": [5]}], [{"role": "assistant", "tool_calls": "x"}],
                [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "not json"}}]}],
                [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}],
                [{"role": "user", "content": "a <\uff5cdeepseek_image\uff5c> b"}], [{"role": "tool", "content": 5}],
                [{"role": "user", "content": "x", "task": "dance"}], [{"role": "user"}], [{"role": "user", "content": []}],
                [{"role": "tool", "content": "x"}], [{"role": "assistant"}],
                [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}],
                [{"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}], [{"role": "system", "content": None}], [{"role": "user", "content": "x" * 5000}] * 0 or [[]]]
for i, m in enumerate(bad_messages):
    add("chat_messages_%d" % i, json.dumps({"messages": m, "max_tokens": 2}))
bad_prompts = [None, 5, [], [[]], [-1], [1.5], ["a", 5], {"a": 1}, [10 ** 12], [[1], [-4]], [99999], [True], [[1], 5]]
for i, p in enumerate(bad_prompts):
    b = {"max_tokens": 2}
    if p is not None:
        b["prompt"] = p
    add("completions_prompt_%d" % i, json.dumps(b), "/v1/completions")
# truncated bodies
for ep, good in (("/v1/chat/completions", dict(good_chat, temperature=0.5, stop=["x"])), ("/v1/completions", dict(good_comp, echo=True))):
    s = json.dumps(good)
    for cut in range(0, len(s) - 1, 2):
        add("truncated_%s_%d" % (ep.split("/")[-1], cut), s[:cut], ep)
# invalid UTF-8 and NUL
for i, bad in enumerate([b"\xff", b"\xc3\x28", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\xe2\x82", b"\\u0000",
                         b"\\ud800", b"\x00"]):
    add("utf8_chat_%d" % i, b'{"messages":[{"role":"user","content":"a' + bad + b'b"}],"max_tokens":2}')
    add("utf8_comp_%d" % i, b'{"prompt":"a' + bad + b'b","max_tokens":2}', "/v1/completions")
    add("utf8_key_%d" % i, b'{"pro' + bad + b'mpt":"ab","max_tokens":2}', "/v1/completions")
# deep JSON and odd top levels
for d in (65, 200, 5000, 100000):
    add("deep_array_%d" % d, "[" * d + "]" * d)
    add("deep_messages_%d" % d, '{"messages":' + "[" * d + "]" * d + "}")
    add("deep_unclosed_%d" % d, '{"prompt":' + "[" * d, "/v1/completions")
for i, b in enumerate(["", " ", "null", "[]", "5", '"x"', "{", "}", "{{}}", '{"messages":}', "{'a':1}", '{"a":1,}', "NaN",
                       '{"prompt":"x","max_tokens":Infinity}', '{"prompt":"x"}{"prompt":"y"}', "\x00\x01\x02"]):
    add("top_chat_%d" % i, b)
    add("top_comp_%d" % i, b, "/v1/completions")
# tokenize / detokenize
for i, b in enumerate(["", "{}", '{"prompt":5}', '{"messages":5}', '{"tokens":"x"}', '{"tokens":[-1]}', '{"tokens":[99999]}', "[["]):
    add("tokenize_%d" % i, b, "/tokenize")
    add("detokenize_%d" % i, b, "/detokenize")
# methods, paths, auth
for m, p in (("GET", "/v1/chat/completions"), ("PUT", "/v1/completions"), ("DELETE", "/v1/models"), ("POST", "/v1/models"),
             ("POST", "/health"), ("GET", "/tokenize"), ("PATCH", "/metrics")):
    add("method_%s_%s" % (m, p), "", p, m)
for p in ("/", "/v1", "/v1/chat", "/v1/models/nope", "/v2/completions", "/v1/completions/", "/%00", "/" + "a" * 3000, "/../etc/passwd"):
    add("path_%d" % len(cases), "", p, "GET")
add("no_key_chat", json.dumps(good_chat), auth=False)
add("no_key_models", "", "/v1/models", "GET", auth=False)
add("no_key_tokenize", '{"prompt":"x"}', "/tokenize", auth=False)

# OpenAI Responses route: OpenAI error objects whose param names the member
good_resp = {"model": json.loads(req("GET", "/v1/models")[1])["data"][0]["id"], "input": "Hi", "max_output_tokens": 2}
resp_bad = {
    "input": [None, 5, [], {}, [5], [{"type": "wizard"}], [{"role": "wizard", "content": "x"}], [{"role": "user", "content": 5}],
              [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}], [{"role": "user", "content": [{"type": "input_text"}]}],
              [{"type": "function_call", "name": "f", "arguments": "{}"}], [{"type": "function_call", "call_id": "c", "arguments": "{}"}],
              [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}], [{"type": "function_call_output", "call_id": "c"}],
              [{"type": "function_call_output", "output": "x"}], [{"type": "reasoning", "summary": 5}], [{"type": "reasoning", "summary": [{"x": 1}]}],
              [{"type": "item_reference", "id": "x"}],
              # malformed input_image parts (file ids, fetches, bad base64, the wrong place)
              [{"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}],
              [{"role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/a.png"}]}],
              [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,iVBO*w0K"}]}],
              [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,/9j/4AAQ"}]}],
              [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/gif;base64,R0lGODlh"}]}],
              [{"role": "user", "content": [{"type": "input_image", "image_url": 5}]}],
              [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "x"}]}],
              [{"role": "assistant", "content": [{"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}],
              [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image", "image_url": "http://x/a.png"}]}]],
    "store": [True, "x"], "previous_response_id": ["resp_1"], "conversation": ["conv_1"], "instructions": [5, []],
    "max_output_tokens": [0, -1, "x", 1.5], "temperature": [3, "x"], "top_p": [0, 2], "model": [5, "no-such-model"],
    "reasoning": [5, {"effort": 5}, {"effort": "extreme"}], "text": [5, {"format": 5}, {"format": {"type": "xml"}},
              {"format": {"type": "json_schema", "schema": {"type": "wizard"}}}],
    "tools": [5, [5], [{"name": "f"}], [{"type": "function"}], [{"type": "function", "name": "f", "parameters": 5}]],
    "tool_choice": [5, "maybe", {"type": "function"}, {"type": "function", "name": "nope"}, "required"],
    "parallel_tool_calls": ["x"], "stream": ["x"],
}
for k, vs in resp_bad.items():
    for i, v in enumerate(vs):
        b = dict(good_resp)
        if v is None:
            del b[k]
        else:
            b[k] = v
        add("responses_%s_%d" % (k, i), json.dumps(b), "/v1/responses")
n_corpus = 0
for name, method, path, body, auth in cases:
    try:
        st, rb = req(method, path, body, auth)
    except Exception as e:
        fails.append("%s: %s" % (name, e))
        continue
    n_corpus += 1
    expect_json_error(name, st, rb)
# Anthropic Messages routes: every refusal is Anthropic's error {"type": "error", "error":
# {"type", "message"}} (4xx), and the message names the member given as its third element
def expect_anth_error(name, st, body, needle):
    try:
        o = json.loads(body)
        ok = o["type"] == "error" and isinstance(o["error"]["message"], str) and o["error"]["type"].endswith("_error") \
            and needle in o["error"]["message"]
    except Exception:
        ok = False
    if st is None or not (400 <= st <= 499) or not ok:
        fails.append("%s: status %s body %r" % (name, st, body[:200]))
good_msg = {"model": json.loads(req("GET", "/v1/models")[1])["data"][0]["id"], "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
anth_bad = {
    "max_tokens": ([None, 0, -1, "5", 1.5], "max_tokens"), "messages": (["x", 5, [], {}, [1], [{"role": "system", "content": "x"}],
        [{"role": "user"}], [{"role": "user", "content": 5}], [{"role": "user", "content": []}], [{"role": "user", "content": [5]}],
        [{"role": "user", "content": [{"type": "image", "source": {}}]}], [{"role": "user", "content": [{"type": "document"}]}],
        [{"role": "user", "content": [{"type": "text"}]}], [{"role": "user", "content": [{"type": "video"}]}],
        [{"role": "user", "content": [{"type": "tool_result"}]}], [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": 5}]}],
        [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": [{"type": "image"}]}]}],
        [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "is_error": "y"}]}],
        [{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f"}]}],
        [{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "input": {}}]}],
        [{"role": "assistant", "content": [{"type": "thinking"}]}], [{"role": "assistant", "content": [{"type": "wizard"}]}],
        # malformed image blocks: fetches, files, other types, bad base64, the wrong place
        [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}],
        [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": 5}}]}],
        [{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "file_1"}}]}],
        [{"role": "user", "content": [{"type": "image", "source": {"type": "wizard"}}]}],
        [{"role": "user", "content": [{"type": "image", "source": "x"}]}],
        [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": "R0lGODlh"}}]}],
        [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO*w0K"}}]}],
        [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "/9j/4AAQ"}}]}],
        [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQ"}}]}],
        [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png"}}]}],
        [{"role": "assistant", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}],
        [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": [{"type": "image", "source": {"type": "url", "url": "http://x/a.png"}}]}]}]], "messages"),
    "system": ([5, [5], [{"type": "image"}], {"a": 1}], "system"), "temperature": ([1.5, -0.1, "x"], "temperature"),
    "top_p": ([0, 2, "x"], "top_p"), "top_k": (["x", 1.5], "top_k"), "stop_sequences": (["x", [5], [""]], "stop_sequences"),
    "stream": (["yes", 1], "stream"), "metadata": ([5], "metadata"),
    "thinking": ([5, {"type": "on"}, {"type": "enabled"}, {"type": "enabled", "budget_tokens": 0}, {"type": "enabled", "budget_tokens": 9}], "thinking"),
    "tools": ([5, [5], [{"name": 5}], [{"name": "f"}], [{"name": "f", "input_schema": 5}], [{"type": "bash_20250124", "name": "bash"}],
               [{"name": "f", "input_schema": {}, "description": 5}]], "tools"),
    "tool_choice": ([5, "auto", {"type": "maybe"}, {"type": "any"}, {"type": "tool"}, {"type": "tool", "name": "f"},
                     {"type": "auto", "disable_parallel_tool_use": "x"}], "tool_choice"),
    "model": ([None, 5], "model"),
}
anth_cases = []
for k, (vs, needle) in anth_bad.items():
    for i, v in enumerate(vs):
        b = dict(good_msg)
        if v is None:
            del b[k]
        else:
            b[k] = v
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            if path.endswith("count_tokens") and k in ("max_tokens", "stream", "temperature", "top_p", "top_k", "stop_sequences", "metadata", "thinking"):
                continue   # not read (or not bounded by max_tokens) there
            anth_cases.append(("anth_%s_%s_%d" % (path.split("/")[-1], k, i), path, json.dumps(b).encode(), needle))
s0 = json.dumps(dict(good_msg, system="s", stop_sequences=["x"], temperature=0.5))
for cut in range(0, len(s0) - 1, 3):
    anth_cases.append(("anth_truncated_%d" % cut, "/v1/messages", s0[:cut].encode(), ""))
for i, b in enumerate([b"[]", b"5", b"null", b'{"messages":' + b"[" * 100 + b"]" * 100 + b"}", b'{"model":"x","max_tokens":2,"messages":[{"role":"user","content":"a\xffb"}]}'.replace(b"\\xff", b"\xff")]):
    anth_cases.append(("anth_top_%d" % i, "/v1/messages", b, ""))
for name, path, body, needle in anth_cases:
    try:
        st, rb = req("POST", path, body)
    except Exception as e:
        fails.append("%s: %s" % (name, e))
        continue
    n_corpus += 1
    expect_anth_error(name, st, rb, needle)
# wrong key
st, rb = req("GET", "/v1/models", auth=False, extra="Authorization: Bearer wrong\r\n")
expect_json_error("wrong_key", st, rb, 401, 401)
# oversized bodies: declared, and sent chunked
big = json.dumps({"prompt": "x" * (300 * 1024), "max_tokens": 1})
st, rb = req("POST", "/v1/completions", big)
expect_json_error("body_over_max_declared", st, rb, 413, 413)
chunked = b"".join(b"%x\r\n%s\r\n" % (len(big[i:i + 8192]), big[i:i + 8192].encode()) for i in range(0, len(big), 8192)) + b"0\r\n\r\n"
st, rb = raw(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%sTransfer-Encoding: chunked\r\n\r\n" % AUTH).encode() + chunked)
expect_json_error("body_over_max_chunked", st, rb, 413, 413)
# framing errors answered by microhttpd itself: a 4xx or a closed connection
for name, data in (("huge_header", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200000 + b"\r\n\r\n"),
                   ("many_headers", b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 20000 + b"\r\n"),
                   ("garbage_line", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n"),
                   ("bad_version", b"GET /health HTTP/7.5\r\n\r\n"),
                   ("bad_content_length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n"),
                   ("two_content_lengths", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 9\r\n\r\n{}")):
    try:
        st, rb = raw(data, timeout=15)
    except Exception:
        st = None
    n_corpus += 1
    if st is not None and not (400 <= st <= 499 or st == 505):
        fails.append("%s: status %s" % (name, st))
print(("PASS hostile_corpus_%d_cases" % n_corpus) if not fails else "FAIL hostile_corpus: %d of %d: %s" % (len(fails), n_corpus, "; ".join(fails[:8])))
n_fail_corpus = len(fails)

# ---------------------------------------------------------------- slow and vanishing clients
slow_fails = []
def trickle_body():
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\n%sContent-Length: 200\r\n\r\n" % AUTH).encode())
    t0 = time.time()
    try:
        for _ in range(60):
            s.sendall(b" ")
            time.sleep(0.25)
        slow_fails.append("trickled body: connection still open after %.1f s" % (time.time() - t0))
    except OSError:
        if time.time() - t0 > 10:
            slow_fails.append("trickled body dropped only after %.1f s" % (time.time() - t0))
    s.close()
def endless_headers():
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    t0 = time.time()
    try:
        d = s.recv(100)
        if time.time() - t0 > 12:
            slow_fails.append("idle headers closed only after %.1f s" % (time.time() - t0))
    except socket.timeout:
        slow_fails.append("idle headers: connection kept 30 s")
    except OSError:
        pass
    s.close()
def vanish_stream():
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    body = json.dumps({"prompt": [5, 6, 7], "max_tokens": 800, "ignore_eos": True, "stream": True})
    s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s" % (AUTH, len(body), body)).encode())
    s.recv(2000)
    s.close()
def vanish_wait():
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    body = json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 800, "ignore_eos": True})
    s.sendall(("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s" % (AUTH, len(body), body)).encode())
    time.sleep(0.3)
    s.close()
def half_request():
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\n%sContent-Length: 500\r\n\r\n{\"prompt\":" % AUTH).encode())
    s.close()
ths = [threading.Thread(target=f) for f in [trickle_body, endless_headers] + [vanish_stream] * 8 + [vanish_wait] * 4 + [half_request] * 4]
for t in ths:
    t.start()
time.sleep(1.0)
# others are served meanwhile
st, rb = req("POST", "/v1/completions", json.dumps({"prompt": "Hello", "max_tokens": 2}))
if st != 200:
    slow_fails.append("a request during the slow clients got %s %r" % (st, rb[:200]))
for t in ths:
    t.join()

def metrics():
    st, rb = req("GET", "/metrics")
    vals = {}
    for line in rb.decode().splitlines():
        m = re.match(r'^([a-z0-9_:]+)\{model_name="[^"]*"(,finished_reason="(\w+)")?\} (\S+)$', line)
        if m:
            vals[m.group(1) + (":" + m.group(3) if m.group(3) else "")] = float(m.group(4))
    return vals
t0 = time.time()
while True:
    m = metrics()
    idle = m.get("vllm:num_requests_running") == 0 and m.get("vllm:num_requests_waiting") == 0 and m.get("ds41:sessions_open") == 0 \
        and m.get("ds41:kv_reserved_bytes") == 0
    if idle or time.time() - t0 > 20:
        break
    time.sleep(0.2)
if not idle:
    slow_fails.append("not idle 20 s after the clients left: %s" % {k: v for k, v in m.items() if "bucket" not in k and not k.endswith("_sum")})
if m.get("vllm:request_success_total:abort", 0) < 12:
    slow_fails.append("expected >= 12 aborted sequences, metrics say %s" % m.get("vllm:request_success_total:abort"))
print("PASS hostile_slow_and_vanishing_clients" if not slow_fails else "FAIL hostile_slow_and_vanishing_clients: " + "; ".join(slow_fails))
st, _ = req("GET", "/health")
st2, rb2 = req("POST", "/v1/completions", json.dumps({"prompt": "Hello", "max_tokens": 3}))
ok = st == 200 and st2 == 200 and json.loads(rb2)["usage"]["completion_tokens"] == 3
print("PASS hostile_server_still_serves" if ok else "FAIL hostile_server_still_serves: %s %s %r" % (st, st2, rb2[:200]))
sys.exit(1 if fails or slow_fails or not ok else 0)
