/* libFuzzer harness for the --layer-map parser (src/dist/dist_stage.c): any byte string must
 * either give 3 contiguous stages of an 8-layer plan, each later one starting at a layer 1..5
 * (demo's DSpark targets are 5-7: the last stage holds them), or
 * fail with a one-line message that starts with "--layer-map:"; never crash, leak or
 * overflow. Build and run with `make fuzz`. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dist_stage.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* demo's plan: KV sources 2 and 4, candidate pool from 4, read by the index source 6,
     * DSpark targets 5-7 */
    ds41_layer_plan lp[8];
    memset(lp, 0, sizeof lp);
    ds41_config c;
    memset(&c, 0, sizeof c);
    c.n_layers = 8;
    c.layers = lp;
    c.n_kv_sources = 2;
    c.kv_sources[0] = 2;
    c.kv_sources[1] = 4;
    c.candidate_source = 4;
    lp[2].is_kv_source = lp[4].is_kv_source = 1;
    lp[6].uses_candidates = 1;
    c.n_mtp = 1;
    c.n_dspark_targets = 3;
    c.dspark_targets[0] = 5, c.dspark_targets[1] = 6, c.dspark_targets[2] = 7;
    int first[4] = { -1, -1, -1, -1 };
    char err[512];
    memset(err, 0, sizeof err);
    if (ds41_stage_parse(&c, 3, (const char *)data, size, first, err, sizeof err) != 0) {
        if (!memchr(err, 0, sizeof err) || strchr(err, '\n') || strncmp(err, "--layer-map:", 12)) abort();
        return 0;
    }
    if (first[0] != 0 || first[3] != 8) abort();
    for (int r = 1; r < 3; r++)
        if (first[r] <= first[r - 1] || first[r] > 5) abort();
    return 0;
}
