/* Tests for src/model/config.c: the production layer plan row by row against the table of spec
 * section 2, the tiny oracle config of spec section 9, flat == HF spelling, budgets (spec 6,
 * 8), and every case of the malformed config corpus. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "malformed.h"
#include "config.h"
#include "contract.h"

static const char *root(void) {
    const char *r = getenv("DS41_ROOT");
    return r && *r ? r : ".";
}

static int load(const char *rel, ds41_config *c) {
    char path[1024];
    ds41_err e;
    snprintf(path, sizeof path, "%s/%s", root(), rel);
    if (ds41_config_load(path, c, &e)) {
        CHECK(0, "loading %s: %s", rel, e.msg);
        return -1;
    }
    return 0;
}

/* One row of an expected plan. kv/topk -1 = none ("-" in the spec table). */
typedef struct prow {
    int lo, hi;
    const char *part, *mode;
    int ratio, kv, topk;
    const char *cand;     /* "-", "source", "uses" */
    int engram;           /* slot or -1 */
    int target;           /* DSpark target */
} prow;

/* Spec section 2, transcribed row by row (ranges as in the table). */
static const prow PRODUCTION[] = {
    { 0, 0, "encoder", "swa", 0, -1, -1, "-", -1, 0 },
    { 1, 1, "encoder", "swa", 0, -1, -1, "-", 0, 0 },
    { 2, 2, "encoder", "full", 2, 2, 2, "-", -1, 0 },
    { 3, 7, "encoder", "reuse", 2, 2, 2, "-", -1, 0 },
    { 8, 8, "encoder", "full", 2, 8, 8, "-", -1, 0 },
    { 9, 13, "encoder", "reuse", 2, 8, 8, "-", -1, 0 },
    { 14, 14, "encoder", "full", 2, 14, 14, "-", 1, 0 },
    { 15, 19, "encoder", "reuse", 2, 14, 14, "-", -1, 0 },
    { 20, 20, "decoder", "full", 1, 20, 20, "source", -1, 0 },
    { 21, 23, "decoder", "reuse", 1, 20, 20, "-", -1, 0 },
    { 24, 24, "decoder", "reindex", 1, 20, 24, "uses", -1, 0 },
    { 25, 27, "decoder", "reuse", 1, 20, 24, "-", -1, 0 },
    { 28, 28, "decoder", "reindex", 1, 20, 28, "uses", -1, 0 },
    { 29, 31, "decoder", "reuse", 1, 20, 28, "-", -1, 0 },
    { 32, 32, "decoder", "reindex", 1, 20, 32, "uses", -1, 0 },
    { 33, 35, "decoder", "reuse", 1, 20, 32, "-", -1, 0 },
    { 36, 36, "decoder", "reindex", 1, 20, 36, "uses", -1, 0 },
    { 37, 39, "decoder", "reuse", 1, 20, 36, "-", -1, 1 },
    { 40, 42, "draft", "draft", 0, -1, -1, "-", -1, 0 },
};

/* Spec section 9: SWA-only, ratio-2 source, ratio-2 consumer, candidate source (ratio 1),
 * ratio-1 consumer, candidate+index source; Engram on 0 and 1; targets 4, 5; one stage. */
static const prow TINY[] = {
    { 0, 0, "encoder", "swa", 0, -1, -1, "-", 0, 0 },
    { 1, 1, "encoder", "full", 2, 1, 1, "-", 1, 0 },
    { 2, 2, "encoder", "reuse", 2, 1, 1, "-", -1, 0 },
    { 3, 3, "decoder", "full", 1, 3, 3, "source", -1, 0 },
    { 4, 4, "decoder", "reuse", 1, 3, 3, "-", -1, 1 },
    { 5, 5, "decoder", "reindex", 1, 3, 5, "uses", -1, 1 },
    { 6, 6, "draft", "draft", 0, -1, -1, "-", -1, 0 },
};

