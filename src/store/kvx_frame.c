/* ds41 KV transfer frames: see kvx_frame.h. */
#include "kvx_frame.h"

#include <stdio.h>
#include <string.h>

#include "crc32c.h"
#include "le.h"

const char *ds41_kvx_type_name(unsigned type) {
    switch (type) {
    case DS41_KVX_HELLO: return "HELLO";
    case DS41_KVX_WELCOME: return "WELCOME";
    case DS41_KVX_REQ: return "REQ";
    case DS41_KVX_LAYER: return "LAYER";
    case DS41_KVX_DONE: return "DONE";
    case DS41_KVX_ERROR: return "ERROR";
    case DS41_KVX_RESUME: return "RESUME";
    default: return "unknown";
    }
}

void ds41_kvx_encode(const ds41_kvx_hdr *h, const void *payload, uint8_t out[DS41_KVX_HEADER]) {
    memset(out, 0, DS41_KVX_HEADER);
    memcpy(out, DS41_KVX_MAGIC, 4);
    ds41_put16(out + 4, h->version ? h->version : DS41_KVX_VERSION);
    ds41_put16(out + 6, h->type);
    ds41_put64(out + 8, h->req);
    ds41_put32(out + 16, h->seq);
    ds41_put32(out + 20, (uint32_t)h->layer);
    ds41_put32(out + 24, h->arg0);
    ds41_put32(out + 28, h->arg1);
    ds41_put32(out + 32, h->len);
    ds41_put32(out + 36, ds41_crc32c(0, out, 36));
    ds41_put32(out + 40, h->len ? ds41_crc32c(0, payload, h->len) : 0);
}

int ds41_kvx_decode_header(const uint8_t in[DS41_KVX_HEADER], uint32_t max_payload, ds41_kvx_hdr *h, char *why,
                           size_t whycap) {
    memset(h, 0, sizeof *h);
    if (memcmp(in, DS41_KVX_MAGIC, 4)) { snprintf(why, whycap, "bad magic (not a ds41 KV transfer frame)"); return -1; }
    if (ds41_get32(in + 36) != ds41_crc32c(0, in, 36)) { snprintf(why, whycap, "header checksum mismatch"); return -1; }
    h->version = ds41_get16(in + 4);
    h->type = ds41_get16(in + 6);
    h->req = ds41_get64(in + 8);
    h->seq = ds41_get32(in + 16);
    h->layer = (int32_t)ds41_get32(in + 20);
    h->arg0 = ds41_get32(in + 24);
    h->arg1 = ds41_get32(in + 28);
    h->len = ds41_get32(in + 32);
    h->pcrc = ds41_get32(in + 40);
    if (h->version != DS41_KVX_VERSION) {
        snprintf(why, whycap, "frame version %u (this build speaks %d)", h->version, DS41_KVX_VERSION);
        return -1;
    }
    if (h->type < DS41_KVX_HELLO || h->type > DS41_KVX_RESUME) { snprintf(why, whycap, "unknown frame type %u", h->type); return -1; }
    if (ds41_get32(in + 44)) { snprintf(why, whycap, "reserved header bytes are not zero"); return -1; }
    if (max_payload > DS41_KVX_MAX_PAYLOAD) max_payload = DS41_KVX_MAX_PAYLOAD;
    if (h->len > max_payload) {
        snprintf(why, whycap, "%s frame payload of %u bytes (at most %u)", ds41_kvx_type_name(h->type), h->len, max_payload);
        return -1;
    }
    if (!h->len && h->pcrc) { snprintf(why, whycap, "empty payload with a non-zero checksum"); return -1; }
    return 0;
}

int ds41_kvx_check_payload(const ds41_kvx_hdr *h, const void *payload, char *why, size_t whycap) {
    if (h->len && ds41_crc32c(0, payload, h->len) != h->pcrc) {
        snprintf(why, whycap, "%s frame payload checksum mismatch (%u bytes)", ds41_kvx_type_name(h->type), h->len);
        return -1;
    }
    return 0;
}

int ds41_kvx_expect(const ds41_kvx_hdr *h, unsigned allowed, uint64_t req, uint32_t seq, char *why, size_t whycap) {
    if (!(allowed & (1u << h->type))) {
        snprintf(why, whycap, "unexpected %s frame", ds41_kvx_type_name(h->type));
        return -1;
    }
    if (h->req != req) {
        snprintf(why, whycap, "%s frame of request %llu (expected %llu)", ds41_kvx_type_name(h->type),
                 (unsigned long long)h->req, (unsigned long long)req);
        return -1;
    }
    if (h->seq != seq) {
        snprintf(why, whycap, "%s frame with sequence number %u (expected %u)", ds41_kvx_type_name(h->type), h->seq, seq);
        return -1;
    }
    return 0;
}

int ds41_kvx_parse(const uint8_t *data, size_t n, uint32_t max_payload, ds41_kvx_hdr *h, const uint8_t **payload,
                   char *why, size_t whycap) {
    *payload = NULL;
    if (n < DS41_KVX_HEADER) {
        memset(h, 0, sizeof *h);
        snprintf(why, whycap, "truncated frame: %zu bytes, the header alone is %d", n, DS41_KVX_HEADER);
        return -1;
    }
    if (ds41_kvx_decode_header(data, max_payload, h, why, whycap)) return -1;
    if (n - DS41_KVX_HEADER != h->len) {
        snprintf(why, whycap, "%s frame of %zu bytes, its header says %u + %d", ds41_kvx_type_name(h->type), n, h->len,
                 DS41_KVX_HEADER);
        return -1;
    }
    if (ds41_kvx_check_payload(h, data + DS41_KVX_HEADER, why, whycap)) return -1;
    *payload = data + DS41_KVX_HEADER;
    return 0;
}
