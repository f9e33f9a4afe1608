/* Prompts with images for ds41 run and ds41 chat (docs/vision.md, "Where an image goes"): each
 * image's span replaces one image placeholder, the chat template's <｜deepseek_image｜> in text
 * or the config's image_token_id in a list of ids, in order, as the official
 * prepare_vl_inputs expands them. The result is what ds41_feed_embeds takes. */
#ifndef DS41_CLI_VPROMPT_H
#define DS41_CLI_VPROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "ds41.h"
#include "tokenizer.h"

/* One image file through the tower: its span [rows, dim] and its content key (the prefix
 * cache's, ds41_image_prepare). */
typedef struct ds41_cli_vimage {
    char *path;
    float *span;
    int rows;
    uint8_t key[32];
} ds41_cli_vimage;

/* An encoded image (PNG or JPEG bytes) through ds41_image_prepare and the tower
 * (ds41_image_span, or with apart ds41_image_span_apart: the server encodes off its scheduler
 * thread): 0, or -1 with msg (im then empty). */
int ds41_cli_image_encode(ds41_engine *e, const uint8_t *data, size_t len, int apart, ds41_cli_vimage *im, char *msg,
                          size_t cap);
/* Reads and encodes path (ds41_cli_image_encode); messages start with the path. */
int ds41_cli_image_load(ds41_engine *e, const char *path, ds41_cli_vimage *im, ds41_err *err);
void ds41_cli_image_free(ds41_cli_vimage *im);

/* ids[n] with is_image[n], emb[n * dim] and key[n * 32], each image position's content key
 * (emb, key and is_image NULL while no image was placed). */
typedef struct ds41_cli_vprompt {
    int32_t *ids;
    uint8_t *is_image;
    float *emb;
    uint8_t *key;
    size_t n, cap;
    int dim, n_images;
} ds41_cli_vprompt;

void ds41_cli_vprompt_free(ds41_cli_vprompt *p);
/* text tokenized as ds41_cli_vprompt_text does, each placeholder one image_token_id position
 * flagged in is_image (no embeddings: p->emb stays NULL); the number of placeholders must
 * equal n_images. The server's prompt ids before the scheduler places the images. */
int ds41_cli_vprompt_split(ds41_cli_vprompt *p, const ds41_tokenizer *tok, const char *text, size_t len, int add_bos,
                           int n_images, int32_t image_token_id, ds41_err *err);
/* text: tokenized piece by piece around each placeholder (special tokens parsed; BOS added in
 * front when add_bos), the k-th placeholder expanded to images[k]. The number of placeholders
 * must equal n_images. */
int ds41_cli_vprompt_text(ds41_cli_vprompt *p, const ds41_tokenizer *tok, const char *text, size_t len, int add_bos,
                          const ds41_cli_vimage *images, int n_images, int dim, int32_t image_token_id, ds41_err *err);
/* ids: each image_token_id expanded to the next image; their number must equal n_images. */
int ds41_cli_vprompt_ids(ds41_cli_vprompt *p, const int32_t *ids, size_t n, const ds41_cli_vimage *images,
                         int n_images, int dim, int32_t image_token_id, ds41_err *err);
/* The feed: ds41_feed_embeds (ds41_feed when no image was placed). */
int ds41_cli_vprompt_feed(ds41_session *s, const ds41_cli_vprompt *p, size_t from);
/* The prompt as the prefix cache keys it (its ids are p->ids): is_image NULL for a text prompt. */
ds41_prefix_img ds41_cli_vprompt_keys(const ds41_cli_vprompt *p);

#endif
