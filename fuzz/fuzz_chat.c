/* libFuzzer harness for the chat JSON parser and the V4.1 prompt renderer (src/text/chat*.c).
 * Each input is parsed as a conversation file; a rejected input must come with a one-line
 * message. An accepted one is rendered in chat and thinking mode with and without dropped
 * reasoning: rendering either succeeds with a NUL-terminated text of the reported length that
 * starts with the BOS, or fails with a one-line message. Violations abort. */
#include "chat.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_msg(const ds41_err *err) {
    if (!err->msg[0] || strchr(err->msg, '\n')) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ds41_chat c;
    ds41_chat_init(&c);
    ds41_chat_options o;
    ds41_chat_options_init(&o);
    ds41_err err;
    err.msg[0] = 0;
    if (ds41_chat_parse_json((const char *)data, size, "fuzz", &c, &o, &err)) {
        check_msg(&err);
        ds41_chat_free(&c);
        return 0;
    }
    for (int v = 0; v < 4; v++) {
        ds41_chat_options r = o;
        r.thinking = v & 1;
        r.drop_thinking = !(v & 2);
        char *out = NULL;
        size_t len = 0;
        err.msg[0] = 0;
        if (ds41_chat_render(&c, &r, &out, &len, &err)) {
            if (out) abort();
            check_msg(&err);
            continue;
        }
        if (!out || strlen(out) != len) abort();
        if (r.add_bos && strncmp(out, DS41_CHAT_BOS, strlen(DS41_CHAT_BOS))) abort();
        free(out);
    }
    ds41_chat_free(&c);
    return 0;
}