/* Checks the plan against rows; theta/yarn/index-K/experts follow the rule text of spec 2. */
static void check_plan(const ds41_config *c, const prow *rows, size_t nrows, int total, float theta_swa,
                       float theta_csa, int E, int K, int dE, int dK) {
    int seen = 0;
    CHECK(c->n_layers + c->n_mtp == total, "layer count %d", c->n_layers + c->n_mtp);
    for (size_t i = 0; i < nrows; i++) {
        const prow *r = &rows[i];
        for (int id = r->lo; id <= r->hi && id < total; id++, seen++) {
            const ds41_layer_plan *p = &c->layers[id];
            CHECK(p->id == id, "layer %d: id %d", id, p->id);
            CHECK(!strcmp(ds41_part_name(p->part), r->part), "layer %d: part %s, expected %s", id,
                  ds41_part_name(p->part), r->part);
            CHECK(!strcmp(ds41_mode_name(p->mode), r->mode), "layer %d: mode %s, expected %s", id,
                  ds41_mode_name(p->mode), r->mode);
            CHECK(p->ratio == r->ratio, "layer %d: ratio %d, expected %d", id, p->ratio, r->ratio);
            CHECK(p->kv_source == r->kv, "layer %d: kv_source %d, expected %d", id, p->kv_source, r->kv);
            CHECK(p->topk_source == r->topk, "layer %d: topk_source %d, expected %d", id, p->topk_source, r->topk);
            int full = !strcmp(r->mode, "full"), reindex = !strcmp(r->mode, "reindex");
            int want_ik = full ? id : reindex ? r->kv : -1;
            CHECK(p->index_k_source == want_ik, "layer %d: index_k_source %d, expected %d", id, p->index_k_source,
                  want_ik);
            CHECK(p->is_kv_source == full, "layer %d: is_kv_source %d", id, p->is_kv_source);
            CHECK(p->is_index_source == (full || reindex), "layer %d: is_index_source %d", id, p->is_index_source);
            CHECK(p->is_candidate_source == !strcmp(r->cand, "source"), "layer %d: is_candidate_source", id);
            CHECK(p->uses_candidates == !strcmp(r->cand, "uses"), "layer %d: uses_candidates %d", id,
                  p->uses_candidates);
            CHECK(p->engram_slot == r->engram, "layer %d: engram_slot %d, expected %d", id, p->engram_slot, r->engram);
            CHECK(p->is_dspark_target == r->target, "layer %d: is_dspark_target %d", id, p->is_dspark_target);
            float th = r->ratio ? theta_csa : theta_swa;
            CHECK(p->rope_theta == th, "layer %d: rope theta %g, expected %g", id, (double)p->rope_theta, (double)th);
            CHECK(p->yarn == (r->ratio > 0), "layer %d: yarn %d", id, p->yarn);
            int draft = !strcmp(r->part, "draft");
            CHECK(p->n_experts == (draft ? dE : E), "layer %d: n_experts %d", id, p->n_experts);
            CHECK(p->n_active == (draft ? dK : K), "layer %d: n_active %d", id, p->n_active);
        }
    }
    CHECK(seen == total, "table covers %d of %d layers", seen, total);
}

static void test_production_plan(void) {
    ds41_config c;
    if (load("models/production", &c)) return;
    CHECK(!strcmp(c.source_spelling, "hf"), "spelling %s", c.source_spelling);
    CHECK(c.first_decoder_layer == 20, "first decoder layer %d", c.first_decoder_layer);
    check_plan(&c, PRODUCTION, sizeof PRODUCTION / sizeof PRODUCTION[0], 43, 10000.0f, 160000.0f, 384, 6, 128, 3);
    ds41_config_free(&c);
}

