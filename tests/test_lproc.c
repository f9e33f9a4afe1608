/* Logits processing (src/engine/lproc.h): each control's exact effect on a row, in the
 * documented order; a verify tail counts as accepted tokens without changing the state;
 * min_tokens bans the end tokens until enough are generated; a row never ends all -inf. */
#include "check.h"
#include "lproc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define V 8

static void row_init(float *r) {
    static const float base[V] = { 1.0f, -2.0f, 3.0f, 0.5f, -0.5f, 2.0f, 0.0f, 4.0f };
    memcpy(r, base, sizeof base);
}

static void test_bias_and_penalties(void) {
    CASE_BEGIN();
    ds41_lproc lp;
    ds41_lproc_init(&lp, V, 7);
    CHECK(!ds41_lproc_active(&lp), "all off: inactive");
    lp.freq = 0.5f;
    lp.pres = 0.25f;
    lp.rep = 2.0f;
    int32_t bid[1] = { 3 };
    float bval[1] = { 1.5f };
    lp.bias_id = malloc(sizeof bid); memcpy(lp.bias_id, bid, sizeof bid);
    lp.bias_val = malloc(sizeof bval); memcpy(lp.bias_val, bval, sizeof bval);
    lp.n_bias = 1;
    CHECK(ds41_lproc_active(&lp) && ds41_lproc_ready(&lp) == 0, "ready");
    int32_t prompt[3] = { 1, 2, 1 };
    CHECK(ds41_lproc_prompt(&lp, prompt, 3) == 0, "prompt");
    ds41_lproc_accept(&lp, 5);
    ds41_lproc_accept(&lp, 5);
    ds41_lproc_accept(&lp, 2);
    float r[V];
    row_init(r);
    ds41_lproc_apply(&lp, r, NULL, 0);
    /* 1: prompt only, negative: * 2 = -4; 2: prompt + generated once, positive: 3 / 2 - 0.5 - 0.25
     * = 0.75; 3: bias 0.5 + 1.5 = 2 (no penalty); 5: generated twice: 2 / 2 - 1 - 0.25 = -0.25 */
    CHECK(r[0] == 1.0f && r[1] == -4.0f && r[2] == 0.75f && r[3] == 2.0f && r[4] == -0.5f && r[5] == -0.25f &&
          r[6] == 0.0f && r[7] == 4.0f, "row %g %g %g %g %g %g %g %g", r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]);
    /* a tail [6, 6] is counted for the row only */
    int32_t tail[2] = { 6, 6 };
    row_init(r);
    ds41_lproc_apply(&lp, r, tail, 2);
    CHECK(r[6] == 0.0f - 1.0f - 0.25f, "tail counted: %g", r[6]);   /* 0 * 2 = 0, then - 0.5 * 2 - 0.25 */
    row_init(r);
    ds41_lproc_apply(&lp, r, NULL, 0);
    CHECK(r[6] == 0.0f, "tail not kept: %g", r[6]);
    ds41_lproc_free(&lp);
    case_end("lproc_bias_and_penalties");
}

static void test_min_tokens(void) {
    CASE_BEGIN();
    ds41_lproc lp;
    ds41_lproc_init(&lp, V, 7);
    lp.min_tokens = 2;
    lp.ban_ids = malloc(2 * sizeof *lp.ban_ids);
    lp.ban_ids[0] = 7;
    lp.ban_ids[1] = 4;
    lp.n_ban = 2;
    CHECK(ds41_lproc_active(&lp) && ds41_lproc_ready(&lp) == 0, "ready");
    float r[V];
    row_init(r);
    ds41_lproc_apply(&lp, r, NULL, 0);
    CHECK(r[7] == -INFINITY && r[4] == -INFINITY && r[2] == 3.0f, "banned before 2");
    int32_t t1[1] = { 2 };
    row_init(r);
    ds41_lproc_apply(&lp, r, t1, 1);
    CHECK(r[7] == -INFINITY, "one in the tail: still banned");
    int32_t t2[2] = { 2, 2 };
    row_init(r);
    ds41_lproc_apply(&lp, r, t2, 2);
    CHECK(r[7] == 4.0f && r[4] == -0.5f, "two in the tail: allowed");
    ds41_lproc_accept(&lp, 1);
    ds41_lproc_accept(&lp, 1);
    row_init(r);
    ds41_lproc_apply(&lp, r, NULL, 0);
    CHECK(r[7] == 4.0f, "two accepted: allowed");
    ds41_lproc_free(&lp);
    case_end("lproc_min_tokens");
}

