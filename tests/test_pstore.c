/* Tests of the persistent prefix store (src/store/pstore.c) and its CRC32C: round trips, keys,
 * fingerprints, LRU eviction order, a prompt's chain evicted tail first, every byte of a file
 * flipped and every truncation (a miss, never a wrong payload), foreign versions, orphaned
 * temporary files, scan / fix / clear, failing puts, threads. Each case works in its own directory under a fresh /tmp directory. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "crc32c.h"
#include "sha256.h"
#include "pstore.h"

static char root[64];
static int case_no;

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st; (void)flag; (void)ftw;
    return remove(p);
}
static void rm_rf(const char *p) { nftw(p, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* a fresh directory name for one case (not created: open creates it) */
static void case_dir(char *out, size_t cap) { snprintf(out, cap, "%s/case%d/store", root, ++case_no); }

static void fp_of(int seed, uint8_t fp[32]) { for (int i = 0; i < 32; i++) fp[i] = (uint8_t)(seed * 41 + i * 3 + 7); }
static void key_of(int seed, uint8_t key[16]) { for (int i = 0; i < 16; i++) key[i] = (uint8_t)(seed * 13 + i * 17 + 1); }
static void ids_of(int seed, int32_t *ids, int n) { for (int i = 0; i < n; i++) ids[i] = (seed * 7919 + i * 104729) % 129280; }
static void payload_of(int seed, uint8_t *p, size_t n) {
    uint32_t x = 2463534242u + (uint32_t)seed * 977u;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 17; x ^= x << 5;
        p[i] = (uint8_t)x;
    }
}

#define NID 128
typedef struct blk { uint8_t key[16], parent[16]; int32_t ids[NID]; uint8_t *p; size_t n; } blk;

static void blk_make(blk *b, int seed, size_t n) {
    key_of(seed, b->key);
    if (seed > 0) key_of(seed - 1, b->parent);
    else memset(b->parent, 0, 16);
    ids_of(seed, b->ids, NID);
    b->n = n;
    b->p = malloc(n ? n : 1);
    payload_of(seed, b->p, n);
}

static int put(ds41_pstore *s, const blk *b) {
    ds41_err err;
    int r = ds41_pstore_put(s, b->key, b->parent, b->ids, NID, b->p, b->n, &err);
    if (r != 0) printf("  put failed: %s\n", err.msg);
    return r;
}

/* 1 hit with b's payload, 0 miss (payload NULL), 2 hit with another payload, -1 error */
static int get(ds41_pstore *s, const blk *b) {
    void *p = (void *)1;
    size_t n = 12345;
    ds41_err err;
    int r = ds41_pstore_get(s, b->key, b->parent, b->ids, NID, &p, &n, &err);
    if (r == 0) return p == NULL && n == 0 ? 0 : 2;
    if (r < 0) return -1;
    int same = n == b->n && memcmp(p, b->p, n) == 0;
    free(p);
    return same ? 1 : 2;
}

static void blk_path(ds41_pstore *s, const uint8_t key[16], char *out, size_t cap) {
    char h[33];
    ds41_pstore_hex(key, 16, h);
    snprintf(out, cap, "%s/%s.blk", ds41_pstore_path(s), h);
}

static int exists(const char *p) { struct stat st; return stat(p, &st) == 0; }
static int blk_exists(ds41_pstore *s, const blk *b) { char p[512]; blk_path(s, b->key, p, sizeof p); return exists(p); }

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)sz + 1);
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) { free(b); b = NULL; }
    fclose(f);
    *n = (size_t)sz;
    return b;
}

