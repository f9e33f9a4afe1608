/* ds41 inspect --ranks N --split layers (docs/distributed.md): what each stage of an
 * `mpiexec -n N ... --split layers` job holds and what each token moves, from the config
 * alone. Stage r holds its layers' weights (routed experts and Engram tables included), the
 * first stage the embedding, the last the final norm, head and DSpark stages (dist_stage.h).
 * KV per token: the KV sources inside a stage hold compressed entries there, and a stage that
 * starts at a layer that is not a KV source also keeps a replica of each earlier source its
 * layers read; the SWA rings of its layers. Per token and hop: one row of the residual stream
 * (hc x dim FP32 and the hc pre-mix weights) plus a 32-byte header per message and step, and
 * at a cut that is not a KV source what crosses beside it (dist_stage.h ds41_stage_cut_bytes:
 * the source's new entries, top-k lists, candidate pool; given for a decode step at a context
 * of DS41_INSPECT_CUT_CTX tokens, the lists and pool growing with the context); after the last stage
 * the sampled token (4 B and the header) goes to each of the N - 1 other ranks (run, chat,
 * bench), or in serve the logits row (vocab x 4 B and the header) to rank 0, which samples. */
#include "cli_inspect_stages.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist_stage.h"

#define DS41_INSPECT_CUT_CTX 65536