static void test_production_fields(void) {
    ds41_config c;
    if (load("models/production", &c)) return;
    /* spec section 1, value by value */
    CHECK(c.vocab_size == 129280 && c.dim == 5120 && c.n_layers == 40 && c.n_mtp == 3, "backbone");
    CHECK(c.max_position_embeddings == 1048576, "max_position_embeddings %lld", c.max_position_embeddings);
    CHECK(c.norm_eps == 1e-20f && c.tie_word_embeddings == 0, "eps/tie");
    CHECK(c.n_heads == 64 && c.n_kv_heads == 1 && c.head_dim == 512 && c.rope_dim == 64, "attention");
    CHECK(c.q_lora_rank == 1280 && c.o_groups == 8 && c.o_lora_rank == 1024 && c.window == 128, "lora/window");
    CHECK(c.rope_theta == 10000.0f && c.compress_rope_theta == 160000.0f && c.yarn == 1, "rope");
    CHECK(c.rope_factor == 16.0f && c.original_seq_len == 65536 && c.beta_fast == 32.0f && c.beta_slow == 1.0f,
          "yarn params");
    CHECK(c.n_kv_sources == 4 && c.n_index_sources == 8 && c.candidate_source == 20, "sources");
    CHECK(c.candidate_topk_blocks == 2048 && c.candidate_block_size == 8, "candidates");
    CHECK(c.index_n_heads == 32 && c.index_head_dim == 128 && c.index_topk == 512, "indexer");
    CHECK(c.n_routed_experts == 384 && c.n_shared_experts == 1 && c.n_active_experts == 6 && c.moe_inter_dim == 2304,
          "moe");
    CHECK(!strcmp(c.score_func, "sqrtsoftplus") && c.norm_topk_prob == 1, "scoring %s", c.score_func);
    CHECK(c.route_scale == 1.5f && c.swiglu_limit == 10.0f && c.gate_temp == 1.0f, "route scale");
    CHECK(c.hc_mult == 4 && c.hc_sinkhorn_iters == 20 && c.hc_eps == 1e-6f, "mhc");
    CHECK(c.n_engram_layers == 2 && c.engram_layers[0] == 1 && c.engram_layers[1] == 14, "engram layers");
    CHECK(c.engram_max_ngram == 4 && c.engram_n_heads == 8 && c.engram_head_dim == 256, "engram dims");
    CHECK(c.engram_vocab_size == 16000000 && c.engram_compressed_vocab == 99092 && c.engram_pad_id == 2, "engram");
    CHECK(c.engram_num_embeddings[0] == 384006168 && c.engram_num_embeddings[1] == 384016682, "engram rows");
    CHECK(c.dspark_block_size == 5 && c.dspark_noise_token_id == 128799 && c.dspark_markov_rank == 256, "dspark");
    CHECK(c.dspark_n_experts == 128 && c.dspark_n_active == 3 && c.n_dspark_targets == 3 && c.dspark_targets[0] == 37,
          "dspark moe");
    CHECK(c.quant_fp8 && c.expert_fp4 && c.weight_block[0] == 32 && c.weight_block[1] == 32, "quant");
    CHECK(c.vision_n_layers == 32, "vision layers %d", c.vision_n_layers);
    ds41_config_free(&c);
}

typedef struct layer_bytes { uint64_t bytes[64]; uint64_t expert0; size_t count; } layer_bytes;

static int sum_cb(const ds41_tensor_spec *t, void *ctx) {
    layer_bytes *lb = ctx;
    if (t->optional) return 0;
    lb->count++;
    if (t->layer >= 0 && t->layer < 64) lb->bytes[t->layer] += ds41_spec_nbytes(t);
    if (t->layer == 0 && t->expert == 0) lb->expert0 += ds41_spec_nbytes(t);
    return 0;
}

