/* Tests for the tensor contract (src/model/contract.c) and the weight binding (src/model/model.c).
 * Contract: production names/dtypes/shapes spot-checked against spec section 8 by hand.
 * Binding: the test writes its own small safetensors files for the tiny config (spec 9),
 * complete and with one defect each, and binds them. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "config.h"
#include "contract.h"
#include "model.h"

static const char *root(void) {
    const char *r = getenv("DS41_ROOT");
    return r && *r ? r : ".";
}

static const char *build_dir(void) {
    const char *b = getenv("DS41_BUILD");
    return b && *b ? b : "build";
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

/* ------------------------------------------------------------------------------------------
 * Contract spot checks (spec 8, production)
 * ---------------------------------------------------------------------------------------- */

typedef struct find_ctx { const char *name; ds41_tensor_spec found; int hit; size_t count; } find_ctx;

static int find_cb(const ds41_tensor_spec *t, void *ctx) {
    find_ctx *f = ctx;
    f->count++;
    if (!strcmp(t->name, f->name)) {
        f->found = *t;
        f->hit++;
    }
    return 0;
}

/* expect a tensor with dtype and shape (ndim 1 when d1 < 0); ndim 0 = expect absence */
static void expect(const ds41_config *c, const char *name, ds41_dtype dt, int64_t d0, int64_t d1) {
    find_ctx f = { .name = name };
    ds41_contract_each(c, NULL, find_cb, &f);
    if (dt == DS41_DT_COUNT) {
        CHECK(f.hit == 0, "%s: present, spec 8 says absent", name);
        return;
    }
    CHECK(f.hit == 1, "%s: found %d times", name, f.hit);
    if (f.hit != 1) return;
    int nd = d1 < 0 ? 1 : 2;
    CHECK(f.found.dtype == dt, "%s: dtype %s", name, ds41_dtype_name(f.found.dtype));
    CHECK(f.found.ndim == nd && f.found.shape[0] == d0 && (nd == 1 || f.found.shape[1] == d1),
          "%s: shape [%lld, %lld]", name, (long long)f.found.shape[0], (long long)f.found.shape[1]);
}

#define ABSENT DS41_DT_COUNT, 0, 0

