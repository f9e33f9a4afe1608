/* Unit tests of src/engine/cache.c: packed record sizes of spec 6.1, page addressing, the state
 * bytes of spec 6.2 / 6.3 on the production plan (890 B per token of global KV), the initial
 * compressor state, and record round trips (the dequantized record equals the QDQ value). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "cache.h"
#include "check.h"
#include "config.h"
#include "formats.h"

static ds41_config prod;
static int have_prod;

static void load_prod(void) {
    ds41_err err;
    const char *root = getenv("DS41_ROOT");
    char path[1024];
    snprintf(path, sizeof path, "%s/models/production", root ? root : ".");
    have_prod = ds41_config_load(path, &prod, &err) == 0;
    if (!have_prod) printf("  cannot load %s: %s\n", path, err.msg);
}

static void test_record_sizes(void) {
    CHECK(have_prod, "production config");
    if (!have_prod) return;
    CHECK(ds41_kv_rec_bytes(&prod) == 288, "main KV record %d", ds41_kv_rec_bytes(&prod));
    CHECK(ds41_ik_rec_bytes(&prod) == 68, "index K record %d", ds41_ik_rec_bytes(&prod));
    CHECK(ds41_swa_rec_bytes(&prod) == 528, "SWA record %d", ds41_swa_rec_bytes(&prod));
}

/* Fills a production cache as a forward would (one entry per r tokens per source). */
static void fill(ds41_cache *c, long long n_tok) {
    for (int i = 0; i < c->n_stores; i++) {
        ds41_kv_store *s = &c->stores[i];
        long long E = n_tok / s->ratio;
        for (long long j = 0; j < E; j++) {
            uint8_t *kr = ds41_store_kv_rec(s, j, 1, NULL), *ir = ds41_store_ik_rec(s, j, 1, NULL);
            memset(kr, (int)(j & 0x77), (size_t)s->kv_bytes);
            memset(ir, (int)((j + 1) & 0x77), (size_t)s->ik_bytes);
        }
        s->n_entries = E;
    }
    c->pos = n_tok;
}

static void test_production_state_bytes(void) {
    if (!have_prod) { CHECK(0, "production config"); return; }
    ds41_cache c;
    ds41_err err;
    CHECK(ds41_cache_init(&c, &prod, 4096, &err) == 0, "init: %s", err.msg);
    CHECK(c.n_stores == 4 && c.n_comp == 3 && c.n_rings == 43, "stores %d comp %d rings %d", c.n_stores, c.n_comp, c.n_rings);
    fill(&c, 1024);
    ds41_state_bytes b;
    ds41_cache_bytes(&c, &b);
    /* spec 6.2: 720 main + 170 index = 890 B per token */
    CHECK(b.global_kv_main == 720LL * 1024, "main %lld", b.global_kv_main);
    CHECK(b.global_kv_index == 170LL * 1024, "index %lld", b.global_kv_index);
    CHECK(b.global_kv_per_token == 890.0, "per token %g", b.global_kv_per_token);
    /* 128-token pages: 113,920 B = 890 x 128 per 128 tokens */
    CHECK(b.global_kv_pages == 113920LL * 8, "pages %lld", b.global_kv_pages);
    /* spec 6.3: 40 SWA rings x 128 x 528, 3 DSpark rings, 3 x 2 x 1024 FP32 compressor rows */
    CHECK(b.swa_rings == 2703360, "swa %lld", b.swa_rings);
    CHECK(b.dspark_rings == 202752, "dspark %lld", b.dspark_rings);
    CHECK(b.compressor == 24576, "compressor %lld", b.compressor);
    /* agrees with the config's budget (config.c, independent arithmetic) */
    ds41_budgets bud;
    ds41_config_budgets(&prod, &bud);
    CHECK(bud.global_kv_bytes_per_token == b.global_kv_per_token, "budget %g vs held %g",
          bud.global_kv_bytes_per_token, b.global_kv_per_token);
    ds41_cache_free(&c);
}

