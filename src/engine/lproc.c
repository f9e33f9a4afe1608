/* ds41 logits processing before sampling (lproc.h). */
#include "lproc.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ds41_lproc_init(ds41_lproc *lp, int V, int eos) {
    memset(lp, 0, sizeof *lp);
    lp->V = V;
    lp->eos = eos;
    lp->rep = 1.0f;
    lp->gate = -1;
    lp->gstate = -1;
    lp->xset = -1;
    lp->think_budget = -1;
}

void ds41_lproc_think_budget(ds41_lproc *lp, int end, long long budget) {
    if (end < 0 || end >= lp->V || budget < 0) return;
    lp->gate = end;
    lp->gate_open = 0;
    lp->think_budget = budget;
    lp->n_think = 0;
}

/* 1 when the row after the accepted tokens plus tail must end the reasoning: the gate is still
 * closed there and the reasoning has spent its budget */
static int think_forced(const ds41_lproc *lp, const int32_t *tail, int n_tail) {
    if (lp->think_budget < 0 || lp->gate < 0 || lp->gate_open) return 0;
    long long n = lp->n_think;
    for (int i = 0; i < n_tail; i++) {
        if (tail[i] == lp->gate) return 0;
        n++;
    }
    return n >= lp->think_budget;
}

void ds41_lproc_free(ds41_lproc *lp) {
    if (!lp) return;
    free(lp->bias_id); free(lp->bias_val); free(lp->ban_ids); free(lp->stop_ids);
    free(lp->count); free(lp->flag); free(lp->gen_ids); free(lp->pr_ids); free(lp->bits); free(lp->xbits); free(lp->xon);
    memset(lp, 0, sizeof *lp);
}

static int penalised(const ds41_lproc *lp) { return lp->freq != 0.0f || lp->pres != 0.0f || lp->rep != 1.0f; }

int ds41_lproc_active(const ds41_lproc *lp) {
    return lp && (penalised(lp) || lp->n_bias > 0 || (lp->min_tokens > 0 && lp->n_ban > 0) || lp->gm || lp->remote ||
                  lp->think_budget >= 0);
}

int ds41_lproc_ready(ds41_lproc *lp) {
    if (lp->gm && lp->gstate < 0) lp->gstate = ds41_gmatch_start(lp->gm);
    if ((lp->gm || lp->remote) && !lp->bits && !(lp->bits = malloc(((size_t)lp->V + 31) / 32 * sizeof *lp->bits))) return -1;
    if (!penalised(lp) || lp->count) return 0;
    lp->count = calloc((size_t)lp->V, sizeof *lp->count);
    lp->flag = calloc((size_t)lp->V, 1);
    return lp->count && lp->flag ? 0 : -1;
}

int ds41_lproc_prompt(ds41_lproc *lp, const int32_t *ids, size_t n) {
    if (lp->rep == 1.0f || !lp->flag) return 0;
    free(lp->pr_ids);
    lp->pr_ids = malloc((n ? n : 1) * sizeof *lp->pr_ids);
    if (!lp->pr_ids) return -1;
    lp->n_pr_ids = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < lp->V && !(lp->flag[ids[i]] & 1)) {
            lp->flag[ids[i]] |= 1;
            lp->pr_ids[lp->n_pr_ids++] = ids[i];
        }
    return 0;
}

static void count_add(ds41_lproc *lp, int32_t id) {
    if (!lp->count || id < 0 || id >= lp->V) return;
    if (lp->count[id]++ == 0 && !(lp->flag[id] & 2)) {
        if (lp->n_gen_ids == lp->cap_gen_ids) {
            size_t nc = lp->cap_gen_ids ? lp->cap_gen_ids * 2 : 64;
            int32_t *p = realloc(lp->gen_ids, nc * sizeof *p);
            if (!p) { lp->count[id]--; return; }   /* out of memory: the token goes uncounted */
            lp->gen_ids = p;
            lp->cap_gen_ids = nc;
        }
        lp->gen_ids[lp->n_gen_ids++] = id;
        lp->flag[id] |= 2;
    }
}

/* The tail's tokens are counted for the row and uncounted after; an id first seen in the tail
 * stays in gen_ids with a zero count, which every penalty treats as absent. */
