/* ds41 serve: request -> logits processor (serve_lproc.h). */
#include "serve_lproc.h"

#include <stdlib.h>
#include <string.h>

#define OOM() ds41_req_fail(e, 500, "internal_error", NULL, NULL, "out of memory")

int ds41_serve_lproc(const ds41_req *r, int V, int eos, ds41_gmatch *gm, int gate, ds41_lproc *lp, ds41_req_error *e) {
    ds41_lproc_init(lp, V, eos);
    if (gm) {
        lp->gm = gm;
        lp->gate = gate;
        if (r->n_stop_token_ids) {
            lp->stop_ids = malloc(r->n_stop_token_ids * sizeof *lp->stop_ids);
            if (!lp->stop_ids) return OOM();
            for (size_t i = 0; i < r->n_stop_token_ids; i++) lp->stop_ids[i] = r->stop_token_ids[i];
            lp->n_stop_ids = (int)r->n_stop_token_ids;
        }
    }
    /* gate: </think> when the reply starts as reasoning; the budget counts the tokens before it */
    if (gate >= 0 && r->think_budget >= 0) ds41_lproc_think_budget(lp, gate, r->think_budget);
    lp->freq = (float)r->frequency_penalty;
    lp->pres = (float)r->presence_penalty;
    lp->rep = (float)r->repetition_penalty;
    if (r->n_bias) {
        lp->bias_id = malloc((size_t)r->n_bias * sizeof *lp->bias_id);
        lp->bias_val = malloc((size_t)r->n_bias * sizeof *lp->bias_val);
        if (!lp->bias_id || !lp->bias_val) return OOM();
        for (int i = 0; i < r->n_bias; i++) {
            if (r->bias_id[i] >= V)
                return ds41_req_fail(e, 400, "invalid_request_error", "logit_bias", NULL,
                                     "logit_bias: token id %d is outside the vocabulary 0..%d", r->bias_id[i], V - 1);
            lp->bias_id[i] = r->bias_id[i];
            lp->bias_val[i] = r->bias_val[i];
        }
        lp->n_bias = r->n_bias;
    }
    if (r->min_tokens > 0) {
        /* vLLM's min_tokens: the end token and the stop ids cannot come before */
        lp->min_tokens = r->min_tokens;
        lp->ban_ids = malloc((r->n_stop_token_ids + 1) * sizeof *lp->ban_ids);
        if (!lp->ban_ids) return OOM();
        if (eos >= 0) lp->ban_ids[lp->n_ban++] = eos;
        for (size_t i = 0; i < r->n_stop_token_ids; i++)
            if (r->stop_token_ids[i] < V) lp->ban_ids[lp->n_ban++] = r->stop_token_ids[i];
    }
    for (size_t i = 0; i < r->n_stop_token_ids; i++)
        if (r->stop_token_ids[i] >= V)
            return ds41_req_fail(e, 400, "invalid_request_error", "stop_token_ids", NULL,
                                 "stop_token_ids: token id %d is outside the vocabulary 0..%d", r->stop_token_ids[i], V - 1);
    return 0;
}