static void test_production_budgets(void) {
    ds41_config c;
    if (load("models/production", &c)) return;
    ds41_budgets b;
    ds41_config_budgets(&c, &b);
    /* spec 6.2 / 6.1 / 6.3 */
    CHECK(b.global_kv_bytes_per_token == 890.0, "global KV %g", b.global_kv_bytes_per_token);
    CHECK(b.global_kv_main_bytes_per_token == 720.0, "main %g", b.global_kv_main_bytes_per_token);
    CHECK(b.global_kv_index_bytes_per_token == 170.0, "index %g", b.global_kv_index_bytes_per_token);
    CHECK(b.global_kv_main_bytes_per_token_x2 == 1440 && b.global_kv_index_bytes_per_token_x2 == 340, "x2");
    CHECK(b.swa_bytes_per_token_per_layer == 528, "swa %lld", b.swa_bytes_per_token_per_layer);
    CHECK(b.swa_ring_bytes == 2703360, "swa rings %lld", b.swa_ring_bytes);
    CHECK(b.dspark_ring_bytes == 202752, "dspark rings %lld", b.dspark_ring_bytes);
    CHECK(b.compressor_state_bytes == 24576, "compressor %lld", b.compressor_state_bytes);
    /* rings + compressor + 3 int32 Engram history ids */
    CHECK(b.bounded_state_bytes == 2703360 + 202752 + 24576 + 12, "bounded %lld", b.bounded_state_bytes);

    /* spec 8: per-layer byte sizes and one routed expert */
    layer_bytes lb;
    memset(&lb, 0, sizeof lb);
    ds41_contract_each(&c, NULL, sum_cb, &lb);
    CHECK(lb.bytes[0] == 7389500888ULL, "ordinary layer 0: %llu", (unsigned long long)lb.bytes[0]);
    CHECK(lb.bytes[3] == 7389500888ULL, "ordinary layer 3: %llu", (unsigned long long)lb.bytes[3]);
    CHECK(lb.bytes[39] == 7389500888ULL, "ordinary layer 39: %llu", (unsigned long long)lb.bytes[39]);
    CHECK(lb.bytes[2] == 7405694680ULL, "layer 2: %llu", (unsigned long long)lb.bytes[2]);
    CHECK(lb.bytes[1] == 108924651160ULL, "layer 1: %llu", (unsigned long long)lb.bytes[1]);
    CHECK(lb.bytes[40] == 2652643800ULL, "mtp.0: %llu", (unsigned long long)lb.bytes[40]);
    CHECK(lb.expert0 == 17694720ULL + 1105920ULL, "one expert %llu", (unsigned long long)lb.expert0);
    uint64_t sum = 0;
    for (int i = 0; i < 43; i++) sum += lb.bytes[i];
    /* globals: embed + head BF16 [129280, 5120] + norm [5120] */
    sum += 2ULL * 129280 * 5120 * 2 + 5120 * 2;
    CHECK((uint64_t)b.weight_bytes == sum, "weight bytes %lld vs %llu", b.weight_bytes, (unsigned long long)sum);
    /* spec 8: 96,085 tensors and 510,286,023,000 bytes including the vision tower, which
     * is not in our contract; the language-model part must be below both */
    CHECK(lb.count < 96085 && b.weight_bytes < 510286023000LL, "count %zu", lb.count);
    /* spec 8 parameter counts, given to 0.1B: backbone 551.9 + Engram 196.6 + DSpark 14.2 */
    CHECK(b.total_params > 762.65e9 && b.total_params < 762.75e9, "total params %.4fB", b.total_params / 1e9);
    /* spec 8: "about 7.0B non-expert + 8.5B routed + 0.66B head, i.e. ~16B"; S4: 8B prefill.
     * Stated tolerance: the spec's own rounding (a few 0.1B). */
    CHECK(b.active_params_decode > 15.9e9 && b.active_params_decode < 16.3e9, "decode %.3fB",
          b.active_params_decode / 1e9);
    CHECK(b.active_params_prefill > 7.7e9 && b.active_params_prefill < 8.1e9, "prefill %.3fB",
          b.active_params_prefill / 1e9);
    ds41_config_free(&c);
}

