/* ds41 serve: a request's images encoded off the scheduler thread (docs/vision.md,
 * "Scheduling"). The tower takes seconds at production width; run on the scheduler thread it
 * would stall every other stream for that long. A job encodes the images of one sequence on
 * a thread of its own, with a thread pool of its own (ds41_image_span_apart: the engine's pool
 * runs one job at a time, and one attention job of the tower would hold a batch step for
 * seconds), while the scheduler keeps stepping the others and polls the job. An image seen
 * recently takes its rows from the image cache (serve_vcache.h) and skips the tower. */
#ifndef DS41_SERVE_VISION_H
#define DS41_SERVE_VISION_H

#include <stddef.h>
#include <stdint.h>

#include "cli_vprompt.h"
#include "ds41.h"
#include "serve_vcache.h"

typedef struct ds41_vjob ds41_vjob;

/* Starts encoding images img[k] (len[k] bytes, borrowed: they must stay valid until
 * ds41_vjob_finish) on a new thread; without a thread they are encoded before it returns.
 * An image whose rows the cache vc holds (NULL: none) takes them and skips the tower; the
 * others go through it and into vc. NULL only when out of memory. */
ds41_vjob *ds41_vjob_start(ds41_engine *e, ds41_vcache *vc, uint8_t *const *img, const size_t *len, int n);
/* 1 once the images are encoded (or one failed): ds41_vjob_finish then does not wait. */
int ds41_vjob_done(ds41_vjob *j);
/* Waits for the job and frees it. 0: *out = the n images (spans and content keys; the caller
 * frees each with ds41_cli_image_free, then the array); -1: msg says which image failed why. */
int ds41_vjob_finish(ds41_vjob *j, ds41_cli_vimage **out, char *msg, size_t cap);

#endif
