/* libFuzzer harness for the persistent prefix store's reader (src/store/pstore.c). Each input is
 * a block file image. ds41_pstore_parse must classify it (ok / damaged / foreign) with a reason,
 * and an accepted image must satisfy the format's promises (size equation, views inside the
 * image, both checksums). The header-only check must never accept what the full check refuses
 * for a header reason. Then the bytes are written as a real store file, under the fingerprint
 * and key its header names, and read back with ds41_pstore_get: a hit exactly when the image
 * parses, with the parsed payload; a miss never hands out memory. Before the read the file is
 * offered to another store (ds41_pstore_adopt, serve --dp-attention restarted with fewer
 * ranks): it moves exactly when its header passes the header-only check, and the read then
 * goes to whichever store holds it. Any violation aborts. */
#include "crc32c.h"
#include "pstore.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char root[64], root2[64];

static void remove_root(void) {
    char lock[96];
    snprintf(lock, sizeof lock, "%s/lock", root);
    unlink(lock);
    rmdir(root);
    snprintf(lock, sizeof lock, "%s/lock", root2);
    unlink(lock);
    rmdir(root2);
}

static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!root[0]) {
        /* tmpfs where there is one: the store fsyncs each new fingerprint directory */
        snprintf(root, sizeof root, "/dev/shm/ds41-fuzz-pstore-XXXXXX");
        if (!mkdtemp(root)) {
            snprintf(root, sizeof root, "/tmp/ds41-fuzz-pstore-XXXXXX");
            if (!mkdtemp(root)) abort();
        }
        snprintf(root2, sizeof root2, "%s-to", root);
        if (mkdir(root2, 0755) != 0) abort();
        atexit(remove_root);
    }
    ds41_pstore_block b;
    int kind = ds41_pstore_parse(data, size, size, &b);
    if (kind != DS41_PSTORE_OK && kind != DS41_PSTORE_DAMAGED && kind != DS41_PSTORE_FOREIGN) abort();
    if (kind != DS41_PSTORE_OK && (!b.why[0] || strchr(b.why, '\n'))) abort();
    volatile uint8_t sink = 0;
    if (kind == DS41_PSTORE_OK) {
        if (size < DS41_PSTORE_HEADER + 4 || b.version != DS41_PSTORE_VERSION || b.file_bytes != size) abort();
        if ((uint64_t)DS41_PSTORE_HEADER + 4ull * b.n_ids + b.n_payload + 4 != size) abort();
        if (b.ids != data + DS41_PSTORE_HEADER || b.payload != b.ids + 4 * (size_t)b.n_ids) abort();
        if (le32(data + size - 4) != ds41_crc32c(0, data, size - 4)) abort();
        if (le32(data + 100) != ds41_crc32c(0, data, 100)) abort();
        if (memcmp(b.key, data + 48, 16) != 0 || memcmp(b.fingerprint, data + 16, 32) != 0) abort();
        for (uint64_t k = 0; k < b.n_payload; k++) sink ^= b.payload[k];
    }
    /* the header-only check (what ds41 cache ls reads) agrees on every accepted file */
    if (size >= DS41_PSTORE_HEADER) {
        ds41_pstore_block h;
        int hk = ds41_pstore_parse(data, DS41_PSTORE_HEADER, size, &h);
        if (kind == DS41_PSTORE_OK &&
            (hk != DS41_PSTORE_OK || h.ids || h.payload || h.n_ids != b.n_ids || h.n_payload != b.n_payload))
            abort();
        if (hk == DS41_PSTORE_FOREIGN && kind != DS41_PSTORE_FOREIGN) abort();
    }

    /* through the file system: the store of the fingerprint the header names, its key's file */
    uint8_t fp[32] = { 0 }, key[16] = { 0 }, parent[16] = { 0 };
    if (size >= 80) {
        memcpy(fp, data + 16, 32);
        memcpy(key, data + 48, 16);
        memcpy(parent, data + 64, 16);
    }
    ds41_err err;
    ds41_pstore *s = ds41_pstore_open(root, fp, 0, &err);
    if (!s) abort();
    char hex[33], path[512];
    ds41_pstore_hex(key, 16, hex);
    snprintf(path, sizeof path, "%s/%s.blk", ds41_pstore_path(s), hex);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
    int header_ok = 0;
    if (size >= DS41_PSTORE_HEADER) {
        ds41_pstore_block h;
        header_ok = ds41_pstore_parse(data, DS41_PSTORE_HEADER, size, &h) == DS41_PSTORE_OK;
    }
    ds41_pstore *d = ds41_pstore_open(root2, fp, 0, &err);
    if (!d) abort();
    long long moved = -1, bytes = -1, dups = -1;
    if (ds41_pstore_adopt(d, root, &moved, &bytes, &dups, &err) != 0) abort();
    if (moved != header_ok || dups != 0 || bytes != (header_ok ? (long long)size : 0) || (access(path, F_OK) == 0) == header_ok)
        abort();
    char dpath[512];
    snprintf(dpath, sizeof dpath, "%s/%s.blk", ds41_pstore_path(d), hex);
    int n_ids = kind == DS41_PSTORE_OK ? (int)b.n_ids : 0;
    int32_t *ids = malloc(sizeof *ids * (size_t)(n_ids ? n_ids : 1));
    if (!ids) abort();
    for (int i = 0; i < n_ids; i++) ids[i] = (int32_t)le32(b.ids + 4 * (size_t)i);
    void *got = (void *)1;
    size_t n = 99;
    int r = ds41_pstore_get(header_ok ? d : s, key, parent, ids, n_ids, &got, &n, &err);
    if (r == 1) {
        if (kind != DS41_PSTORE_OK || n != b.n_payload || (n && memcmp(got, b.payload, n) != 0)) abort();
        free(got);
    } else if (r == 0) {
        if (kind == DS41_PSTORE_OK || got != NULL || n != 0) abort();
    } else {
        abort();
    }
    free(ids);
    unlink(path);
    unlink(dpath);
    rmdir(ds41_pstore_path(s));
    rmdir(ds41_pstore_path(d));
    ds41_pstore_close(s);
    ds41_pstore_close(d);
    (void)sink;
    return 0;
}
