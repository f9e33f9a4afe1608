/* ds41 run --spec: see cli_spec.h and README "Speculative decoding". */
#include "cli_args.h"
#include "cli_spec.h"
#include "dist.h"
#include "dist_pipe.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int ds41_cli_spec_parse(const char *cmd, const char *arg, int block, int plain_only, ds41_cli_spec *o) {
    memset(o, 0, sizeof *o);
    o->explicit_arg = arg != NULL;
    if (!arg) { o->mode = block > 0 && !plain_only && !ds41_pipe_on() ? DS41_SPEC_AUTO : DS41_SPEC_OFF; return 0; }
    if (!strcmp(arg, "off")) o->mode = DS41_SPEC_OFF;
    else if (!strcmp(arg, "auto")) o->mode = DS41_SPEC_AUTO;
    else if (!strncmp(arg, "fixed:", 6)) {
        char *end;
        errno = 0;
        long k = strtol(arg + 6, &end, 10);
        if (end == arg + 6 || *end || errno || k < 0 || k > DS41_SPEC_MAX_DRAFTS) {
            fprintf(stderr, "ds41 %s: --spec fixed:K needs K in 0..%d, got '%s'\n", cmd, DS41_SPEC_MAX_DRAFTS, arg);
            return 2;
        }
        o->mode = DS41_SPEC_FIXED;
        o->k = (int)k;
    } else {
        fprintf(stderr, "ds41 %s: --spec must be off, fixed:K or auto, not '%s'\n", cmd, arg);
        return 2;
    }
    if (o->mode != DS41_SPEC_OFF && block == 0) {
        fprintf(stderr, "ds41 %s: --spec %s: the model has no DSpark stages\n", cmd, arg);
        return 2;
    }
    if (o->mode != DS41_SPEC_OFF && plain_only) {
        fprintf(stderr, "ds41 %s: --spec %s cannot be combined with --trace, --draft-trace or --force-ids\n", cmd, arg);
        return 2;
    }
    return 0;
}

int ds41_cli_spec_curve(ds41_engine *e, const char *dir, int threads, int exact, int quiet, ds41_spec_curve *c) {
    char path[4096];
    int have_path = ds41_spec_curve_path(dir, threads, exact, path, sizeof path) == 0;
    /* under mpiexec rank 0's cache and measurement decide for every rank (docs/distributed.md):
     * the ranks calibrate together (its forwards are collective) and take rank 0's curve */
    int cached = have_path && ds41_spec_curve_load(path, c) == 0;
    ds41_dist_bcast(&cached, sizeof cached);
    if (cached) return ds41_dist_bcast(c, sizeof *c);
    char err[512];
    double t0 = ds41_cli_now();
    int w = ds41_draft_block_size(e) + 1;
    if (ds41_spec_calibrate(e, w, 32, 3, c, err, sizeof err)) {
        fprintf(stderr, "ds41: speculative calibration failed: %s\n", err);
        return -1;
    }
    if (ds41_dist_rank() == 0 && have_path && ds41_spec_curve_save(path, c) == 0) ds41_spec_curve_load(path, c);   /* the saved values */
    ds41_dist_bcast(c, sizeof *c);
    if (!quiet)
        fprintf(stderr, "ds41: measured the verify-width curve in %.2f s (widths 1..%d)%s%s\n", ds41_cli_now() - t0, c->n,
                have_path ? ", cached in " : "", have_path ? path : "");
    return 0;
}

static void put_json(json_t *o) {
    char *line = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9));
    if (line) { puts(line); free(line); }
    json_decref(o);
}

