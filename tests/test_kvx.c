/* Tests of the KV transfer frame codec (src/store/kvx_frame.c): round trips of every type,
 * every single-bit flip and every truncation of a frame refused with a reason, payload limits,
 * the expectation checks (type, request id, sequence number), and the malformed corpus
 * tests/malformed/kvx/ (each file refused) next to the valid seeds in fuzz/corpus/fuzz_kvx/.
 * The RESUME payload codec (src/store/kvx_resume.c): a round trip, every truncation refused,
 * and tests/malformed/kvx_resume/ (well-formed frames, each payload refused with a reason naming
 * the field) against the geometry of fuzz/kvx_test_geom.h. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kvx_frame.h"
#include "../fuzz/kvx_test_geom.h"

static size_t make(uint8_t *buf, unsigned type, uint64_t req, uint32_t seq, int layer, const void *pl, uint32_t n) {
    ds41_kvx_hdr h = { .type = (uint16_t)type, .req = req, .seq = seq, .layer = layer, .arg0 = 7, .arg1 = 9, .len = n };
    ds41_kvx_encode(&h, pl, buf);
    if (n) memcpy(buf + DS41_KVX_HEADER, pl, n);
    return DS41_KVX_HEADER + n;
}

static void round_trip(void) {
    uint8_t pl[300], buf[DS41_KVX_HEADER + 300];
    for (int i = 0; i < 300; i++) pl[i] = (uint8_t)(i * 37 + 1);
    for (unsigned t = DS41_KVX_HELLO; t <= DS41_KVX_RESUME; t++) {
        uint32_t n = t == DS41_KVX_DONE ? 0 : 300;
        size_t len = make(buf, t, 0x1122334455667788ULL, 5, t == DS41_KVX_LAYER ? 20 : -1, pl, n);
        ds41_kvx_hdr h;
        const uint8_t *p;
        char why[160];
        int rc = ds41_kvx_parse(buf, len, DS41_KVX_MAX_PAYLOAD, &h, &p, why, sizeof why);
        CHECK(rc == 0, "type %u: %s", t, why);
        CHECK(h.type == t && h.req == 0x1122334455667788ULL && h.seq == 5 && h.arg0 == 7 && h.arg1 == 9 && h.len == n,
              "type %u fields", t);
        CHECK(h.layer == (t == DS41_KVX_LAYER ? 20 : -1), "layer %d", h.layer);
        CHECK(n == 0 || (p == buf + DS41_KVX_HEADER && !memcmp(p, pl, n)), "payload");
        CHECK(ds41_kvx_expect(&h, 1u << t, 0x1122334455667788ULL, 5, why, sizeof why) == 0, "expect: %s", why);
    }
}

static void every_flip_refused(void) {
    uint8_t pl[64], buf[DS41_KVX_HEADER + 64], c[DS41_KVX_HEADER + 64];
    for (int i = 0; i < 64; i++) pl[i] = (uint8_t)i;
    size_t len = make(buf, DS41_KVX_LAYER, 42, 3, 2, pl, 64);
    int refused = 0, total = 0;
    for (size_t i = 0; i < len; i++)
        for (int b = 0; b < 8; b++) {
            memcpy(c, buf, len);
            c[i] ^= (uint8_t)(1u << b);
            ds41_kvx_hdr h;
            const uint8_t *p;
            char why[160] = "";
            total++;
            if (ds41_kvx_parse(c, len, DS41_KVX_MAX_PAYLOAD, &h, &p, why, sizeof why) != 0 && why[0] && !p) refused++;
        }
    /* CRC32C detects every single-bit error in the header (36 bytes) and in the payload */
    CHECK(refused == total, "%d of %d single-bit flips refused", refused, total);
}

static void every_truncation_refused(void) {
    uint8_t pl[100], buf[DS41_KVX_HEADER + 100];
    memset(pl, 0xab, sizeof pl);
    size_t len = make(buf, DS41_KVX_REQ, 1, 0, -1, pl, 100);
    for (size_t n = 0; n < len; n++) {
        ds41_kvx_hdr h;
        const uint8_t *p;
        char why[160] = "";
        CHECK(ds41_kvx_parse(buf, n, DS41_KVX_MAX_PAYLOAD, &h, &p, why, sizeof why) != 0 && why[0], "%zu bytes accepted", n);
    }
    /* one byte too many is refused as well (the length must match exactly) */
    uint8_t big[DS41_KVX_HEADER + 101];
    memcpy(big, buf, len);
    big[len] = 0;
    ds41_kvx_hdr h;
    const uint8_t *p;
    char why[160];
    CHECK(ds41_kvx_parse(big, len + 1, DS41_KVX_MAX_PAYLOAD, &h, &p, why, sizeof why) != 0, "trailing byte accepted");
}