static void test_flat_equals_hf(void) {
    ds41_config h, f;
    if (load("models/production", &h)) return;
    if (load("tests/configs/production-flat", &f)) {
        ds41_config_free(&h);
        return;
    }
    CHECK(!strcmp(f.source_spelling, "flat"), "spelling %s", f.source_spelling);
    int total = h.n_layers + h.n_mtp;
    CHECK(f.n_layers + f.n_mtp == total, "layer count");
    for (int i = 0; i < total && i < f.n_layers + f.n_mtp; i++)
        CHECK(!memcmp(&h.layers[i], &f.layers[i], sizeof h.layers[i]), "plan row %d differs", i);
    /* the whole config must agree, except what the flat file cannot say */
    ds41_config a = h, b = f;
    a.layers = b.layers = NULL;
    memset(a.source_spelling, 0, sizeof a.source_spelling);
    memset(b.source_spelling, 0, sizeof b.source_spelling);
    a.bos_token_id = b.bos_token_id = a.eos_token_id = b.eos_token_id = 0;
    size_t off = 0;
    const unsigned char *pa = (const void *)&a, *pb = (const void *)&b;
    while (off < sizeof a && pa[off] == pb[off]) off++;
    CHECK(off == sizeof a, "configs differ at byte offset %zu", off);
    ds41_config_free(&h);
    ds41_config_free(&f);
}

/* tests/configs/tiny is the checkpoint writer's copy of the spec-9 config */
static void test_tiny_plan(void) {
    ds41_config c;
    if (load("tests/configs/tiny", &c)) return;
    CHECK(c.first_decoder_layer == 3, "first decoder %d", c.first_decoder_layer);
    check_plan(&c, TINY, sizeof TINY / sizeof TINY[0], 7, 10000.0f, 160000.0f, 4, 2, 4, 2);
    ds41_budgets b;
    ds41_config_budgets(&c, &b);
    /* main entry 64/2 + 64/16 = 36 B, index entry 64/2 + 64/32 = 34 B; source 1 at ratio 2,
     * source 3 at ratio 1: main 18 + 36 = 54, index 17 + 34 = 51 */
    CHECK(b.global_kv_main_bytes_per_token == 54.0 && b.global_kv_index_bytes_per_token == 51.0, "tiny kv %g + %g",
          b.global_kv_main_bytes_per_token, b.global_kv_index_bytes_per_token);
    CHECK(b.swa_bytes_per_token_per_layer == 66, "tiny swa %lld", b.swa_bytes_per_token_per_layer);
    CHECK(b.compressor_state_bytes == 2 * 2 * 64 * 4, "tiny compressor %lld", b.compressor_state_bytes);
    ds41_config_free(&c);
}

static int load_config(const char *path, const char *name, ds41_err *err) {
    ds41_config c;
    int rc = ds41_config_load(path, &c, err);
    if (rc == 0) ds41_config_free(&c);
    else CHECK(c.layers == NULL, "%s: plan left allocated", name);
    return rc;
}

static void test_malformed_corpus(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/malformed/config", root());
    int n = malformed_corpus(dir, "/expected", load_config);
    CHECK(n >= 12, "only %d cases", n);
}

static void test_parse_api(void) {
    ds41_config c;
    ds41_err e;
    /* embedded NUL: rejected before jansson (which may stop reading at it) */
    const char nul[] = "{\"n_layers\": 1\0}";
    CHECK(ds41_config_parse(nul, sizeof nul - 1, &c, &e) == -1, "NUL accepted");
    CHECK(strstr(e.msg, "invalid JSON") != NULL, "NUL message: %s", e.msg);
    /* a directory without config.json */
    char path[1024];
    snprintf(path, sizeof path, "%s/tests", root());
    CHECK(ds41_config_load(path, &c, &e) == -1, "no config.json accepted");
    CHECK(strstr(e.msg, "config.json") != NULL, "message: %s", e.msg);
    CHECK(!strcmp(ds41_mode_name(DS41_MODE_REINDEX), "reindex") && !strcmp(ds41_part_name(DS41_PART_DRAFT), "draft"),
          "names");
    ds41_config_free(NULL);
}

int main(void) {
    RUN_CASE(test_production_plan);
    RUN_CASE(test_production_fields);
    RUN_CASE(test_production_budgets);
    RUN_CASE(test_flat_equals_hf);
    RUN_CASE(test_tiny_plan);
    RUN_CASE(test_malformed_corpus);
    RUN_CASE(test_parse_api);
    return check_exit();
}