static void test_pages_addressing(void) {
    if (!have_prod) { CHECK(0, "production config"); return; }
    ds41_cache c;
    ds41_err err;
    CHECK(ds41_cache_init(&c, &prod, 4096, &err) == 0, "init: %s", err.msg);
    ds41_kv_store *s2 = ds41_cache_store(&c, 2), *s20 = ds41_cache_store(&c, 20);
    CHECK(s2 && s20 && !ds41_cache_store(&c, 3), "store lookup");
    if (!s2 || !s20) { ds41_cache_free(&c); return; }
    CHECK(s2->per_page == 64 && s20->per_page == 128, "entries per page %d %d", s2->per_page, s20->per_page);
    fill(&c, 700);
    /* entry j of a store lives in page j / E at row j mod E: records are distinct and
     * keep their bytes */
    int ok = 1;
    for (long long j = 0; j < 350; j++) {
        uint8_t *kr = ds41_store_kv_rec(s2, j, 0, NULL), *ir = ds41_store_ik_rec(s2, j, 0, NULL);
        ok &= kr && ir && kr[0] == (uint8_t)(j & 0x77) && kr[287] == (uint8_t)(j & 0x77) && ir[67] == (uint8_t)((j + 1) & 0x77);
    }
    CHECK(ok, "records keep their bytes across pages");
    CHECK(ds41_store_kv_rec(s2, 384, 0, NULL) == NULL, "entry beyond the pages must not be addressable without alloc");
    CHECK(s2->n_pages == 6 && s20->n_pages == 6, "pages %d %d", s2->n_pages, s20->n_pages);
    /* compressor state starts at kv 0, score -inf */
    ds41_comp_state *cs = ds41_cache_comp(&c, 8);
    CHECK(cs && cs->kv[0] == 0.0f && cs->sc[1023] == -INFINITY, "initial compressor state");
    CHECK(!ds41_cache_comp(&c, 20), "ratio-1 source has no compressor state");
    ds41_state_bytes before, b;
    ds41_cache_bytes(&c, &before);
    ds41_cache_reset(&c);
    ds41_cache_bytes(&c, &b);
    CHECK(b.global_kv_pages == before.global_kv_pages && b.global_kv_pages > 0, "reset keeps the pages (%lld vs %lld)",
          b.global_kv_pages, before.global_kv_pages);
    CHECK(c.pos == 0 && b.global_kv_written == 0, "reset forgets the entries");
    ds41_cache_free(&c);
}

static void test_record_roundtrip(void) {
    if (!have_prod) { CHECK(0, "production config"); return; }
    /* the SWA record's dequantization equals Q8-QDQ of the vector, bit for bit */
    int D = prod.head_dim;
    float *x = malloc(sizeof(float) * D), *y = malloc(sizeof(float) * D), *z = malloc(sizeof(float) * D);
    uint8_t *rec = malloc((size_t)ds41_swa_rec_bytes(&prod));
    uint64_t r = 1;
    for (int i = 0; i < D; i++) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        x[i] = ds41_bf16_round((float)((double)(r >> 11) / 9007199254740992.0 * 8 - 4));
    }
    memcpy(y, x, sizeof(float) * D);
    ds41_q8_qdq(y, D);
    ds41_pack_q8(x, D, rec, rec + D);
    ds41_swa_rec_unpack(&prod, rec, 1, z);
    CHECK(!memcmp(y, z, sizeof(float) * D), "SWA record != Q8-QDQ");
    /* main KV: Q4nv */
    uint8_t *kv = malloc((size_t)ds41_kv_rec_bytes(&prod));
    memcpy(y, x, sizeof(float) * D);
    ds41_q4nv_qdq(y, D);
    ds41_pack_q4nv(x, D, kv, kv + D / 2);
    ds41_kv_rec_unpack(&prod, kv, 1, z);
    CHECK(!memcmp(y, z, sizeof(float) * D), "main-KV record != Q4nv-QDQ");
    free(x); free(y); free(z); free(rec); free(kv);
}

int main(void) {
    load_prod();
    RUN_CASE(test_record_sizes);
    RUN_CASE(test_production_state_bytes);
    RUN_CASE(test_pages_addressing);
    RUN_CASE(test_record_roundtrip);
    if (have_prod) ds41_config_free(&prod);
    return check_exit();
}