static void limits_and_expect(void) {
    uint8_t buf[DS41_KVX_HEADER + 100], pl[100] = { 0 };
    size_t len = make(buf, DS41_KVX_ERROR, 9, 1, -1, pl, 100);
    ds41_kvx_hdr h;
    const uint8_t *p;
    char why[160];
    CHECK(ds41_kvx_parse(buf, len, 99, &h, &p, why, sizeof why) != 0 && strstr(why, "at most 99"), "limit: %s", why);
    CHECK(ds41_kvx_parse(buf, len, 100, &h, &p, why, sizeof why) == 0, "limit exact: %s", why);
    CHECK(ds41_kvx_expect(&h, 1u << DS41_KVX_LAYER | 1u << DS41_KVX_DONE, 9, 1, why, sizeof why) != 0 &&
          strstr(why, "unexpected ERROR"), "type: %s", why);
    CHECK(ds41_kvx_expect(&h, 1u << DS41_KVX_ERROR, 8, 1, why, sizeof why) != 0 && strstr(why, "request 9"), "req: %s", why);
    CHECK(ds41_kvx_expect(&h, 1u << DS41_KVX_ERROR, 9, 2, why, sizeof why) != 0 && strstr(why, "sequence number 1"),
          "seq: %s", why);
    /* another version (2: before the decoder split), with a valid header checksum: refused by
     * version, not by checksum */
    ds41_kvx_hdr v = { .version = 2, .type = DS41_KVX_HELLO, .req = 1 };
    ds41_kvx_encode(&v, NULL, buf);
    CHECK(ds41_kvx_parse(buf, DS41_KVX_HEADER, 1000, &h, &p, why, sizeof why) != 0 && strstr(why, "version 2"), "version: %s", why);
}

/* A RESUME payload for the test geometry: head from r, body bytes i * 7 + 1. */
static size_t resume_payload(uint8_t *out, ds41_kvx_resume *r) {
    size_t n = ds41_kvx_resume_bytes(&kvx_test_geom, r->mh_rows, r->stream_rows);
    ds41_kvx_resume_write_head(&kvx_test_geom, r, out);
    for (size_t i = r->rings_off; i < n; i++) out[i] = (uint8_t)(i * 7 + 1);
    return n;
}

static void resume_round_trip(void) {
    const ds41_kvx_geom *g = &kvx_test_geom;
    uint8_t buf[1024];
    /* 112 B head + 12 B compressor table + 2 x 4 x 8 B rings + 2 x 2 x 4 FP32 + 3 x 6 BF16 */
    CHECK(ds41_kvx_resume_bytes(g, 3, 0) == 112 + 12 + 64 + 64 + 36, "size %zu", ds41_kvx_resume_bytes(g, 3, 0));
    CHECK(ds41_kvx_resume_bytes(g, 5, 0) == 0, "5 context rows in 4 slots sized");
    /* the decoder split: ring 0 only (32 B), no context rows, 3 stream rows x 5 FP32 (60 B) */
    CHECK(ds41_kvx_resume_bytes(g, 0, 3) == 112 + 12 + 32 + 64 + 60, "split size %zu", ds41_kvx_resume_bytes(g, 0, 3));
    CHECK(ds41_kvx_resume_bytes(g, 0, 4) == 0 && ds41_kvx_resume_bytes(g, 1, 3) == 0, "4 stream rows or context rows sized");
    CHECK(ds41_kvx_stream_rows(g, 2) == 2 && ds41_kvx_stream_rows(g, 256) == 3, "stream rows");
    ds41_kvx_resume w = { .pos = 384, .mh_pos0 = 381, .ik_owner = -1, .mh_rows = 3, .hist = { 9, 0, 4 } };
    size_t n = resume_payload(buf, &w);
    ds41_kvx_resume r;
    char why[256];
    CHECK(ds41_kvx_resume_parse(buf, n, g, 384, &r, why, sizeof why) == 0, "parse: %s", why);
    CHECK(r.pos == 384 && r.mh_pos0 == 381 && r.ik_owner == -1 && r.mh_rows == 3 && r.hist[0] == 9 && r.hist[2] == 4 &&
          r.hist[15] == 0, "fields");
    CHECK(r.rings_off == 124 && r.comp_off == 188 && r.mh_off == 252 && r.rings_off == w.rings_off && r.mh_off == w.mh_off,
          "offsets %zu %zu %zu", r.rings_off, r.comp_off, r.mh_off);
    CHECK(ds41_kvx_resume_parse(buf, n, g, 256, &r, why, sizeof why) != 0 && strstr(why, "position 384"), "pos: %s", why);
    for (size_t k = 0; k < n; k++)
        CHECK(ds41_kvx_resume_parse(buf, k, g, 384, &r, why, sizeof why) != 0 && why[0], "%zu of %zu bytes accepted", k, n);
    /* the split form round-trips, and a node without the split's geometry refuses it by name */
    ds41_kvx_resume s = { .pos = 384, .ik_owner = 2, .stream_rows = 3, .hist = { 1 } };
    n = resume_payload(buf, &s);
    CHECK(ds41_kvx_resume_parse(buf, n, g, 384, &r, why, sizeof why) == 0, "split parse: %s", why);
    CHECK(r.stream_rows == 3 && r.rings_off == 124 && r.comp_off == 156 && r.mh_off == 220 && r.stream_off == 220 &&
          r.stream_off + 60 == n, "split offsets %zu %zu %zu %zu of %zu", r.rings_off, r.comp_off, r.mh_off, r.stream_off, n);
    ds41_kvx_geom nos = *g;
    nos.stream_layer = nos.stream_width = nos.stream_max = 0;
    CHECK(ds41_kvx_resume_parse(buf, n, &nos, 384, &r, why, sizeof why) != 0 && strstr(why, "3 decoder stream rows"),
          "split without geometry: %s", why);
    for (size_t k = 0; k < n; k++)
        CHECK(ds41_kvx_resume_parse(buf, k, g, 384, &r, why, sizeof why) != 0 && why[0], "split: %zu of %zu accepted", k, n);
}

