/* Prompts with images for ds41 run and ds41 chat (cli_vprompt.h). */
#define _GNU_SOURCE
#include "cli_vprompt.h"

#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "image.h"

int ds41_cli_image_encode(ds41_engine *e, const uint8_t *data, size_t len, int apart, ds41_cli_vimage *im, char *msg,
                          size_t cap) {
    memset(im, 0, sizeof *im);
    float *px = NULL;
    int H, W;
    int rc = ds41_image_prepare(e, data, len, &px, &H, &W, im->key, msg, cap);
    if (!rc) rc = (apart ? ds41_image_span_apart : ds41_image_span)(e, px, H, W, &im->span, &im->rows, msg, cap);
    free(px);
    return rc;
}

int ds41_cli_image_load(ds41_engine *e, const char *path, ds41_cli_vimage *im, ds41_err *err) {
    memset(im, 0, sizeof *im);
    char *data = NULL, msg[512];
    size_t len = 0;
    if (ds41_read_file(path, DS41_IMAGE_MAX_BYTES, &data, &len, err)) return -1;
    int rc = ds41_cli_image_encode(e, (const uint8_t *)data, len, 0, im, msg, sizeof msg);
    free(data);
    if (rc) return ds41_errf(err, "%s: %s", path, msg);
    if (!(im->path = strdup(path))) {
        ds41_cli_image_free(im);
        return ds41_errf(err, "out of memory");
    }
    return 0;
}

void ds41_cli_image_free(ds41_cli_vimage *im) {
    free(im->path);
    free(im->span);
    memset(im, 0, sizeof *im);
}

void ds41_cli_vprompt_free(ds41_cli_vprompt *p) {
    free(p->ids);
    free(p->is_image);
    free(p->emb);
    free(p->key);
    memset(p, 0, sizeof *p);
}

/* Room for k more positions (the image arrays only once an image is placed). */
static int grow(ds41_cli_vprompt *p, size_t k, ds41_err *err) {
    if (p->n + k <= p->cap) return 0;
    size_t cap = p->cap ? p->cap : 64;
    while (cap < p->n + k) cap *= 2;
    int32_t *ids = realloc(p->ids, cap * sizeof *ids);
    if (ids) p->ids = ids;
    uint8_t *img = p->is_image ? realloc(p->is_image, cap) : NULL;
    if (img) p->is_image = img;
    float *emb = p->emb ? realloc(p->emb, cap * p->dim * sizeof *emb) : NULL;
    if (emb) p->emb = emb;
    uint8_t *key = p->key ? realloc(p->key, cap * 32) : NULL;
    if (key) p->key = key;
    if (!ids || (p->is_image && !img) || (p->emb && !emb) || (p->key && !key)) return ds41_errf(err, "out of memory for a prompt of %zu positions", p->n + k);
    p->cap = cap;
    return 0;
}

static int add_ids(ds41_cli_vprompt *p, const int32_t *ids, size_t n, ds41_err *err) {
    if (grow(p, n, err)) return -1;
    memcpy(p->ids + p->n, ids, n * sizeof *ids);
    if (p->is_image) memset(p->is_image + p->n, 0, n);
    p->n += n;
    return 0;
}

static int add_image(ds41_cli_vprompt *p, const ds41_cli_vimage *im, int32_t image_token_id, ds41_err *err) {
    if (grow(p, (size_t)im->rows, err)) return -1;
    if (!p->is_image) {
        p->is_image = calloc(p->cap, 1);
        p->emb = calloc(p->cap * p->dim, sizeof *p->emb);
        p->key = calloc(p->cap, 32);
        if (!p->is_image || !p->emb || !p->key) return ds41_errf(err, "out of memory for the image embeddings");
    }
    for (int r = 0; r < im->rows; r++) {
        p->ids[p->n + r] = image_token_id;
        p->is_image[p->n + r] = 1;
        memcpy(p->key + (p->n + r) * 32, im->key, 32);
    }
    memcpy(p->emb + p->n * p->dim, im->span, (size_t)im->rows * p->dim * sizeof *p->emb);
    p->n += (size_t)im->rows;
    p->n_images++;
    return 0;
}

