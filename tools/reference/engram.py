"""Engram constants (spec 1.7), hashing (3.2) and the Engram module (3.3)."""

import numpy as np

from formats import F32, bf16_round, E4M3_TABLE, ue8m0_decode
from exact import c32, mean32, rsqrt32, sigmoid32, sum32, linear_quant

INT64_MAX = np.iinfo(np.int64).max

# Production constants, baked (NumPy does not promise RNG stream stability across versions).
PRODUCTION_MULTIPLIERS = {
    1: [76632096046245, 4839876093313, 35959672319349, 73987337458391],
    14: [67716810739261, 51510806800915, 30921347202721, 82619226485591],
}
PRODUCTION_PRIMES = {
    1: [[16000057, 16000079, 16000081, 16000097, 16000121, 16000129, 16000133, 16000183],
        [16000189, 16000207, 16000211, 16000253, 16000277, 16000289, 16000307, 16000321],
        [16000339, 16000381, 16000393, 16000399, 16000403, 16000409, 16000447, 16000463]],
    14: [[16000477, 16000487, 16000499, 16000507, 16000511, 16000573, 16000609, 16000627],
         [16000667, 16000669, 16000693, 16000697, 16000711, 16000729, 16000759, 16000769],
         [16000781, 16000799, 16000813, 16000819, 16000841, 16000877, 16000879, 16000889]],
}


def is_prime(n):
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    f = 3
    while f * f <= n:
        if n % f == 0:
            return False
        f += 2
    return True


def engram_primes_recipe(cfg):
    """[slot][order n-2][head]: for each layer, order and head the smallest prime strictly above the
    previous value; the walk restarts at engram_vocab_size - 1 for every (layer, order) and a global
    used set keeps all primes distinct."""
    used, out = set(), []
    for _ in cfg["engram_layer_ids"]:
        per_order = []
        for _ in range(cfg["engram_max_ngram_size"] - 1):
            cur, heads = cfg["engram_vocab_size"] - 1, []
            for _ in range(cfg["engram_n_heads"]):
                cur += 1
                while not is_prime(cur) or cur in used:
                    cur += 1
                used.add(cur)
                heads.append(cur)
            per_order.append(heads)
        out.append(per_order)
    return out


def engram_multipliers_recipe(cfg):
    """[slot][lookback]: default_rng(10007 * layer_id).integers(0, bound, max_ngram) * 2 + 1 with
    bound = (INT64_MAX // compressed_vocab) // 2 (at least 1)."""
    bound = max(1, (INT64_MAX // cfg["engram_compressed_vocab_size"]) // 2)
    out = []
    for layer in cfg["engram_layer_ids"]:
        g = np.random.default_rng(10007 * layer)
        out.append([int(v) for v in g.integers(0, bound, size=cfg["engram_max_ngram_size"], dtype=np.int64) * 2 + 1])
    return out


def is_production_engram(cfg):
    return (list(cfg["engram_layer_ids"]) == [1, 14] and cfg["engram_max_ngram_size"] == 4
            and cfg["engram_n_heads"] == 8 and cfg["engram_vocab_size"] == 16000000
            and cfg["engram_compressed_vocab_size"] == 99092)


class EngramConstants:
    def __init__(self, cfg):
        if is_production_engram(cfg):
            layers = cfg["engram_layer_ids"]
            self.primes = [PRODUCTION_PRIMES[l] for l in layers]
            self.multipliers = [PRODUCTION_MULTIPLIERS[l] for l in layers]
        else:
            self.primes = engram_primes_recipe(cfg)
            self.multipliers = engram_multipliers_recipe(cfg)
        self.n_heads = cfg["engram_n_heads"]
        self.max_ngram = cfg["engram_max_ngram_size"]
        self.cols = (self.max_ngram - 1) * self.n_heads
        # offsets[slot][col] = sum of the primes of all earlier columns of that layer
        self.flat_primes = [np.array([p for order in layer for p in order], dtype=np.int64) for layer in self.primes]
        self.offsets = [np.concatenate([[0], np.cumsum(fp)[:-1]]).astype(np.int64) for fp in self.flat_primes]
        self.rows = [int(fp.sum()) for fp in self.flat_primes]


def engram_hash(consts, hist, positions, pad):
    """3.2: hash ids [T, n_slots, cols] (int64) for the given positions; hist holds the compressed
    id of every position so far (including these)."""
    T = len(positions)
    out = np.zeros((T, len(consts.multipliers), consts.cols), dtype=np.int64)
    for t, p in enumerate(positions):
        tok, blocked = [], False
        for s in range(consts.max_ngram):
            blocked = blocked or p < s or hist[p - s] < 0
            tok.append(pad if blocked else hist[p - s])
        for slot, M in enumerate(consts.multipliers):
            r = np.int64(tok[0]) * np.int64(M[0])
            for n in range(2, consts.max_ngram + 1):
                r = r ^ (np.int64(tok[n - 1]) * np.int64(M[n - 1]))
                for k in range(consts.n_heads):
                    col = (n - 2) * consts.n_heads + k
                    out[t, slot, col] = r % consts.flat_primes[slot][col] + consts.offsets[slot][col]
    return out


def engram_module(X, ids, w, eps, dim, dead=None):
    """3.3. X: stream [T, hc, dim] BF16; ids [T, cols]; w: dict of this layer's Engram weights;
    dead [T] bool (or None): image positions, whose gate is 0."""
    codes = np.asarray(w["table"][ids.reshape(-1)])                # [T*cols, hd] E4M3
    scales = ue8m0_decode(np.asarray(w["table_scale"][ids.reshape(-1)]))   # [T*cols, hd/32]
    hd = codes.shape[-1]
    rows = E4M3_TABLE[codes].reshape(-1, hd // 32, 32) * scales[:, :, None]
    rows = bf16_round(rows.reshape(ids.shape[0], -1))               # [T, cols*hd]
    kv = linear_quant(rows, w["wkv"])                               # BF16 [T, (hc+1)*dim]
    T, hc = X.shape[0], X.shape[1]
    key = kv[:, :hc * dim].reshape(T, hc, dim)
    value = kv[:, hc * dim:]
    h = X
    rstd = rsqrt32(mean32(h * h) + c32(eps)) * rsqrt32(mean32(key * key) + c32(eps))
    S = sum32((h * w["qk"][None]) * key)
    dot = (S * rstd) * c32(dim ** -0.5)
    g = sigmoid32(np.copysign(np.sqrt(np.maximum(np.abs(dot), c32(1e-6))), dot))
    if dead is not None:
        g = np.where(dead[:, None], F32(0), g).astype(F32)
    return bf16_round(h + g[:, :, None] * value[:, None, :])
