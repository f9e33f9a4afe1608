/* ds41 bench --routing-counts FILE (docs/distributed.md "Placement of the experts"): the
 * (token, choice) pairs the router sent to each routed expert over the bench's run, per MoE
 * layer, written as "LAYER EXPERT COUNT" lines; `ds41 inspect --ranks N --expert-map-from FILE
 * --write-expert-map MAP` turns them into a balanced --expert-map. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "dist.h"
#include "dist_pipe.h"
#include "ds41.h"
#include "forward.h"

int ds41_cli_bench_routes_check(const char *path, int spec_curve) {
    if (!path) return 0;
    if (spec_curve) {
        fprintf(stderr, "ds41 bench: --routing-counts counts the prefill and decode runs; --spec-curve runs none\n");
        return 2;
    }
    if (ds41_pipe_on()) {
        fprintf(stderr, "ds41 bench: --routing-counts counts the experts of --split experts (the default); under --split "
                        "layers each rank runs all the experts of its layers and no --expert-map applies\n");
        return 2;
    }
    return 0;
}

int ds41_cli_bench_routes_start(ds41_engine *e, const char *path) {
    if (!path) return 0;
    if (ds41_engine_route_count_start(e)) {
        fprintf(stderr, "ds41 bench: --routing-counts: out of memory\n");
        return 1;
    }
    return 0;
}

int ds41_cli_bench_routes_write(const ds41_engine *e, const char *path, const char *dir) {
    if (!path || ds41_dist_rank() != 0) return 0;   /* every rank counted the same: rank 0 writes */
    int nl, ne;
    const unsigned long long *n = ds41_engine_route_counts(e, &nl, &ne);
    if (!n) return 0;
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "ds41 bench: --routing-counts %s: %s\n", path, strerror(errno));
        return 1;
    }
    unsigned long long total = 0;
    for (size_t i = 0; i < (size_t)nl * ne; i++) total += n[i];
    fprintf(f, "# ds41 bench routing counts of %s: (token, choice) pairs per routed expert, %llu in all\n"
               "# LAYER EXPERT COUNT   (LAYER: 0..%d the backbone's, then %d DSpark stage(s))\n"
               "# a balanced map: ds41 inspect --ranks N --expert-map-from THIS_FILE --write-expert-map MAP %s\n",
            dir, total, e->cfg->n_layers - 1, nl - e->cfg->n_layers, dir);
    for (int l = 0; l < nl; l++)
        for (int x = 0; x < ne && x < e->w->layers[l].n_experts; x++)
            fprintf(f, "%d %d %llu\n", l, x, n[(size_t)l * ne + x]);
    if (fclose(f)) {
        fprintf(stderr, "ds41 bench: --routing-counts %s: write error\n", path);
        return 1;
    }
    return 0;
}
