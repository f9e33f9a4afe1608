/* libFuzzer harness for the decoder of serve's records under mpiexec (src/serve/serve_mpi_wire.c):
 * the input, read as int32 words, must decode operation by operation, each within the record
 * and moving forward, until the end or a one-line message naming the word; never crash or read
 * past the record. Build and run with `make fuzz`. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve_mpi.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t n = size / sizeof(int32_t);
    int32_t *w = malloc((n ? n : 1) * sizeof *w);   /* exactly n words: ASan sees any overread */
    if (!w) return 0;
    memcpy(w, data, n * sizeof *w);
    size_t at = 0;
    ds41_sop op;
    char err[256];
    int r;
    err[0] = 0;
    while ((r = ds41_sop_next(w, n, &at, &op, err, sizeof err)) == 1) {
        if (at > n) abort();
        if (op.ids && (op.ids < w || op.ids + op.n > w + n)) abort();
        if (op.op == DS41_SOP_STEP) {
            const int32_t *p = op.items;
            for (int k = 0; k < op.count; k++) {
                if (p + 3 > w + n || p[1] < 1 || p + 3 + p[1] > w + n) abort();
                if (p[2] < DS41_SOP_VERIFY || (p[2] == DS41_SOP_VERIFY && p[1] > DS41_SPEC_MAX_DRAFTS + 1)) abort();
                p += 3 + p[1];
            }
            if (p != w + at) abort();
        }
        if (op.op == DS41_SOP_DRAFT && op.t_next < 0) abort();
        if (op.op == DS41_SOP_IMAGES || op.op == DS41_SOP_PROBE_IMG) {
            size_t k = 0;
            if (op.flags < w || op.flags + op.n > w + n) abort();
            for (size_t j = 0; j < op.n; j++) {
                if (op.flags[j] != 0 && op.flags[j] != 1) abort();
                k += (size_t)op.flags[j];
            }
            if (k != op.k || k == 0 || op.keys != op.flags + op.n) abort();
            const int32_t *end = op.keys + op.k * 8;
            if (op.op == DS41_SOP_IMAGES) {
                if (op.dim < 1 || op.rows != end) abort();
                end = op.rows + op.k * (size_t)op.dim;
            } else if (op.flags != op.ids + op.n) {
                abort();
            }
            if (end != w + at) abort();
        }
        if (op.op == DS41_SOP_LPROC) {
            if (op.n_bias < 0 || op.n_ban < 0 || op.bias_id != op.ids - op.n_ban - 2 * (size_t)op.n_bias || op.ids + op.n != w + at) abort();
            if (op.bias_val != op.bias_id + op.n_bias || op.ban != op.bias_val + op.n_bias || op.ban + op.n_ban != op.ids) abort();
            if (!(op.rep > 0 && op.rep <= 2) || op.min_tokens < 0 || op.eos < -1) abort();
        }
        if (op.op == DS41_SOP_BLOCKS && (op.n < 1 || op.first < 0 || op.nb < 1 || op.blk_len < 1 ||
                                         (size_t)(op.first + op.nb) * DS41_PREFIX_BLOCK > op.n ||
                                         op.blk + op.blk_len > (const uint8_t *)(w + at) || op.blk < (const uint8_t *)w))
            abort();
        if (op.op == DS41_SOP_INSTALL && (op.n < 2 || op.first < 0 || op.nb < 1 || op.blk_len < 1 || op.res_len < 1 ||
                                          (size_t)(op.first + op.nb) * DS41_PREFIX_BLOCK >= op.n || op.ids != w + at - op.n - 4 -
                                          (op.blk_len + op.res_len + 3) / 4 || op.res != op.blk + op.blk_len ||
                                          op.res + op.res_len > (const uint8_t *)(w + at) || op.blk < (const uint8_t *)w))
            abort();
        if (op.op == DS41_SOP_PD_SEQ && (op.stop < 0 || op.n < 1 || op.ids + op.n != w + at)) abort();
        if (op.op == DS41_SOP_PD_FWD && (op.at_pos < 0 || op.n < 1 || op.at_pos >= (long long)op.n || op.ids + op.n != w + at)) abort();
        if (op.op == DS41_SOP_GMASK && ((op.on != 0 && op.on != 1) || (op.on ? op.n < 1 || op.n > DS41_SOP_GMASK_MAX_WORDS : op.n != 0) ||
                                        op.bits != w + at - op.n))
            abort();
        if (op.op == DS41_SOP_CALIBRATE && (op.width < 1 || op.prompt_len < 1 || op.reps < 1 || op.reps > 64)) abort();
    }
    if (r < 0 && (!memchr(err, 0, sizeof err) || strchr(err, '\n') || strncmp(err, "serve mirror: word ", 19))) abort();
    if (r == 0 && at != n) abort();
    free(w);
    return 0;
}
