/* ds41 inspect: config summary, layer plan, tensor statistics and byte budgets of a
 * checkpoint directory (or of a directory / file holding only config.json). */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "config.h"
#include "contract.h"
#include "model.h"
#include "safetensors.h"
#include "cli_inspect_ranks.h"
#include "cli_inspect_stages.h"
#include "dist_pipe.h"
#include "cli_args.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: ds41 inspect [--json] [--role prefill|decode [--pd-decoder prefill|decode]]\n"
            "       [--ranks N [--dp-attention] [--expert-map FILE | --expert-map-from COUNTS [--write-expert-map FILE]\n"
            "                   | --split layers [--layer-map RANGES]]\n"
            "                  [--node-bandwidth GB/s [--link Gbit/s] [--latency us]]] PATH\n"
            "\n"
            "PATH is a checkpoint directory (config.json plus safetensors: one file or a sharded\n"
            "model.safetensors.index.json), a directory holding only config.json, or a config.json file.\n"
            "Prints the config summary, the layer plan, tensor statistics (when tensors are present) and\n"
            "the budgets: global KV bytes per token, SWA bytes, bounded per-sequence state, weight bytes,\n"
            "parameters (total, active per token for decode and prefill).\n"
            "\n"
            "  --json      one JSON object on stdout instead of the text report\n"
            "  --role R    only the weight bytes a prefill or decode node of a disaggregated deployment\n"
            "              holds resident (docs/pd.md): prefill = what the KV-only prefill reads\n"
            "  --pd-decoder D  with --role prefill: where the decoder layers run (serve --pd-decoder):\n"
            "              prefill (default, the decoder's rings ship) or decode (the stream at the first\n"
            "              decoder layer ships; the prefill node reads no decoder weight)\n"
            "  --ranks N   the bytes each rank of an `mpiexec -n N` job holds (replicated weights, its\n"
            "              routed experts under the default placement or --expert-map FILE, Engram, KV per\n"
            "              token) and the bytes each token sends per layer (docs/distributed.md); with --split\n"
            "              layers: each stage's layers and bytes, and the bytes per token and hop\n"
            "  --expert-map-from COUNTS  with --ranks: the placement balanced on the routing counts of\n"
            "              `ds41 bench --routing-counts COUNTS` (per layer the hottest experts spread, every\n"
            "              rank an equal number of them) and each rank's share of the counted load\n"
            "  --write-expert-map FILE   writes that placement as an --expert-map FILE for mpiexec -n N\n"
            "  --dp-attention  with --ranks: sizing for serve --dp-attention: each rank holds the KV of\n"
            "              its own sequences (1/N of them), and a token's row goes to its experts' owners\n"
            "              and back (dispatch + combine per MoE layer, expected and at most)\n"
            "  --node-bandwidth GB/s  with --ranks: adds a projection of one stream's decode, one rank per\n"
            "              machine: the bytes a rank reads a token at this memory bandwidth (measure yours:\n"
            "              the probe of `ds41 bench --profile`), the bytes it sends at --link Gbit/s (default\n"
            "              100) and --latency us per exchange (default 20); with --split layers the stages in\n"
            "              turn, and the rate with a stream per stage in flight\n"
            "  -h, --help  this help\n"
            "\n"
            "Exit status: 0 ok; 1 bad config, unreadable checkpoint or a missing/misshaped tensor\n"
            "(one line on stderr naming it); 2 bad usage.\n");
}

/* ------------------------------------------------------------------------------------------ */

typedef struct dtype_stat { size_t count; uint64_t bytes; } dtype_stat;

typedef struct report {
    const char *path;
    ds41_config cfg;
    ds41_budgets bud;
    double params_backbone, params_engram_tables, params_dspark;
    size_t contract_tensors;
    /* tensors (has_tensors) */
    int has_tensors;
    ds41_st *st;
    ds41_check_stats chk;
    dtype_stat by_dtype[DS41_DT_COUNT];
    size_t n_tensors;
    uint64_t tensor_bytes;
    json_t *ranks;          /* --ranks N --json: the "ranks" object, or NULL */
} report;

