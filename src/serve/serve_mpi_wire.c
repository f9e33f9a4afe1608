/* ds41 serve under mpiexec: the decoder of rank 0's records (serve_mpi.h), and the messages
 * of rank 0 to its 503 guard (serve_mpi_guard.c). Apart from the MPI side and the processes so
 * that the fuzz harnesses (fuzz/fuzz_serve_mirror.c, fuzz/fuzz_serve_guard.c) link it alone. */
#include <stdio.h>
#include <string.h>

#include "serve_mpi.h"
#include "serve_req.h"

static const char *const op_name[] = { "?", "OPEN", "CLOSE", "RESTORE", "PUBLISH", "TRIM", "STEP", "END", "OPEN_ON", "SAMPLE", "PROBE", "DRAFT", "CALIBRATE",
                                        "?", "LPROC", "?", "?", "?", "IMAGES", "PROBE_IMG", "BLOCKS",
                                        "GMASK", "GRAMMAR", "VMASK", "INSTALL", "PD_SEQ", "PD_FWD", "DRAFTS" };

/* IMAGES and PROBE_IMG: flags[n] (0 or 1) at w[*i], then a content key (8 words) per flag set */
/* op->n tokens at word *i */
static int tokens(const int32_t *w, size_t n, size_t *i, ds41_sop *op, const char *name, char *err, size_t errcap) {
    if (n - *i < op->n) return snprintf(err, errcap, "serve mirror: word %zu: %s: expected the tokens, the record ends", *i, name), -1;
    op->ids = w + *i;
    *i += op->n;
    return 0;
}

/* a session id, a token count (at least min) and the tokens, as BLOCKS and INSTALL begin */
static int id_tokens(const int32_t *w, size_t n, size_t *i, ds41_sop *op, const char *name, int min, char *err, size_t errcap) {
    if (n - *i < 2)
        return snprintf(err, errcap, "serve mirror: word %zu: %s: expected a session id and a token count, the record ends", *i, name), -1;
    op->id = w[*i];
    if (w[*i + 1] < min)
        return snprintf(err, errcap, "serve mirror: word %zu: %s: %d tokens (expected >= %d)", *i + 1, name, (int)w[*i + 1], min), -1;
    op->n = (size_t)w[*i + 1];
    *i += 2;
    return tokens(w, n, i, op, name, err, errcap);
}

static int image_flags(const int32_t *w, size_t n, size_t *i, ds41_sop *op, const char *name, char *err, size_t errcap) {
    if (n - *i < op->n) return snprintf(err, errcap, "serve mirror: word %zu: %s: expected a flag per token, the record ends", *i, name), -1;
    op->flags = w + *i;
    for (size_t j = 0; j < op->n; j++) {
        if (op->flags[j] != 0 && op->flags[j] != 1)
            return snprintf(err, errcap, "serve mirror: word %zu: %s: flag %d, expected 0 (text) or 1 (image)", *i + j, name,
                            (int)op->flags[j]), -1;
        op->k += (size_t)op->flags[j];
    }
    *i += op->n;
    if (op->k == 0) return snprintf(err, errcap, "serve mirror: word %zu: %s: no image position", *i - 1, name), -1;
    if ((n - *i) / 8 < op->k)
        return snprintf(err, errcap, "serve mirror: word %zu: %s: expected %zu content keys, the record ends", *i, name, op->k), -1;
    op->keys = w + *i;
    *i += op->k * 8;
    return 0;
}

