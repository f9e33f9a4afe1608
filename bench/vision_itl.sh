#!/usr/bin/env bash
# Inter-token latency of running streams while an image request arrives (docs/vision.md,
# "Scheduling"). A server on a checkpoint with the tinyvl text model and a tower of the
# released block shape (D 1024, 16 heads, I 2816; BLOCKS of its 32 blocks, default 1) runs
# STREAMS greedy text streams (default 2); once they are decoding, one request with a
# 448 x 448 noise PNG arrives. Printed per stream: the median gap between streamed tokens
# before the image request, the median and the largest gap from its arrival to its answer (one
# token), and that wait (tower + prefill). With the tower on the scheduler thread the largest
# gap is the whole encode; off it, the streams keep stepping.
# TEXT=N adds N words to the image request's question (a longer prefill after the encode);
# BATCH sets the server's --batch-tokens; GEN the streams' max_tokens (default 400: they must
# still run when the image's prefill starts, after the encode; CTX, default 1024, the context).
#   bench/vision_itl.sh [DS41 binary]   (env: BLOCKS, STREAMS, THREADS, TEXT, BATCH, GEN, CTX, OUT=dir kept)
set -eu
cd "$(dirname "$0")/.."
DS41=${1:-build/ds41}
PY=${PYTHON:-/usr/bin/python3}
BLOCKS=${BLOCKS:-1} STREAMS=${STREAMS:-2} THREADS=${THREADS:-1} TEXT=${TEXT:-0} BATCH=${BATCH:-} GEN=${GEN:-400}
TMP=${OUT:-$(mktemp -d /tmp/ds41-vitl.XXXXXX)}
mkdir -p "$TMP"
SPID=
trap '[ -n "$SPID" ] && kill "$SPID" 2>/dev/null; [ -z "${OUT:-}" ] && rm -rf "$TMP"' EXIT
. bench/vision_lib.sh   # CK: the tinyvl text model with a tower of the released block shape
"$PY" -c "
import numpy as np; from PIL import Image
Image.fromarray(np.random.default_rng(1).integers(0, 256, (448, 448, 3), dtype=np.uint8)).save('$TMP/noise.png')"
vserve -t "$THREADS" --spec off --no-prefix-cache -c "$CTX" ${BATCH:+--batch-tokens $BATCH}
"$PY" - "$PORT" "$TMP/noise.png" "$STREAMS" "$TEXT" "$GEN" <<'PYEOF'
import base64, json, statistics, sys, threading, time, urllib.request
port, png, n, words, gen = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
url = "http://127.0.0.1:%s/v1/chat/completions" % port
def post(body, times):
    rq = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(rq) as r:
        for line in r:
            if line.startswith(b"data: {"):
                times.append(time.monotonic())
streams = [[] for _ in range(n)]
th = [threading.Thread(target=post, args=({"messages": [{"role": "user", "content": "Tell a long story %d." % i}],
                                           "max_tokens": gen, "ignore_eos": True, "temperature": 0, "stream": True}, streams[i]))
      for i in range(n)]
for t in th: t.start()
while min(len(s) for s in streams) < 40: time.sleep(0.01)
img = []
url_img = "data:image/png;base64," + base64.b64encode(open(png, "rb").read()).decode()
t0 = time.monotonic()
post({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url_img}},
                                                {"type": "text", "text": "What is this?" + " word" * words}]}],
      "max_tokens": 1, "temperature": 0, "stream": True}, img)
t1 = time.monotonic()   # its one token streamed and the request ended
for t in th: t.join()
print("image request: answered after %.2f s (tower + prefill + one token); streams ended %.2f s after it arrived"
      % (t1 - t0, min(s[-1] for s in streams) - t0))
for i, s in enumerate(streams):
    gaps = [(b - a) * 1e3 for a, b in zip(s, s[1:])]
    before = [g for (a, g) in zip(s[1:], gaps) if a < t0]
    during = [g for (a, g) in zip(s[1:], gaps) if t0 <= a and a - g / 1e3 < t1]
    print("stream %d: ITL median before %.1f ms; while the image is encoded and prefilled: %d gaps, median %.1f ms, max %.1f ms"
          % (i, statistics.median(before), len(during), statistics.median(during) if during else float("nan"),
             max(during) if during else float("nan")))
PYEOF