static void test_never_empty(void) {
    CASE_BEGIN();
    ds41_lproc lp;
    ds41_lproc_init(&lp, V, 7);
    lp.n_bias = V;
    lp.bias_id = malloc(V * sizeof *lp.bias_id);
    lp.bias_val = malloc(V * sizeof *lp.bias_val);
    for (int i = 0; i < V; i++) { lp.bias_id[i] = i; lp.bias_val[i] = -INFINITY; }
    ds41_lproc_ready(&lp);
    float r[V];
    row_init(r);
    ds41_lproc_apply(&lp, r, NULL, 0);
    int allowed = 0;
    for (int i = 0; i < V; i++) allowed += r[i] > -INFINITY;
    CHECK(allowed == 1 && r[7] == 0.0f, "only the end token left (%d allowed)", allowed);
    ds41_lproc_free(&lp);
    case_end("lproc_never_empty");
}

/* The reasoning budget: think_end (5) alone once `budget` reasoning tokens are accepted or in
 * the tail; nothing after the reasoning closed; drafts past it cut at the first refusal */
static void test_think_budget(void) {
    CASE_BEGIN();
    ds41_lproc lp;
    ds41_lproc_init(&lp, V, 7);
    ds41_lproc_think_budget(&lp, 9, 2);   /* not a token of the vocabulary: stays off */
    CHECK(!ds41_lproc_active(&lp), "an end outside the vocabulary: off");
    ds41_lproc_think_budget(&lp, 5, 2);
    CHECK(ds41_lproc_active(&lp) && ds41_lproc_ready(&lp) == 0, "ready");
    float r[V];
    row_init(r);
    ds41_lproc_apply(&lp, r, NULL, 0);
    CHECK(r[0] == 1.0f && r[7] == 4.0f && r[5] == 2.0f, "nothing spent: the row as it was");
    int32_t t2[2] = { 1, 3 };
    row_init(r);
    ds41_lproc_apply(&lp, r, t2, 2);
    int allowed = 0;
    for (int i = 0; i < V; i++) allowed += r[i] > -INFINITY;
    CHECK(allowed == 1 && r[5] == 2.0f, "two in the tail: </think> alone, its logit kept (%d allowed, %g)", allowed, r[5]);
    int32_t closed[2] = { 5, 3 };
    row_init(r);
    ds41_lproc_apply(&lp, r, closed, 2);
    CHECK(r[0] == 1.0f && r[7] == 4.0f, "closed in the tail: free");
    ds41_lproc_accept(&lp, 1);
    row_init(r);
    ds41_lproc_apply(&lp, r, NULL, 0);
    CHECK(r[7] == 4.0f, "one accepted: free");
    int32_t d[4] = { 2, 3, 5, 6 };
    CHECK(ds41_lproc_valid_prefix(&lp, d, 4) == 1, "drafts: the second is past the budget");
    int32_t d2[4] = { 5, 3, 4, 6 };
    CHECK(ds41_lproc_valid_prefix(&lp, d2, 4) == 4, "drafts that close it: all");
    ds41_lproc_accept(&lp, 1);
    row_init(r);
    r[5] = -INFINITY;   /* a bias of -inf on </think> does not keep the reasoning going */
    ds41_lproc_apply(&lp, r, NULL, 0);
    allowed = 0;
    for (int i = 0; i < V; i++) allowed += r[i] > -INFINITY;
    CHECK(allowed == 1 && r[5] == 0.0f, "two accepted: </think> alone at 0 (%d allowed, %g)", allowed, r[5]);
    ds41_lproc_accept(&lp, 5);
    row_init(r);
    ds41_lproc_apply(&lp, r, NULL, 0);
    CHECK(r[0] == 1.0f && r[5] == 2.0f && r[7] == 4.0f && ds41_lproc_valid_prefix(&lp, d, 4) == 4, "closed: free again");
    ds41_lproc_free(&lp);
    ds41_lproc_init(&lp, V, 7);
    ds41_lproc_think_budget(&lp, 5, 0);
    ds41_lproc_ready(&lp);
    row_init(r);
    ds41_lproc_apply(&lp, r, NULL, 0);
    CHECK(r[5] == 2.0f && r[0] == -INFINITY && r[7] == -INFINITY, "budget 0: </think> first");
    ds41_lproc_free(&lp);
    case_end("lproc_think_budget");
}

int main(void) {
    test_bias_and_penalties();
    test_min_tokens();
    test_never_empty();
    test_think_budget();
    return check_total_failed ? 1 : 0;
}