static void test_contract_production(void) {
    ds41_config c;
    if (load("models/production", &c)) return;
    /* globals */
    expect(&c, "embed.weight", DS41_DT_BF16, 129280, 5120);
    expect(&c, "head.weight", DS41_DT_BF16, 129280, 5120);
    expect(&c, "norm.weight", DS41_DT_BF16, 5120, -1);
    /* every layer and stage */
    expect(&c, "layers.0.attn.attn_sink", DS41_DT_F32, 64, -1);
    expect(&c, "layers.0.attn.wq_a.scale", DS41_DT_F8_E8M0, 40, 160);
    expect(&c, "layers.0.attn.wq_b.weight", DS41_DT_F8_E4M3, 32768, 1280);
    expect(&c, "layers.0.attn.wq_b.scale", DS41_DT_F8_E8M0, 1024, 40);
    expect(&c, "layers.0.attn.wkv.scale", DS41_DT_F8_E8M0, 16, 160);
    expect(&c, "layers.0.attn.wo_a.weight", DS41_DT_F8_E4M3, 8192, 4096);
    expect(&c, "layers.0.attn.wo_a.scale", DS41_DT_F8_E8M0, 256, 128);
    expect(&c, "layers.0.attn.wo_b.scale", DS41_DT_F8_E8M0, 160, 256);
    expect(&c, "layers.7.hc_attn_fn", DS41_DT_F32, 24, 20480);
    expect(&c, "layers.7.hc_ffn_scale", DS41_DT_F32, 3, -1);
    expect(&c, "layers.7.ffn.gate.weight", DS41_DT_BF16, 384, 5120);
    expect(&c, "layers.7.ffn.gate.bias_vl", DS41_DT_F32, 384, -1);
    expect(&c, "layers.0.ffn.experts.383.w1.weight", DS41_DT_I8, 2304, 2560);
    expect(&c, "layers.0.ffn.experts.383.w1.scale", DS41_DT_F8_E8M0, 2304, 160);
    expect(&c, "layers.0.ffn.experts.383.w2.weight", DS41_DT_I8, 5120, 1152);
    expect(&c, "layers.0.ffn.experts.383.w2.scale", DS41_DT_F8_E8M0, 5120, 72);
    expect(&c, "layers.0.ffn.experts.384.w1.weight", ABSENT);
    expect(&c, "layers.0.ffn.shared_experts.w1.scale", DS41_DT_F8_E8M0, 72, 160);
    expect(&c, "layers.0.ffn.shared_experts.w2.scale", DS41_DT_F8_E8M0, 160, 72);
    /* KV sources */
    expect(&c, "layers.2.attn.compressor.wgate.weight", DS41_DT_BF16, 512, 5120);
    expect(&c, "layers.20.attn.compressor.wkv.weight", DS41_DT_BF16, 512, 5120);
    expect(&c, "layers.20.attn.compressor.wgate.weight", ABSENT);
    expect(&c, "layers.14.attn.indexer.wk.weight", DS41_DT_BF16, 128, 512);
    expect(&c, "layers.8.attn.indexer.k_norm.weight", DS41_DT_BF16, 128, -1);
    expect(&c, "layers.3.attn.compressor.norm.weight", ABSENT);
    /* index sources */
    expect(&c, "layers.24.attn.indexer.weights_proj.weight", DS41_DT_BF16, 32, 5120);
    expect(&c, "layers.24.attn.indexer.wq_b.scale", DS41_DT_F8_E8M0, 128, 40);
    expect(&c, "layers.24.attn.indexer.wk.weight", ABSENT);
    expect(&c, "layers.25.attn.indexer.wq_b.weight", ABSENT);
    /* Engram */
    expect(&c, "layers.1.engram.embed.weight", DS41_DT_F8_E4M3, 384006168, 256);
    expect(&c, "layers.14.engram.embed.scale", DS41_DT_F8_E8M0, 384016682, 8);
    expect(&c, "layers.1.engram.q_weight", DS41_DT_BF16, 4, 5120);
    expect(&c, "layers.1.engram.wkv.weight", DS41_DT_F8_E4M3, 25600, 6144);
    expect(&c, "layers.1.engram.wkv.scale", DS41_DT_F8_E8M0, 800, 192);
    expect(&c, "layers.2.engram.wkv.weight", ABSENT);
    /* DSpark */
    expect(&c, "mtp.0.ffn.gate.weight", DS41_DT_BF16, 128, 5120);
    expect(&c, "mtp.0.ffn.experts.127.w3.weight", DS41_DT_I8, 2304, 2560);
    expect(&c, "mtp.0.ffn.experts.128.w3.weight", ABSENT);
    expect(&c, "mtp.0.main_proj.weight", DS41_DT_F8_E4M3, 5120, 15360);
    expect(&c, "mtp.0.main_proj.scale", DS41_DT_F8_E8M0, 160, 480);
    expect(&c, "mtp.0.main_norm.weight", DS41_DT_BF16, 5120, -1);
    expect(&c, "mtp.1.main_proj.weight", ABSENT);
    expect(&c, "mtp.2.norm.weight", DS41_DT_BF16, 5120, -1);
    expect(&c, "mtp.2.markov_head.embed.weight", DS41_DT_BF16, 129280, 256);
    expect(&c, "mtp.2.markov_head.head.weight", DS41_DT_BF16, 129280, 256);
    expect(&c, "mtp.2.confidence_head.proj.weight", DS41_DT_BF16, 1, 5376);
    expect(&c, "mtp.0.attn.compressor.wkv.weight", ABSENT);
    /* absent in V4.1 */
    expect(&c, "layers.0.hc_head_fn", ABSENT);
    expect(&c, "layers.2.attn.compressor.ape", ABSENT);
    expect(&c, "layers.0.ffn.gate.tid2eid", ABSENT);
    ds41_config_free(&c);
}

/* ------------------------------------------------------------------------------------------
 * A small safetensors writer (test side)
 * ---------------------------------------------------------------------------------------- */

typedef struct wtensor { char name[96]; ds41_dtype dt; int ndim; int64_t shape[2]; uint64_t nbytes; } wtensor;
typedef struct wlist { wtensor *t; size_t n, cap; } wlist;

