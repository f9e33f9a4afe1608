/* ds41 serve: a validated request's logits processing (src/engine/lproc.h) for one of its
 * sequences: penalties, logit_bias, min_tokens, the grammar of its constrained output and the
 * budget of its reasoning. */
#ifndef DS41_SERVE_LPROC_H
#define DS41_SERVE_LPROC_H

#include "lproc.h"
#include "serve_req.h"

/* Fills lp from r for a vocabulary of V with end token eos; gm: the request's grammar matcher
 * (NULL: none), gate: </think> when the reply starts as reasoning (the grammar starts after it,
 * and r->think_budget counts the tokens before it), else -1 (at once). 0, or -1 with e
 * set (a token id outside the vocabulary: 400 naming the member). */
int ds41_serve_lproc(const ds41_req *r, int V, int eos, ds41_gmatch *gm, int gate, ds41_lproc *lp, ds41_req_error *e);

#endif