/* What one corpus file must be: 0 when it is, else 1 after a line naming it. */
typedef int (*file_check)(const char *path, const uint8_t *data, size_t n, int want_ok, int *files);

/* Runs check on every file of dir; the number of files that failed it. */
static int for_each_file(const char *dir, file_check check, int want_ok, int *files) {
    DIR *d = opendir(dir);
    if (!d) { printf("  cannot open %s\n", dir); return 1; }
    int bad = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) { bad++; continue; }
        static uint8_t data[1 << 16];
        size_t n = fread(data, 1, sizeof data, f);
        fclose(f);
        bad += check(path, data, n, want_ok, files);
    }
    closedir(d);
    return bad;
}

/* a frame that parses (want_ok) or is refused with a one-line reason */
static int frame_file(const char *path, const uint8_t *data, size_t n, int want_ok, int *files) {
    ds41_kvx_hdr h;
    const uint8_t *p;
    char why[160] = "";
    int rc = ds41_kvx_parse(data, n, 1 << 20, &h, &p, why, sizeof why);
    (*files)++;
    if ((rc == 0) == want_ok && !(rc && (!why[0] || strchr(why, '\n')))) return 0;
    printf("  %s: parse %d (%s)\n", path, rc, why);
    return 1;
}

/* a valid RESUME frame whose payload parses (want_ok) or is refused naming the payload; the
 * valid seeds of other types are skipped */
static int resume_file(const char *path, const uint8_t *data, size_t n, int want_ok, int *files) {
    ds41_kvx_hdr h;
    const uint8_t *p;
    char why[256] = "";
    if (ds41_kvx_parse(data, n, 1 << 20, &h, &p, why, sizeof why) || h.type != DS41_KVX_RESUME) {
        if (want_ok) return 0;
        printf("  %s: not a RESUME frame (%s)\n", path, why);
        return 1;
    }
    ds41_kvx_resume r;
    int rc = ds41_kvx_resume_parse(p, h.len, &kvx_test_geom, KVX_TEST_POS, &r, why, sizeof why);
    (*files)++;
    if ((rc == 0) == want_ok && !(rc && (!strstr(why, "RESUME payload") || strchr(why, '\n')))) return 0;
    printf("  %s: resume parse %d (%s)\n", path, rc, why);
    return 1;
}

static void corpus(void) {
    const char *root = getenv("DS41_ROOT") ? getenv("DS41_ROOT") : ".";
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/tests/malformed/kvx", root);
    snprintf(b, sizeof b, "%s/fuzz/corpus/fuzz_kvx", root);
    int na = 0, nb = 0;
    CHECK(for_each_file(a, frame_file, 0, &na) == 0, "a malformed frame accepted");
    CHECK(for_each_file(b, frame_file, 1, &nb) == 0, "a valid seed refused");
    CHECK(na >= 10 && nb >= 5, "corpus: %d malformed, %d valid", na, nb);
    snprintf(a, sizeof a, "%s/tests/malformed/kvx_resume", root);
    int ra = 0, rb = 0;
    CHECK(for_each_file(a, resume_file, 0, &ra) == 0, "a malformed RESUME payload accepted");
    CHECK(for_each_file(b, resume_file, 1, &rb) == 0, "a valid RESUME seed refused");
    CHECK(ra >= 25 && rb == 3, "RESUME corpus: %d malformed, %d valid", ra, rb);
}

int main(void) {
    RUN_CASE(round_trip);
    RUN_CASE(every_flip_refused);
    RUN_CASE(every_truncation_refused);
    RUN_CASE(limits_and_expect);
    RUN_CASE(resume_round_trip);
    RUN_CASE(corpus);
    return check_exit();
}