int ds41_cli_spec_generate(ds41_cli_spec_run *r) {
    ds41_session *s = r->s;
    int V = ds41_vocab_size(r->e), B = ds41_draft_block_size(r->e), cap = B + 2;
    ds41_spec_curve curve;
    memset(&curve, 0, sizeof curve);
    if (r->spec.mode == DS41_SPEC_AUTO && ds41_cli_spec_curve(r->e, r->dir, r->threads, r->exact, r->json, &curve))
        return -1;
    ds41_spec_params p = { r->spec.mode, r->spec.k, r->spec.mode == DS41_SPEC_AUTO ? &curve : NULL };
    int32_t *out = malloc((size_t)cap * sizeof(int32_t));
    float *lg = malloc((size_t)cap * V * sizeof(float));
    ds41_spec_stats st;
    memset(&st, 0, sizeof st);
    int rc = -1, done = 0;
    r->n_gen = r->n_dec = 0;
    r->t_decode = 0;
    if (!out || !lg) { fprintf(stderr, "ds41 run: out of memory\n"); goto end; }
    double t_first = 0;
    while (!done && r->n_gen < r->n_predict) {
        ds41_spec_step_info info;
        /* the step's context: pos + 1 + K <= ctx is clamped by the library; the last emitted
         * token is never fed, so a step needs one free position */
        if (ds41_session_pos(s) + 1 > ds41_ctx_size(r->e)) break;
        double t1 = ds41_cli_now();
        /* the rows only where they are read (--split layers: they stay on the last stage) */
        int m = ds41_spec_step(s, &p, out, cap, r->fdump || r->json ? lg : NULL, &info, &st);
        double dt = ds41_cli_now() - t1;
        if (m < 0) { fprintf(stderr, "\nds41 run: %s\n", ds41_session_error(s)); goto end; }
        if (r->n_gen == 0) t_first = dt;   /* the first step also samples the prefill's token */
        r->t_decode += dt;
        json_t *held = NULL;   /* --json: the step's last token object, printed with "spec_step" */
        for (int j = 0; j < m && !done && r->n_gen < r->n_predict; j++) {
            const float *row = lg + (size_t)j * V;
            if (r->fdump && fwrite(row, sizeof(float), (size_t)V, r->fdump) != (size_t)V) {
                fprintf(stderr, "ds41 run: --dump-logits: write failed: %s\n", strerror(errno));
                goto end;
            }
            int32_t next = out[j];
            char text[256];
            size_t tl = 0;
            if (r->tok) tl = ds41_detok_stream_push(r->ds, next, text, sizeof text - 1);
            text[tl] = 0;
            if (r->json) {
                json_t *o = json_object();
                json_object_set_new(o, "id", json_integer(next));
                json_object_set_new(o, "text", r->tok ? json_stringn(text, tl) : json_null());
                json_object_set_new(o, "top", ds41_cli_top_json(row, V, r->top_lp));
                if (held) put_json(held);
                held = o;
            } else if (r->tok) {
                if (r->ignore_eos || r->eos < 0 || next != r->eos) fwrite(text, 1, tl, stdout);   /* the stop token is not text */
            } else {
                printf("%s%d", r->n_gen ? " " : "", next);
            }
            r->n_gen++;
            if (!r->ignore_eos && r->eos >= 0 && next == r->eos) done = 1;
        }
        if (held) {
            json_t *c = json_array();
            for (int k = 0; k < info.proposed; k++) json_array_append_new(c, json_real(info.conf[k]));
            json_object_set_new(held, "spec_step", json_pack("{s:b,s:i,s:i,s:i,s:i,s:f,s:o}", "proposal", info.proposal,
                                                             "proposed", info.proposed, "drafted", info.drafted,
                                                             "accepted", info.accepted, "emitted", m, "expected",
                                                             info.expected, "conf", c));
            put_json(held);
        }
        fflush(stdout);
    }
    (void)t_first;
    r->n_dec = r->n_gen > 0 ? r->n_gen - 1 : 0;
    /* statistics */
    double mean_acc = st.steps ? (double)st.accepted / st.steps : 0;
    double rate = st.drafted ? (double)st.accepted / st.drafted : 0;
    const char *mname = r->spec.mode == DS41_SPEC_AUTO ? "auto" : r->spec.mode == DS41_SPEC_FIXED ? "fixed" : "off";
    if (r->json) {
        json_t *da = json_array(), *aa = json_array(), *ra = json_array(), *cv = json_array();
        for (int i = 0; i < B; i++) {
            json_array_append_new(da, json_integer(st.drafted_at[i]));
            json_array_append_new(aa, json_integer(st.accepted_at[i]));
            json_array_append_new(ra, json_real(st.drafted_at[i] ? (double)st.accepted_at[i] / st.drafted_at[i] : 0.0));
        }
        for (int w = 1; w <= curve.n; w++) json_array_append_new(cv, json_real(curve.sps[w]));
        json_t *o = json_pack("{s:s,s:i,s:I,s:I,s:I,s:I,s:f,s:f,s:f,s:o,s:o,s:o,s:o}", "mode", mname, "k", r->spec.k,
                              "steps", (json_int_t)st.steps, "drafted", (json_int_t)st.drafted, "accepted",
                              (json_int_t)st.accepted, "emitted", (json_int_t)st.emitted, "mean_accepted", mean_acc,
                              "acceptance_rate", rate, "tokens_per_step", st.steps ? (double)st.emitted / st.steps : 0.0,
                              "drafted_at", da, "accepted_at", aa, "acceptance_at", ra, "curve_steps_per_s", cv);
        r->stats_json = o;   /* ds41 run puts it into the timing object */
    } else {
        /* printed by ds41 run after the text's line ends */
        size_t o = (size_t)snprintf(r->stats_line, sizeof r->stats_line,
                                    "ds41 run: spec %s: %lld steps, drafted %lld, accepted %lld (%.1f %%), mean accepted length %.2f, "
                                    "%.2f tokens/step; acceptance by position:", mname, st.steps, st.drafted, st.accepted, 100 * rate,
                                    mean_acc, st.steps ? (double)st.emitted / st.steps : 0.0);
        for (int i = 0; i < B && o < sizeof r->stats_line; i++)
            o += (size_t)snprintf(r->stats_line + o, sizeof r->stats_line - o, " %.3f",
                                  st.drafted_at[i] ? (double)st.accepted_at[i] / st.drafted_at[i] : 0.0);
    }
    rc = 0;
end:
    free(out);
    free(lg);
    return rc;
}

