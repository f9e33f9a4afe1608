/* Tests of the KV transfer frame codec (src/store/kvx_frame.c): round trips of every type,
 * every single-bit flip and every truncation of a frame refused with a reason, payload limits,
 * the expectation checks (type, request id, sequence number), and the malformed corpus
 * tests/malformed/kvx/ (each file refused) next to the valid seeds in fuzz/corpus/fuzz_kvx/. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kvx_frame.h"

static size_t make(uint8_t *buf, unsigned type, uint64_t req, uint32_t seq, int layer, const void *pl, uint32_t n) {
    ds41_kvx_hdr h = { .type = (uint16_t)type, .req = req, .seq = seq, .layer = layer, .arg0 = 7, .arg1 = 9, .len = n };
    ds41_kvx_encode(&h, pl, buf);
    if (n) memcpy(buf + DS41_KVX_HEADER, pl, n);
    return DS41_KVX_HEADER + n;
}

static void round_trip(void) {
    uint8_t pl[300], buf[DS41_KVX_HEADER + 300];
    for (int i = 0; i < 300; i++) pl[i] = (uint8_t)(i * 37 + 1);
    for (unsigned t = DS41_KVX_HELLO; t <= DS41_KVX_ERROR; t++) {
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
    /* another version, with a valid header checksum: refused by version, not by checksum */
    ds41_kvx_hdr v = { .version = 2, .type = DS41_KVX_HELLO, .req = 1 };
    ds41_kvx_encode(&v, NULL, buf);
    CHECK(ds41_kvx_parse(buf, DS41_KVX_HEADER, 1000, &h, &p, why, sizeof why) != 0 && strstr(why, "version 2"), "version: %s", why);
}

static int for_dir(const char *dir, int want_ok, int *files) {
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
        ds41_kvx_hdr h;
        const uint8_t *p;
        char why[160] = "";
        int rc = ds41_kvx_parse(data, n, 1 << 20, &h, &p, why, sizeof why);
        (*files)++;
        if ((rc == 0) != want_ok || (rc && (!why[0] || strchr(why, '\n')))) {
            printf("  %s: parse %d (%s)\n", path, rc, why);
            bad++;
        }
    }
    closedir(d);
    return bad;
}

static void corpus(void) {
    const char *root = getenv("DS41_ROOT") ? getenv("DS41_ROOT") : ".";
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/tests/malformed/kvx", root);
    snprintf(b, sizeof b, "%s/fuzz/corpus/fuzz_kvx", root);
    int na = 0, nb = 0;
    CHECK(for_dir(a, 0, &na) == 0, "a malformed frame accepted");
    CHECK(for_dir(b, 1, &nb) == 0, "a valid seed refused");
    CHECK(na >= 10 && nb >= 5, "corpus: %d malformed, %d valid", na, nb);
}

int main(void) {
    RUN_CASE(round_trip);
    RUN_CASE(every_flip_refused);
    RUN_CASE(every_truncation_refused);
    RUN_CASE(limits_and_expect);
    RUN_CASE(corpus);
    return check_exit();
}