int ds41_sop_next(const int32_t *w, size_t n, size_t *at, ds41_sop *op, char *err, size_t errcap) {
    size_t i = *at;
    if (i >= n) return 0;
    memset(op, 0, sizeof *op);
    op->op = w[i];
    if (op->op < DS41_SOP_OPEN || (op->op > DS41_SOP_CALIBRATE && op->op < DS41_SOP_LPROC) ||
        (op->op > DS41_SOP_LPROC && op->op < DS41_SOP_IMAGES) || op->op > DS41_SOP_DRAFTS)
        return snprintf(err, errcap, "serve mirror: word %zu: expected an operation code 1..%d, %d or %d..%d, got %d", i,
                        DS41_SOP_CALIBRATE, DS41_SOP_LPROC, DS41_SOP_IMAGES, DS41_SOP_DRAFTS, (int)w[i]), -1;
    const char *name = op_name[op->op];
    i++;
#define NEED(k, what) \
    do { if (n - i < (size_t)(k)) return snprintf(err, errcap, "serve mirror: word %zu: %s: expected %s, the record ends", i, name, what), -1; } while (0)
    switch (op->op) {
    case DS41_SOP_OPEN:
    case DS41_SOP_CLOSE:
        NEED(1, "a session id");
        op->id = w[i++];
        break;
    case DS41_SOP_OPEN_ON:
        NEED(2, "a session id and a rank");
        if (w[i + 1] < 0) return snprintf(err, errcap, "serve mirror: word %zu: OPEN_ON: rank %d is negative", i + 1, (int)w[i + 1]), -1;
        op->id = w[i];
        op->rank = w[i + 1];
        i += 2;
        break;
    case DS41_SOP_SAMPLE: {
        NEED(8, "a session id, temperature, top_k, top_p, min_p, a seed (two words) and a logprobs count");
        op->id = w[i];
        memcpy(&op->temperature, &w[i + 1], 4);
        op->top_k = w[i + 2];
        memcpy(&op->top_p, &w[i + 3], 4);
        memcpy(&op->min_p, &w[i + 4], 4);
        op->seed = ((uint64_t)(uint32_t)w[i + 6] << 32) | (uint32_t)w[i + 5];
        op->n_top = w[i + 7];
        /* what the sampler takes (ds41_sampler_init): finite temperature >= 0, top_p in (0, 1] */
        if (!(op->temperature >= 0 && op->temperature <= 3.4e38f) || op->top_k < 0 || !(op->top_p > 0 && op->top_p <= 1) ||
            !(op->min_p >= 0 && op->min_p <= 1))
            return snprintf(err, errcap, "serve mirror: word %zu: SAMPLE: temperature %g, top_k %d, top_p %g, min_p %g out of range",
                            i + 1, op->temperature, op->top_k, op->top_p, op->min_p), -1;
        if (op->n_top < -1 || op->n_top > DS41_REQ_MAX_TOP_LOGPROBS)
            return snprintf(err, errcap, "serve mirror: word %zu: SAMPLE: logprobs count %d (expected -1..%d)", i + 7, op->n_top,
                            DS41_REQ_MAX_TOP_LOGPROBS), -1;
        i += 8;
        break;
    }
    case DS41_SOP_PROBE:
        NEED(1, "a token count");
        if (w[i] < 0) return snprintf(err, errcap, "serve mirror: word %zu: PROBE: token count %d is negative", i, (int)w[i]), -1;
        op->n = (size_t)w[i++];
        if (tokens(w, n, &i, op, name, err, errcap)) return -1;
        break;
    case DS41_SOP_RESTORE:
    case DS41_SOP_PUBLISH:
        NEED(2, "a session id and a token count");
        op->id = w[i++];
        if (w[i] < 0) return snprintf(err, errcap, "serve mirror: word %zu: %s: token count %d is negative", i, name, (int)w[i]), -1;
        op->n = (size_t)w[i++];
        if (tokens(w, n, &i, op, name, err, errcap)) return -1;
        break;
    case DS41_SOP_TRIM:
        NEED(2, "a byte count (two words)");
        op->bytes = (long long)(((uint64_t)(uint32_t)w[i + 1] << 32) | (uint32_t)w[i]);
        if (op->bytes < 0) return snprintf(err, errcap, "serve mirror: word %zu: TRIM: byte count %lld is negative", i, op->bytes), -1;
        i += 2;
        break;
    case DS41_SOP_STEP:
        NEED(1, "an item count");
        if (w[i] < 1) return snprintf(err, errcap, "serve mirror: word %zu: STEP: item count %d, expected at least 1", i, (int)w[i]), -1;
        op->count = w[i++];
        op->items = w + i;
        for (int k = 0; k < op->count; k++) {
            NEED(3, "an item (session id, token count, look-ahead)");
            if (w[i + 1] < 1 || w[i + 2] < DS41_SOP_VERIFY)
                return snprintf(err, errcap, "serve mirror: word %zu: STEP item %d: %d tokens, look-ahead %d (expected >= 1 and >= 0, "
                                "or %d for a verify block)", i, k, (int)w[i + 1], (int)w[i + 2], DS41_SOP_VERIFY), -1;
            if (w[i + 2] == DS41_SOP_VERIFY && w[i + 1] > DS41_SPEC_MAX_DRAFTS + 1)
                return snprintf(err, errcap, "serve mirror: word %zu: STEP item %d: a verify block of %d tokens (at most %d)", i, k,
                                (int)w[i + 1], DS41_SPEC_MAX_DRAFTS + 1), -1;
            size_t t = (size_t)w[i + 1];
            i += 3;
            NEED(t, "the item's tokens");
            i += t;
        }
        break;
    case DS41_SOP_DRAFT:
        NEED(2, "a session id and the token to draft after");
        if (w[i + 1] < 0) return snprintf(err, errcap, "serve mirror: word %zu: DRAFT: token %d is negative", i + 1, (int)w[i + 1]), -1;
        op->id = w[i];
        op->t_next = w[i + 1];
        i += 2;
        break;
    case DS41_SOP_CALIBRATE:
        NEED(3, "a width, a prompt length and a repeat count");
        if (w[i] < 1 || w[i] > DS41_SPEC_MAX_WIDTH || w[i + 1] < 1 || w[i + 1] > 4096 || w[i + 2] < 1 || w[i + 2] > 64)
            return snprintf(err, errcap, "serve mirror: word %zu: CALIBRATE: width %d, prompt %d, reps %d (expected 1..%d, 1..4096, 1..64)",
                            i, (int)w[i], (int)w[i + 1], (int)w[i + 2], DS41_SPEC_MAX_WIDTH), -1;
        op->width = w[i];
        op->prompt_len = w[i + 1];
        op->reps = w[i + 2];
        i += 3;
        break;
    case DS41_SOP_IMAGES:
        NEED(3, "a session id, a token count and a width");
        if (w[i + 1] < 1 || w[i + 2] < 1 || w[i + 2] > 65536)
            return snprintf(err, errcap, "serve mirror: word %zu: IMAGES: %d tokens of width %d (expected >= 1 and 1..65536)", i + 1,
                            (int)w[i + 1], (int)w[i + 2]), -1;
        op->id = w[i];
        op->n = (size_t)w[i + 1];
        op->dim = w[i + 2];
        i += 3;
        if (image_flags(w, n, &i, op, name, err, errcap)) return -1;
        /* k <= n < 2^31 and dim <= 2^16: no overflow in size_t */
        NEED(op->k * (size_t)op->dim, "the image rows");
        op->rows = w + i;
        i += op->k * (size_t)op->dim;
        break;
    case DS41_SOP_LPROC: {
        NEED(13, "a session id, three penalties, eos, min_tokens (two words), the reasoning's end and budget (three words) "
                 "and the bias, ban and prompt counts");
        op->id = w[i];
        memcpy(&op->freq, &w[i + 1], 4);
        memcpy(&op->pres, &w[i + 2], 4);
        memcpy(&op->rep, &w[i + 3], 4);
        op->eos = w[i + 4];
        op->min_tokens = (long long)(((uint64_t)(uint32_t)w[i + 6] << 32) | (uint32_t)w[i + 5]);
        /* what the request parser takes (serve_req.c): penalties -2..2, repetition 0..2 (exclusive of 0) */
        if (!(op->freq >= -2 && op->freq <= 2) || !(op->pres >= -2 && op->pres <= 2) || !(op->rep > 0 && op->rep <= 2) ||
            op->eos < -1 || op->min_tokens < 0)
            return snprintf(err, errcap, "serve mirror: word %zu: LPROC: frequency %g, presence %g, repetition %g, eos %d, "
                            "min_tokens %lld out of range", i + 1, op->freq, op->pres, op->rep, op->eos, op->min_tokens), -1;
        op->think_end = w[i + 7];
        op->think_budget = (long long)(((uint64_t)(uint32_t)w[i + 9] << 32) | (uint32_t)w[i + 8]);
        /* what the request parser takes: a budget 0..2^31-1 with a token id, or none (-1, -1) */
        if (op->think_budget < -1 || op->think_budget > INT32_MAX || (op->think_budget >= 0) != (op->think_end >= 0) ||
            op->think_end < -1)
            return snprintf(err, errcap, "serve mirror: word %zu: LPROC: reasoning end %d and budget %lld (expected a token id "
                            "and 0..%d, or -1 and -1)", i + 7, op->think_end, op->think_budget, INT32_MAX), -1;
        if (w[i + 10] < 0 || w[i + 10] > DS41_REQ_MAX_BIAS || w[i + 11] < 0 || w[i + 12] < 0)
            return snprintf(err, errcap, "serve mirror: word %zu: LPROC: %d biases (at most %d), %d banned ids, %d prompt ids",
                            i + 10, (int)w[i + 10], DS41_REQ_MAX_BIAS, (int)w[i + 11], (int)w[i + 12]), -1;
        op->n_bias = w[i + 10];
        op->n_ban = w[i + 11];
        op->n = (size_t)w[i + 12];
        i += 13;
        NEED(2 * (size_t)op->n_bias, "the biases' ids and values");
        op->bias_id = w + i;
        op->bias_val = w + i + op->n_bias;
        for (int k = 0; k < op->n_bias; k++) {
            float v;
            memcpy(&v, &op->bias_val[k], 4);
            if (op->bias_id[k] < 0 || !(v >= -100 && v <= 100))
                return snprintf(err, errcap, "serve mirror: word %zu: LPROC: bias %g on token %d (expected a token >= 0, -100..100)",
                                i + (size_t)op->n_bias + (size_t)k, (double)v, (int)op->bias_id[k]), -1;
        }
        i += 2 * (size_t)op->n_bias;
        NEED((size_t)op->n_ban, "the banned ids");
        op->ban = w + i;
        i += (size_t)op->n_ban;
        NEED(op->n, "the prompt's ids");
        op->ids = w + i;
        i += op->n;
        break;
    }
    case DS41_SOP_PROBE_IMG:
        NEED(1, "a token count");
        if (w[i] < 1) return snprintf(err, errcap, "serve mirror: word %zu: PROBE_IMG: token count %d, expected at least 1", i, (int)w[i]), -1;
        op->n = (size_t)w[i++];
        if (tokens(w, n, &i, op, name, err, errcap)) return -1;
        if (image_flags(w, n, &i, op, name, err, errcap)) return -1;
        break;
    case DS41_SOP_BLOCKS:
        if (id_tokens(w, n, &i, op, name, 1, err, errcap)) return -1;
        NEED(3, "the first block, a block count and a byte count");
        if (w[i] < 0 || w[i + 1] < 1 || w[i + 2] < 1 || ((int64_t)w[i] + w[i + 1]) * DS41_PREFIX_BLOCK > (int64_t)op->n)
            return snprintf(err, errcap, "serve mirror: word %zu: BLOCKS: blocks %d + %d of %zu tokens, %d bytes (expected whole "
                            "blocks of %d tokens inside the prompt and bytes >= 1)", i, (int)w[i], (int)w[i + 1], op->n, (int)w[i + 2],
                            DS41_PREFIX_BLOCK), -1;
        op->first = w[i];
        op->nb = w[i + 1];
        op->blk_len = (size_t)w[i + 2];
        i += 3;
        NEED((op->blk_len + 3) / 4, "the blocks' bytes");
        op->blk = (const uint8_t *)(const void *)(w + i);
        i += (op->blk_len + 3) / 4;
        break;
    case DS41_SOP_INSTALL:
        if (id_tokens(w, n, &i, op, name, 2, err, errcap)) return -1;
        NEED(4, "the first block, a block count and the pages' and the state's byte counts");
        if (w[i] < 0 || w[i + 1] < 1 || ((int64_t)w[i] + w[i + 1]) * DS41_PREFIX_BLOCK >= (int64_t)op->n)
            return snprintf(err, errcap, "serve mirror: word %zu: INSTALL: blocks %d + %d of %zu tokens (expected at least one "
                            "whole block of %d tokens, short of the prompt's last token)", i, (int)w[i], (int)w[i + 1], op->n,
                            DS41_PREFIX_BLOCK), -1;
        if (w[i + 2] < 1 || w[i + 3] < 1 || (int64_t)w[i + 2] + w[i + 3] > (int64_t)INT32_MAX)
            return snprintf(err, errcap, "serve mirror: word %zu: INSTALL: %d bytes of pages and %d of state (expected each >= 1, "
                            "together < 2^31)", i + 2, (int)w[i + 2], (int)w[i + 3]), -1;
        op->first = w[i];
        op->nb = w[i + 1];
        op->blk_len = (size_t)w[i + 2];
        op->res_len = (size_t)w[i + 3];
        i += 4;
        NEED((op->blk_len + op->res_len + 3) / 4, "the pages' and the state's bytes");
        op->blk = (const uint8_t *)(const void *)(w + i);
        op->res = op->blk + op->blk_len;
        i += (op->blk_len + op->res_len + 3) / 4;
        break;
    case DS41_SOP_PD_SEQ:
        NEED(3, "a session id, a layer and a token count");
        if (w[i + 1] < 0) return snprintf(err, errcap, "serve mirror: word %zu: PD_SEQ: layer %d is negative", i + 1, (int)w[i + 1]), -1;
        if (w[i + 2] < 1) return snprintf(err, errcap, "serve mirror: word %zu: PD_SEQ: %d tokens (expected >= 1)", i + 2, (int)w[i + 2]), -1;
        op->id = w[i];
        op->stop = w[i + 1];
        op->n = (size_t)w[i + 2];
        i += 3;
        if (tokens(w, n, &i, op, name, err, errcap)) return -1;
        break;
    case DS41_SOP_PD_FWD:
        NEED(3, "a session id, a position and a token count");
        if (w[i + 1] < 0 || w[i + 2] < 1 || w[i + 1] >= w[i + 2])
            return snprintf(err, errcap, "serve mirror: word %zu: PD_FWD: from position %d of %d tokens (expected 0 <= position < "
                            "tokens)", i + 1, (int)w[i + 1], (int)w[i + 2]), -1;
        op->id = w[i];
        op->at_pos = w[i + 1];
        op->n = (size_t)w[i + 2];
        i += 3;
        if (tokens(w, n, &i, op, name, err, errcap)) return -1;
        break;
    case DS41_SOP_GMASK:
        NEED(3, "a session id, a flag and a word count");
        if (w[i + 1] != 0 && w[i + 1] != 1)
            return snprintf(err, errcap, "serve mirror: word %zu: GMASK: flag %d, expected 0 (no token constrained) or 1 (the "
                            "allowed tokens follow)", i + 1, (int)w[i + 1]), -1;
        if (w[i + 1] == 0 ? w[i + 2] != 0 : (w[i + 2] < 1 || w[i + 2] > DS41_SOP_GMASK_MAX_WORDS))
            return snprintf(err, errcap, "serve mirror: word %zu: GMASK: %d words with flag %d (expected 0 with flag 0, "
                            "1..%d with flag 1)", i + 2, (int)w[i + 2], (int)w[i + 1], DS41_SOP_GMASK_MAX_WORDS), -1;
        op->id = w[i];
        op->on = w[i + 1];
        op->n = (size_t)w[i + 2];
        i += 3;
        NEED(op->n, "the allowed tokens' words");
        op->bits = w + i;
        i += op->n;
        break;
    case DS41_SOP_GRAMMAR:
        NEED(1, "a session id");
        op->id = w[i++];
        break;
    case DS41_SOP_DRAFTS:
        NEED(1, "a sequence count");
        if (w[i] < 2 || w[i] > DS41_SOP_DRAFTS_MAX)
            return snprintf(err, errcap, "serve mirror: word %zu: DRAFTS: %d sequences (expected 2..%d)", i, (int)w[i],
                            DS41_SOP_DRAFTS_MAX), -1;
        op->n = (size_t)w[i++];
        NEED(2 * op->n, "a session id and the token to draft after per sequence");
        op->ids = w + i;
        for (size_t k = 0; k < op->n; k++)
            if (w[i + 2 * k + 1] < 0)
                return snprintf(err, errcap, "serve mirror: word %zu: DRAFTS: token %d is negative", i + 2 * k + 1,
                                (int)w[i + 2 * k + 1]), -1;
        i += 2 * op->n;
        break;
    case DS41_SOP_VMASK: {
        NEED(3, "a session id, a row count and a count of restricted rows");
        if (w[i + 1] < 1 || w[i + 1] > DS41_SPEC_MAX_DRAFTS + 1 || w[i + 2] < 0 || w[i + 2] > w[i + 1])
            return snprintf(err, errcap, "serve mirror: word %zu: VMASK: %d rows, %d of them restricted (expected 1..%d rows, "
                            "0..rows restricted)", i + 1, (int)w[i + 1], (int)w[i + 2], DS41_SPEC_MAX_DRAFTS + 1), -1;
        op->id = w[i];
        op->n = (size_t)w[i + 1];
        op->k = (size_t)w[i + 2];
        i += 3;
        op->bits = w + i;
        for (size_t k = 0, last = 0; k < op->k; k++) {
            NEED(3, "a restricted row (row, form, word count)");
            int32_t r = w[i], form = w[i + 1], c = w[i + 2];
            if (r < 0 || (size_t)r >= op->n || (k > 0 && (size_t)r <= last))
                return snprintf(err, errcap, "serve mirror: word %zu: VMASK: row %d of a block of %zu rows (expected ascending "
                                "rows below the count)", i, (int)r, op->n), -1;
            if (form != 1 && form != 2)
                return snprintf(err, errcap, "serve mirror: word %zu: VMASK: row %d: form %d, expected 1 (a bitset) or 2 (the "
                                "allowed ids)", i + 1, (int)r, (int)form), -1;
            if (form == 1 ? c < 1 || c > DS41_SOP_GMASK_MAX_WORDS : c < 0 || c > DS41_SOP_GMASK_MAX_WORDS)
                return snprintf(err, errcap, "serve mirror: word %zu: VMASK: row %d: %d words of form %d (expected 1..%d for a "
                                "bitset, 0..%d ids)", i + 2, (int)r, (int)c, (int)form, DS41_SOP_GMASK_MAX_WORDS,
                                DS41_SOP_GMASK_MAX_WORDS), -1;
            i += 3;
            NEED(c, form == 1 ? "the row's bitset" : "the row's allowed ids");
            for (int32_t j = 0; form == 2 && j < c; j++)
                if (w[i + j] < 0 || (j > 0 && w[i + j] <= w[i + j - 1]))
                    return snprintf(err, errcap, "serve mirror: word %zu: VMASK: row %d: allowed id %d (expected ascending ids "
                                    ">= 0)", i + j, (int)r, (int)w[i + j]), -1;
            i += (size_t)c;
            last = (size_t)r;
        }
        break;
    }
    default:   /* END */
        break;
    }
#undef NEED
    *at = i;
    return 1;
}

