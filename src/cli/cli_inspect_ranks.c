/* ds41 inspect --ranks N (docs/distributed.md): what each rank of an `mpiexec -n N` job holds
 * and what each token sends, from the config alone, so that a cluster can be sized before
 * it is bought. Weights per rank from the tensor contract: routed experts (backbone and
 * DSpark) on their owners under the placement (the default, or --expert-map), everything else
 * replicated (attention, shared experts, norms, router, embeddings, head); the Engram tables
 * sharded by rows (ds41_dist_engram_range: rank r holds a contiguous 1/N of every table's rows).
 * KV per token: replicated attention holds every sequence's cache on every rank. Exchange per
 * token and MoE layer: every (token, choice) output travels from its owner to the N - 1 other
 * ranks as FP32 (dim x 4 bytes), plus a 24-byte header per message and step. Engram exchange
 * per token: each of its rows (cols per Engram layer, head_dim E4M3 bytes + head_dim / 32
 * scales) travels from its owner to the N - 1 other ranks (every rank runs every row), fewer
 * when a step looks up a row twice, plus a 32-byte header per message and step.
 * --expert-map-from COUNTS: the placement balanced on ds41 bench's routing counts
 * (ds41_placement_balance), each rank's share of the counted (token, choice) pairs beside the
 * default's, and --write-expert-map FILE writes that placement as a map for --expert-map.
 * --dp-attention (serve's): each rank holds the KV of the sequences it owns only, and a token
 * travels to its experts' owners and back (dp_layer); Engram rows are asked of their owners by
 * the rank whose token needs them.
 * --node-bandwidth GB/s [--link Gbit/s] [--latency us]: a projection (not a measurement) of one
 * stream's decode (batch 1, --spec off, one rank per machine): per token a rank reads the
 * backbone's replicated tensors whole (attention, shared experts, norms, router, head; one row
 * of the embedding), its 1/N share of the active routed experts (k of each layer's E, at the
 * layer's mean expert size) and of the token's Engram rows, at the machine's bandwidth; sends
 * its share of the exchanges' bytes over the link; and waits the latency once per exchange (a
 * MoE layer, plus one Engram exchange per step). Not modelled: compute beyond the reads, the
 * routing's imbalance, DSpark, batches (docs/distributed.md, "Projection"). */
#include "cli_inspect_ranks.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "contract.h"

typedef struct rank_acc {
    const ds41_placement *p;
    int n;
    unsigned long long *experts;   /* [n] routed-expert bytes per rank */
    unsigned long long replicated, engram, expert_total;
    const ds41_config *c;
    double read_repl, read_expert;  /* projection: bytes a decode step reads (replicated; active routed, all ranks) */
} rank_acc;

double ds41_inspect_read_bytes(const ds41_config *c, const ds41_tensor_spec *t) {
    if (t->optional || t->layer >= c->n_layers) return 0;   /* DSpark stages: not run under --spec off */
    double b = (double)ds41_spec_nbytes(t);
    switch (t->role) {
    case DS41_ROLE_EMBED: return (double)c->dim * 2.0;   /* one BF16 row a token */
    case DS41_ROLE_ROUTED_EXPERT:
        return t->layer >= 0 && c->n_routed_experts > 0 ? b * c->n_active_experts / c->n_routed_experts : 0;
    case DS41_ROLE_ENGRAM_TABLE: return 0;   /* its rows: ds41_inspect_engram_row_bytes */
    case DS41_ROLE_DSPARK_HEAD: return 0;
    default: return b;
    }
}

double ds41_inspect_engram_row_bytes(const ds41_config *c) {
    return (double)(c->engram_max_ngram - 1) * c->engram_n_heads * (c->engram_head_dim + c->engram_head_dim / 32);
}

static int acc_cb(const ds41_tensor_spec *t, void *ctx) {
    rank_acc *a = ctx;
    if (t->optional) return 0;
    unsigned long long b = ds41_spec_nbytes(t);
    double rb = ds41_inspect_read_bytes(a->c, t);
    if (t->role == DS41_ROLE_ROUTED_EXPERT) a->read_expert += rb;
    else a->read_repl += rb;
    if (t->role == DS41_ROLE_ROUTED_EXPERT && t->expert >= 0 && t->layer >= 0 && t->layer < a->p->n_layers &&
        t->expert < a->p->n_experts) {
        a->experts[ds41_dist_owner(a->p, t->layer, t->expert)] += b;
        a->expert_total += b;
    } else if (t->role == DS41_ROLE_ENGRAM_TABLE) {
        a->engram += b;
    } else {
        a->replicated += b;
    }
    return 0;
}

