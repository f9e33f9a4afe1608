"""The grammar table cache of `ds41 serve` (issue 25): grammar_cache.py PORT
PORT: an --exact server on models/demo. The same grammar twice builds its tables once (the
second request is a cache hit, ds41:grammar_tables_builds_total unchanged) and gives the same
tokens as the first (the cached tables give the trie walk's masks bit for bit); the same schema
through another front end (guided_json) maps to the same GBNF text, so to the same entry; a
different grammar builds once more. Masks of decode steps are computed beside the forward
(ds41:grammar_masks_prefetched_total grows with a grammar's new states), and so is the first
token's, beside the prefill step that ends the prompt: a request of one token (sampled from the
grammar's start state, a matcher of its own) adds exactly one prefetched mask."""
import json, re, sys, urllib.request

port = int(sys.argv[1])

def post(body):
    r = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, json.dumps(body).encode(),
                               {"Content-Type": "application/json"})
    with urllib.request.urlopen(r, timeout=120) as f:
        return json.loads(f.read())

def metrics():
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=30) as f:
        t = f.read().decode()
    val = lambda name: float(re.search(r"^%s\{[^}]*\} (\S+)$" % re.escape(name), t, re.M).group(1))
    return (val("ds41:grammar_tables_builds_total"), val("ds41:grammar_tables_hits_total"), val("ds41:grammar_tables_cached"),
            val("ds41:grammar_masks_prefetched_total"))

def ok(name, cond, why=""):
    print(("PASS %s" % name) if cond else ("FAIL %s: %s" % (name, why)))

# a schema no other test sends, so that its first request here is a miss
schema = {"type": "object", "properties": {"cache_probe": {"enum": ["alpha", "beta", "gamma"]},
                                            "n": {"type": "integer"}}, "required": ["cache_probe", "n"]}
body = {"prompt": "A record:", "max_tokens": 24, "temperature": 0, "logprobs": 0, "return_tokens_as_token_ids": True}
toks = lambda j: j["choices"][0]["logprobs"]["tokens"]

b0, h0, _, p0 = metrics()
j1 = post(dict(body, response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}))
b1, h1, c1, p1 = metrics()
ok("first request builds", b1 == b0 + 1 and h1 == h0, "builds %g -> %g, hits %g -> %g" % (b0, b1, h0, h1))
ok("the entry is cached", c1 >= 1, "cached %g" % c1)
ok("a new grammar's masks are computed beside the forward", p1 > p0, "prefetched %g -> %g" % (p0, p1))
j2 = post(dict(body, response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}))
b2, h2, _, _ = metrics()
ok("same grammar again: no build, a hit", b2 == b1 and h2 == h1 + 1, "builds %g -> %g, hits %g -> %g" % (b1, b2, h1, h2))
ok("same grammar again: same tokens", toks(j1) == toks(j2), "%s vs %s" % (toks(j1), toks(j2)))
j3 = post(dict(body, guided_json=schema))
b3, h3, _, _ = metrics()
ok("guided_json of the same schema: same entry", b3 == b2 and h3 == h2 + 1, "builds %g -> %g, hits %g -> %g" % (b2, b3, h2, h3))
ok("guided_json of the same schema: same tokens", toks(j3) == toks(j1), "%s vs %s" % (toks(j3), toks(j1)))
post(dict(body, guided_regex="cache-probe-[0-9]{2,4}"))
b4, h4, _, _ = metrics()
ok("a different grammar builds once more", b4 == b3 + 1 and h4 == h3, "builds %g -> %g, hits %g -> %g" % (b3, b4, h3, h4))
_, _, _, p5 = metrics()
j5 = post(dict(body, prompt="One token under a grammar, its mask prefetched:", max_tokens=1, guided_regex="first-[a-z]{3}"))
_, _, _, p6 = metrics()
ok("the first token's mask is computed beside the prefill", p6 == p5 + 1 and len(toks(j5)) == 1,
   "prefetched %g -> %g, %d tokens" % (p5, p6, len(toks(j5))))
