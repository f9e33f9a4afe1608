/* ds41 serve: a validated request's logits processing (src/engine/lproc.h) for one of its
 * sequences: penalties, logit_bias, min_tokens, and the grammar of its constrained output. */
#ifndef DS41_SERVE_LPROC_H
#define DS41_SERVE_LPROC_H

#include "lproc.h"
#include "serve_req.h"

/* Fills lp from r for a vocabulary of V with end token eos; gm: the request's grammar matcher
 * (NULL: none), gate: the token after which the grammar starts (-1: at once). 0, or -1 with e
 * set (a token id outside the vocabulary: 400 naming the member). */
int ds41_serve_lproc(const ds41_req *r, int V, int eos, ds41_gmatch *gm, int gate, ds41_lproc *lp, ds41_req_error *e);

#endif
