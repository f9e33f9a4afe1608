/* The cache geometry the RESUME corpus is written for (tests/malformed/kvx_make.py), shared by
 * fuzz/fuzz_kvx.c and tests/test_kvx.c: small, so that seeds stay small, with every part a
 * payload has (2 rings of 4 slots x 8 B, one ratio-2 compressor of dim 4, 6-value context rows; the decoder
 * split: ring 0 shipped, 3 stream rows of 5 values). */
#ifndef DS41_KVX_TEST_GEOM_H
#define DS41_KVX_TEST_GEOM_H

#include "kvx_resume.h"

#define KVX_TEST_POS 256   /* the position the RESUME seeds follow */

static const ds41_kvx_geom kvx_test_geom = {
    .n_rings = 2, .slots = 4, .rec_bytes = 8,
    .n_comp = 1, .comp_layer = { 1 }, .comp_ratio = { 2 }, .comp_dim = { 4 },
    .n_layers = 3, .n_hist_ids = 10, .mh_width = 6,
    .stream_layer = 1, .stream_width = 5, .stream_max = 3,
};

#endif