static int count_error(int found, int n_images, const char *where, ds41_err *err) {
    return ds41_errf(err, "%s has %d image placeholder%s but %d image%s %s given", where, found, found == 1 ? "" : "s",
                     n_images, n_images == 1 ? "" : "s", n_images == 1 ? "was" : "were");
}

/* One placeholder position: image_token_id, flagged (no embedding yet). */
static int add_placeholder(ds41_cli_vprompt *p, int32_t image_token_id, ds41_err *err) {
    if (grow(p, 1, err)) return -1;
    if (!p->is_image && !(p->is_image = calloc(p->cap, 1))) return ds41_errf(err, "out of memory for the image flags");
    p->ids[p->n] = image_token_id;
    p->is_image[p->n++] = 1;
    p->n_images++;
    return 0;
}

int ds41_cli_vprompt_split(ds41_cli_vprompt *p, const ds41_tokenizer *tok, const char *text, size_t len, int add_bos,
                           int n_images, int32_t image_token_id, ds41_err *err) {
    const char *ph = DS41_CHAT_IMAGE_PLACEHOLDER;
    size_t phl = strlen(ph);
    int found = 0;
    for (const char *q = text; (q = memmem(q, (size_t)(text + len - q), ph, phl)); q += phl) found++;
    if (found != n_images) return count_error(found, n_images, "the prompt", err);
    int32_t bos = ds41_tokenizer_bos(tok);
    if (add_bos && bos >= 0 && add_ids(p, &bos, 1, err)) return -1;
    const char *q = text, *end = text + len;
    for (int k = 0;; k++) {
        const char *hit = k < n_images ? memmem(q, (size_t)(end - q), ph, phl) : NULL;
        size_t piece = (size_t)((hit ? hit : end) - q);
        if (piece) {
            int32_t *ids = NULL;
            size_t n = 0;
            if (ds41_tokenize(tok, q, piece, 1, 0, &ids, &n, err)) return -1;
            int rc = add_ids(p, ids, n, err);
            free(ids);
            if (rc) return -1;
        }
        if (!hit) break;
        if (add_placeholder(p, image_token_id, err)) return -1;
        q = hit + phl;
    }
    return 0;
}

int ds41_cli_vprompt_text(ds41_cli_vprompt *p, const ds41_tokenizer *tok, const char *text, size_t len, int add_bos,
                          const ds41_cli_vimage *images, int n_images, int dim, int32_t image_token_id, ds41_err *err) {
    ds41_cli_vprompt t = { 0 };
    int rc = ds41_cli_vprompt_split(&t, tok, text, len, add_bos, n_images, image_token_id, err), k = 0;
    p->dim = dim;
    for (size_t i = 0; !rc && i < t.n; i++)
        rc = t.is_image && t.is_image[i] ? add_image(p, &images[k++], image_token_id, err) : add_ids(p, &t.ids[i], 1, err);
    ds41_cli_vprompt_free(&t);
    return rc;
}

int ds41_cli_vprompt_ids(ds41_cli_vprompt *p, const int32_t *ids, size_t n, const ds41_cli_vimage *images,
                         int n_images, int dim, int32_t image_token_id, ds41_err *err) {
    int found = 0;
    for (size_t i = 0; i < n; i++) found += ids[i] == image_token_id;
    if (found != n_images) return count_error(found, n_images, "--prompt-ids", err);
    p->dim = dim;
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        int rc = ids[i] == image_token_id ? add_image(p, &images[k++], image_token_id, err) : add_ids(p, &ids[i], 1, err);
        if (rc) return -1;
    }
    return 0;
}

int ds41_cli_vprompt_feed(ds41_session *s, const ds41_cli_vprompt *p, size_t from) {
    if (from >= p->n) return 0;
    if (!p->is_image) return ds41_feed(s, p->ids + from, p->n - from);
    return ds41_feed_embeds(s, p->ids + from, p->n - from, p->emb + from * p->dim, p->is_image + from);
}

ds41_prefix_img ds41_cli_vprompt_keys(const ds41_cli_vprompt *p) {
    ds41_prefix_img k = { p->is_image, p->key, p->emb, p->n };
    if (!p->key || !p->emb) k.is_image = NULL;   /* placeholders only (split): nothing placed */
    return k;
}