static void count_sub(ds41_lproc *lp, int32_t id) {
    if (lp->count && id >= 0 && id < lp->V && lp->count[id] > 0) lp->count[id]--;
}

static void penalise(const ds41_lproc *lp, float *row) {
    if (lp->rep != 1.0f) {
        for (size_t i = 0; i < lp->n_pr_ids; i++) {
            float *l = &row[lp->pr_ids[i]];
            *l = *l > 0 ? *l / lp->rep : *l * lp->rep;
        }
        for (size_t i = 0; i < lp->n_gen_ids; i++) {
            int32_t id = lp->gen_ids[i];
            if ((lp->flag[id] & 1) || !lp->count[id]) continue;   /* prompt ids done above */
            row[id] = row[id] > 0 ? row[id] / lp->rep : row[id] * lp->rep;
        }
    }
    if (lp->freq != 0.0f || lp->pres != 0.0f)
        for (size_t i = 0; i < lp->n_gen_ids; i++) {
            int32_t id = lp->gen_ids[i];
            uint32_t c = lp->count[id];
            if (c) row[id] -= lp->freq * (float)c + lp->pres;
        }
}

/* The grammar state after the accepted tokens and tail (-1: refused, or before the gate). */
static int tail_state(ds41_lproc *lp, const int32_t *tail, int n_tail, int *gated) {
    int s = lp->gstate, open = lp->gate < 0 || lp->gate_open;
    for (int i = 0; i < n_tail; i++) {
        if (!open) { open = tail[i] == lp->gate; continue; }
        if (s >= 0) s = ds41_gmatch_advance(lp->gm, s, tail[i]);
    }
    *gated = !open;
    return s;
}

static int is_stop(const ds41_lproc *lp, int id) {
    if (id == lp->eos) return 1;
    for (int i = 0; i < lp->n_stop_ids; i++) if (lp->stop_ids[i] == id) return 1;
    return 0;
}

void ds41_lproc_apply(ds41_lproc *lp, float *row, const int32_t *tail, int n_tail) {
    int V = lp->V;
    if (lp->min_tokens > 0 && lp->n_gen + n_tail < lp->min_tokens)
        for (int i = 0; i < lp->n_ban; i++)
            if (lp->ban_ids[i] >= 0 && lp->ban_ids[i] < V) row[lp->ban_ids[i]] = -INFINITY;
    for (int i = 0; i < lp->n_bias; i++) row[lp->bias_id[i]] += lp->bias_val[i];
    if (lp->count) {
        for (int i = 0; i < n_tail; i++) count_add(lp, tail[i]);
        penalise(lp, row);
        for (int i = 0; i < n_tail; i++) count_sub(lp, tail[i]);
    }
    /* the grammar's allowed tokens, or (remote) those rank 0 sent for this row: a verify
     * block's row after n_tail drafts, else the one row given */
    if (lp->gm && !lp->bits && !(lp->bits = malloc(((size_t)V + 31) / 32 * sizeof *lp->bits))) {
        if (!lp->err[0]) snprintf(lp->err, sizeof lp->err, "out of memory for a grammar's mask");
        for (int i = 0; i < V; i++) row[i] = -INFINITY;
    } else if (lp->gm) {
        if (ds41_lproc_allowed(lp, tail, n_tail, lp->bits)) ds41_gmask_apply(lp->bits, row, V);
    } else if (lp->remote && lp->xrows > 0) {
        if (n_tail >= 0 && n_tail < lp->xrows && lp->xon[n_tail])
            ds41_gmask_apply(lp->xbits + (size_t)n_tail * (((size_t)V + 31) / 32), row, V);
    } else if (lp->remote && lp->xset > 0 && lp->bits) {
        ds41_gmask_apply(lp->bits, row, V);
    }
    /* the reasoning's budget spent: its end alone (before the grammar's gate, the grammar
     * allows it; a bias of -inf on it does not keep the reasoning going) */
    if (think_forced(lp, tail, n_tail)) {
        float keep = row[lp->gate];
        for (int i = 0; i < V; i++) row[i] = -INFINITY;
        row[lp->gate] = keep > -INFINITY ? keep : 0.0f;
        return;
    }
    /* nothing allowed (a grammar that cannot continue, min_tokens against a finished grammar):
     * end the sequence rather than sample a refused token */
    int any = 0;
    for (int i = 0; i < V && !any; i++) any = row[i] > -INFINITY;
    if (!any) row[lp->eos >= 0 && lp->eos < V ? lp->eos : 0] = 0.0f;
}

