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
 * when a step looks up a row twice, plus a 32-byte header per message and step. */
#include "cli_inspect_ranks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "contract.h"

typedef struct rank_acc {
    const ds41_placement *p;
    int n;
    unsigned long long *experts;   /* [n] routed-expert bytes per rank */
    unsigned long long replicated, engram, expert_total;
} rank_acc;

static int acc_cb(const ds41_tensor_spec *t, void *ctx) {
    rank_acc *a = ctx;
    if (t->optional) return 0;
    unsigned long long b = ds41_spec_nbytes(t);
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

int ds41_cli_inspect_ranks(const ds41_config *c, const ds41_budgets *bud, int n, const char *map, json_t **json) {
    ds41_placement p;
    int nl = c->n_layers + c->n_mtp, ne = c->n_routed_experts > c->dspark_n_experts ? c->n_routed_experts : c->dspark_n_experts;
    char err[512];
    if (ds41_placement_default(&p, n, nl, ne)) { fprintf(stderr, "ds41 inspect: out of memory\n"); return 1; }
    if (map && ds41_placement_load(&p, map, err, sizeof err)) {
        fprintf(stderr, "ds41 inspect: %s\n", err);
        ds41_placement_free(&p);
        return 1;
    }
    rank_acc a = { &p, n, calloc((size_t)n, sizeof(unsigned long long)), 0, 0, 0 };
    if (!a.experts) { ds41_placement_free(&p); fprintf(stderr, "ds41 inspect: out of memory\n"); return 1; }
    ds41_contract_each(c, NULL, acc_cb, &a);
    /* per token: a MoE layer's k outputs each go to N - 1 ranks */
    double row = (double)c->dim * 4.0;
    double moe_tok = (double)c->n_active_experts * row * (n - 1), ds_tok = (double)c->dspark_n_active * row * (n - 1);
    double step_tok = moe_tok * c->n_layers;
    /* this rank's rows of every Engram table */
    int eg_cols = (c->engram_max_ngram - 1) * c->engram_n_heads, eg_rb = c->engram_head_dim + c->engram_head_dim / 32;
    unsigned long long *eg = calloc((size_t)n, sizeof *eg);
    if (!eg) { free(a.experts); ds41_placement_free(&p); fprintf(stderr, "ds41 inspect: out of memory\n"); return 1; }
    for (int t = 0; t < c->n_engram_layers; t++)
        for (int r = 0; r < n; r++) {
            int64_t lo, hi;
            ds41_dist_engram_range(c->engram_num_embeddings[t], r, n, &lo, &hi);
            eg[r] += (unsigned long long)(hi - lo) * (unsigned long long)eg_rb;
        }
    double eg_tok = (double)c->n_engram_layers * eg_cols * eg_rb * (n - 1);
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
            json_array_append_new(per, e);
        }
        json_object_set_new(o, "ranks", json_integer(n));
        json_object_set_new(o, "placement", json_string(map ? map : "default: expert e on rank e mod N"));
        json_object_set_new(o, "replicated_bytes", json_integer((json_int_t)a.replicated));
        json_object_set_new(o, "engram_bytes", json_integer((json_int_t)a.engram));
        json_object_set_new(o, "engram_sharded", json_true());
        json_object_set_new(o, "kv_bytes_per_token_per_rank", json_real(bud->global_kv_bytes_per_token));
        json_object_set_new(o, "swa_ring_bytes_per_sequence_per_rank", json_integer(bud->swa_ring_bytes));
        json_object_set_new(o, "per_rank", per);
        json_object_set_new(o, "exchange_bytes_per_token_per_moe_layer", json_real(moe_tok));
        json_object_set_new(o, "exchange_bytes_per_token_per_dspark_stage", json_real(ds_tok));
        json_object_set_new(o, "exchange_bytes_per_token_per_forward", json_real(step_tok));
        json_object_set_new(o, "engram_exchange_bytes_per_token", json_real(eg_tok));
        json_object_set_new(o, "engram_exchange_bytes_per_token_per_rank", json_real(eg_tok / n));
        *json = o;
    } else {
        printf("\nranks: %d (mpiexec -n %d; placement %s)\n", n, n, map ? map : "default, expert e on rank e mod N");
        printf("  replicated weights         %llu B on every rank (attention, shared experts, norms, router, embeddings, head)\n",
               a.replicated);
        printf("  Engram tables              %llu B in all, sharded by rows (rank r: the r-th 1/N of each table's rows)\n",
               a.engram);
        for (int r = 0; r < n; r++)
            printf("  rank %-3d routed experts    %llu B, Engram rows %llu B, weights in all %llu B\n", r, a.experts[r],
                   eg[r], a.experts[r] + a.replicated + eg[r]);
        printf("  routed experts in all      %llu B (per rank %llu .. %llu)\n", a.expert_total, mn, mx);
        printf("  KV per token per rank      %g B (attention replicated: every rank holds every sequence)\n",
               bud->global_kv_bytes_per_token);
        printf("  exchange per token         %.0f B per MoE layer (%d outputs x %d B x %d peers), %.0f B per forward"
               " (%d layers); DSpark stage %.0f B\n", moe_tok, c->n_active_experts, (int)row, n - 1, step_tok, c->n_layers,
               ds_tok);
        printf("  Engram exchange per token  %.0f B on the wire (%d layers x %d rows x %d B x %d peers), %.0f B sent per "
               "rank; a row looked up twice in a step travels once\n", eg_tok, c->n_engram_layers, eg_cols, eg_rb, n - 1,
               eg_tok / n);
    }
    free(a.experts);
    free(eg);
    ds41_placement_free(&p);
    return 0;
}
