/* libFuzzer harness for the --expert-map parser (src/dist/dist_place.c): any byte string must
 * either apply to the placement, leaving every owner a valid rank, or fail with a one-line
 * message naming the line; never crash, leak or overflow. Build and run with `make fuzz`. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ds41_placement p;
    if (ds41_placement_default(&p, 3, 5, 8)) abort();
    char err[256];
    memset(err, 0, sizeof err);
    if (ds41_placement_parse(&p, (const char *)data, size, "map", err, sizeof err) != 0) {
        if (!memchr(err, 0, sizeof err) || strchr(err, '\n') || strncmp(err, "map:", 4)) abort();
    }
    for (int i = 0; i < 5 * 8; i++)
        if (p.owner[i] < 0 || p.owner[i] >= 3) abort();
    ds41_placement_free(&p);
    return 0;
}
