/* libFuzzer harness for the config parser (src/model/config.c): any byte string must either parse
 * into a consistent plan or fail with a one-line message; never crash, leak or overflow.
 * Build and run with `make fuzz` (clang, -fsanitize=fuzzer,address,undefined). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ds41_config c;
    ds41_err e;
    memset(&e, 0, sizeof e);
    if (ds41_config_parse((const char *)data, size, &c, &e) != 0) {
        /* messages are one line, NUL-terminated inside the buffer */
        if (!memchr(e.msg, 0, sizeof e.msg) || strchr(e.msg, '\n') || !e.msg[0]) abort();
        return 0;
    }
    /* the plan must satisfy the rules it was derived from */
    int total = c.n_layers + c.n_mtp;
    for (int i = 0; i < total; i++) {
        const ds41_layer_plan *p = &c.layers[i];
        if (p->id != i) abort();
        if (p->ratio > 0 && (p->kv_source < 0 || p->kv_source > i || p->topk_source < 0 || p->topk_source > i)) abort();
        if (p->ratio == 0 && (p->kv_source >= 0 || p->topk_source >= 0)) abort();
        if (p->n_active > p->n_experts || p->n_active < 1) abort();
    }
    /* Budgets walk the whole tensor contract (96k tensors at production size, ~10 ms); keep
     * the fuzzer fast by doing it only for small plans, where the same arithmetic runs. */
    if ((long long)total * c.n_routed_experts <= 4096) {
        ds41_budgets b;
        ds41_config_budgets(&c, &b);
        if (b.weight_bytes <= 0 || b.swa_bytes_per_token_per_layer <= 0) abort();
    }
    ds41_config_free(&c);
    return 0;
}
