/* ds41 long-context measurement support (issue 11, items 6 and 7): a synthetic context builder
 * for the decode benchmark and the engine switches of the deployment performance points. */
#ifndef DS41_LONGCTX_H
#define DS41_LONGCTX_H

#include "forward.h"

/* Fills an empty sequence's state as if n tokens had been prefilled, without running the
 * model: every KV source's store gets n / ratio entries of valid packed records (main KV Q4nv,
 * index K Q4mx) made by the engine's quantizers from random BF16 values (seeded), every SWA and
 * DSpark ring its window of Q8 records, the ratio-r compressors random state rows, the Engram
 * history random compressed ids, the published index-K owner the one n decodes leave, and the
 * position n. The values are not what a prompt would produce, but every later forward reads
 * exactly the bytes and does exactly the work it would after a real prefill of n tokens (same
 * entry counts, lists, top-k widths, record formats). Requires position 0 and n < max_pos. */
int ds41_seq_synthetic(ds41_seq *s, long long n, uint64_t seed, ds41_err *err);

#endif