int ds41_lproc_xrows(ds41_lproc *lp, int rows) {
    if (rows < 1) return -1;
    if (rows > lp->xcap) {
        size_t W = ((size_t)lp->V + 31) / 32;
        uint32_t *b = realloc(lp->xbits, (size_t)rows * W * sizeof *b);
        if (!b) return -1;
        lp->xbits = b;
        uint8_t *o = realloc(lp->xon, (size_t)rows);
        if (!o) return -1;
        lp->xon = o;
        lp->xcap = rows;
    }
    memset(lp->xon, 0, (size_t)rows);
    lp->xrows = rows;
    return 0;
}

static void bit_set(uint32_t *bits, int i, int on) {
    if (on) bits[i >> 5] |= 1u << (i & 31);
    else bits[i >> 5] &= ~(1u << (i & 31));
}

int ds41_lproc_allowed(ds41_lproc *lp, const int32_t *tail, int n_tail, uint32_t *bits) {
    if (!lp->gm) return 0;
    int V = lp->V, gated = 0, s = tail_state(lp, tail, n_tail, &gated);
    size_t W = ((size_t)V + 31) / 32;
    if (gated) {
        /* before the gate (the reasoning, up to </think>) every token but the end token: a
         * constrained reply (a forced tool call, a schema) cannot end before its grammar starts */
        if (lp->eos < 0 || lp->eos >= V) return 0;
        memset(bits, 0xff, W * sizeof *bits);
        bit_set(bits, lp->eos, 0);
        return 1;
    }
    /* the end tokens are outside the trie: allowed exactly when the grammar may end */
    int can_end = s >= 0 && ds41_gmatch_can_end(lp->gm, s);
    const uint32_t *mask = s >= 0 ? ds41_gmatch_mask(lp->gm, s) : NULL;
    if (!mask) {
        if (s >= 0 && !lp->err[0]) snprintf(lp->err, sizeof lp->err, "%s", ds41_gmatch_error(lp->gm));
        memset(bits, 0, W * sizeof *bits);
    } else {
        memcpy(bits, mask, W * sizeof *bits);
        int nk = 0;
        for (int i = 0; i < lp->n_stop_ids && nk < 64; i++)
            if (lp->stop_ids[i] >= 0 && lp->stop_ids[i] < V) {
                bit_set(bits, lp->stop_ids[i], can_end);
                nk++;
            }
    }
    if (lp->eos >= 0 && lp->eos < V) bit_set(bits, lp->eos, can_end);
    return 1;
}

void ds41_lproc_accept(ds41_lproc *lp, int32_t id) {
    lp->n_gen++;
    count_add(lp, id);
    if (lp->gate >= 0 && !lp->gate_open) {   /* the reasoning: the grammar starts after it */
        lp->gate_open = id == lp->gate;
        lp->n_think += !lp->gate_open;
        return;
    }
    if (!lp->gm) return;
    if (lp->gstate >= 0 && !is_stop(lp, id)) lp->gstate = ds41_gmatch_advance(lp->gm, lp->gstate, id);
}

int ds41_lproc_valid_prefix(ds41_lproc *lp, const int32_t *drafts, int k) {
    if (!lp) return k;
    for (int i = 0; i < k; i++)   /* past the budget only the end of the reasoning */
        if (drafts[i] != lp->gate && think_forced(lp, drafts, i)) {
            k = i;
            break;
        }
    if (!lp->gm) return k;
    int s = lp->gstate, open = lp->gate < 0 || lp->gate_open;
    for (int i = 0; i < k; i++) {
        if (!open) {
            if (drafts[i] == lp->eos) return i;   /* banned before the gate (ds41_lproc_allowed) */
            open = drafts[i] == lp->gate;
            continue;
        }
        if (s < 0) return i;
        if (is_stop(lp, drafts[i])) return ds41_gmatch_can_end(lp->gm, s) ? i + 1 : i;
        s = ds41_gmatch_advance(lp->gm, s, drafts[i]);
        if (s < 0) return i;
    }
    return k;
}