/* --dp-attention: what a token sends per MoE layer l when its sequence's rank brings it to
 * the expert exchange (src/dist/dist_dp.c): its row (the normed input, FP32, with its k ids and
 * weights: (dim + 2k) x 4 B) once to each other rank that owns one of its choices (dispatch),
 * and back the output of each choice run there (dim x 4 B; combine). Expected bytes for
 * routing uniform over the layer's experts and the sequences spread evenly over the ranks,
 * under placement p; the most: every choice on another rank. Headers (16 B per message, two
 * rounds per peer and layer) are per forward, not per token. */
typedef struct dp_bytes {
    double disp, comb;          /* expected */
    double disp_max, comb_max;
} dp_bytes;

static dp_bytes dp_layer(const ds41_config *c, const ds41_placement *p, int l) {
    dp_bytes b = { 0, 0, 0, 0 };
    int E = c->layers[l].n_experts, k = c->layers[l].n_active, N = p->n_ranks;
    if (E > p->n_experts) E = p->n_experts;
    if (k > E) k = E;
    if (E <= 0 || k <= 0 || N < 2) return b;
    double rec = ((double)c->dim + 2.0 * k) * 4.0, out = (double)c->dim * 4.0;
    for (int q = 0; q < N; q++) {
        int Eq = 0;
        for (int e = 0; e < E; e++) Eq += ds41_dist_owner(p, l, e) == q;
        /* none of the k distinct choices on q: C(E - Eq, k) / C(E, k) */
        double none = 1.0;
        for (int i = 0; i < k; i++) none *= E - Eq - i > 0 ? (double)(E - Eq - i) / (double)(E - i) : 0.0;
        /* the token lives on each rank with 1 / N; on N - 1 of them q is another rank */
        b.disp += (1.0 - none) * rec * (N - 1) / N;
    }
    b.comb = k * out * (N - 1) / N;   /* a choice is on another rank than its token's: 1 - E_h / E, on average 1 - 1 / N */
    b.disp_max = (k < N - 1 ? k : N - 1) * rec;
    b.comb_max = k * out;
    return b;
}

/* The share of the counted (token, choice) pairs each rank's experts take under p, into
 * share[n]; 0 when nothing was counted. */
static int route_share(const ds41_placement *p, const unsigned long long *counts, double *share) {
    unsigned long long total = 0;
    memset(share, 0, (size_t)p->n_ranks * sizeof *share);
    for (int l = 0; l < p->n_layers; l++)
        for (int e = 0; e < p->n_experts; e++) {
            unsigned long long k = counts[(size_t)l * p->n_experts + e];
            share[ds41_dist_owner(p, l, e)] += (double)k;
            total += k;
        }
    for (int r = 0; r < p->n_ranks && total; r++) share[r] /= (double)total;
    return total > 0;
}

/* --expert-map-from: the counts into *counts, p balanced on them, share[r] / share0[r] under
 * p and under the default; writes --write-expert-map when asked (write = 1). 0, or 1 after a
 * message. */
static int from_counts(const ds41_config *c, const ds41_inspect_ranks_opts *o, ds41_placement *p, int write,
                       unsigned long long **counts, double *share, double *share0) {
    int nl = p->n_layers, ne = p->n_experts;
    char err[512];
    int *experts = malloc((size_t)nl * sizeof *experts);
    *counts = calloc((size_t)nl * (ne ? ne : 1), sizeof **counts);
    if (!experts || !*counts) {
        free(experts);
        fprintf(stderr, "ds41 inspect: out of memory\n");
        return 1;
    }
    for (int l = 0; l < nl; l++) experts[l] = c->layers[l].n_experts;
    int rc = 0;
    if (ds41_route_counts_load(p, o->counts, *counts, err, sizeof err)) {
        fprintf(stderr, "ds41 inspect: %s\n", err);
        rc = 1;
    } else if (!route_share(p, *counts, share0)) {
        fprintf(stderr, "ds41 inspect: --expert-map-from %s: no expert was counted (every COUNT is 0)\n", o->counts);
        rc = 1;
    } else {
        ds41_placement_balance(p, *counts, experts);
        route_share(p, *counts, share);
    }
    if (!rc && write && o->map_out) {
        FILE *f = fopen(o->map_out, "w");
        if (!f || ds41_placement_write(p, *counts, experts, o->counts, f)) {
            fprintf(stderr, "ds41 inspect: --write-expert-map %s: %s\n", o->map_out, f ? "write error" : strerror(errno));
            rc = 1;
        }
        if (f && fclose(f) && !rc) {
            fprintf(stderr, "ds41 inspect: --write-expert-map %s: write error\n", o->map_out);
            rc = 1;
        }
    }
    free(experts);
    return rc;
}