/* ====================================================================== ds41 bench --spec */

typedef struct bench_run {
    double tps, seconds;
    double cpu_tps;          /* tokens per second of the thread's CPU time (-t 1: robust to other processes) */
    int n, identical;
    ds41_spec_stats st;
    long long chose[DS41_SPEC_MAX_DRAFTS + 1];
    long long proposals;   /* steps that ran a proposal */
} bench_run;

/* seconds of a drafting step of K drafts: the verify of width 1 + K, the stages, K head passes */
static double step_time(const ds41_spec_curve *c, int k) {
    return 1.0 / ds41_spec_curve_sps(c, 1 + k) + (k > 0 ? c->propose_s + k * c->draft_s : 0.0);
}

/* mode: -2 plain decoding on a session without the drafter (what --spec off runs), -1 plain
 * decoding with the drafter's rings kept (params.draft), else a DS41_SPEC_* mode */
static int bench_one(ds41_engine *e, const int32_t *prompt, int np, int n, int mode, int k, const ds41_spec_curve *cv,
                     int reuse, int32_t *toks, const int32_t *ref, bench_run *o) {
    memset(o, 0, sizeof *o);
    ds41_session_params sp;
    ds41_session_params_default(&sp);
    sp.draft = mode != -2 && ds41_draft_block_size(e) > 0;
    sp.no_meta_reuse = !reuse;
    char err[512];
    ds41_session *s = ds41_session_open(e, &sp, err, sizeof err);
    if (!s) { fprintf(stderr, "ds41 bench: %s\n", err); return -1; }
    if (ds41_feed(s, prompt, (size_t)np)) { fprintf(stderr, "ds41 bench: %s\n", ds41_session_error(s)); ds41_session_close(s); return -1; }
    int B = ds41_draft_block_size(e), got = 0;
    int32_t out[DS41_SPEC_MAX_DRAFTS + 2];
    double t0 = ds41_cli_now(), c0 = ds41_cli_cpu_thread();
    if (mode < 0) {   /* plain decoding */
        for (; got < n; got++) {
            toks[got] = ds41_session_sample(s);
            if (got + 1 < n && ds41_feed(s, &toks[got], 1)) { ds41_session_close(s); return -1; }
        }
    } else {
        ds41_spec_params p = { mode, k, cv };
        while (got < n) {
            ds41_spec_step_info info;
            int m = ds41_spec_step(s, &p, out, B + 2, NULL, &info, &o->st);
            if (m < 0) { fprintf(stderr, "ds41 bench: %s\n", ds41_session_error(s)); ds41_session_close(s); return -1; }
            o->chose[info.drafted]++;
            o->proposals += info.proposal;
            for (int j = 0; j < m && got < n; j++) toks[got++] = out[j];
        }
    }
    o->seconds = ds41_cli_now() - t0;
    double cs = ds41_cli_cpu_thread() - c0;
    o->n = n;
    o->tps = n / o->seconds;
    o->cpu_tps = cs > 0 ? n / cs : 0.0;
    o->identical = ref ? !memcmp(ref, toks, (size_t)n * sizeof(int32_t)) : 1;
    ds41_session_close(s);
    return 0;
}