int ds41_cli_inspect_stages(const ds41_config *c, int n, const char *map, json_t **json) {
    int *first = calloc((size_t)n + 1, sizeof *first);
    unsigned long long *bytes = calloc((size_t)n, sizeof *bytes);
    char err[512];
    if (!first || !bytes) {
        free(first); free(bytes);
        fprintf(stderr, "ds41 inspect: out of memory\n");
        return 1;
    }
    if (n == 1) first[1] = c->n_layers;
    else if (map ? ds41_stage_parse(c, n, map, strlen(map), first, err, sizeof err) : ds41_stage_default(c, n, first, err, sizeof err)) {
        fprintf(stderr, "ds41 inspect: %s\n", err);
        free(first); free(bytes);
        return 1;
    }
    ds41_stage_bytes(c, n, first, bytes);
    long long main_entry = c->head_dim / 2 + c->head_dim / 16, index_entry = c->index_head_dim / 2 + c->index_head_dim / 32;
    long long swa_entry = c->head_dim + c->head_dim / 32;
    double hop = (double)ds41_stage_row_bytes(c), token = (4.0 + 32.0) * (n - 1), logits = c->vocab_size * 4.0 + 32.0;
    json_t *per = json ? json_array() : NULL;
    if (!json)
        printf("\nranks: %d (mpiexec -n %d --split layers; stages %s%s)\n", n, n,
               map ? map : "default, balancing weight bytes; at KV sources unless other cuts make the largest stage ",
               map ? "" : DS41_STAGE_FINER_PCT_TEXT " smaller");
    for (int r = 0; r < n; r++) {
        double kv = 0, replica = 0;
        for (int l = first[r]; l < first[r + 1]; l++)
            if (c->layers[l].is_kv_source) kv += (double)(main_entry + index_entry) / c->layers[l].ratio;
        ds41_cut_need nd;
        char rep[160] = "";
        if (r > 0 && ds41_stage_cut_needs(c, first[r], &nd))
            for (int i = 0; i < c->n_kv_sources; i++)
                if (nd.stores[i]) {
                    int src = c->kv_sources[i];
                    replica += (double)(main_entry + index_entry) / c->layers[src].ratio;
                    size_t k = strlen(rep);
                    snprintf(rep + k, sizeof rep - k, "%s%d", k ? ", " : " of layer ", src);
                }
        long long swa = (long long)(first[r + 1] - first[r]) * c->window * swa_entry;
        if (json) {
            json_t *e = json_object();
            json_object_set_new(e, "rank", json_integer(r));
            json_object_set_new(e, "first_layer", json_integer(first[r]));
            json_object_set_new(e, "last_layer", json_integer(first[r + 1] - 1));
            json_object_set_new(e, "weight_bytes", json_integer((json_int_t)bytes[r]));
            json_object_set_new(e, "kv_bytes_per_token", json_real(kv + replica));
            json_object_set_new(e, "replica_kv_bytes_per_token", json_real(replica));
            json_object_set_new(e, "swa_ring_bytes_per_sequence", json_integer(swa));
            json_array_append_new(per, e);
        } else {
            printf("  rank %-3d layers %d..%d%s%s: weights %llu B, KV %g B per token", r, first[r], first[r + 1] - 1,
                   r == 0 ? " + embedding" : "", r == n - 1 ? " + head" : "", bytes[r], kv + replica);
            if (rep[0]) printf(" (%g B of it the replica%s)", replica, rep);
            printf(", SWA rings %lld B per sequence\n", swa);
        }
    }
    /* per hop: the cut in front of each stage but the first */
    json_t *hops = json ? json_array() : NULL;
    for (int r = 1; r < n; r++) {
        ds41_cut_bytes cb;
        ds41_stage_cut_bytes(c, first[r], DS41_INSPECT_CUT_CTX, &cb);
        if (json) {
            json_t *e = json_object();
            json_object_set_new(e, "layer", json_integer(first[r]));
            json_object_set_new(e, "kv_source", json_boolean(c->layers[first[r]].is_kv_source));
            json_object_set_new(e, "stream_bytes_per_token", json_real(cb.stream));
            json_object_set_new(e, "kv_entry_bytes_per_token", json_real(cb.entries));
            json_object_set_new(e, "topk_bytes_per_token", json_real(cb.topk));
            json_object_set_new(e, "pool_bytes_per_token", json_real(cb.pool));
            json_object_set_new(e, "bytes_per_token", json_real(cb.total));
            json_object_set_new(e, "context", json_integer(DS41_INSPECT_CUT_CTX));
            json_array_append_new(hops, e);
        } else {
            printf("  hop into layer %-3d %.0f B per token (stream %.0f", first[r], cb.total, cb.stream);
            if (cb.entries > 0) printf(", KV entries %g", cb.entries);
            if (cb.topk > 0) printf(", top-k lists %.0f", cb.topk);
            if (cb.pool > 0) printf(", candidate pool %.0f", cb.pool);
            printf(")%s\n", c->layers[first[r]].is_kv_source ? "; a KV source: the stream alone"
                                                             : "; a decode step at 65536 tokens of context");
        }
    }
    if (json) {
        json_t *o = json_object();
        json_object_set_new(o, "ranks", json_integer(n));
        json_object_set_new(o, "split", json_string("layers"));
        json_object_set_new(o, "stages", json_string(map ? map : "default"));
        json_object_set_new(o, "per_rank", per);
        json_object_set_new(o, "hop_bytes_per_token", json_real(hop));
        json_object_set_new(o, "per_hop", hops);
        json_object_set_new(o, "hops", json_integer(n - 1));
        json_object_set_new(o, "token_bytes_per_token", json_real(token));
        json_object_set_new(o, "serve_logits_bytes_per_token", json_real(logits));
        *json = o;
    } else {
        printf("  per token and hop          %.0f B (%d x (%d + 1) x 4 B: the stream and its pre-mix weights), %d hop%s;"
               " a step sends the rows the next stage's first layer reads (a KV source: every prompt row)\n", hop, c->hc_mult, c->dim, n - 1,
               n == 2 ? "" : "s");
        printf("  sampled token              %.0f B per token (4 B and a 32-byte header from the last stage to %d other "
               "rank%s); serve: the logits, %.0f B per token (%d x 4 B and the header) to rank 0, which samples\n", token,
               n - 1, n == 2 ? "" : "s", logits, c->vocab_size);
    }
    free(first);
    free(bytes);
    return 0;
}