int ds41_cli_inspect_ranks(const ds41_config *c, const ds41_budgets *bud, const ds41_inspect_ranks_opts *opt,
                           json_t **json) {
    ds41_placement p;
    int n = opt->n, nl = c->n_layers + c->n_mtp;
    int ne = c->n_routed_experts > c->dspark_n_experts ? c->n_routed_experts : c->dspark_n_experts;
    const char *map = opt->map;
    char err[512];
    if (ds41_placement_default(&p, n, nl, ne)) { fprintf(stderr, "ds41 inspect: out of memory\n"); return 1; }
    if (map && ds41_placement_load(&p, map, err, sizeof err)) {
        fprintf(stderr, "ds41 inspect: %s\n", err);
        ds41_placement_free(&p);
        return 1;
    }
    unsigned long long *counts = NULL;
    double *share = calloc((size_t)n * 2, sizeof *share), *share0 = share ? share + n : NULL;
    if (!share || (opt->counts && from_counts(c, opt, &p, json != NULL, &counts, share, share0))) {
        if (!share) fprintf(stderr, "ds41 inspect: out of memory\n");
        free(counts);
        free(share);
        ds41_placement_free(&p);
        return 1;
    }
    char placement[600];
    if (opt->counts) snprintf(placement, sizeof placement, "balanced on the routing counts of %s", opt->counts);
    else snprintf(placement, sizeof placement, "%s", map ? map : "default, expert e on rank e mod N");
    rank_acc a = { &p, n, calloc((size_t)n, sizeof(unsigned long long)), 0, 0, 0, c, 0, 0 };
    if (!a.experts) {
        free(counts);
        free(share);
        ds41_placement_free(&p);
        fprintf(stderr, "ds41 inspect: out of memory\n");
        return 1;
    }
    ds41_contract_each(c, NULL, acc_cb, &a);
    /* per token: a MoE layer's k outputs each go to N - 1 ranks */
    double row = (double)c->dim * 4.0;
    double moe_tok = (double)c->n_active_experts * row * (n - 1), ds_tok = (double)c->dspark_n_active * row * (n - 1);
    double step_tok = moe_tok * c->n_layers;
    /* this rank's rows of every Engram table */
    int eg_cols = (c->engram_max_ngram - 1) * c->engram_n_heads, eg_rb = c->engram_head_dim + c->engram_head_dim / 32;
    unsigned long long *eg = calloc((size_t)n, sizeof *eg);
    if (!eg) {
        free(a.experts);
        free(counts);
        free(share);
        ds41_placement_free(&p);
        fprintf(stderr, "ds41 inspect: out of memory\n");
        return 1;
    }
    for (int t = 0; t < c->n_engram_layers; t++)
        for (int r = 0; r < n; r++) {
            int64_t lo, hi;
            ds41_dist_engram_range(c->engram_num_embeddings[t], r, n, &lo, &hi);
            eg[r] += (unsigned long long)(hi - lo) * (unsigned long long)eg_rb;
        }
    double eg_tok = (double)c->n_engram_layers * eg_cols * eg_rb * (n - 1);
    /* --dp-attention: the expert exchange per token (per layer: the mean over the backbone's
     * MoE layers; per forward: their sum), and the Engram rows a token needs that another rank
     * holds ((N - 1) / N of them), each sent once by its owner after an 8-byte key asked it */
    dp_bytes dpl = { 0, 0, 0, 0 }, dps = { 0, 0, 0, 0 };
    int dpn = 0;
    for (int l = 0; opt->dp && l < c->n_layers; l++) {
        dp_bytes b = dp_layer(c, &p, l);
        if (b.comb_max <= 0) continue;
        dpl.disp += b.disp; dpl.comb += b.comb;
        if (b.disp_max > dpl.disp_max) dpl.disp_max = b.disp_max;
        if (b.comb_max > dpl.comb_max) dpl.comb_max = b.comb_max;
        dpn++;
    }
    if (opt->dp && c->n_mtp > 0) dps = dp_layer(c, &p, c->n_layers);
    double dp_fwd = dpl.disp + dpl.comb, dp_layer_mean = dpn ? dp_fwd / dpn : 0;
    if (opt->dp) eg_tok = (double)c->n_engram_layers * eg_cols * (eg_rb + 8.0) * (n - 1) / n;
    /* the projection (opt->node_gbps > 0): per rank and token */
    double pr_read = a.read_repl + a.read_expert / n + c->n_engram_layers * ds41_inspect_engram_row_bytes(c) / n;
    double pr_wire = (opt->dp ? dp_fwd + eg_tok : step_tok + eg_tok) / n;   /* bytes each rank sends (and receives) */
    int pr_x = n > 1 ? c->n_layers + (c->n_engram_layers > 0) : 0;
    double link = opt->link_gbits, lat = opt->latency_us;
    double pr_mem_ms = opt->node_gbps > 0 ? pr_read / (opt->node_gbps * 1e9) * 1e3 : 0;
    double pr_wire_ms = pr_wire / (link * 1e9 / 8) * 1e3, pr_lat_ms = pr_x * lat * 1e-3;
    double pr_ms = pr_mem_ms + pr_wire_ms + pr_lat_ms;
    unsigned long long mn = a.experts[0], mx = a.experts[0];
    for (int r = 1; r < n; r++) {
        if (a.experts[r] < mn) mn = a.experts[r];
        if (a.experts[r] > mx) mx = a.experts[r];
    }
    if (json) {
        json_t *o = json_object(), *per = json_array();
        for (int r = 0; r < n; r++) {
            json_t *e = json_object();
            json_object_set_new(e, "rank", json_integer(r));
            json_object_set_new(e, "expert_bytes", json_integer((json_int_t)a.experts[r]));
            json_object_set_new(e, "engram_bytes", json_integer((json_int_t)eg[r]));
            json_object_set_new(e, "weight_bytes", json_integer((json_int_t)(a.experts[r] + a.replicated + eg[r])));
            if (counts) {
                json_object_set_new(e, "routed_share", json_real(share[r]));
                json_object_set_new(e, "routed_share_default", json_real(share0[r]));
            }
            json_array_append_new(per, e);
        }
        json_object_set_new(o, "ranks", json_integer(n));
        json_object_set_new(o, "placement", json_string(placement));
        json_object_set_new(o, "replicated_bytes", json_integer((json_int_t)a.replicated));
        json_object_set_new(o, "engram_bytes", json_integer((json_int_t)a.engram));
        json_object_set_new(o, "engram_sharded", json_true());
        json_object_set_new(o, "attention", json_string(opt->dp ? "data-parallel" : "replicated"));
        json_object_set_new(o, "kv_bytes_per_token_per_rank", json_real(bud->global_kv_bytes_per_token));
        /* the share of the job's sequences (and so of its KV) each rank holds */
        json_object_set_new(o, "kv_share_per_rank", json_real(opt->dp ? 1.0 / n : 1.0));
        json_object_set_new(o, "swa_ring_bytes_per_sequence_per_rank", json_integer(bud->swa_ring_bytes));
        json_object_set_new(o, "per_rank", per);
        json_object_set_new(o, "exchange_bytes_per_token_per_moe_layer", json_real(opt->dp ? dp_layer_mean : moe_tok));
        json_object_set_new(o, "exchange_bytes_per_token_per_dspark_stage", json_real(opt->dp ? dps.disp + dps.comb : ds_tok));
        json_object_set_new(o, "exchange_bytes_per_token_per_forward", json_real(opt->dp ? dp_fwd : step_tok));
        json_object_set_new(o, "dispatch_bytes_per_token_per_moe_layer", json_real(opt->dp && dpn ? dpl.disp / dpn : 0));
        json_object_set_new(o, "combine_bytes_per_token_per_moe_layer", json_real(opt->dp && dpn ? dpl.comb / dpn : moe_tok));
        if (opt->dp) {
            json_object_set_new(o, "dispatch_bytes_per_token_per_moe_layer_max", json_real(dpl.disp_max));
            json_object_set_new(o, "combine_bytes_per_token_per_moe_layer_max", json_real(dpl.comb_max));
        }
        json_object_set_new(o, "engram_exchange_bytes_per_token", json_real(eg_tok));
        json_object_set_new(o, "engram_exchange_bytes_per_token_per_rank", json_real(eg_tok / n));
        if (opt->node_gbps > 0) {
            json_t *q = json_object();
            json_object_set_new(q, "node_bandwidth_gbps", json_real(opt->node_gbps));
            json_object_set_new(q, "link_gbits", json_real(link));
            json_object_set_new(q, "latency_us", json_real(lat));
            json_object_set_new(q, "read_bytes_per_token_per_rank", json_real(pr_read));
            json_object_set_new(q, "wire_bytes_per_token_per_rank", json_real(pr_wire));
            json_object_set_new(q, "exchanges_per_token", json_integer(pr_x));
            json_object_set_new(q, "memory_ms", json_real(pr_mem_ms));
            json_object_set_new(q, "wire_ms", json_real(pr_wire_ms));
            json_object_set_new(q, "latency_ms", json_real(pr_lat_ms));
            json_object_set_new(q, "ms_per_token", json_real(pr_ms));
            json_object_set_new(q, "tokens_per_second", json_real(1e3 / pr_ms));
            json_object_set_new(o, "projection", q);
        }
        *json = o;
    } else {
        printf("\nranks: %d (mpiexec -n %d; placement %s)\n", n, n, placement);
        printf("  replicated weights         %llu B on every rank (attention, shared experts, norms, router, embeddings, head)\n",
               a.replicated);
        printf("  Engram tables              %llu B in all, sharded by rows (rank r: the r-th 1/N of each table's rows)\n",
               a.engram);
        for (int r = 0; r < n; r++)
            printf("  rank %-3d routed experts    %llu B, Engram rows %llu B, weights in all %llu B\n", r, a.experts[r],
                   eg[r], a.experts[r] + a.replicated + eg[r]);
        for (int r = 0; r < n && counts; r++)
            printf("  rank %-3d routed load       %.1f %% of the counted (token, choice) pairs (default placement %.1f %%)\n",
                   r, 100 * share[r], 100 * share0[r]);
        if (counts && opt->map_out) printf("  expert map written to      %s (--expert-map %s)\n", opt->map_out, opt->map_out);
        printf("  routed experts in all      %llu B (per rank %llu .. %llu)\n", a.expert_total, mn, mx);
        if (!opt->dp) {
            printf("  KV per token per rank      %g B (attention replicated: every rank holds every sequence)\n",
                   bud->global_kv_bytes_per_token);
            printf("  exchange per token         %.0f B per MoE layer (%d outputs x %d B x %d peers), %.0f B per forward"
                   " (%d layers); DSpark stage %.0f B\n", moe_tok, c->n_active_experts, (int)row, n - 1, step_tok,
                   c->n_layers, ds_tok);
            printf("  Engram exchange per token  %.0f B on the wire (%d layers x %d rows x %d B x %d peers), %.0f B sent per "
                   "rank; a row looked up twice in a step travels once\n", eg_tok, c->n_engram_layers, eg_cols, eg_rb,
                   n - 1, eg_tok / n);
        } else {
            printf("  KV per token               %g B on the rank that owns the sequence only (--dp-attention: each rank "
                   "holds its 1/%d of the sequences, so 1/%d of the job's KV)\n", bud->global_kv_bytes_per_token, n, n);
            printf("  exchange per token         %.0f B per MoE layer: dispatch %.0f B (its row, %d B, to each other rank "
                   "owning one of its choices; at most %.0f) + combine %.0f B (%d B per choice run elsewhere; at most %.0f); "
                   "expected for uniform routing\n", dp_layer_mean, dpn ? dpl.disp / dpn : 0, (c->dim + 2 * c->n_active_experts) * 4,
                   dpl.disp_max, dpn ? dpl.comb / dpn : 0, (int)row, dpl.comb_max);
            printf("                             %.0f B per forward (%d MoE layers); DSpark stage %.0f B\n", dp_fwd, dpn,
                   dps.disp + dps.comb);
            printf("  Engram exchange per token  %.0f B (%d layers x %d rows x (%d B + an 8-byte key) x %d/%d held by "
                   "another rank), asked of their owners by the token's rank\n", eg_tok, c->n_engram_layers, eg_cols,
                   eg_rb, n - 1, n);
        }
    }
    if (!json && opt->node_gbps > 0) {
        printf("  projection (not a measurement): decode of one stream, one rank per machine, --spec off\n");
        printf("    memory   %.3f GB a token per rank (replicated %.3f GB, its share of the active experts %.3f GB,"
               " of the Engram rows %.0f B) at %g GB/s = %.2f ms\n", pr_read / 1e9, a.read_repl / 1e9,
               a.read_expert / n / 1e9, (double)c->n_engram_layers * eg_cols * eg_rb / n, opt->node_gbps, pr_mem_ms);
        printf("    wire     %.0f B a token per rank at %g Gbit/s = %.3f ms\n", pr_wire, link, pr_wire_ms);
        printf("    latency  %d exchanges a token x %g us = %.3f ms\n", pr_x, lat, pr_lat_ms);
        printf("    total    %.2f ms a token: %.2f tok/s (not modelled: compute beyond the reads, routing imbalance, "
               "DSpark, batches)\n", pr_ms, 1e3 / pr_ms);
    }
    free(a.experts);
    free(eg);
    free(counts);
    free(share);
    ds41_placement_free(&p);
    return 0;
}