/* one mode over the rounds: the last round's run (stats, choices: the same every round for
 * greedy exact decoding; in fast mode they can differ with timing only through nothing: the
 * scheduler reads the curve, not the clock) and the medians */
typedef struct bench_mode {
    const char *name;
    int mode, k, reuse;
    const ds41_spec_curve *cv;
    bench_run last;
    double tps[1000], ratio[1000], cratio[1000];
    double tps_med, ratio_med, cratio_med;
    int identical;
} bench_mode;

int ds41_cli_bench_spec(ds41_engine *e, const char *dir, int threads, int exact, const char *spec_prompt,
                        const int32_t *prompt_ids, int n_prompt, int n, int rounds, void *json_root) {
    int B = ds41_draft_block_size(e);
    if (B == 0) { fprintf(stderr, "ds41 bench: --spec: %s has no DSpark stages\n", dir); return 1; }
    if (rounds < 1) rounds = 1;
    if (rounds > 1000) rounds = 1000;
    int32_t *prompt = NULL;
    size_t np = 0;
    if (spec_prompt) {
        ds41_tokenizer *tok;
        ds41_err err;
        if (ds41_tokenizer_load(dir, &tok, &err)) { fprintf(stderr, "ds41 bench: --spec-prompt: %s\n", err.msg); return 1; }
        if (ds41_tokenize(tok, spec_prompt, strlen(spec_prompt), 1, 1, &prompt, &np, &err)) {
            fprintf(stderr, "ds41 bench: %s\n", err.msg);
            ds41_tokenizer_free(tok);
            return 1;
        }
        ds41_tokenizer_free(tok);
    } else {
        np = (size_t)n_prompt;
        prompt = malloc(np * sizeof(int32_t));
        if (prompt) memcpy(prompt, prompt_ids, np * sizeof(int32_t));
    }
    long long C = ds41_ctx_size(e);
    if (!prompt || np < 2) { fprintf(stderr, "ds41 bench: --spec needs a prompt of at least 2 tokens\n"); free(prompt); return 1; }
    if ((long long)np + n + B + 2 > C) n = (int)(C - (long long)np - B - 2);
    if (n < 1) { fprintf(stderr, "ds41 bench: --spec: the context %lld is too small (use -c)\n", C); free(prompt); return 1; }
    ds41_spec_curve cv, cv_old;
    char err[512];
    if (ds41_spec_calibrate(e, B + 1, 32, 5, &cv, err, sizeof err)) { fprintf(stderr, "ds41 bench: %s\n", err); free(prompt); return 1; }
    cv_old = cv;            /* the scheduler as it was: the proposal not counted */
    cv_old.propose_s = cv_old.draft_s = 0;
    char path[4096];
    int saved = ds41_spec_curve_path(dir, threads, exact, path, sizeof path) == 0 && ds41_spec_curve_save(path, &cv) == 0;
    int32_t *ref = malloc((size_t)n * sizeof(int32_t)), *toks = malloc((size_t)n * sizeof(int32_t));
    int nm = 0, rc = 1;
    bench_mode *m = calloc((size_t)B + 6, sizeof *m);
    if (!ref || !toks || !m) goto done;
    m[nm++] = (bench_mode){ .name = "plain", .mode = -2, .reuse = 1 };
    m[nm++] = (bench_mode){ .name = "plain, rings kept", .mode = -1, .reuse = 1 };
    static char names[DS41_SPEC_MAX_DRAFTS + 1][24];
    for (int k = 1; k <= B && k <= DS41_SPEC_MAX_DRAFTS; k++) {
        snprintf(names[k], sizeof names[k], "fixed:%d", k);
        m[nm++] = (bench_mode){ .name = names[k], .mode = DS41_SPEC_FIXED, .k = k, .reuse = 1 };
    }
    int i_auto = nm;
    m[nm++] = (bench_mode){ .name = "auto", .mode = DS41_SPEC_AUTO, .reuse = 1, .cv = &cv };
    m[nm++] = (bench_mode){ .name = "auto, P5 reuse off", .mode = DS41_SPEC_AUTO, .reuse = 0, .cv = &cv };
    m[nm++] = (bench_mode){ .name = "auto, proposal free", .mode = DS41_SPEC_AUTO, .reuse = 1, .cv = &cv_old };
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < nm; i++) {
            bench_run br;
            if (bench_one(e, prompt, (int)np, n, m[i].mode, m[i].k, m[i].cv, m[i].reuse, i == 0 ? ref : toks,
                          i == 0 ? NULL : ref, &br))
                goto done;
            m[i].identical = r == 0 ? br.identical : m[i].identical && br.identical;
            m[i].last = br;
            m[i].tps[r] = br.tps;
            m[i].ratio[r] = br.tps / m[0].tps[r];
            m[i].cratio[r] = m[0].last.cpu_tps > 0 ? br.cpu_tps / m[0].last.cpu_tps : 0.0;
        }
    }
    for (int i = 0; i < nm; i++) {
        m[i].tps_med = ds41_cli_median(m[i].tps, rounds);
        m[i].ratio_med = ds41_cli_median(m[i].ratio, rounds);
        m[i].cratio_med = ds41_cli_median(m[i].cratio, rounds);
    }
    const bench_mode *fB = &m[2 + B - 1];   /* fixed:B: every position drafted every step */
    int single = threads <= 1;               /* the thread's CPU time is the whole work */
    /* what a step costs (the curve and the proposal, in plain decode steps) and the expected
     * tokens a step of K drafts must emit to match plain decoding and to reach 1.8x */
    double t1 = 1.0 / cv.sps[1];
    if (json_root) {
        json_t *curve = json_array(), *modes = json_array(), *acc = json_array(), *chose = json_array(),
               *need = json_array();
        for (int w = 1; w <= cv.n; w++)
            json_array_append_new(curve, json_pack("{s:i,s:f,s:f}", "width", w, "steps_per_s", cv.sps[w], "cost_vs_decode",
                                                   cv.sps[1] / cv.sps[w]));
        for (int k = 1; k <= B && k + 1 <= cv.n; k++) {
            double tk = step_time(&cv, k);
            json_array_append_new(need, json_pack("{s:i,s:f,s:f,s:f}", "k", k, "step_cost_vs_decode", tk / t1,
                                                  "tokens_for_1x", tk / t1, "tokens_for_1_8x", 1.8 * tk / t1));
        }
        for (int i = 0; i < nm; i++) {
            const bench_run *b = &m[i].last;
            json_array_append_new(modes, json_pack("{s:s,s:f,s:f,s:f,s:f,s:f,s:b}", "mode", m[i].name, "tokens_per_s",
                                                   m[i].tps_med, "speedup", m[i].ratio_med, "cpu_speedup",
                                                   single ? m[i].cratio_med : 0.0, "mean_accepted",
                                                   b->st.steps ? (double)b->st.accepted / b->st.steps : 0.0,
                                                   "tokens_per_step", b->st.steps ? (double)b->st.emitted / b->st.steps : 0.0,
                                                   "identical", m[i].identical));
        }
        for (int i = 0; i < B; i++) {
            const ds41_spec_stats *st = &fB->last.st;
            json_array_append_new(acc, json_real(st->drafted_at[i] ? (double)st->accepted_at[i] / st->drafted_at[i] : 0.0));
        }
        for (int k = 0; k <= B; k++) json_array_append_new(chose, json_integer(m[i_auto].last.chose[k]));
        json_t *o = json_pack("{s:i,s:i,s:i,s:f,s:o,s:f,s:f,s:o,s:o,s:o,s:o,s:o,s:s}", "prompt_tokens", (int)np, "tokens", n,
                              "rounds", rounds, "plain_tokens_per_s", m[0].tps_med, "curve", curve, "propose_s",
                              cv.propose_s, "draft_s", cv.draft_s, "break_even", need, "modes", modes,
                              "acceptance_by_position", acc, "chose_k", chose,
                              "auto_identical", json_boolean(m[i_auto].identical), "curve_file", saved ? path : "");
        json_object_set_new(o, "auto_proposals", json_integer(m[i_auto].last.proposals));
        json_object_set_new((json_t *)json_root, "spec", o);
    } else {
        printf("\nspeculative decoding (greedy, %zu-token prompt, %d tokens, block %d, %d rounds interleaved)\n", np, n, B,
               rounds);
        printf("verify-width curve (steps/s; cost relative to a decode step)%s%s:\n", saved ? ", cached in " : "",
               saved ? path : "");
        for (int w = 1; w <= cv.n; w++) printf("  width %d: %10.2f steps/s  x%.2f\n", w, cv.sps[w], cv.sps[1] / cv.sps[w]);
        printf("proposal: the stages %.3f ms (x%.2f of a decode step), each draft taken %.3f ms (x%.2f)\n",
               cv.propose_s * 1e3, cv.propose_s / t1, cv.draft_s * 1e3, cv.draft_s / t1);
        printf("a step of K drafts costs (in decode steps; the expected tokens it must emit to match plain, to reach 1.8x):\n");
        for (int k = 1; k <= B && k + 1 <= cv.n; k++) {
            double tk = step_time(&cv, k) / t1;
            printf("  K = %d: x%.2f  (%.2f tokens for 1x, %.2f for 1.8x; at most %d)\n", k, tk, tk, 1.8 * tk, k + 1);
        }
        printf("%-22s %10s %8s %8s %14s %12s %10s\n", "mode", "tok/s", "speedup", "cpu", "mean accepted", "tokens/step",
               "identical");
        for (int i = 0; i < nm; i++) {
            const bench_run *b = &m[i].last;
            char cpu[16] = "-";
            if (single) snprintf(cpu, sizeof cpu, "%.2f", m[i].cratio_med);
            if (m[i].mode < 0)
                printf("%-22s %10.2f %8.2f %8s %14s %12s %10s\n", m[i].name, m[i].tps_med, m[i].ratio_med, cpu, "-", "-",
                       i == 0 ? "-" : m[i].identical ? "yes" : "NO");
            else
                printf("%-22s %10.2f %8.2f %8s %14.2f %12.2f %10s\n", m[i].name, m[i].tps_med, m[i].ratio_med, cpu,
                       b->st.steps ? (double)b->st.accepted / b->st.steps : 0.0,
                       b->st.steps ? (double)b->st.emitted / b->st.steps : 0.0, m[i].identical ? "yes" : "NO");
        }
        printf("(medians over the rounds; speedup = median of each round's ratio to plain in wall time; cpu = the same\n"
               " in the thread's CPU time, -t 1 only: what the work costs whatever the other processes take)\n");
        printf("acceptance by draft position (fixed:%d):", B);
        for (int i = 0; i < B; i++)
            printf(" %.3f", fB->last.st.drafted_at[i] ? (double)fB->last.st.accepted_at[i] / fB->last.st.drafted_at[i] : 0.0);
        printf("\nscheduler (auto) chose K = 0..%d:", B);
        for (int k = 0; k <= B; k++) printf(" %lld", m[i_auto].last.chose[k]);
        printf(" steps (%lld with a proposal); with the proposal not counted (the old scheduler):",
               m[i_auto].last.proposals);
        for (int k = 0; k <= B; k++) printf(" %lld", m[nm - 1].last.chose[k]);
        printf(" (%lld proposals)\n", m[nm - 1].last.proposals);
    }
    rc = 0;
done:
    free(m);
    free(ref);
    free(toks);
    free(prompt);
    return rc;
}