static void wadd(wlist *l, const char *name, ds41_dtype dt, int ndim, int64_t d0, int64_t d1) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 256;
        l->t = realloc(l->t, l->cap * sizeof *l->t);
    }
    wtensor *t = &l->t[l->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dt = dt;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->nbytes = (uint64_t)ds41_dtype_size(dt);
    for (int i = 0; i < ndim; i++) t->nbytes *= (uint64_t)t->shape[i];
}

static int collect_cb(const ds41_tensor_spec *s, void *ctx) {
    wadd(ctx, s->name, s->dtype, s->ndim, s->shape[0], s->shape[1]);
    return 0;
}

static wtensor *wfind(wlist *l, const char *name) {
    for (size_t i = 0; i < l->n; i++)
        if (!strcmp(l->t[i].name, name)) return &l->t[i];
    return NULL;
}

static void wremove(wlist *l, const char *name) {
    wtensor *t = wfind(l, name);
    if (t) *t = l->t[--l->n];
}

/* Writes the tensors packed without holes and aligned to their element size: 8-byte
 * multiples first, then 4, then 2, then the rest. Byte j of a tensor = (its index + j) & 255. */
static int wwrite(wlist *l, const char *path) {
    json_t *h = json_object();
    uint64_t off = 0;
    size_t order_n = 0;
    size_t *order = malloc((l->n ? l->n : 1) * sizeof *order);
    for (int pass = 0; pass < 4; pass++) {
        for (size_t i = 0; i < l->n; i++) {
            uint64_t b = l->t[i].nbytes;
            int cls = b % 8 == 0 ? 0 : b % 4 == 0 ? 1 : b % 2 == 0 ? 2 : 3;
            if (cls != pass) continue;
            order[order_n++] = i;
            json_t *e = json_object();
            json_object_set_new(e, "dtype", json_string(ds41_dtype_name(l->t[i].dt)));
            json_t *s = json_array();
            for (int d = 0; d < l->t[i].ndim; d++) json_array_append_new(s, json_integer(l->t[i].shape[d]));
            json_object_set_new(e, "shape", s);
            json_t *o = json_array();
            json_array_append_new(o, json_integer((json_int_t)off));
            json_array_append_new(o, json_integer((json_int_t)(off + b)));
            json_object_set_new(e, "data_offsets", o);
            json_object_set_new(h, l->t[i].name, e);
            off += b;
        }
    }
    char *text = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    size_t hl = strlen(text), padded = (hl + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(text);
        free(order);
        return -1;
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(text, 1, hl, f);
    for (size_t i = hl; i < padded; i++) fputc(' ', f);
    for (size_t k = 0; k < order_n; k++) {
        size_t i = order[k];
        for (uint64_t j = 0; j < l->t[i].nbytes; j++) fputc((int)((i + j) & 255), f);
    }
    free(text);
    free(order);
    return fclose(f);
}

static void tiny_list(const ds41_config *c, wlist *l) {
    memset(l, 0, sizeof *l);
    ds41_contract_each(c, NULL, collect_cb, l);
}

/* Scratch files under $DS41_BUILD/test-model, removed at the end of the run. */
static char written[32][1024];
static int n_written;

static char *tmp_path(const char *name) {
    static char buf[1024];
    char dir[900];
    snprintf(dir, sizeof dir, "%s/%s/test-model", root(), build_dir());
    mkdir(dir, 0755);
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    if (n_written < 32) snprintf(written[n_written++], sizeof written[0], "%s", buf);
    return buf;
}

static void remove_scratch(void) {
    char dir[1024];
    for (int i = 0; i < n_written; i++) remove(written[i]);
    snprintf(dir, sizeof dir, "%s/%s/test-model/tinydir/model.safetensors", root(), build_dir());
    remove(dir);
    snprintf(dir, sizeof dir, "%s/%s/test-model/tinydir/config.json", root(), build_dir());
    remove(dir);
    snprintf(dir, sizeof dir, "%s/%s/test-model/tinydir", root(), build_dir());
    rmdir(dir);
    snprintf(dir, sizeof dir, "%s/%s/test-model", root(), build_dir());
    rmdir(dir);
}

/* Writes l, opens it and binds it; returns the bind result, err filled. */
static int write_and_bind(const ds41_config *c, wlist *l, const char *file, ds41_weights *w, ds41_st **st,
                          ds41_err *err) {
    char *p = tmp_path(file);
    *st = NULL;
    memset(w, 0, sizeof *w);
    if (wwrite(l, p)) {
        snprintf(err->msg, sizeof err->msg, "cannot write %s", p);
        return -2;
    }
    if (ds41_st_open(p, st, err)) return -2;
    return ds41_weights_bind(c, *st, w, err);
}

/* ------------------------------------------------------------------------------------------ */

static void test_bind_tiny_complete(void) {
    ds41_config c;
    if (load("tests/configs/tiny", &c)) return;
    wlist l;
    tiny_list(&c, &l);
    size_t expected = l.n;
    wadd(&l, "vision.blocks.0.attn.qkv.weight", DS41_DT_BF16, 2, 8, 8);
    wadd(&l, "image_newline", DS41_DT_BF16, 1, 256, 0);
    wadd(&l, "layers.0.attn.mystery.weight", DS41_DT_F32, 1, 4, 0);
    ds41_weights w;
    ds41_st *st;
    ds41_err err;
    int old = ds41_log_level;
    ds41_log_level = 0;
    int rc = write_and_bind(&c, &l, "tiny-complete.safetensors", &w, &st, &err);
    ds41_log_level = old;
    CHECK(rc == 0, "bind failed: %s", err.msg);
    if (rc == 0) {
        CHECK(w.n_bound == expected, "bound %zu of %zu", w.n_bound, expected);
        CHECK(w.n_vision == 2 && w.n_unexpected == 1, "vision %zu unexpected %zu", w.n_vision, w.n_unexpected);
        CHECK(w.n_layers == 7, "n_layers %d", w.n_layers);
        const ds41_tensor *t = ds41_st_find(st, "embed.weight");
        CHECK(t && (const void *)w.embed == t->data, "embed view");
        t = ds41_st_find(st, "layers.1.attn.compressor.wgate.weight");
        CHECK(t && (const void *)w.layers[1].comp_wgate.w == t->data, "ratio-2 wgate view");
        CHECK(w.layers[1].comp_wgate.out == 64 && w.layers[1].comp_wgate.in == 256, "wgate dims");
        CHECK(w.layers[3].comp_wgate.w == NULL && w.layers[3].comp_wkv.w != NULL, "ratio-1 source has no wgate");
        CHECK(w.layers[5].idx_wq_b.w != NULL && w.layers[5].idx_wk.w == NULL, "reindex layer: own q, no wk");
        CHECK(w.layers[2].idx_wq_b.w == NULL && w.layers[2].comp_wkv.w == NULL, "reuse layer: no indexer");
        CHECK(w.layers[0].eg_rows == 660 && w.layers[1].eg_rows == 864 && w.layers[0].eg_embed, "engram rows");
        CHECK(w.layers[2].eg_embed == NULL, "no engram on layer 2");
        CHECK(w.layers[6].main_proj.out == 256 && w.layers[6].main_proj.in == 512 && w.layers[6].main_proj.s,
              "mtp.0 main_proj");
        CHECK(w.layers[6].conf_proj.in == 256 + 32 && w.layers[6].markov_embed.w, "mtp.0 heads");
        CHECK(w.layers[0].n_experts == 4 && w.layers[0].experts[3].w2.out == 256 && w.layers[0].experts[3].w2.in == 128,
              "expert dims");
        t = ds41_st_find(st, "layers.4.ffn.experts.3.w2.scale");
        CHECK(t && (const void *)w.layers[4].experts[3].w2.s == t->data, "expert scale view");
        t = ds41_st_find(st, "layers.4.hc_ffn_scale");
        CHECK(t && (const void *)w.layers[4].hc_ffn_scale == t->data, "hc scale view");
        CHECK(w.layers[4].gate_bias_vl != NULL, "bias_vl bound (vision_config present)");
        ds41_weights_free(&w);
    }
    if (st) ds41_st_close(st);
    free(l.t);
    ds41_config_free(&c);
}

static void bind_expect_error(const char *file, void (*mutate)(wlist *), const char *substr) {
    ds41_config c;
    if (load("tests/configs/tiny", &c)) return;
    wlist l;
    tiny_list(&c, &l);
    mutate(&l);
    ds41_weights w;
    ds41_st *st;
    ds41_err err;
    memset(&err, 0, sizeof err);
    int rc = write_and_bind(&c, &l, file, &w, &st, &err);
    CHECK(rc == -1, "%s: bind returned %d (%s)", file, rc, err.msg);
    CHECK(strstr(err.msg, substr) != NULL, "%s: message '%s' lacks '%s'", file, err.msg, substr);
    CHECK(w.layers == NULL, "weights left allocated");
    if (rc == 0) ds41_weights_free(&w);
    if (st) ds41_st_close(st);
    free(l.t);
    ds41_config_free(&c);
}

static void drop_scale(wlist *l) { wremove(l, "layers.2.attn.wq_b.scale"); }
static void swap_expert_shape(wlist *l) {
    wtensor *t = wfind(l, "layers.3.ffn.experts.1.w2.weight");
    int64_t a = t->shape[0];
    t->shape[0] = t->shape[1];
    t->shape[1] = a;
}
static void wrong_dtype(wlist *l) {
    wtensor *t = wfind(l, "layers.0.attn.attn_sink");
    t->dt = DS41_DT_BF16;
    t->nbytes = 2 * (uint64_t)t->shape[0];
}
static void drop_engram(wlist *l) {
    wremove(l, "layers.1.engram.embed.weight");
}
static void drop_bias_vl(wlist *l) {
    for (size_t i = 0; i < l->n;)
        if (strstr(l->t[i].name, "gate.bias_vl")) l->t[i] = l->t[--l->n];
        else i++;
}

static void test_bind_missing(void) {
    bind_expect_error("tiny-missing.safetensors", drop_scale,
                      "tensor layers.2.attn.wq_b.scale: missing from the checkpoint (expected F8_E8M0 [8, 2])");
}
static void test_bind_wrong_shape(void) {
    bind_expect_error("tiny-shape.safetensors", swap_expert_shape,
                      "tensor layers.3.ffn.experts.1.w2.weight: expected I8 [256, 64], found I8 [64, 256]");
}
static void test_bind_wrong_dtype(void) {
    bind_expect_error("tiny-dtype.safetensors", wrong_dtype,
                      "tensor layers.0.attn.attn_sink: expected F32 [4], found BF16 [4]");
}
static void test_bind_missing_engram(void) {
    bind_expect_error("tiny-engram.safetensors", drop_engram,
                      "tensor layers.1.engram.embed.weight: missing from the checkpoint (expected F8_E4M3 [864, 32])");
}
/* with a vision tower in the config, gate.bias_vl is required */
static void test_bind_bias_vl_required(void) {
    bind_expect_error("tiny-novl.safetensors", drop_bias_vl,
                      "tensor layers.0.ffn.gate.bias_vl: missing from the checkpoint (expected F32 [4])");
}

/* without a vision tower, a checkpoint without gate.bias_vl binds (reference Gate) */
static void test_bind_bias_vl_optional(void) {
    ds41_config c;
    if (load("tests/configs/tiny", &c)) return;
    c.vision_n_layers = 0;
    wlist l;
    memset(&l, 0, sizeof l);
    ds41_contract_each(&c, NULL, collect_cb, &l);
    size_t n_with = l.n;
    for (int i = 0; i < 7; i++) {
        char n[64];
        snprintf(n, sizeof n, "%s.%d.ffn.gate.bias_vl", i < 6 ? "layers" : "mtp", i < 6 ? i : 0);
        wremove(&l, n);
    }
    CHECK(l.n == n_with - 7, "removed %zu", n_with - l.n);
    ds41_weights w;
    ds41_st *st;
    ds41_err err;
    int rc = write_and_bind(&c, &l, "tiny-novl-ok.safetensors", &w, &st, &err);
    CHECK(rc == 0, "bind failed: %s", err.msg);
    if (rc == 0) {
        CHECK(w.layers[0].gate_bias_vl == NULL && w.layers[0].gate_bias != NULL, "bias_vl absent");
        CHECK(w.n_bound == l.n, "bound %zu of %zu", w.n_bound, l.n);
        ds41_weights_free(&w);
    }
    if (st) ds41_st_close(st);
    free(l.t);
    ds41_config_free(&c);
}

static void test_check_stats(void) {
    ds41_config c;
    if (load("tests/configs/tiny", &c)) return;
    wlist l;
    tiny_list(&c, &l);
    size_t n = l.n;
    drop_scale(&l);
    swap_expert_shape(&l);
    wadd(&l, "layers.9.attn.wq_a.weight", DS41_DT_F8_E4M3, 2, 64, 256);
    wadd(&l, "aligner.w1.weight", DS41_DT_BF16, 2, 4, 4);
    char *p = tmp_path("tiny-stats.safetensors");
    ds41_st *st = NULL;
    ds41_err err;
    CHECK(wwrite(&l, p) == 0, "write");
    if (ds41_st_open(p, &st, &err)) {
        CHECK(0, "open: %s", err.msg);
    } else {
        ds41_check_stats s;
        CHECK(ds41_weights_check(&c, st, &s, &err) == 0, "check: %s", err.msg);
        CHECK(s.expected == n && s.present == n - 2, "expected %zu present %zu", s.expected, s.present);
        CHECK(s.missing == 1 && s.misshaped == 1 && s.vision == 1 && s.unexpected == 1, "m %zu s %zu v %zu u %zu",
              s.missing, s.misshaped, s.vision, s.unexpected);
        CHECK(s.n_unexpected_names == 1 && !strcmp(s.unexpected_names[0], "layers.9.attn.wq_a.weight"), "names");
        CHECK(s.n_missing_names == 1 && !strcmp(s.missing_names[0], "layers.2.attn.wq_b.scale"), "missing names");
        CHECK(strstr(s.first_problem, "layers.2.attn.wq_b.scale") || strstr(s.first_problem, "experts.1.w2"),
              "first problem %s", s.first_problem);
        ds41_check_stats_free(&s);
        ds41_st_close(st);
    }
    free(l.t);
    ds41_config_free(&c);
}

static void test_model_open(void) {
    /* a directory holding only config.json: no tensors, no error */
    ds41_model m;
    ds41_err err;
    char path[1024];
    snprintf(path, sizeof path, "%s/models/production", root());
    CHECK(ds41_model_open(path, &m, &err) == 0, "open config-only: %s", err.msg);
    CHECK(m.st == NULL && m.cfg.n_layers == 40 && m.w.layers == NULL, "config-only model");
    ds41_model_close(&m);
    /* a directory with config.json and a complete model.safetensors */
    ds41_config c;
    if (load("tests/configs/tiny", &c)) return;
    wlist l;
    tiny_list(&c, &l);
    char dir[1024], file[1100], cfgp[1100], src[1024];
    snprintf(dir, sizeof dir, "%s/%s/test-model/tinydir", root(), build_dir());
    tmp_path("x");
    mkdir(dir, 0755);
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    snprintf(src, sizeof src, "%s/tests/configs/tiny/config.json", root());
    char *text = NULL;
    size_t len = 0;
    CHECK(ds41_read_file(src, 1 << 20, &text, &len, &err) == 0, "read tiny config");
    FILE *f = fopen(cfgp, "wb");
    if (f && text) {
        fwrite(text, 1, len, f);
        fclose(f);
    }
    free(text);
    CHECK(wwrite(&l, file) == 0, "write");
    CHECK(ds41_model_open(dir, &m, &err) == 0, "open tiny dir: %s", err.msg);
    CHECK(m.st != NULL && m.w.n_bound == l.n && m.w.layers[3].comp_wkv.w != NULL, "bound %zu", m.w.n_bound);
    ds41_model_close(&m);
    /* a defect: the error names the directory and the tensor */
    swap_expert_shape(&l);
    CHECK(wwrite(&l, file) == 0, "write");
    CHECK(ds41_model_open(dir, &m, &err) == -1, "defective dir opened");
    CHECK(strstr(err.msg, "tinydir") && strstr(err.msg, "layers.3.ffn.experts.1.w2.weight"), "message %s", err.msg);
    free(l.t);
    ds41_config_free(&c);
}

int main(void) {
    RUN_CASE(test_contract_production);
    RUN_CASE(test_bind_tiny_complete);
    RUN_CASE(test_bind_missing);
    RUN_CASE(test_bind_wrong_shape);
    RUN_CASE(test_bind_wrong_dtype);
    RUN_CASE(test_bind_missing_engram);
    RUN_CASE(test_bind_bias_vl_required);
    RUN_CASE(test_bind_bias_vl_optional);
    RUN_CASE(test_check_stats);
    RUN_CASE(test_model_open);
    remove_scratch();
    return check_exit();
}