/* ---------------------------------------------------------------- the guard's messages */


int ds41_sguard_decode(const uint8_t *b, size_t n, int nfd, ds41_sguard_msg *m, char *err, size_t errcap) {
    memset(m, 0, sizeof *m);
    if (n < DS41_SGUARD_HDR) { snprintf(err, errcap, "serve guard: a message of %zu bytes, shorter than its 32-byte header", n); return -1; }
    uint32_t magic, op, nf, nt;
    memcpy(&magic, b, 4);
    memcpy(&op, b + 4, 4);
    memcpy(&m->id, b + 8, 4);
    memcpy(&m->flags, b + 12, 4);
    memcpy(&m->written, b + 16, 8);
    memcpy(&nf, b + 24, 4);
    memcpy(&nt, b + 28, 4);
    if (magic != DS41_SGUARD_MAGIC) { snprintf(err, errcap, "serve guard: bad magic 0x%08x", magic); return -1; }
    if (op < DS41_SGUARD_OPEN || op > DS41_SGUARD_BYE) { snprintf(err, errcap, "serve guard: unknown operation %u", op); return -1; }
    m->op = (int)op;
    if (op != DS41_SGUARD_OPEN) {
        if (n != DS41_SGUARD_HDR || nf || nt || nfd) {
            snprintf(err, errcap, "serve guard: %s carries %zu bytes, %u + %u answer bytes and %d descriptors (expected none)",
                     op == DS41_SGUARD_DONE ? "DONE" : "BYE", n - DS41_SGUARD_HDR, nf, nt, nfd);
            return -1;
        }
        return 0;
    }
    if (nfd != 1) { snprintf(err, errcap, "serve guard: OPEN %u carries %d descriptors (expected 1)", m->id, nfd); return -1; }
    if (m->id == 0) { snprintf(err, errcap, "serve guard: OPEN with id 0"); return -1; }
    if (m->flags & ~(uint32_t)DS41_SGUARD_STREAM) { snprintf(err, errcap, "serve guard: OPEN %u: unknown flags 0x%x", m->id, m->flags); return -1; }
    if (m->written < 0) { snprintf(err, errcap, "serve guard: OPEN %u: %lld bytes written", m->id, (long long)m->written); return -1; }
    if (nf == 0 || (size_t)nf + nt != n - DS41_SGUARD_HDR) {
        snprintf(err, errcap, "serve guard: OPEN %u: %u + %u answer bytes in a message of %zu (expected a 503 reply and the "
                 "rest the stream's tail)", m->id, nf, nt, n);
        return -1;
    }
    if (nt == 0 && (m->flags & DS41_SGUARD_STREAM)) { snprintf(err, errcap, "serve guard: OPEN %u: a stream without a tail", m->id); return -1; }
    m->full = b + DS41_SGUARD_HDR;
    m->n_full = nf;
    m->tail = b + DS41_SGUARD_HDR + nf;
    m->n_tail = nt;
    return 0;
}

void ds41_sguard_header(uint8_t *b, uint32_t op, uint32_t id, uint32_t flags, int64_t written, uint32_t nf, uint32_t nt) {
    uint32_t magic = DS41_SGUARD_MAGIC;
    memcpy(b, &magic, 4);
    memcpy(b + 4, &op, 4);
    memcpy(b + 8, &id, 4);
    memcpy(b + 12, &flags, 4);
    memcpy(b + 16, &written, 8);
    memcpy(b + 24, &nf, 4);
    memcpy(b + 28, &nt, 4);
}
