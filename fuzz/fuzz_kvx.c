/* libFuzzer harness for the KV transfer frame decoder (src/store/kvx_frame.c) and the RESUME
 * payload decoder (src/store/kvx_resume.c). Each input is a byte string read as one frame.
 * ds41_kvx_parse must refuse it with a one-line reason or accept it only when the format's
 * promises hold (magic, version, known type, size equation, both checksums); an accepted frame
 * re-encodes to the same bytes, and the header-only decoder agrees with the whole-frame one.
 * The bytes past the 48-byte header are also read as a RESUME payload (checksum or not, so that
 * mutations reach the payload checks) against fuzz/kvx_test_geom.h: refused with a one-line
 * reason, or accepted only with the exact size, fields in range and a head that re-encodes to
 * the same bytes. Any violation aborts. */
#include "crc32c.h"
#include "kvx_frame.h"
#include "kvx_test_geom.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void resume_payload(const uint8_t *p, size_t n) {
    const ds41_kvx_geom *g = &kvx_test_geom;
    ds41_kvx_resume r;
    char why[256] = "";
    if (ds41_kvx_resume_parse(p, n, g, KVX_TEST_POS, &r, why, sizeof why) != 0) {
        if (!why[0] || strchr(why, '\n')) abort();
        return;
    }
    if (n != ds41_kvx_resume_bytes(g, r.mh_rows, r.stream_rows) || r.pos != KVX_TEST_POS || r.mh_rows < 0 ||
        r.mh_rows > g->slots)
        abort();
    /* the decoder split's form: exactly the rows the position implies, no context rows */
    if (r.stream_rows && (r.stream_rows != ds41_kvx_stream_rows(g, r.pos) || r.mh_rows)) abort();
    if (r.ik_owner < -1 || r.ik_owner >= g->n_layers || (r.mh_rows && r.mh_pos0 + r.mh_rows != r.pos)) abort();
    for (int k = 0; k < 16; k++)
        if (r.hist[k] < 0 || r.hist[k] >= g->n_hist_ids) abort();
    if (r.mh_off + (size_t)r.mh_rows * g->mh_width * 2 != r.stream_off ||
        r.stream_off + (size_t)r.stream_rows * g->stream_width * 4 != n || r.rings_off > r.comp_off || r.comp_off > r.mh_off)
        abort();
    /* the head re-encodes to the same bytes (the context start only counts with rows) */
    uint8_t head[DS41_KVX_RESUME_HEAD + 12 * DS41_KVX_MAX_COMP];
    ds41_kvx_resume w = r;
    ds41_kvx_resume_write_head(g, &w, head);
    size_t hn = DS41_KVX_RESUME_HEAD + 12 * (size_t)g->n_comp;
    if (r.mh_rows == 0) memcpy(head + 40, p + 40, 8);
    if (memcmp(head, p, hn) || w.mh_off != r.mh_off || w.stream_off != r.stream_off) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ds41_kvx_hdr h;
    const uint8_t *p = (const uint8_t *)1;
    char why[160] = "";
    uint32_t maxp = size > 4 ? (uint32_t)data[size - 1] << 8 | data[size - 2] : 1024;
    int rc = ds41_kvx_parse(data, size, maxp, &h, &p, why, sizeof why);
    if (rc != 0) {
        if (!why[0] || strchr(why, '\n') || p != NULL) abort();
    } else {
        if (size != DS41_KVX_HEADER + (size_t)h.len || h.len > maxp || p != data + DS41_KVX_HEADER) abort();
        if (memcmp(data, DS41_KVX_MAGIC, 4) || h.version != DS41_KVX_VERSION) abort();
        if (h.type < DS41_KVX_HELLO || h.type > DS41_KVX_RESUME) abort();
        if (h.len && ds41_crc32c(0, p, h.len) != h.pcrc) abort();
        uint8_t re[DS41_KVX_HEADER];
        ds41_kvx_encode(&h, p, re);
        if (memcmp(re, data, DS41_KVX_HEADER)) abort();
    }
    if (size >= DS41_KVX_HEADER) resume_payload(data + DS41_KVX_HEADER, size - DS41_KVX_HEADER);
    if (size >= DS41_KVX_HEADER) {
        ds41_kvx_hdr g;
        int hr = ds41_kvx_decode_header(data, maxp, &g, why, sizeof why);
        if (rc == 0 && (hr != 0 || memcmp(&g, &h, sizeof g))) abort();
        if (hr == 0 && rc != 0 && size == DS41_KVX_HEADER + (size_t)g.len && ds41_crc32c(0, data + DS41_KVX_HEADER, g.len) == g.pcrc)
            abort();
    }
    return 0;
}
