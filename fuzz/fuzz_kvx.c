/* libFuzzer harness for the KV transfer frame decoder (src/store/kvx_frame.c). Each input is a
 * byte string read as one frame. ds41_kvx_parse must refuse it with a one-line reason or accept
 * it only when the format's promises hold (magic, version, known type, size equation, both
 * checksums); an accepted frame re-encodes to the same bytes, and the header-only decoder
 * agrees with the whole-frame one. Any violation aborts. */
#include "crc32c.h"
#include "kvx_frame.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
        if (h.type < DS41_KVX_HELLO || h.type > DS41_KVX_ERROR) abort();
        if (h.len && ds41_crc32c(0, p, h.len) != h.pcrc) abort();
        uint8_t re[DS41_KVX_HEADER];
        ds41_kvx_encode(&h, p, re);
        if (memcmp(re, data, DS41_KVX_HEADER)) abort();
    }
    if (size >= DS41_KVX_HEADER) {
        ds41_kvx_hdr g;
        int hr = ds41_kvx_decode_header(data, maxp, &g, why, sizeof why);
        if (rc == 0 && (hr != 0 || memcmp(&g, &h, sizeof g))) abort();
        if (hr == 0 && rc != 0 && size == DS41_KVX_HEADER + (size_t)g.len && ds41_crc32c(0, data + DS41_KVX_HEADER, g.len) == g.pcrc)
            abort();
    }
    return 0;
}
