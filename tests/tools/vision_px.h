/* Shared by the vision test tools (vision_feed, vision_ask): a raw BF16 pixel file read as
 * floats, and the greedy pick. */
#ifndef DS41_TESTS_VISION_PX_H
#define DS41_TESTS_VISION_PX_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* PATH holds exactly the [3, H, W] BF16 little-endian values (a longer file: its head); NULL
 * when it cannot be read. The caller frees the result. */
static inline float *vision_px_read(const char *path, int H, int W) {
    size_t np = (size_t)3 * H * W;
    uint16_t *raw = malloc(np * 2);
    float *px = malloc(np * sizeof(float));
    FILE *f = fopen(path, "rb");
    int ok = raw && px && f && fread(raw, 2, np, f) == np;
    if (f) fclose(f);
    for (size_t i = 0; ok && i < np; i++) {
        uint32_t u = (uint32_t)raw[i] << 16;
        memcpy(&px[i], &u, 4);
    }
    free(raw);
    if (!ok) {
        free(px);
        return NULL;
    }
    return px;
}

static inline int vision_px_argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}
#endif
