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

#include "cli_inspect_ranks.h"
#include "contract.h"
#include "dist_stage.h"

#define DS41_INSPECT_CUT_CTX 65536

typedef struct stage_read {
    const ds41_config *c;
    const int *first;
    int n;
    double *read;   /* [n] bytes a decode step reads per token on each stage */
} stage_read;

/* the stage of a tensor: its layer's, the embedding the first, the head and final norm the last */
static int read_cb(const ds41_tensor_spec *t, void *ctx) {
    stage_read *a = ctx;
    double b = ds41_inspect_read_bytes(a->c, t);
    if (b <= 0) return 0;
    int s = t->layer < 0 ? (t->role == DS41_ROLE_EMBED ? 0 : a->n - 1) : 0;
    while (t->layer >= 0 && s + 1 < a->n && t->layer >= a->first[s + 1]) s++;
    a->read[s] += b;
    return 0;
}

int ds41_cli_inspect_stages(const ds41_config *c, int n, const char *map, json_t **json) {
    return ds41_cli_inspect_stages_proj(c, n, map, 0, 0, 0, json);
}

int ds41_cli_inspect_stages_proj(const ds41_config *c, int n, const char *map, double node_gbps, double link_gbits,
                                 double latency_us, json_t **json) {
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
    /* the projection: a step's stages in turn, then the hops and the sampled token on the link */
    double *rd = node_gbps > 0 ? calloc((size_t)n, sizeof *rd) : NULL;
    double pr_read = 0, pr_mem = 0, pr_wire = 0, pr_lat = 0, pr_ms = 0, busiest = 0;
    int busiest_r = 0;
    if (node_gbps > 0 && !rd) {
        free(first); free(bytes);
        fprintf(stderr, "ds41 inspect: out of memory\n");
        return 1;
    }
    if (rd) {
        stage_read a = { c, first, n, rd };
        ds41_contract_each(c, NULL, read_cb, &a);
        for (int l = 0; l < c->n_engram_layers; l++) {   /* a token's Engram rows, on their layer's stage */
            int s = 0;
            while (s + 1 < n && c->engram_layers[l] >= first[s + 1]) s++;
            rd[s] += ds41_inspect_engram_row_bytes(c);
        }
        double link = link_gbits * 1e9 / 8;
        for (int r = 0; r < n; r++) {
            double hop_b = 0;
            if (r + 1 < n) {
                ds41_cut_bytes cb;
                ds41_stage_cut_bytes(c, first[r + 1], DS41_INSPECT_CUT_CTX, &cb);
                hop_b = cb.total + 32;   /* the message's header */
            } else if (n > 1) {
                hop_b = token / (n - 1);   /* the sampled token, to each other rank at once */
            }
            double t_mem = rd[r] / (node_gbps * 1e9) * 1e3, t_wire = hop_b / link * 1e3, t_lat = n > 1 ? latency_us * 1e-3 : 0;
            pr_read += rd[r];
            pr_mem += t_mem;
            pr_wire += t_wire;
            pr_lat += t_lat;
            if (t_mem + t_wire + t_lat > busiest) { busiest = t_mem + t_wire + t_lat; busiest_r = r; }
        }
        pr_ms = pr_mem + pr_wire + pr_lat;
    }
    if (json) {
        json_t *o = json_object();
        if (rd) {
            json_t *q = json_object(), *ps = json_array();
            for (int r = 0; r < n; r++) json_array_append_new(ps, json_real(rd[r]));
            json_object_set_new(q, "node_bandwidth_gbps", json_real(node_gbps));
            json_object_set_new(q, "link_gbits", json_real(link_gbits));
            json_object_set_new(q, "latency_us", json_real(latency_us));
            json_object_set_new(q, "read_bytes_per_token", json_real(pr_read));
            json_object_set_new(q, "read_bytes_per_token_per_stage", ps);
            json_object_set_new(q, "memory_ms", json_real(pr_mem));
            json_object_set_new(q, "wire_ms", json_real(pr_wire));
            json_object_set_new(q, "latency_ms", json_real(pr_lat));
            json_object_set_new(q, "ms_per_token", json_real(pr_ms));
            json_object_set_new(q, "tokens_per_second", json_real(1e3 / pr_ms));
            json_object_set_new(q, "busiest_stage", json_integer(busiest_r));
            json_object_set_new(q, "busiest_stage_ms", json_real(busiest));
            json_object_set_new(q, "pipelined_tokens_per_second", json_real(1e3 / busiest));
            json_object_set_new(o, "projection", q);
        }
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
        if (rd) {
            printf("  projection (not a measurement): decode, one rank per machine, --spec off; a stream's step runs the "
                   "stages in turn\n");
            printf("    memory   %.3f GB a token in all (stages", pr_read / 1e9);
            for (int r = 0; r < n; r++) printf("%s %.3f", r ? "," : "", rd[r] / 1e9);
            printf(" GB) at %g GB/s = %.2f ms\n", node_gbps, pr_mem);
            printf("    wire     %d hop%s and the sampled token at %g Gbit/s = %.3f ms; latency %d x %g us = %.3f ms\n",
                   n - 1, n == 2 ? "" : "s", link_gbits, pr_wire, n > 1 ? n : 0, latency_us, pr_lat);
            printf("    total    %.2f ms a token: %.2f tok/s for one stream; with a stream per stage in flight (serve) "
                   "at most %.2f tok/s (stage %d, the busiest, %.2f ms)\n", pr_ms, 1e3 / pr_ms, 1e3 / busiest, busiest_r,
                   busiest);
        }
    }
    free(rd);
    free(first);
    free(bytes);
    return 0;
}
