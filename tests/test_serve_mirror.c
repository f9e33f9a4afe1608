/* The records rank 0's serve sends its followers under mpiexec (src/serve/serve_mpi_wire.c):
 * valid records decode to exactly their fields, every malformed one in
 * tests/malformed/serve-mirror/ (decimal words; the expected message beside them) is refused
 * with that message, and the fuzz seeds (fuzz/corpus/fuzz_serve_mirror/) decode to the end. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "serve_mpi.h"

static void valid_records(void) {
    /* OPEN 4; RESTORE 4 [10 11]; STEP {4: [12] ahead 0} {9: [1 2 3] ahead 7}; TRIM 2^32 + 5;
     * PUBLISH 4 []; CLOSE 4; END */
    const int32_t w[] = { 1, 4, 3, 4, 2, 10, 11, 6, 2, 4, 1, 0, 12, 9, 3, 7, 1, 2, 3, 5, 5, 1, 4, 4, 0, 2, 4, 7 };
    size_t n = sizeof w / sizeof *w, at = 0;
    ds41_sop op;
    char err[256] = "";
    CHECK(ds41_sop_next(w, n, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_OPEN && op.id == 4 && at == 2, "OPEN");
    CHECK(ds41_sop_next(w, n, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_RESTORE && op.id == 4 && op.n == 2 &&
          op.ids == w + 5 && at == 7, "RESTORE");
    CHECK(ds41_sop_next(w, n, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_STEP && op.count == 2 && op.items == w + 9 &&
          at == 19, "STEP (at %zu)", at);
    CHECK(ds41_sop_next(w, n, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_TRIM && op.bytes == (1LL << 32) + 5, "TRIM");
    CHECK(ds41_sop_next(w, n, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_PUBLISH && op.n == 0, "PUBLISH");
    CHECK(ds41_sop_next(w, n, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_CLOSE && op.id == 4, "CLOSE");
    CHECK(ds41_sop_next(w, n, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_END && at == n, "END");
    CHECK(ds41_sop_next(w, n, &at, &op, err, sizeof err) == 0, "the end");
    CHECK(!err[0], "no message on valid records: %s", err);
    /* --dp-attention: OPEN_ON 6 on rank 2, then END */
    const int32_t v[] = { 8, 6, 2, 7 };
    at = 0;
    CHECK(ds41_sop_next(v, 4, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_OPEN_ON && op.id == 6 && op.rank == 2 &&
          at == 3, "OPEN_ON");
    CHECK(ds41_sop_next(v, 4, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_END && at == 4, "END after OPEN_ON");
    /* PROBE [5 6 7]; SAMPLE 4: temperature 0.8, top_k 40, top_p 0.9, min_p 0 (as their float
     * bits), seed 2^32 + 104, logprobs with 3 alternatives; END */
    const int32_t u[] = { 10, 3, 5, 6, 7, 9, 4, 1061997773, 40, 1063675494, 0, 104, 1, 3, 7 };
    at = 0;
    CHECK(ds41_sop_next(u, 15, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_PROBE && op.n == 3 && op.ids == u + 2 &&
          at == 5, "PROBE");
    CHECK(ds41_sop_next(u, 15, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_SAMPLE && op.id == 4 && op.temperature == 0.8f &&
          op.top_k == 40 && op.top_p == 0.9f && op.min_p == 0.0f && op.seed == (1ULL << 32) + 104 && op.n_top == 3 && at == 14,
          "SAMPLE");
    CHECK(ds41_sop_next(u, 15, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_END && at == 15, "END after SAMPLE");
    CHECK(!err[0], "no message on valid records: %s", err);
    /* --spec: CALIBRATE width 5, prompt 32, 3 reps; DRAFT 6 after token 17; STEP {6: verify
     * [17 20 21]} {2: [5] ahead 0} */
    const int32_t sw[] = { 12, 5, 32, 3, 11, 6, 17, 6, 2, 6, 3, -1, 17, 20, 21, 2, 1, 0, 5 };
    size_t sn = sizeof sw / sizeof *sw;
    at = 0;
    CHECK(ds41_sop_next(sw, sn, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_CALIBRATE && op.width == 5 &&
          op.prompt_len == 32 && op.reps == 3 && at == 4, "CALIBRATE");
    CHECK(ds41_sop_next(sw, sn, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_DRAFT && op.id == 6 && op.t_next == 17 &&
          at == 7, "DRAFT");
    CHECK(ds41_sop_next(sw, sn, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_STEP && op.count == 2 &&
          op.items == sw + 9 && op.items[2] == DS41_SOP_VERIFY && op.items[6] == 2 && op.items[8] == 0 && at == sn,
          "STEP with a verify block (at %zu)", at);
    CHECK(!err[0], "no message on valid --spec records: %s", err);
    /* serve --role decode: INSTALL 6, a 130-token prompt, its block 0 (128 tokens < 130: a tail
     * remains), 6 bytes of pages and 3 of state (3 words with the padding); END */
    int32_t iw[3 + 130 + 4 + 3 + 1] = { 24, 6, 130 };
    for (int k = 0; k < 130; k++) iw[3 + k] = 2 + k;
    iw[133] = 0; iw[134] = 1; iw[135] = 6; iw[136] = 3;
    iw[140] = 7;
    size_t in = sizeof iw / sizeof *iw;
    at = 0;
    CHECK(ds41_sop_next(iw, in, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_INSTALL && op.id == 6 && op.n == 130 &&
          op.ids == iw + 3 && op.first == 0 && op.nb == 1 && op.blk_len == 6 && op.res_len == 3 &&
          op.blk == (const uint8_t *)(iw + 137) && op.res == op.blk + 6 && at == 140, "INSTALL (at %zu)", at);
    CHECK(ds41_sop_next(iw, in, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_END && at == in, "END after INSTALL");
    /* serve --role prefill: PD_SEQ 2 stop at layer 3 [5 6 7]; PD_FWD 2 from position 1 [5 6 7] */
    const int32_t pw[] = { 25, 2, 3, 3, 5, 6, 7, 26, 2, 1, 3, 5, 6, 7 };
    at = 0;
    CHECK(ds41_sop_next(pw, 14, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_PD_SEQ && op.id == 2 && op.stop == 3 &&
          op.n == 3 && op.ids == pw + 4 && at == 7, "PD_SEQ");
    CHECK(ds41_sop_next(pw, 14, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_PD_FWD && op.id == 2 && op.at_pos == 1 &&
          op.n == 3 && op.ids == pw + 11 && at == 14, "PD_FWD");
    /* the same blocks end at the prompt's last token: no tail to compute the first logits */
    iw[2] = 128;
    iw[131] = 0; iw[132] = 1;
    at = 0;
    CHECK(ds41_sop_next(iw, 3 + 128 + 4, &at, &op, err, sizeof err) == -1 && strstr(err, "INSTALL: blocks 0 + 1 of 128 tokens"),
          "INSTALL up to the prompt's end refused: %s", err);
    err[0] = 0;
    /* an image prompt: IMAGES 3: 4 tokens, flags [0 1 1 0], 2 content keys of 8 words, 2 rows
     * of width 2; PROBE_IMG [1 500 7], flags [0 1 0], 1 key */
    const int32_t ew[] = { 18, 3, 4, 2, 0, 1, 1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13,
                           19, 3, 1, 500, 7, 0, 1, 0, 9, 9, 9, 9, 9, 9, 9, 9 };
    size_t en = sizeof ew / sizeof *ew;
    at = 0;
    CHECK(ds41_sop_next(ew, en, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_IMAGES && op.id == 3 && op.n == 4 &&
          op.dim == 2 && op.flags == ew + 4 && op.k == 2 && op.keys == ew + 8 && op.rows == ew + 24 && at == 28, "IMAGES");
    CHECK(ds41_sop_next(ew, en, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_PROBE_IMG && op.n == 3 &&
          op.ids == ew + 30 && op.flags == ew + 33 && op.k == 1 && op.keys == ew + 36 && at == en, "PROBE_IMG (at %zu)", at);
    CHECK(!err[0], "no message on valid image records: %s", err);
    /* a logits processor for the owner: LPROC 5: frequency 1.5, presence 0.5, repetition 1.25,
     * eos 2, min_tokens 12, reasoning end 9 with a budget of 3,
     * biases {100: 6, 262: -100}, banned [2], prompt ids [7 8 9]; END */
    const int32_t lw[] = { 14, 5, 1069547520, 1056964608, 1067450368, 2, 12, 0, 9, 3, 0, 2, 1, 3, 100, 262, 1086324736, -1027080192,
                           2, 7, 8, 9, 7 };
    size_t ln = sizeof lw / sizeof *lw;
    at = 0;
    CHECK(ds41_sop_next(lw, ln, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_LPROC && op.id == 5 && op.freq == 1.5f &&
          op.pres == 0.5f && op.rep == 1.25f && op.eos == 2 && op.min_tokens == 12 && op.think_end == 9 && op.think_budget == 3 &&
          op.n_bias == 2 && op.bias_id == lw + 14 && op.bias_val == lw + 16 && op.n_ban == 1 && op.ban == lw + 18 && op.n == 3 &&
          op.ids == lw + 19 && at == ln - 1, "LPROC");
    CHECK(ds41_sop_next(lw, ln, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_END && at == ln, "END after LPROC");
    CHECK(!err[0], "no message on a valid LPROC: %s", err);
    /* malformed: a budget without an end token, an end token without a budget, a budget past
     * 2^31 - 1 (its high word set) */
    static const int32_t bad_think[3][3] = { { -1, 3, 0 }, { 9, -1, -1 }, { 9, 0, 1 } };
    for (int b = 0; b < 3; b++) {
        int32_t bw[sizeof lw / sizeof *lw];
        memcpy(bw, lw, sizeof lw);
        memcpy(bw + 8, bad_think[b], sizeof bad_think[b]);
        at = 0;
        err[0] = 0;
        CHECK(ds41_sop_next(bw, ln, &at, &op, err, sizeof err) == -1 && strstr(err, "reasoning end"),
              "LPROC reasoning budget case %d refused: %s", b, err);
    }
    err[0] = 0;
    /* a grammar held by rank 0: GRAMMAR 5; GMASK 5 with 2 words of allowed tokens; GMASK 5 with
     * none constrained; END */
    const int32_t gw[] = { 22, 5, 21, 5, 1, 2, -1, 65535, 21, 5, 0, 0, 7 };
    size_t gn = sizeof gw / sizeof *gw;
    at = 0;
    CHECK(ds41_sop_next(gw, gn, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_GRAMMAR && op.id == 5 && at == 2, "GRAMMAR");
    CHECK(ds41_sop_next(gw, gn, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_GMASK && op.id == 5 && op.on == 1 &&
          op.n == 2 && op.bits == gw + 6 && at == 8, "GMASK with the allowed tokens");
    CHECK(ds41_sop_next(gw, gn, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_GMASK && op.id == 5 && op.on == 0 &&
          op.n == 0 && at == 12, "GMASK with none constrained");
    CHECK(ds41_sop_next(gw, gn, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_END && at == gn, "END after GMASK");
    CHECK(!err[0], "no message on a valid GMASK: %s", err);
    /* a verify block of 4 rows of session 5 whose grammar rank 0 holds: VMASK with 2 rows
     * restricted, row 1 as the allowed ids [3 9 40], row 3 as a bitset of 2 words (row 0 and
     * row 2 not constrained); STEP {5: verify [17 20 21 22]}; VMASK of a block of 1 row with
     * none restricted; END */
    const int32_t vw[] = { 23, 5, 4, 2, 1, 2, 3, 3, 9, 40, 3, 1, 2, -1, 255, 6, 1, 5, 4, -1, 17, 20, 21, 22, 23, 5, 1, 0, 7 };
    size_t vn = sizeof vw / sizeof *vw;
    at = 0;
    CHECK(ds41_sop_next(vw, vn, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_VMASK && op.id == 5 && op.n == 4 &&
          op.k == 2 && op.bits == vw + 4 && at == 15, "VMASK with two rows restricted (at %zu)", at);
    CHECK(ds41_sop_next(vw, vn, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_STEP && op.count == 1 &&
          op.items[2] == DS41_SOP_VERIFY && at == 24, "STEP after VMASK (at %zu)", at);
    CHECK(ds41_sop_next(vw, vn, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_VMASK && op.id == 5 && op.n == 1 &&
          op.k == 0 && at == 28, "VMASK with no row restricted (at %zu)", at);
    CHECK(ds41_sop_next(vw, vn, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_END && at == vn, "END after VMASK");
    CHECK(!err[0], "no message on a valid VMASK: %s", err);
    /* the proposals of 3 sequences at once: DRAFTS {4 after 17} {9 after 0} {2 after 300}; END */
    const int32_t dw[] = { 27, 3, 4, 17, 9, 0, 2, 300, 7 };
    size_t dn = sizeof dw / sizeof *dw;
    at = 0;
    CHECK(ds41_sop_next(dw, dn, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_DRAFTS && op.n == 3 && op.ids == dw + 2 &&
          op.ids[5] == 300 && at == 8, "DRAFTS (at %zu)", at);
    CHECK(ds41_sop_next(dw, dn, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_END && at == dn, "END after DRAFTS");
    CHECK(!err[0], "no message on a valid DRAFTS: %s", err);
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = malloc(1 << 16);
    size_t k = b ? fread(b, 1, (1 << 16) - 1, f) : 0;
    fclose(f);
    if (b) b[k] = 0;
    if (len) *len = k;
    return b;
}

/* Decodes the words w[0..n) to the end: 0 at the end, -1 with err. */
static int decode_all(const int32_t *w, size_t n, char *err, size_t cap) {
    size_t at = 0;
    ds41_sop op;
    int r;
    while ((r = ds41_sop_next(w, n, &at, &op, err, cap)) == 1) {}
    return r == 0 && at != n ? -2 : r;
}

/* Calls fn(path, name) for each entry of $DS41_ROOT/sub; returns how many. */
static int each_entry(const char *sub, void (*fn)(const char *path, const char *name)) {
    const char *root = getenv("DS41_ROOT") ? getenv("DS41_ROOT") : ".";
    char dir[512], p[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, sub);
    DIR *d = opendir(dir);
    CHECK(d, "cannot open %s", dir);
    if (!d) return 0;
    int k = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        fn(p, de->d_name);
        k++;
    }
    closedir(d);
    return k;
}

/* a malformed case: NAME/words (decimal) refused with the message in NAME/expected */
static void one_malformed(const char *path, const char *name) {
    char p[1100];
    snprintf(p, sizeof p, "%s/words", path);
    char *txt = slurp(p, NULL);
    snprintf(p, sizeof p, "%s/expected", path);
    char *want = slurp(p, NULL);
    CHECK(txt && want, "%s: words or expected missing", name);
    if (txt && want) {
        want[strcspn(want, "\n")] = 0;
        int32_t w[512];   /* INSTALL's cases need a prompt of more than one block */
        size_t n = 0;
        for (char *s = txt, *e; n < 512; s = e) {
            long v = strtol(s, &e, 10);
            if (e == s) break;
            w[n++] = (int32_t)v;
        }
        char err[256] = "";
        CHECK(decode_all(w, n, err, sizeof err) == -1, "%s: accepted", name);
        CHECK(!strcmp(err, want), "%s: message '%s', expected '%s'", name, err, want);
    }
    free(txt);
    free(want);
}

static void malformed_corpus(void) {
    int cases = each_entry("tests/malformed/serve-mirror", one_malformed);
    CHECK(cases >= 98, "%d malformed cases", cases);
}

/* a fuzz seed: whole int32 words that decode to the end */
static void one_seed(const char *path, const char *name) {
    size_t len = 0;
    char *b = slurp(path, &len);
    CHECK(b && len % 4 == 0, "%s: not whole words", name);
    char err[256] = "";
    if (b) CHECK(decode_all((const int32_t *)(void *)b, len / 4, err, sizeof err) == 0, "%s: %s", name, err);
    free(b);
}

static void fuzz_seeds(void) {
    int seeds = each_entry("fuzz/corpus/fuzz_serve_mirror", one_seed);
    CHECK(seeds >= 13, "%d seeds", seeds);
}

int main(void) {
    RUN_CASE(valid_records);
    RUN_CASE(malformed_corpus);
    RUN_CASE(fuzz_seeds);
    return check_exit();
}
