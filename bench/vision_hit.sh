#!/usr/bin/env bash
# Time to first token of an image request that hits the prefix cache (docs/vision.md, "Prefix
# cache"). A server (prefix cache on) on the checkpoint of bench/vision_lib.sh (the tinyvl text
# model, a tower of the released block shape with BLOCKS of its 32 blocks) gets, ROUNDS times,
# a fresh 448 x 448 noise PNG with a question that puts the image's span in a whole cached
# block: once cold, then the same request again (a hit: the span's block restored, the rest
# prefilled). Each request asks for one token, so its time is the TTFT. Printed per round: the
# cold and the hit TTFT and the hit's cached tokens; then the medians. Before the image cache a
# hit still ran the tower (the replay of the restored image positions needs their
# embeddings); with it a hit takes the rows from the cache.
#   bench/vision_hit.sh [DS41 binary]   (env: BLOCKS, ROUNDS, THREADS, OUT=dir kept)
set -eu
cd "$(dirname "$0")/.."
DS41=${1:-build/ds41}
PY=${PYTHON:-/usr/bin/python3}
BLOCKS=${BLOCKS:-1} ROUNDS=${ROUNDS:-3} THREADS=${THREADS:-1}
TMP=${OUT:-$(mktemp -d /tmp/ds41-vhit.XXXXXX)}
mkdir -p "$TMP"
SPID=
trap '[ -n "$SPID" ] && kill "$SPID" 2>/dev/null; [ -z "${OUT:-}" ] && rm -rf "$TMP"' EXIT
. bench/vision_lib.sh
vserve -t "$THREADS" --spec off -c "$CTX"
"$PY" - "$PORT" "$ROUNDS" <<'PYEOF'
import base64, io, json, statistics, sys, time, urllib.request
import numpy as np
from PIL import Image
port, rounds = sys.argv[1], int(sys.argv[2])
def ask(url_img):
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url_img}},
                                                      {"type": "text", "text": "Describe the picture above." + " word" * 60}]}],
            "max_tokens": 1, "temperature": 0}
    rq = urllib.request.Request("http://127.0.0.1:%s/v1/chat/completions" % port, json.dumps(body).encode(),
                                {"Content-Type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(rq) as r: d = json.loads(r.read())
    return time.monotonic() - t0, d["usage"]["prompt_tokens"], d["usage"]["prompt_tokens_details"]["cached_tokens"]
cold, hit = [], []
for i in range(rounds):
    f = io.BytesIO()
    Image.fromarray(np.random.default_rng(100 + i).integers(0, 256, (448, 448, 3), dtype=np.uint8)).save(f, "PNG")
    u = "data:image/png;base64," + base64.b64encode(f.getvalue()).decode()
    c, n, _ = ask(u)
    h, _, k = ask(u)
    cold.append(c); hit.append(h)
    print("round %d: prompt %d tokens; TTFT cold %.3f s, hit %.3f s (%d cached)" % (i, n, c, h, k))
print("median TTFT: cold %.3f s, hit %.3f s" % (statistics.median(cold), statistics.median(hit)))
PYEOF