static int param_cb(const ds41_tensor_spec *t, void *ctx) {
    report *r = ctx;
    if (t->optional) return 0;
    r->contract_tensors++;
    double p = (double)ds41_spec_params(t);
    if (t->role == DS41_ROLE_ENGRAM_TABLE) r->params_engram_tables += p;
    else if (t->layer >= r->cfg.n_layers) r->params_dspark += p;
    else r->params_backbone += p;
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * --role (docs/pd.md): the weights a prefill node reads. With --pd-decoder decode it stops at
 * the first decoder layer's keys (the last KV source: its KV path only, as the last layer's
 * below) and reads no later layer. Its prefill (CED, no logits) runs the
 * embedding, the encoder on every row and the decoder layers on the rows their windows reach
 * (the resume state it ships is every layer's SWA ring), and of the last layer only what its
 * ring needs: the mHC attention mix, the attention norm and the SWA key projection (with a
 * compressor and index-K projection where that layer has them). No query or output projection
 * of that layer, no FFN, no head, no DSpark stage (the decode node seeds those rings from the
 * shipped context rows). A decode node holds everything (it prefills locally when a prefill
 * node fails). */
static const char *human_bytes(double v, char *buf, size_t cap);

typedef struct role_acc { int prefill, last; uint64_t bytes, total; size_t tensors; } role_acc;

static int prefill_reads(const ds41_tensor_spec *t, int last) {
    if (t->role == DS41_ROLE_EMBED) return 1;
    if (t->layer < 0 || t->layer > last) return 0;
    if (t->layer < last) return 1;
    static const char *kv_path[] = { "hc_attn_", "attn_norm.", "attn.wkv.", "attn.kv_norm.", "attn.compressor.",
                                     "attn.indexer.wk.", "attn.indexer.k_norm.", ".engram." };
    for (size_t i = 0; i < sizeof kv_path / sizeof kv_path[0]; i++)
        if (strstr(t->name, kv_path[i])) return 1;
    return 0;
}

static int role_cb(const ds41_tensor_spec *t, void *ctx) {
    role_acc *a = ctx;
    if (t->optional) return 0;
    uint64_t b = ds41_spec_nbytes(t);
    a->total += b;
    if (!a->prefill || prefill_reads(t, a->last)) { a->bytes += b; a->tensors++; }
    return 0;
}

static int print_role(const char *path, const char *role, int decoder_on_decode) {
    ds41_config cfg;
    ds41_err err;
    if (ds41_config_load(path, &cfg, &err)) { fprintf(stderr, "ds41 inspect: %s\n", err.msg); return 1; }
    role_acc a = { .prefill = !strcmp(role, "prefill"), .last = cfg.n_layers - 1 };
    if (decoder_on_decode) a.last = cfg.first_decoder_layer;
    ds41_contract_each(&cfg, NULL, role_cb, &a);
    char b1[32], b2[32];
    printf("role %s: %zu tensors, %llu bytes (%s) resident of %llu (%s), %.1f%%\n", role, a.tensors,
           (unsigned long long)a.bytes, human_bytes((double)a.bytes, b1, sizeof b1), (unsigned long long)a.total,
           human_bytes((double)a.total, b2, sizeof b2), a.total ? 100.0 * (double)a.bytes / (double)a.total : 0.0);
    if (a.prefill && decoder_on_decode)
        printf("  embedding, layers 0..%d whole (the encoder), layer %d's KV path (mHC attention mix, norm, SWA K, "
               "compressor, index K); no decoder layer after it, no head, no DSpark stage\n", a.last - 1, a.last);
    else if (a.prefill)
        printf("  embedding, layers 0..%d whole (the decoder on the rows its windows reach), layer %d's SWA K path "
               "(mHC attention mix, norm, SWA K); no head, no DSpark stage\n", a.last - 1, a.last);
    else
        printf("  the whole model (a failed remote prefill runs locally)\n");
    ds41_config_free(&cfg);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Text report
 * ---------------------------------------------------------------------------------------- */

static void print_list(const int *v, int n) {
    printf("[");
    for (int i = 0; i < n; i++) printf("%s%d", i ? ", " : "", v[i]);
    printf("]");
}

static const char *id_or_dash(int v, char *buf, size_t cap) {
    if (v < 0) return "-";
    snprintf(buf, cap, "%d", v);
    return buf;
}

static void layer_name(const ds41_config *c, int id, char *buf, size_t cap) {
    if (id < c->n_layers) snprintf(buf, cap, "layers.%d", id);
    else snprintf(buf, cap, "mtp.%d", id - c->n_layers);
}

/* 762.720B, 45.2M, 3.1K: parameter counts at any model size */
static const char *human(double v, char *buf, size_t cap) {
    if (v >= 1e9) snprintf(buf, cap, "%.3fB", v / 1e9);
    else if (v >= 1e6) snprintf(buf, cap, "%.3fM", v / 1e6);
    else if (v >= 1e3) snprintf(buf, cap, "%.3fK", v / 1e3);
    else snprintf(buf, cap, "%.0f", v);
    return buf;
}

/* 474.3 GiB, 5.4 MiB, ... */
static const char *human_bytes(double v, char *buf, size_t cap) {
    const char *u[] = { "B", "KiB", "MiB", "GiB", "TiB" };
    int i = 0;
    while (v >= 1024 && i < 4) v /= 1024, i++;
    snprintf(buf, cap, i ? "%.1f %s" : "%.0f %s", v, u[i]);
    return buf;
}

static void print_text(report *r) {
    const ds41_config *c = &r->cfg;
    const ds41_budgets *b = &r->bud;
    printf("ds41 inspect %s (%s spelling)\n\n", r->path,
           strcmp(c->source_spelling, "hf") ? "flat inference/config.json" : "Hugging Face");
    printf("config\n");
    printf("  vocab %d, dim %d, %d layers + %d DSpark stages, norm eps %g\n", c->vocab_size, c->dim, c->n_layers,
           c->n_mtp, (double)c->norm_eps);
    printf("  attention: %d heads x %d (rope %d), q_lora %d, %d output groups x %d, window %d\n", c->n_heads,
           c->head_dim, c->rope_dim, c->q_lora_rank, c->o_groups, c->o_lora_rank, c->window);
    printf("  rope theta %g (ratio 0) / %g (ratio > 0)", (double)c->rope_theta, (double)c->compress_rope_theta);
    if (c->yarn) printf(", YaRN factor %g over %lld (beta %g/%g)", (double)c->rope_factor, c->original_seq_len,
                        (double)c->beta_fast, (double)c->beta_slow);
    printf("\n  CSA2: KV sources ");
    print_list(c->kv_sources, c->n_kv_sources);
    printf(", index sources ");
    print_list(c->index_sources, c->n_index_sources);
    if (c->candidate_source >= 0)
        printf(", candidate source %d (%d blocks x %d)", c->candidate_source, c->candidate_topk_blocks,
               c->candidate_block_size);
    if (c->n_index_sources) printf(", indexer %d heads x %d, top-%d", c->index_n_heads, c->index_head_dim, c->index_topk);
    printf("\n  MoE: %d experts top-%d + %d shared, inter %d, %s, route scale %g, swiglu limit %g\n",
           c->n_routed_experts, c->n_active_experts, c->n_shared_experts, c->moe_inter_dim, c->score_func,
           (double)c->route_scale, (double)c->swiglu_limit);
    printf("  mHC: %d copies, %d Sinkhorn iterations\n", c->hc_mult, c->hc_sinkhorn_iters);
    if (c->n_engram_layers) {
        printf("  Engram: layers ");
        print_list(c->engram_layers, c->n_engram_layers);
        printf(", n-grams up to %d, %d heads x %d, rows [", c->engram_max_ngram, c->engram_n_heads, c->engram_head_dim);
        for (int i = 0; i < c->n_engram_layers; i++) printf("%s%lld", i ? ", " : "", c->engram_num_embeddings[i]);
        printf("]\n");
    }
    if (c->n_mtp) {
        printf("  DSpark: %d stages, block %d, targets ", c->n_mtp, c->dspark_block_size);
        print_list(c->dspark_targets, c->n_dspark_targets);
        printf(", %d experts top-%d, Markov rank %d\n", c->dspark_n_experts, c->dspark_n_active, c->dspark_markov_rank);
    }
    if (c->first_decoder_layer < c->n_layers)
        printf("  decoder: layers %d-%d (from the last KV source on); encoder: layers 0-%d\n", c->first_decoder_layer,
               c->n_layers - 1, c->first_decoder_layer - 1);
    else
        printf("  no KV source: no decoder part\n");

    printf("\nlayer plan\n");
    printf("  %-10s %-8s %-8s %3s %5s %5s %5s %-10s %-7s %-7s %-9s %-5s %s\n", "layer", "part", "mode", "r", "kv",
           "topk", "idxK", "candidate", "engram", "dspark", "theta", "yarn", "experts");
    for (int i = 0; i < c->n_layers + c->n_mtp; i++) {
        const ds41_layer_plan *p = &c->layers[i];
        char nm[32], a[16], bb[16], cc[16], eg[16], ex[32];
        layer_name(c, i, nm, sizeof nm);
        const char *cand = p->is_candidate_source ? "source" : p->uses_candidates ? "uses" : "-";
        if (p->engram_slot >= 0) snprintf(eg, sizeof eg, "slot %d", p->engram_slot);
        else snprintf(eg, sizeof eg, "-");
        snprintf(ex, sizeof ex, "%d/%d", p->n_experts, p->n_active);
        printf("  %-10s %-8s %-8s %3d %5s %5s %5s %-10s %-7s %-7s %-9g %-5s %s\n", nm, ds41_part_name(p->part),
               ds41_mode_name(p->mode), p->ratio, id_or_dash(p->kv_source, a, sizeof a),
               id_or_dash(p->topk_source, bb, sizeof bb), id_or_dash(p->index_k_source, cc, sizeof cc), cand, eg,
               p->is_dspark_target ? "target" : "-", (double)p->rope_theta, p->yarn ? "yes" : "no", ex);
    }

    if (r->has_tensors) {
        printf("\ntensors: %zu in %d shard(s), %llu bytes\n", r->n_tensors, ds41_st_shard_count(r->st),
               (unsigned long long)r->tensor_bytes);
        for (int d = 0; d < DS41_DT_COUNT; d++)
            if (r->by_dtype[d].count)
                printf("  %-8s %8zu tensors %18llu bytes\n", ds41_dtype_name((ds41_dtype)d), r->by_dtype[d].count,
                       (unsigned long long)r->by_dtype[d].bytes);
        const ds41_check_stats *s = &r->chk;
        printf("  expected %zu, bound %zu, missing %zu, misshaped %zu, vision (unbound) %zu, unexpected %zu\n",
               s->expected, s->present, s->missing, s->misshaped, s->vision, s->unexpected);
        for (size_t i = 0; i < s->n_missing_names; i++) printf("  missing: %s\n", s->missing_names[i]);
        for (size_t i = 0; i < s->n_unexpected_names; i++) printf("  unexpected: %s\n", s->unexpected_names[i]);
        if (s->first_problem[0]) printf("  first problem: %s\n", s->first_problem);
    }

    printf("\nbudgets\n");
    printf("  global KV per token        %g B (main %g + index %g)\n", b->global_kv_bytes_per_token,
           b->global_kv_main_bytes_per_token, b->global_kv_index_bytes_per_token);
    printf("  SWA per token per layer    %lld B\n", b->swa_bytes_per_token_per_layer);
    printf("  SWA rings per sequence     %lld B (%d layers x %d x %lld)\n", b->swa_ring_bytes, c->n_layers, c->window,
           b->swa_bytes_per_token_per_layer);
    printf("  DSpark rings per sequence  %lld B\n", b->dspark_ring_bytes);
    printf("  compressor state           %lld B\n", b->compressor_state_bytes);
    printf("  bounded per-sequence state %lld B\n", b->bounded_state_bytes);
    char h1[32], h2[32], h3[32], h4[32];
    printf("  weights (contract)         %lld B (%s, %zu tensors, vision excluded)\n", b->weight_bytes,
           human_bytes((double)b->weight_bytes, h1, sizeof h1), r->contract_tensors);
    printf("  parameters                 %s total (backbone %s, Engram tables %s, DSpark %s)\n",
           human(b->total_params, h1, sizeof h1), human(r->params_backbone, h2, sizeof h2),
           human(r->params_engram_tables, h3, sizeof h3), human(r->params_dspark, h4, sizeof h4));
    printf("  active per token           decode %s, prefill %s (CED: encoder layers + the decoder's KV path)\n",
           human(b->active_params_decode, h1, sizeof h1), human(b->active_params_prefill, h2, sizeof h2));
}

/* ------------------------------------------------------------------------------------------
 * JSON report
 * ---------------------------------------------------------------------------------------- */

static json_t *jid(int v) { return v < 0 ? json_null() : json_integer(v); }

static json_t *jnum(double v) {
    if (v == (double)(long long)v) return json_integer((long long)v);
    return json_real(v);
}

static json_t *jints(const int *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

static void print_json(report *r) {
    const ds41_config *c = &r->cfg;
    const ds41_budgets *b = &r->bud;
    json_t *o = json_object();
    json_object_set_new(o, "path", json_string(r->path));
    json_object_set_new(o, "spelling", json_string(c->source_spelling));

    json_t *cj = json_object();
    json_object_set_new(cj, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(cj, "dim", json_integer(c->dim));
    json_object_set_new(cj, "n_layers", json_integer(c->n_layers));
    json_object_set_new(cj, "n_mtp", json_integer(c->n_mtp));
    json_object_set_new(cj, "n_heads", json_integer(c->n_heads));
    json_object_set_new(cj, "head_dim", json_integer(c->head_dim));
    json_object_set_new(cj, "rope_dim", json_integer(c->rope_dim));
    json_object_set_new(cj, "q_lora_rank", json_integer(c->q_lora_rank));
    json_object_set_new(cj, "o_groups", json_integer(c->o_groups));
    json_object_set_new(cj, "o_lora_rank", json_integer(c->o_lora_rank));
    json_object_set_new(cj, "window", json_integer(c->window));
    json_object_set_new(cj, "compress_ratios", jints(c->compress_ratios, c->n_ratios));
    json_object_set_new(cj, "kv_sources", jints(c->kv_sources, c->n_kv_sources));
    json_object_set_new(cj, "index_sources", jints(c->index_sources, c->n_index_sources));
    json_object_set_new(cj, "candidate_source", jid(c->candidate_source));
    json_object_set_new(cj, "engram_layers", jints(c->engram_layers, c->n_engram_layers));
    json_object_set_new(cj, "dspark_targets", jints(c->dspark_targets, c->n_dspark_targets));
    json_object_set_new(cj, "n_routed_experts", json_integer(c->n_routed_experts));
    json_object_set_new(cj, "n_active_experts", json_integer(c->n_active_experts));
    json_object_set_new(cj, "moe_inter_dim", json_integer(c->moe_inter_dim));
    json_object_set_new(cj, "score_func", json_string(c->score_func));
    json_object_set_new(cj, "yarn", json_boolean(c->yarn));
    json_object_set_new(cj, "vision_n_layers", json_integer(c->vision_n_layers));
    json_object_set_new(o, "config", cj);
    json_object_set_new(o, "first_decoder_layer", json_integer(c->first_decoder_layer));

    json_t *layers = json_array();
    for (int i = 0; i < c->n_layers + c->n_mtp; i++) {
        const ds41_layer_plan *p = &c->layers[i];
        char nm[32];
        layer_name(c, i, nm, sizeof nm);
        json_t *l = json_object();
        json_object_set_new(l, "id", json_integer(p->id));
        json_object_set_new(l, "name", json_string(nm));
        json_object_set_new(l, "part", json_string(ds41_part_name(p->part)));
        json_object_set_new(l, "mode", json_string(ds41_mode_name(p->mode)));
        json_object_set_new(l, "ratio", json_integer(p->ratio));
        json_object_set_new(l, "kv_source", jid(p->kv_source));
        json_object_set_new(l, "topk_source", jid(p->topk_source));
        json_object_set_new(l, "index_k_source", jid(p->index_k_source));
        json_object_set_new(l, "is_kv_source", json_boolean(p->is_kv_source));
        json_object_set_new(l, "is_index_source", json_boolean(p->is_index_source));
        json_object_set_new(l, "is_candidate_source", json_boolean(p->is_candidate_source));
        json_object_set_new(l, "uses_candidates", json_boolean(p->uses_candidates));
        json_object_set_new(l, "engram_slot", jid(p->engram_slot));
        json_object_set_new(l, "is_dspark_target", json_boolean(p->is_dspark_target));
        json_object_set_new(l, "rope_theta", jnum(p->rope_theta));
        json_object_set_new(l, "yarn", json_boolean(p->yarn));
        json_object_set_new(l, "n_experts", json_integer(p->n_experts));
        json_object_set_new(l, "n_active", json_integer(p->n_active));
        json_array_append_new(layers, l);
    }
    json_object_set_new(o, "layers", layers);

    json_object_set_new(o, "global_kv_bytes_per_token", jnum(b->global_kv_bytes_per_token));
    json_object_set_new(o, "global_kv_main_bytes_per_token", jnum(b->global_kv_main_bytes_per_token));
    json_object_set_new(o, "global_kv_index_bytes_per_token", jnum(b->global_kv_index_bytes_per_token));
    json_object_set_new(o, "swa_bytes_per_token_per_layer", json_integer(b->swa_bytes_per_token_per_layer));
    json_object_set_new(o, "swa_ring_bytes", json_integer(b->swa_ring_bytes));
    json_object_set_new(o, "dspark_ring_bytes", json_integer(b->dspark_ring_bytes));
    json_object_set_new(o, "compressor_state_bytes", json_integer(b->compressor_state_bytes));
    json_object_set_new(o, "bounded_state_bytes", json_integer(b->bounded_state_bytes));
    json_object_set_new(o, "weight_bytes", json_integer(b->weight_bytes));
    json_object_set_new(o, "contract_tensors", json_integer((json_int_t)r->contract_tensors));
    json_object_set_new(o, "total_params", jnum(b->total_params));
    json_object_set_new(o, "backbone_params", jnum(r->params_backbone));
    json_object_set_new(o, "engram_table_params", jnum(r->params_engram_tables));
    json_object_set_new(o, "dspark_params", jnum(r->params_dspark));
    json_object_set_new(o, "active_params_decode", jnum(b->active_params_decode));
    json_object_set_new(o, "active_params_prefill", jnum(b->active_params_prefill));

    if (r->has_tensors) {
        const ds41_check_stats *s = &r->chk;
        json_t *t = json_object();
        json_object_set_new(t, "count", json_integer((json_int_t)r->n_tensors));
        json_object_set_new(t, "bytes", json_integer((json_int_t)r->tensor_bytes));
        json_object_set_new(t, "shards", json_integer(ds41_st_shard_count(r->st)));
        json_t *bd = json_object();
        for (int d = 0; d < DS41_DT_COUNT; d++) {
            if (!r->by_dtype[d].count) continue;
            json_t *e = json_object();
            json_object_set_new(e, "count", json_integer((json_int_t)r->by_dtype[d].count));
            json_object_set_new(e, "bytes", json_integer((json_int_t)r->by_dtype[d].bytes));
            json_object_set_new(bd, ds41_dtype_name((ds41_dtype)d), e);
        }
        json_object_set_new(t, "by_dtype", bd);
        json_object_set_new(t, "expected", json_integer((json_int_t)s->expected));
        json_object_set_new(t, "bound", json_integer((json_int_t)s->present));
        json_object_set_new(t, "missing", json_integer((json_int_t)s->missing));
        json_object_set_new(t, "misshaped", json_integer((json_int_t)s->misshaped));
        json_object_set_new(t, "vision", json_integer((json_int_t)s->vision));
        json_object_set_new(t, "unexpected", json_integer((json_int_t)s->unexpected));
        json_t *mn = json_array(), *un = json_array();
        for (size_t i = 0; i < s->n_missing_names; i++) json_array_append_new(mn, json_string(s->missing_names[i]));
        for (size_t i = 0; i < s->n_unexpected_names; i++)
            json_array_append_new(un, json_string(s->unexpected_names[i]));
        json_object_set_new(t, "missing_names", mn);
        json_object_set_new(t, "unexpected_names", un);
        json_object_set_new(t, "first_problem", s->first_problem[0] ? json_string(s->first_problem) : json_null());
        json_object_set_new(o, "tensors", t);
    } else {
        json_object_set_new(o, "tensors", json_null());
    }
    if (r->ranks) json_object_set_new(o, "ranks", r->ranks);
    r->ranks = NULL;
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (text) {
        fputs(text, stdout);
        fputc('\n', stdout);
        free(text);
    }
    json_decref(o);
}

/* ------------------------------------------------------------------------------------------ */

int ds41_cli_inspect(int argc, char **argv) {
    int as_json = 0;
    long long ranks = 0;
    const char *path = NULL, *role = NULL;
    ds41_inspect_ranks_opts ro = { 0, NULL, NULL, NULL, 0, 0, 100, 20 };   /* --link, --latency defaults */
    int link_set = 0;
    int pd_decoder = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) as_json = 1;
        else if (!strcmp(argv[i], "--role")) {
            if (i + 1 >= argc || (strcmp(argv[i + 1], "prefill") && strcmp(argv[i + 1], "decode"))) {
                fprintf(stderr, "ds41 inspect: --role needs prefill or decode\n");
                return 2;
            }
            role = argv[++i];
        }
        else if (!strcmp(argv[i], "--pd-decoder")) {
            if (i + 1 >= argc || (strcmp(argv[i + 1], "prefill") && strcmp(argv[i + 1], "decode"))) {
                fprintf(stderr, "ds41 inspect: --pd-decoder needs prefill or decode\n");
                return 2;
            }
            pd_decoder = !strcmp(argv[++i], "decode");
        }
        else if (!strcmp(argv[i], "--ranks")) {
            if (i + 1 >= argc) { fprintf(stderr, "ds41 inspect: --ranks needs a value\n"); return 2; }
            if (ds41_cli_int("inspect", "--ranks", argv[++i], 1, 4096, &ranks)) return 2;
        }
        else if (!strcmp(argv[i], "--dp-attention")) ro.dp = 1;
        else if (!strcmp(argv[i], "--node-bandwidth") || !strcmp(argv[i], "--link") || !strcmp(argv[i], "--latency")) {
            const char *f = argv[i];
            if (i + 1 >= argc) { fprintf(stderr, "ds41 inspect: %s needs a value\n", f); return 2; }
            double *dst = !strcmp(f, "--node-bandwidth") ? &ro.node_gbps : !strcmp(f, "--link") ? &ro.link_gbits : &ro.latency_us;
            if (ds41_cli_double("inspect", f, argv[++i], !strcmp(f, "--latency") ? 0 : 1e-3, 1e6, dst)) return 2;
            if (strcmp(f, "--node-bandwidth")) link_set = 1;
        }
        else if (!strcmp(argv[i], "--expert-map-from") || !strcmp(argv[i], "--write-expert-map")) {
            if (i + 1 >= argc) { fprintf(stderr, "ds41 inspect: %s needs a file\n", argv[i]); return 2; }
            if (!strcmp(argv[i], "--expert-map-from")) ro.counts = argv[++i];
            else ro.map_out = argv[++i];
        }
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "ds41 inspect: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else if (path) {
            fprintf(stderr, "ds41 inspect: more than one PATH ('%s' and '%s')\n", path, argv[i]);
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        fprintf(stderr, "ds41 inspect: PATH is required\n");
        usage(stderr);
        return 2;
    }

    if (pd_decoder >= 0 && (!role || strcmp(role, "prefill"))) {
        fprintf(stderr, "ds41 inspect: --pd-decoder goes with --role prefill\n");
        return 2;
    }
    if ((ro.counts || ro.map_out || ro.dp) && ranks <= 0) {
        fprintf(stderr, "ds41 inspect: %s goes with --ranks N\n",
                ro.dp ? "--dp-attention" : ro.counts ? "--expert-map-from" : "--write-expert-map");
        return 2;
    }
    if ((ro.node_gbps > 0 || link_set) && ranks <= 0) {
        fprintf(stderr, "ds41 inspect: %s goes with --ranks N\n", ro.node_gbps > 0 ? "--node-bandwidth" : "--link / --latency");
        return 2;
    }
    if (link_set && !(ro.node_gbps > 0)) {
        fprintf(stderr, "ds41 inspect: --link and --latency shape the projection of --node-bandwidth GB/s; give it too\n");
        return 2;
    }
    if (ro.dp && ds41_pipe_on()) {
        fprintf(stderr, "ds41 inspect: --dp-attention splits the sequences over the ranks of --split experts; with "
                        "--split layers every stage runs every sequence\n");
        return 2;
    }
    if (ro.map_out && !ro.counts) {
        fprintf(stderr, "ds41 inspect: --write-expert-map writes the placement of --expert-map-from COUNTS; give the counts\n");
        return 2;
    }
    if (ro.counts && (ds41_dist_expert_map() || ds41_pipe_on())) {
        fprintf(stderr, "ds41 inspect: --expert-map-from builds the placement itself; it does not combine with %s\n",
                ds41_pipe_on() ? "--split layers" : "--expert-map");
        return 2;
    }
    ro.n = (int)ranks;
    ro.map = ds41_dist_expert_map();
    if (role) return print_role(path, role, pd_decoder == 1);
    report r;
    memset(&r, 0, sizeof r);
    r.path = path;
    ds41_err err;
    if (ds41_config_load(path, &r.cfg, &err)) {
        fprintf(stderr, "ds41 inspect: %s\n", err.msg);
        return 1;
    }
    ds41_config_budgets(&r.cfg, &r.bud);
    ds41_contract_each(&r.cfg, NULL, param_cb, &r);

    int rc = 0;
    if (ds41_st_dir_has_tensors(path)) {
        if (ds41_st_open(path, &r.st, &err)) {
            fprintf(stderr, "ds41 inspect: %s\n", err.msg);
            ds41_config_free(&r.cfg);
            return 1;
        }
        r.has_tensors = 1;
        r.n_tensors = ds41_st_count(r.st);
        for (size_t i = 0; i < r.n_tensors; i++) {
            const ds41_tensor *t = ds41_st_at(r.st, i);
            if (t->dtype >= 0 && t->dtype < DS41_DT_COUNT) {
                r.by_dtype[t->dtype].count++;
                r.by_dtype[t->dtype].bytes += t->nbytes;
            }
            r.tensor_bytes += t->nbytes;
        }
        if (ds41_weights_check(&r.cfg, r.st, &r.chk, &err)) {
            fprintf(stderr, "ds41 inspect: %s: %s\n", path, err.msg);
            ds41_st_close(r.st);
            ds41_config_free(&r.cfg);
            return 1;
        }
        if (r.chk.missing || r.chk.misshaped) rc = 1;
    }

    /* --ranks: checked (the expert map) before anything is printed */
    if (ranks > 0 && (ds41_pipe_on() ? ds41_cli_inspect_stages_proj(&r.cfg, (int)ranks, ds41_pipe_layer_map(), ro.node_gbps, ro.link_gbits, ro.latency_us, &r.ranks)
                                     : ds41_cli_inspect_ranks(&r.cfg, &r.bud, &ro, &r.ranks))) {
        if (r.has_tensors) {
            ds41_check_stats_free(&r.chk);
            ds41_st_close(r.st);
        }
        ds41_config_free(&r.cfg);
        return 1;
    }
    if (as_json) {
        print_json(&r);
    } else {
        print_text(&r);
        if (r.ranks && ds41_pipe_on()) ds41_cli_inspect_stages_proj(&r.cfg, (int)ranks, ds41_pipe_layer_map(), ro.node_gbps, ro.link_gbits, ro.latency_us, NULL);
        else if (r.ranks) ds41_cli_inspect_ranks(&r.cfg, &r.bud, &ro, NULL);
    }
    json_decref(r.ranks);
    fflush(stdout);
    if (rc)
        fprintf(stderr, "ds41 inspect: %s: %s (%zu missing, %zu misshaped)\n", path, r.chk.first_problem,
                r.chk.missing, r.chk.misshaped);
    if (r.has_tensors) {
        ds41_check_stats_free(&r.chk);
        ds41_st_close(r.st);
    }
    ds41_config_free(&r.cfg);
    return rc;
}