static int spit(const char *path, const uint8_t *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(b, 1, n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static ds41_pstore *open_fp(const char *dir, int fpseed, long long cap) {
    uint8_t fp[32];
    fp_of(fpseed, fp);
    ds41_err err;
    ds41_pstore *s = ds41_pstore_open(dir, fp, cap, &err);
    if (!s) printf("  open %s failed: %s\n", dir, err.msg);
    return s;
}

static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static void set_le32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
/* recomputes both checksums of a block image (to craft well-formed foreign files) */
static void reseal(uint8_t *b, size_t n) {
    set_le32(b + 100, ds41_crc32c(0, b, 100));
    set_le32(b + n - 4, ds41_crc32c(0, b, n - 4));
}

/* ------------------------------------------------------------------------------------------ */

static void crc32c_known_values(void) {
    uint8_t z[32], ff[32], inc[32], dec[32];
    for (int i = 0; i < 32; i++) { z[i] = 0; ff[i] = 0xFF; inc[i] = (uint8_t)i; dec[i] = (uint8_t)(31 - i); }
    /* the check value of the CRC-32C catalogue entry and the iSCSI test vectors (RFC 3720 B.4) */
    CHECK(ds41_crc32c(0, "123456789", 9) == 0xE3069283u, "got %08x", ds41_crc32c(0, "123456789", 9));
    CHECK(ds41_crc32c_sw(0, "123456789", 9) == 0xE3069283u, "sw got %08x", ds41_crc32c_sw(0, "123456789", 9));
    CHECK(ds41_crc32c(0, z, 32) == 0x8A9136AAu, "zeros %08x", ds41_crc32c(0, z, 32));
    CHECK(ds41_crc32c(0, ff, 32) == 0x62A8AB43u, "ones %08x", ds41_crc32c(0, ff, 32));
    CHECK(ds41_crc32c(0, inc, 32) == 0x46DD794Eu, "inc %08x", ds41_crc32c(0, inc, 32));
    CHECK(ds41_crc32c(0, dec, 32) == 0x113FDB5Cu, "dec %08x", ds41_crc32c(0, dec, 32));
    CHECK(ds41_crc32c(0, "", 0) == 0, "empty");
    /* every length and alignment: the instruction and the table agree, and chaining works */
    uint8_t buf[600];
    payload_of(3, buf, sizeof buf);
    int bad = 0;
    for (size_t off = 0; off < 8; off++)
        for (size_t len = 0; len + off <= 300; len++) {
            uint32_t a = ds41_crc32c(0, buf + off, len), b = ds41_crc32c_sw(0, buf + off, len);
            size_t cut = len / 3;
            uint32_t c = ds41_crc32c(ds41_crc32c(0, buf + off, cut), buf + off + cut, len - cut);
            if (a != b || a != c) bad++;
        }
    CHECK(bad == 0, "%d length/offset cases disagree (hw %d)", bad, ds41_crc32c_hw());
}

/* SHA-256, the prefix cache's image keys (sha256.h): the FIPS 180-4 example digests, including
 * the one-million-'a' message fed in uneven pieces, so that every buffering path is crossed */
static int sha_is(const uint8_t d[32], const char *hex) {
    char h[65];
    for (int i = 0; i < 32; i++) snprintf(h + 2 * i, 3, "%02x", d[i]);
    return !strcmp(h, hex);
}

static void sha256_known_values(void) {
    uint8_t d[32];
    ds41_sha256 c;
    ds41_sha256_init(&c);
    ds41_sha256_update(&c, "abc", 3);
    ds41_sha256_final(&c, d);
    CHECK(sha_is(d, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"), "abc");
    ds41_sha256_init(&c);
    ds41_sha256_final(&c, d);
    CHECK(sha_is(d, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"), "empty");
    const char *m2 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";   /* 56 bytes: two padding blocks */
    ds41_sha256_init(&c);
    ds41_sha256_update(&c, m2, strlen(m2));
    ds41_sha256_final(&c, d);
    CHECK(sha_is(d, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"), "two blocks");
    static uint8_t a[1000];
    memset(a, 'a', sizeof a);
    ds41_sha256_init(&c);
    for (size_t done = 0, k = 1; done < 1000000; k = k % 997 + 1) {
        size_t n = 1000000 - done < k ? 1000000 - done : k;
        ds41_sha256_update(&c, a, n);
        done += n;
    }
    ds41_sha256_final(&c, d);
    CHECK(sha_is(d, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"), "a million a");
}

static void roundtrip_and_reopen(void) {
    char dir[256];
    case_dir(dir, sizeof dir);
    ds41_pstore *s = open_fp(dir, 1, 0);
    CHECK(s != NULL, "open");
    if (!s) return;
    blk a, b, e;
    blk_make(&a, 0, 113920);   /* 890 B x 128 tokens: a production block */
    blk_make(&b, 1, 10176);    /* 79.5 B x 128: the demo model's */
    blk_make(&e, 2, 0);        /* an empty payload is a valid block */
    CHECK(get(s, &a) == 0, "miss before put");
    CHECK(put(s, &a) == 0 && put(s, &b) == 0 && put(s, &e) == 0, "puts");
    CHECK(get(s, &a) == 1, "a");
    CHECK(get(s, &b) == 1, "b");
    CHECK(get(s, &e) == 1, "empty payload");
    CHECK(ds41_pstore_used(s) == (long long)(3 * (108 + 4 * NID) + 113920 + 10176), "used %lld", ds41_pstore_used(s));
    char p[512];
    blk_path(s, a.key, p, sizeof p);
    struct stat st;
    CHECK(stat(p, &st) == 0 && st.st_size == 108 + 4 * NID + 113920, "file size of a");
    ds41_pstore_close(s);
    s = open_fp(dir, 1, 0);
    CHECK(s && get(s, &a) == 1 && get(s, &b) == 1, "after reopen");
    CHECK(s && ds41_pstore_used(s) == (long long)(3 * (108 + 4 * NID) + 113920 + 10176), "used after reopen");
    ds41_pstore_close(s);
    free(a.p); free(b.p); free(e.p);
}

static void same_key_twice_left_alone(void) {
    char dir[256];
    case_dir(dir, sizeof dir);
    ds41_pstore *s = open_fp(dir, 1, 0);
    if (!s) { CHECK(0, "open"); return; }
    blk a, other;
    blk_make(&a, 5, 2000);
    blk_make(&other, 6, 3000);
    memcpy(other.key, a.key, 16);
    memcpy(other.parent, a.parent, 16);
    memcpy(other.ids, a.ids, sizeof a.ids);
    CHECK(put(s, &a) == 0, "first put");
    CHECK(put(s, &other) == 0, "second put of the same key returns 0");
    CHECK(get(s, &a) == 1, "the first payload stays");
    CHECK(get(s, &other) == 2, "the second was not written");
    ds41_pstore_close(s);
    free(a.p); free(other.p);
}

static void mismatch_is_miss(void) {
    char dir[256];
    case_dir(dir, sizeof dir);
    ds41_pstore *s = open_fp(dir, 1, 0);
    if (!s) { CHECK(0, "open"); return; }
    blk a;
    blk_make(&a, 9, 1500);
    CHECK(put(s, &a) == 0, "put");
    blk q = a;
    q.ids[77] ^= 1;
    CHECK(get(s, &q) == 0, "one id differs");
    q = a;
    q.parent[15] ^= 0x80;
    CHECK(get(s, &q) == 0, "parent differs");
    void *p = (void *)1;
    size_t n = 7;
    ds41_err err;
    CHECK(ds41_pstore_get(s, a.key, a.parent, a.ids, NID - 1, &p, &n, &err) == 0 && p == NULL && n == 0, "fewer ids");
    int32_t more[NID + 1];
    memcpy(more, a.ids, sizeof a.ids);
    more[NID] = 5;
    CHECK(ds41_pstore_get(s, a.key, a.parent, more, NID + 1, &p, &n, &err) == 0 && p == NULL, "more ids");
    q = a;
    q.key[0] ^= 1;
    CHECK(get(s, &q) == 0, "other key");
    CHECK(blk_exists(s, &a) && get(s, &a) == 1, "a valid block of another prefix is left in place");
    ds41_pstore_close(s);
    free(a.p);
}

static void other_fingerprint_is_miss(void) {
    char dir[256];
    case_dir(dir, sizeof dir);
    ds41_pstore *s1 = open_fp(dir, 1, 0), *s2 = open_fp(dir, 2, 0);
    if (!s1 || !s2) { CHECK(0, "open"); ds41_pstore_close(s1); ds41_pstore_close(s2); return; }
    blk a, a2;
    blk_make(&a, 3, 4000);
    blk_make(&a2, 4, 4100);
    memcpy(a2.key, a.key, 16);
    memcpy(a2.parent, a.parent, 16);
    memcpy(a2.ids, a.ids, sizeof a.ids);
    CHECK(put(s1, &a) == 0, "put 1");
    CHECK(get(s2, &a) == 0, "fingerprint 2 does not see fingerprint 1's block");
    CHECK(put(s2, &a2) == 0, "put 2 (same key, other model)");
    CHECK(get(s1, &a) == 1 && get(s2, &a2) == 1, "each model serves its own payload");
    CHECK(strcmp(ds41_pstore_path(s1), ds41_pstore_path(s2)) != 0, "separate subdirectories");
    ds41_pstore_close(s1);
    ds41_pstore_close(s2);
    free(a.p); free(a2.p);
}

static void lru_eviction_order(void) {
    char dir[256];
    case_dir(dir, sizeof dir);
    const long long fb = 108 + 4 * NID + 1000;   /* 1620 bytes per file */
    ds41_pstore *s = open_fp(dir, 1, fb * 7 / 2);
    if (!s) { CHECK(0, "open"); return; }
    blk b[5];
    for (int i = 0; i < 5; i++) {
        blk_make(&b[i], 20 + i, 1000);
        memset(b[i].parent, 0, 16);   /* five first blocks: plain LRU by time */
    }
    CHECK(put(s, &b[0]) == 0 && put(s, &b[1]) == 0 && put(s, &b[2]) == 0, "A B C");
    CHECK(blk_exists(s, &b[0]) && blk_exists(s, &b[1]) && blk_exists(s, &b[2]), "three fit");
    CHECK(get(s, &b[0]) == 1, "hit A (refreshes its age)");
    CHECK(put(s, &b[3]) == 0, "D");
    CHECK(blk_exists(s, &b[0]) && !blk_exists(s, &b[1]) && blk_exists(s, &b[2]) && blk_exists(s, &b[3]),
          "D evicted B, the least recently used (A was read): A %d B %d C %d D %d", blk_exists(s, &b[0]),
          blk_exists(s, &b[1]), blk_exists(s, &b[2]), blk_exists(s, &b[3]));
    CHECK(ds41_pstore_used(s) == 3 * fb, "used %lld", ds41_pstore_used(s));
    CHECK(get(s, &b[2]) == 1, "hit C");
    CHECK(put(s, &b[4]) == 0, "E");
    CHECK(!blk_exists(s, &b[0]) && blk_exists(s, &b[2]) && blk_exists(s, &b[3]) && blk_exists(s, &b[4]),
          "E evicted A (C read after D was written): A %d C %d D %d E %d", blk_exists(s, &b[0]), blk_exists(s, &b[2]),
          blk_exists(s, &b[3]), blk_exists(s, &b[4]));
    CHECK(get(s, &b[1]) == 0 && get(s, &b[0]) == 0, "evicted blocks miss");
    /* a block larger than the capacity is refused, and nothing else is evicted for it */
    blk big;
    blk_make(&big, 40, 6000);
    ds41_err err;
    CHECK(ds41_pstore_put(s, big.key, big.parent, big.ids, NID, big.p, big.n, &err) == -1 &&
              strstr(err.msg, "larger than the capacity") != NULL, "oversized block: %s", err.msg);
    CHECK(blk_exists(s, &b[2]) && blk_exists(s, &b[3]) && blk_exists(s, &b[4]), "still there");
    ds41_pstore_close(s);
    /* the capacity covers every fingerprint of the directory: another model's put evicts the LRU */
    ds41_pstore *s2 = open_fp(dir, 2, fb * 7 / 2);
    blk o;
    blk_make(&o, 50, 1000);
    memset(o.parent, 0, 16);
    CHECK(s2 && ds41_pstore_used(s2) == 3 * fb, "a new process sees the directory's bytes");
    CHECK(s2 && put(s2, &o) == 0, "put of fingerprint 2");
    s = open_fp(dir, 1, 0);
    CHECK(s && !blk_exists(s, &b[3]) && blk_exists(s, &b[2]) && blk_exists(s, &b[4]), "D (oldest) evicted for it");
    ds41_pstore_close(s);
    ds41_pstore_close(s2);
    for (int i = 0; i < 5; i++) free(b[i].p);
    free(big.p);
    free(o.p);
}

static void chain_evicts_tail_first(void) {
    char dir[256];
    case_dir(dir, sizeof dir);
    const long long fb = 108 + 4 * NID + 1000;
    ds41_pstore *s = open_fp(dir, 1, fb * 11 / 2);
    if (!s) { CHECK(0, "open"); return; }
    /* a prompt of five blocks A0..A4 (A0's parent is zero, Ai's is Ai-1), put head first */
    blk a[5], x, y;
    for (int i = 0; i < 5; i++) blk_make(&a[i], i, 1000);
    blk_make(&x, 100, 1000);
    blk_make(&y, 101, 1000);
    memset(x.parent, 0, 16);
    memset(y.parent, 0, 16);
    int ok = 1;
    for (int i = 0; i < 5; i++) ok &= put(s, &a[i]) == 0;
    CHECK(ok, "chain puts");
    char p0[512], p4[512];
    struct stat s0, s4;
    blk_path(s, a[0].key, p0, sizeof p0);
    blk_path(s, a[4].key, p4, sizeof p4);
    CHECK(stat(p0, &s0) == 0 && stat(p4, &s4) == 0 &&
              (long long)s0.st_mtim.tv_sec * 1000000000LL + s0.st_mtim.tv_nsec -
                      ((long long)s4.st_mtim.tv_sec * 1000000000LL + s4.st_mtim.tv_nsec) == 4000,
          "A4 is stamped 4 us before A0");
    /* another prompt's block needs room: the tail A4 goes, not the head A0 */
    CHECK(put(s, &x) == 0, "X");
    CHECK(blk_exists(s, &a[0]) && blk_exists(s, &a[3]) && !blk_exists(s, &a[4]) && blk_exists(s, &x),
          "X evicted the tail A4: A0 %d A3 %d A4 %d", blk_exists(s, &a[0]), blk_exists(s, &a[3]), blk_exists(s, &a[4]));
    /* the prompt is looked up again, head first: its four blocks become newer than X */
    ok = 1;
    for (int i = 0; i < 4; i++) ok &= get(s, &a[i]) == 1;
    CHECK(ok, "lookups");
    CHECK(put(s, &y) == 0, "Y");
    CHECK(!blk_exists(s, &x) && blk_exists(s, &a[0]) && blk_exists(s, &a[3]) && blk_exists(s, &y),
          "Y evicted X, older than the chain's lookup: X %d A0 %d A3 %d", blk_exists(s, &x), blk_exists(s, &a[0]),
          blk_exists(s, &a[3]));
    ds41_pstore_close(s);
    for (int i = 0; i < 5; i++) free(a[i].p);
    free(x.p);
    free(y.p);
}

/* writes the image into the block's path, then gets: must be a miss (never a wrong payload) */
static int damaged_is_miss(ds41_pstore *s, const blk *a, const char *path, const uint8_t *img, size_t n, int *wrong) {
    if (spit(path, img, n) != 0) return -1;
    int r = get(s, a);
    if (r == 2 || r == 1) (*wrong)++;
    return r;
}

static void corrupt_every_byte(void) {
    char dir[256], path[512];
    case_dir(dir, sizeof dir);
    ds41_pstore *s = open_fp(dir, 1, 0);
    if (!s) { CHECK(0, "open"); return; }
    blk a;
    blk_make(&a, 60, 700);
    CHECK(put(s, &a) == 0, "put");
    blk_path(s, a.key, path, sizeof path);
    size_t n;
    uint8_t *good = slurp(path, &n);
    CHECK(good && n == 108 + 4 * NID + 700, "file of %zu bytes", n);
    if (!good) { ds41_pstore_close(s); free(a.p); return; }
    uint8_t *img = malloc(n);
    int served = 0, parsed_ok = 0, misses = 0;
    static const uint8_t pattern[2] = { 0, 0xA5 };
    for (int pass = 0; pass < 2; pass++)
        for (size_t pos = 0; pos < n; pos++) {
            memcpy(img, good, n);
            img[pos] ^= pass == 0 ? (uint8_t)(1u << (pos % 8)) : pattern[1];
            ds41_pstore_block b;
            if (ds41_pstore_parse(img, n, n, &b) == DS41_PSTORE_OK) parsed_ok++;
            if (damaged_is_miss(s, &a, path, img, n, &served) == 0) misses++;
        }
    CHECK(served == 0, "%d flipped files served", served);
    CHECK(misses == (int)(2 * n), "%d of %zu flips were misses", misses, 2 * n);
    CHECK(parsed_ok == 0, "%d flipped images parsed as valid", parsed_ok);
    /* a damaged file is removed by the get that found it */
    memcpy(img, good, n);
    img[300] ^= 4;
    spit(path, img, n);
    CHECK(get(s, &a) == 0 && !exists(path), "damaged file removed");
    /* the pristine file is still a hit: the cases above were not vacuous */
    spit(path, good, n);
    CHECK(get(s, &a) == 1, "restored file hits");
    ds41_pstore_close(s);
    free(img);
    free(good);
    free(a.p);
}

static void truncate_every_length(void) {
    char dir[256], path[512];
    case_dir(dir, sizeof dir);
    ds41_pstore *s = open_fp(dir, 1, 0);
    if (!s) { CHECK(0, "open"); return; }
    blk a;
    blk_make(&a, 61, 900);
    CHECK(put(s, &a) == 0, "put");
    blk_path(s, a.key, path, sizeof path);
    size_t n;
    uint8_t *good = slurp(path, &n);
    if (!good) { CHECK(0, "read"); ds41_pstore_close(s); free(a.p); return; }
    int served = 0, misses = 0;
    for (size_t len = 0; len < n; len++)
        if (damaged_is_miss(s, &a, path, good, len, &served) == 0) misses++;
    CHECK(served == 0 && misses == (int)n, "truncations: %d served, %d of %zu misses", served, misses, n);
    uint8_t *longer = malloc(n + 1);
    memcpy(longer, good, n);
    longer[n] = 0;
    CHECK(damaged_is_miss(s, &a, path, longer, n + 1, &served) == 0 && served == 0, "one byte appended");
    memset(longer, 0, n);
    CHECK(damaged_is_miss(s, &a, path, longer, n, &served) == 0 && served == 0, "zeros of the right size");
    spit(path, good, n);
    CHECK(get(s, &a) == 1, "restored file hits");
    ds41_pstore_close(s);
    free(longer);
    free(good);
    free(a.p);
}

static void foreign_files_are_misses(void) {
    char dir[256], path[512], path2[512];
    case_dir(dir, sizeof dir);
    ds41_pstore *s = open_fp(dir, 1, 0), *s2 = open_fp(dir, 2, 0);
    if (!s || !s2) { CHECK(0, "open"); ds41_pstore_close(s); ds41_pstore_close(s2); return; }
    blk a;
    blk_make(&a, 70, 512);
    CHECK(put(s, &a) == 0 && put(s2, &a) == 0, "put under both fingerprints");
    blk_path(s, a.key, path, sizeof path);
    blk_path(s2, a.key, path2, sizeof path2);
    size_t n, n2;
    uint8_t *good = slurp(path, &n), *other = slurp(path2, &n2);
    if (!good || !other) { CHECK(0, "read"); goto out; }
    /* a well-formed file of format version 2 (both checksums right): ignored, left in place */
    uint8_t *img = malloc(n);
    memcpy(img, good, n);
    set_le32(img + 8, 2);
    reseal(img, n);
    ds41_pstore_block b;
    CHECK(ds41_pstore_parse(img, n, n, &b) == DS41_PSTORE_FOREIGN && b.version == 2, "parse: foreign (%s)", b.why);
    spit(path, img, n);
    CHECK(get(s, &a) == 0 && exists(path), "version 2: a miss, the file left alone");
    /* version 0 too; and the crafting itself is right: resealed as version 1 it hits */
    set_le32(img + 8, 0);
    reseal(img, n);
    spit(path, img, n);
    CHECK(get(s, &a) == 0, "version 0 is a miss");
    set_le32(img + 8, 1);
    reseal(img, n);
    CHECK(memcmp(img, good, n) == 0, "resealing reproduces the file");
    spit(path, img, n);
    CHECK(get(s, &a) == 1, "resealed version 1 hits");
    /* another model's valid file copied under this model's name: a miss, removed */
    spit(path, other, n2);
    CHECK(get(s, &a) == 0 && !exists(path), "another fingerprint's file: a miss, removed");
    CHECK(get(s2, &a) == 1, "it is still served to its own model");
    /* a valid file of another key renamed to this key: a miss */
    blk c;
    blk_make(&c, 71, 512);
    CHECK(put(s, &c) == 0, "put c");
    char pc[512];
    blk_path(s, c.key, pc, sizeof pc);
    CHECK(rename(pc, path) == 0 && get(s, &a) == 0, "a file under another key's name is a miss");
    CHECK(le32(good + 8) == 1, "this build writes version 1");
    free(img);
    free(c.p);
out:
    free(good);
    free(other);
    ds41_pstore_close(s);
    ds41_pstore_close(s2);
    free(a.p);
}

static void orphan_temp_removed_by_open(void) {
    char dir[256], tmp[512], lockp[512];
    case_dir(dir, sizeof dir);
    ds41_pstore *s = open_fp(dir, 1, 0);
    if (!s) { CHECK(0, "open"); return; }
    snprintf(tmp, sizeof tmp, "%s/.tmp.00112233445566778899aabbccddeeff.999999.0", ds41_pstore_path(s));
    spit(tmp, (const uint8_t *)"DS41PBLK half a block", 21);
    ds41_pstore_close(s);
    /* while a writer holds the shared lock the temporary file may be its write in flight: kept */
    snprintf(lockp, sizeof lockp, "%s/lock", dir);
    int lf = open(lockp, O_RDWR);
    CHECK(lf >= 0 && flock(lf, LOCK_SH) == 0, "take the shared lock");
    s = open_fp(dir, 1, 0);
    CHECK(exists(tmp), "kept while a writer holds the lock");
    ds41_pstore_close(s);
    close(lf);
    s = open_fp(dir, 1, 0);
    CHECK(!exists(tmp), "removed by open once no writer holds the lock");
    ds41_pstore_close(s);
}

typedef struct counts { int ok, damaged, foreign, temp, removed; long long tokens, bytes; } counts;
static int count_visit(const ds41_pstore_info *in, void *ctx) {
    counts *c = ctx;
    if (in->kind == DS41_PSTORE_OK) { c->ok++; c->tokens += in->n_ids; c->bytes += (long long)in->file_bytes; }
    else if (in->kind == DS41_PSTORE_DAMAGED) c->damaged++;
    else if (in->kind == DS41_PSTORE_FOREIGN) c->foreign++;
    else c->temp++;
    c->removed += in->removed;
    return 0;
}

static void scan_verify_fix_clear(void) {
    char dir[256], path[512], tmp[512];
    case_dir(dir, sizeof dir);
    ds41_pstore *s = open_fp(dir, 1, 0), *s2 = open_fp(dir, 2, 0);
    if (!s || !s2) { CHECK(0, "open"); ds41_pstore_close(s); ds41_pstore_close(s2); return; }
    blk b[4];
    for (int i = 0; i < 4; i++) blk_make(&b[i], 80 + i, 300 + 10 * (size_t)i);
    CHECK(put(s, &b[0]) == 0 && put(s, &b[1]) == 0 && put(s, &b[2]) == 0 && put(s2, &b[3]) == 0, "puts");
    /* damage b[0]'s payload (the header stays valid), make b[1] a version-2 file, add a temp file */
    size_t n;
    blk_path(s, b[0].key, path, sizeof path);
    uint8_t *img = slurp(path, &n);
    img[n - 20] ^= 0x10;
    spit(path, img, n);
    free(img);
    blk_path(s, b[1].key, path, sizeof path);
    img = slurp(path, &n);
    set_le32(img + 8, 2);
    reseal(img, n);
    spit(path, img, n);
    free(img);
    snprintf(tmp, sizeof tmp, "%s/.tmp.x.1.0", ds41_pstore_path(s));
    spit(tmp, (const uint8_t *)"x", 1);
    ds41_err err;
    counts c = { 0 };
    CHECK(ds41_pstore_scan(dir, NULL, 0, count_visit, &c, &err) == 0, "header scan");
    CHECK(c.ok == 3 && c.damaged == 0 && c.foreign == 1 && c.temp == 1 && c.tokens == 3 * NID,
          "header scan: ok %d damaged %d foreign %d temp %d", c.ok, c.damaged, c.foreign, c.temp);
    memset(&c, 0, sizeof c);
    CHECK(ds41_pstore_scan(dir, NULL, DS41_PSTORE_SCAN_FULL, count_visit, &c, &err) == 0, "full scan");
    CHECK(c.ok == 2 && c.damaged == 1 && c.foreign == 1 && c.temp == 1 && c.removed == 0,
          "full scan: ok %d damaged %d foreign %d temp %d", c.ok, c.damaged, c.foreign, c.temp);
    uint8_t fp1[32];
    fp_of(1, fp1);
    memset(&c, 0, sizeof c);
    CHECK(ds41_pstore_scan(dir, fp1, DS41_PSTORE_SCAN_FULL, count_visit, &c, &err) == 0 && c.ok == 1 && c.damaged == 1,
          "one fingerprint: ok %d damaged %d", c.ok, c.damaged);
    memset(&c, 0, sizeof c);
    CHECK(ds41_pstore_scan(dir, NULL, DS41_PSTORE_SCAN_FULL | DS41_PSTORE_SCAN_FIX, count_visit, &c, &err) == 0 &&
              c.removed == 3, "fix removed %d", c.removed);
    memset(&c, 0, sizeof c);
    CHECK(ds41_pstore_scan(dir, NULL, DS41_PSTORE_SCAN_FULL, count_visit, &c, &err) == 0 && c.ok == 2 &&
              c.damaged + c.foreign + c.temp == 0, "after fix: ok %d", c.ok);
    CHECK(get(s, &b[2]) == 1 && get(s2, &b[3]) == 1, "the good blocks survive the fix");
    long long blocks = -1, bytes = -1;
    CHECK(ds41_pstore_clear(dir, fp1, &blocks, &bytes, &err) == 0 && blocks == 1 &&
              bytes == (long long)(108 + 4 * NID + b[2].n), "clear fingerprint 1: %lld blocks %lld bytes", blocks, bytes);
    CHECK(get(s, &b[2]) == 0 && get(s2, &b[3]) == 1, "only fingerprint 1 cleared");
    CHECK(ds41_pstore_clear(dir, NULL, &blocks, &bytes, &err) == 0 && blocks == 1, "clear all");
    CHECK(get(s2, &b[3]) == 0, "cleared");
    CHECK(put(s, &b[2]) == 0 && get(s, &b[2]) == 1, "usable after clear");
    CHECK(ds41_pstore_scan("/nonexistent/ds41", NULL, 0, count_visit, &c, &err) == -1 &&
              strstr(err.msg, "/nonexistent/ds41") && strstr(err.msg, "No such file"), "missing dir: %s", err.msg);
    ds41_pstore_close(s);
    ds41_pstore_close(s2);
    for (int i = 0; i < 4; i++) free(b[i].p);
}

static void put_failure_is_clean(void) {
    char dir[256];
    case_dir(dir, sizeof dir);
    ds41_pstore *s = open_fp(dir, 1, 0);
    if (!s) { CHECK(0, "open"); return; }
    blk a;
    blk_make(&a, 90, 100);
    char fpdir[400];
    snprintf(fpdir, sizeof fpdir, "%s", ds41_pstore_path(s));
    /* the fingerprint directory replaced by a file: put fails, naming the path and errno */
    rm_rf(fpdir);
    spit(fpdir, (const uint8_t *)"x", 1);
    ds41_err err;
    err.msg[0] = 0;
    CHECK(ds41_pstore_put(s, a.key, a.parent, a.ids, NID, a.p, a.n, &err) == -1, "put into a non-directory fails");
    CHECK(strstr(err.msg, fpdir) && strstr(err.msg, "Not a directory"), "message: %s", err.msg);
    CHECK(get(s, &a) == 0, "a miss");
    /* the whole store removed under a running process: put recreates it and the lock file */
    rm_rf(dir);
    CHECK(put(s, &a) == 0 && get(s, &a) == 1, "put recreates a removed store directory");
    char lockp[300];
    snprintf(lockp, sizeof lockp, "%s/lock", dir);
    CHECK(exists(lockp) && blk_exists(s, &a), "lock file and block back");
    CHECK(ds41_pstore_put(s, a.key, a.parent, a.ids, -1, a.p, a.n, &err) == -1, "negative n_ids refused");
    CHECK(ds41_pstore_put(s, a.key, a.parent, NULL, 3, a.p, a.n, &err) == -1, "NULL ids refused");
    ds41_pstore_close(s);
    /* open of a path that is a file */
    char f[300];
    snprintf(f, sizeof f, "%s/case%d-file", root, case_no);
    spit(f, (const uint8_t *)"x", 1);
    uint8_t fp[32];
    fp_of(1, fp);
    CHECK(ds41_pstore_open(f, fp, 0, &err) == NULL && strstr(err.msg, f), "open of a file: %s", err.msg);
    free(a.p);
}

typedef struct thr { ds41_pstore *s; int base, bad; } thr;
static void *thread_main(void *arg) {
    thr *t = arg;
    for (int i = 0; i < 40; i++) {
        blk b;
        blk_make(&b, t->base + i, 500 + (size_t)i * 13);
        memset(b.parent, 0, 16);   /* independent blocks: each is the newest when put */
        if (put(t->s, &b) != 0 || get(t->s, &b) != 1) t->bad++;
        free(b.p);
    }
    return NULL;
}

static void threads_share_a_store(void) {
    char dir[256];
    case_dir(dir, sizeof dir);
    /* a capacity of about 60 of the 160 blocks: eviction runs while other threads put and get */
    const long long cap = 60LL * (108 + 4 * NID + 1000);
    ds41_pstore *s = open_fp(dir, 1, cap);
    if (!s) { CHECK(0, "open"); return; }
    pthread_t th[4];
    thr t[4];
    for (int i = 0; i < 4; i++) {
        t[i] = (thr){ s, 1000 + 100 * i, 0 };
        pthread_create(&th[i], NULL, thread_main, &t[i]);
    }
    int bad = 0;
    for (int i = 0; i < 4; i++) { pthread_join(th[i], NULL); bad += t[i].bad; }
    /* a block can be evicted between its put and get by another thread's put, but each get
     * right after its own put comes before 1/16 of the capacity is written by others */
    CHECK(bad == 0, "%d put/get pairs failed", bad);
    ds41_err err;
    counts c = { 0 };
    CHECK(ds41_pstore_scan(dir, NULL, DS41_PSTORE_SCAN_FULL, count_visit, &c, &err) == 0 && c.damaged == 0 && c.temp == 0 &&
              c.ok > 0 && c.bytes <= cap && c.bytes == ds41_pstore_used(s),
          "after: ok %d (%lld bytes, used %lld, cap %lld) damaged %d temp %d", c.ok, c.bytes, ds41_pstore_used(s), cap,
          c.damaged, c.temp);
    ds41_pstore_close(s);
}

static long long mtime_of(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 ? (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec : -1;
}
static void set_mtime(const char *p, long long ns) {
    struct timespec t[2] = { { (time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL) } };
    t[1] = t[0];
    utimensat(AT_FDCWD, p, t, 0);
}

/* serve --dp-attention restarted with fewer ranks: the store of a rank past the new count is
 * moved into a remaining rank's store (ds41_pstore_adopt). Valid blocks of this fingerprint
 * move with their LRU ages; a key both hold keeps the destination's file with the later age;
 * a file with a bad header, a block under another key's name, a temporary file and another
 * fingerprint's block stay in the source; the running total grows by the bytes moved; a
 * capacity is applied at once; a missing source or the store itself is an error naming it. */
static void adopt_moves_valid_blocks(void) {
    char src[256], dst[256];
    case_dir(src, sizeof src);
    case_dir(dst, sizeof dst);
    ds41_pstore *s = open_fp(src, 1, 0), *s2 = open_fp(src, 2, 0), *d = open_fp(dst, 1, 0);
    if (!s || !s2 || !d) { CHECK(0, "open"); ds41_pstore_close(s); ds41_pstore_close(s2); ds41_pstore_close(d); return; }
    blk a, b, c, e, f;
    blk_make(&a, 0, 1000);   /* a chain a <- b */
    blk_make(&b, 1, 1200);
    blk_make(&c, 7, 900);    /* held by both stores */
    blk_make(&e, 9, 800);    /* fingerprint 2 */
    blk_make(&f, 11, 700);   /* its file gets a bad header */
    CHECK(put(s, &a) == 0 && put(s, &b) == 0 && put(s, &c) == 0 && put(s, &f) == 0 && put(s2, &e) == 0, "source puts");
    CHECK(put(d, &c) == 0, "destination put");
    const long long size_a = 108 + 4 * NID + 1000, size_b = 108 + 4 * NID + 1200;
    char pa[512], pb[512], pc_src[512], pc_dst[512], pf[512], mis[512], tmp[512], da[512], db[512];
    blk_path(s, a.key, pa, sizeof pa);
    blk_path(s, b.key, pb, sizeof pb);
    blk_path(s, c.key, pc_src, sizeof pc_src);
    blk_path(d, c.key, pc_dst, sizeof pc_dst);
    blk_path(s, f.key, pf, sizeof pf);
    blk_path(d, a.key, da, sizeof da);
    blk_path(d, b.key, db, sizeof db);
    set_mtime(pc_dst, 1000000000000000000LL);   /* the destination's c older than the source's (2001) */
    const long long ta = mtime_of(pa), tb = mtime_of(pb), tc = mtime_of(pc_src);
    size_t n;
    uint8_t *img = slurp(pf, &n);
    if (img) { img[0] ^= 1; spit(pf, img, n); free(img); }
    /* a valid block (a's bytes) under another key's name: misplaced */
    char hx[33];
    uint8_t k2[16];
    key_of(42, k2);
    ds41_pstore_hex(k2, 16, hx);
    snprintf(mis, sizeof mis, "%s/%s.blk", ds41_pstore_path(s), hx);
    img = slurp(pa, &n);
    if (img) { spit(mis, img, n); free(img); }
    snprintf(tmp, sizeof tmp, "%s/.tmp.00112233445566778899aabbccddeeff.999999.0", ds41_pstore_path(s));
    spit(tmp, (const uint8_t *)"DS41PBLK half a block", 21);
    long long used0 = ds41_pstore_used(d), blocks = -1, bytes = -1, dups = -1;
    ds41_err err;
    CHECK(ds41_pstore_adopt(d, src, &blocks, &bytes, &dups, &err) == 0, "adopt: %s", err.msg);
    CHECK(blocks == 2 && bytes == size_a + size_b && dups == 1, "moved %lld blocks, %lld bytes, %lld already held (expected 2, %lld, 1)",
          blocks, bytes, dups, size_a + size_b);
    CHECK(ds41_pstore_used(d) == used0 + size_a + size_b, "used %lld (expected %lld)", ds41_pstore_used(d), used0 + size_a + size_b);
    /* the ages (before any get, which refreshes them): a and b their own, c the later of its two */
    CHECK(mtime_of(da) == ta && mtime_of(db) == tb, "a, b ages %lld %lld (expected %lld %lld)", mtime_of(da), mtime_of(db), ta, tb);
    CHECK(mtime_of(pc_dst) == tc, "c's age %lld (expected the source's %lld)", mtime_of(pc_dst), tc);
    CHECK(get(d, &a) == 1 && get(d, &b) == 1 && get(d, &c) == 1, "the destination serves a, b and c");
    CHECK(!exists(pa) && !exists(pb) && !exists(pc_src), "a, b and c left the source");
    CHECK(exists(pf) && exists(mis) && exists(tmp), "the bad header, the misplaced block and the temporary file stay");
    CHECK(get(s2, &e) == 1, "fingerprint 2's block stays in the source");
    CHECK(ds41_pstore_adopt(d, src, &blocks, &bytes, &dups, &err) == 0 && blocks == 0 && dups == 0, "a second adopt moves nothing");
    char missing[300];
    snprintf(missing, sizeof missing, "%s/none", src);
    CHECK(ds41_pstore_adopt(d, missing, &blocks, &bytes, &dups, &err) == -1 && strstr(err.msg, missing), "missing source: %s",
          err.msg);
    CHECK(ds41_pstore_adopt(d, dst, &blocks, &bytes, &dups, &err) == -1 && strstr(err.msg, "the store itself"), "itself: %s",
          err.msg);
    ds41_pstore_close(d);
    /* past a capacity the oldest blocks go at once: the moved chain g1 <- g2 is older than the
     * destination's h, put after it */
    char src2[256], dst2[256];
    case_dir(src2, sizeof src2);
    case_dir(dst2, sizeof dst2);
    const long long fb = 108 + 4 * NID + 500;
    blk g1, g2, h;
    blk_make(&g1, 20, 500);
    blk_make(&g2, 21, 500);
    blk_make(&h, 30, 500);
    ds41_pstore *t = open_fp(src2, 1, 0), *u = open_fp(dst2, 1, 2 * fb + 100);
    CHECK(t && u && put(t, &g1) == 0 && put(t, &g2) == 0 && put(u, &h) == 0, "puts");
    if (t && u) {
        CHECK(ds41_pstore_adopt(u, src2, &blocks, &bytes, &dups, &err) == 0 && blocks == 2, "adopt under a capacity: %s", err.msg);
        CHECK(ds41_pstore_used(u) <= 2 * fb + 100 && get(u, &h) == 1, "used %lld over the capacity %lld, or h evicted",
              ds41_pstore_used(u), 2 * fb + 100);
    }
    ds41_pstore_close(t);
    ds41_pstore_close(u);
    ds41_pstore_close(s);
    ds41_pstore_close(s2);
    free(a.p); free(b.p); free(c.p); free(e.p); free(f.p); free(g1.p); free(g2.p); free(h.p);
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/ds41-test-pstore-XXXXXX");
    if (!mkdtemp(root)) { printf("FAIL pstore_setup: mkdtemp: %s\n", strerror(errno)); return 1; }
    RUN_CASE(crc32c_known_values);
    RUN_CASE(sha256_known_values);
    RUN_CASE(roundtrip_and_reopen);
    RUN_CASE(same_key_twice_left_alone);
    RUN_CASE(mismatch_is_miss);
    RUN_CASE(other_fingerprint_is_miss);
    RUN_CASE(lru_eviction_order);
    RUN_CASE(chain_evicts_tail_first);
    RUN_CASE(corrupt_every_byte);
    RUN_CASE(truncate_every_length);
    RUN_CASE(foreign_files_are_misses);
    RUN_CASE(orphan_temp_removed_by_open);
    RUN_CASE(scan_verify_fix_clear);
    RUN_CASE(put_failure_is_clean);
    RUN_CASE(threads_share_a_store);
    RUN_CASE(adopt_moves_valid_blocks);
    rm_rf(root);
    return check_exit();
}
