/* ds41 run --spec: see cli_spec.h and README "Speculative decoding". */
#include "cli_args.h"
#include "cli_spec.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int ds41_cli_spec_parse(const char *cmd, const char *arg, int block, int plain_only, ds41_cli_spec *o) {
    memset(o, 0, sizeof *o);
    o->explicit_arg = arg != NULL;
    if (!arg) { o->mode = block > 0 && !plain_only ? DS41_SPEC_AUTO : DS41_SPEC_OFF; return 0; }
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
    if (have_path && ds41_spec_curve_load(path, c) == 0) return 0;
    char err[512];
    double t0 = now_s();
    int w = ds41_draft_block_size(e) + 1;
    if (ds41_spec_calibrate(e, w, 32, 3, c, err, sizeof err)) {
        fprintf(stderr, "ds41: speculative calibration failed: %s\n", err);
        return -1;
    }
    if (have_path && ds41_spec_curve_save(path, c) == 0) ds41_spec_curve_load(path, c);   /* the saved values */
    if (!quiet)
        fprintf(stderr, "ds41: measured the verify-width curve in %.2f s (widths 1..%d)%s%s\n", now_s() - t0, c->n,
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
        double t1 = now_s();
        int m = ds41_spec_step(s, &p, out, cap, lg, &info, &st);
        double dt = now_s() - t1;
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
                fwrite(text, 1, tl, stdout);
            } else {
                printf("%s%d", r->n_gen ? " " : "", next);
            }
            r->n_gen++;
            if (!r->ignore_eos && r->eos >= 0 && next == r->eos) done = 1;
        }
        if (held) {
            json_t *c = json_array();
            for (int k = 0; k < info.proposed; k++) json_array_append_new(c, json_real(info.conf[k]));
            json_object_set_new(held, "spec_step", json_pack("{s:i,s:i,s:i,s:i,s:f,s:o}", "proposed", info.proposed,
                                                             "drafted", info.drafted, "accepted", info.accepted,
                                                             "emitted", m, "expected", info.expected, "conf", c));
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
        fprintf(stderr, "ds41 run: spec %s: %lld steps, drafted %lld, accepted %lld (%.1f %%), mean accepted length %.2f, "
                "%.2f tokens/step; acceptance by position:", mname, st.steps, st.drafted, st.accepted, 100 * rate,
                mean_acc, st.steps ? (double)st.emitted / st.steps : 0.0);
        for (int i = 0; i < B; i++)
            fprintf(stderr, " %.3f", st.drafted_at[i] ? (double)st.accepted_at[i] / st.drafted_at[i] : 0.0);
        fputc('\n', stderr);
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
    int n, identical;
    ds41_spec_stats st;
    long long chose[DS41_SPEC_MAX_DRAFTS + 1];
} bench_run;

static int bench_one(ds41_engine *e, const int32_t *prompt, int np, int n, int mode, int k, const ds41_spec_curve *cv,
                     int reuse, int32_t *toks, const int32_t *ref, bench_run *o) {
    memset(o, 0, sizeof *o);
    ds41_session_params sp;
    ds41_session_params_default(&sp);
    sp.draft = ds41_draft_block_size(e) > 0;
    sp.no_meta_reuse = !reuse;
    char err[512];
    ds41_session *s = ds41_session_open(e, &sp, err, sizeof err);
    if (!s) { fprintf(stderr, "ds41 bench: %s\n", err); return -1; }
    if (ds41_feed(s, prompt, (size_t)np)) { fprintf(stderr, "ds41 bench: %s\n", ds41_session_error(s)); ds41_session_close(s); return -1; }
    int B = ds41_draft_block_size(e), got = 0;
    int32_t out[DS41_SPEC_MAX_DRAFTS + 2];
    double t0 = now_s();
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
            for (int j = 0; j < m && got < n; j++) toks[got++] = out[j];
        }
    }
    o->seconds = now_s() - t0;
    o->n = n;
    o->tps = n / o->seconds;
    o->identical = ref ? !memcmp(ref, toks, (size_t)n * sizeof(int32_t)) : 1;
    ds41_session_close(s);
    return 0;
}

int ds41_cli_bench_spec(ds41_engine *e, const char *dir, int threads, int exact, const char *spec_prompt,
                        const int32_t *prompt_ids, int n_prompt, int n, void *json_root) {
    int B = ds41_draft_block_size(e);
    if (B == 0) { fprintf(stderr, "ds41 bench: --spec: %s has no DSpark stages\n", dir); return 1; }
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
    ds41_spec_curve cv;
    char err[512];
    if (ds41_spec_calibrate(e, B + 1, 32, 5, &cv, err, sizeof err)) { fprintf(stderr, "ds41 bench: %s\n", err); free(prompt); return 1; }
    char path[4096];
    int saved = ds41_spec_curve_path(dir, threads, exact, path, sizeof path) == 0 && ds41_spec_curve_save(path, &cv) == 0;
    int32_t *ref = malloc((size_t)n * sizeof(int32_t)), *toks = malloc((size_t)n * sizeof(int32_t));
    bench_run plain, fx[DS41_SPEC_MAX_DRAFTS + 1], au, au_noreuse;
    int rc = 1;
    if (!ref || !toks) goto done;
    if (bench_one(e, prompt, (int)np, n, -1, 0, NULL, 1, ref, NULL, &plain)) goto done;
    for (int k = 1; k <= B; k++)
        if (bench_one(e, prompt, (int)np, n, DS41_SPEC_FIXED, k, NULL, 1, toks, ref, &fx[k])) goto done;
    if (bench_one(e, prompt, (int)np, n, DS41_SPEC_AUTO, 0, &cv, 1, toks, ref, &au)) goto done;
    if (bench_one(e, prompt, (int)np, n, DS41_SPEC_AUTO, 0, &cv, 0, toks, ref, &au_noreuse)) goto done;
    if (json_root) {
        json_t *curve = json_array(), *fixed = json_array(), *acc = json_array(), *chose = json_array();
        for (int w = 1; w <= cv.n; w++)
            json_array_append_new(curve, json_pack("{s:i,s:f,s:f}", "width", w, "steps_per_s", cv.sps[w], "cost_vs_decode",
                                                   cv.sps[1] / cv.sps[w]));
        for (int k = 1; k <= B; k++)
            json_array_append_new(fixed, json_pack("{s:i,s:f,s:f,s:f,s:b}", "k", k, "tokens_per_s", fx[k].tps, "speedup",
                                                   fx[k].tps / plain.tps, "mean_accepted",
                                                   fx[k].st.steps ? (double)fx[k].st.accepted / fx[k].st.steps : 0.0,
                                                   "identical", fx[k].identical));
        for (int i = 0; i < B; i++) {
            /* acceptance per position from the fixed:B run (every position drafted every step) */
            const ds41_spec_stats *st = &fx[B].st;
            json_array_append_new(acc, json_real(st->drafted_at[i] ? (double)st->accepted_at[i] / st->drafted_at[i] : 0.0));
        }
        for (int k = 0; k <= B; k++) json_array_append_new(chose, json_integer(au.chose[k]));
        json_t *o = json_pack("{s:i,s:i,s:f,s:o,s:o,s:o,s:{s:f,s:f,s:f,s:b,s:o},s:{s:f,s:f},s:s}", "prompt_tokens", (int)np,
                              "tokens", n, "plain_tokens_per_s", plain.tps, "curve", curve, "fixed", fixed,
                              "acceptance_by_position", acc, "auto", "tokens_per_s", au.tps, "speedup", au.tps / plain.tps,
                              "mean_accepted", au.st.steps ? (double)au.st.accepted / au.st.steps : 0.0, "identical",
                              au.identical, "chose_k", chose, "auto_meta_reuse_off", "tokens_per_s", au_noreuse.tps,
                              "speedup", au_noreuse.tps / plain.tps, "curve_file", saved ? path : "");
        json_object_set_new((json_t *)json_root, "spec", o);
    } else {
        printf("\nspeculative decoding (greedy, %zu-token prompt, %d tokens, block %d)\n", np, n, B);
        printf("verify-width curve (steps/s; cost relative to a decode step)%s%s:\n", saved ? ", cached in " : "",
               saved ? path : "");
        for (int w = 1; w <= cv.n; w++) printf("  width %d: %10.2f steps/s  x%.2f\n", w, cv.sps[w], cv.sps[1] / cv.sps[w]);
        printf("%-22s %10s %8s %14s %10s\n", "mode", "tok/s", "speedup", "mean accepted", "identical");
        printf("%-22s %10.2f %8.2f %14s %10s\n", "plain", plain.tps, 1.0, "-", "-");
        for (int k = 1; k <= B; k++) {
            char name[32];
            snprintf(name, sizeof name, "fixed:%d", k);
            printf("%-22s %10.2f %8.2f %14.2f %10s\n", name, fx[k].tps, fx[k].tps / plain.tps,
                   fx[k].st.steps ? (double)fx[k].st.accepted / fx[k].st.steps : 0.0, fx[k].identical ? "yes" : "NO");
        }
        printf("%-22s %10.2f %8.2f %14.2f %10s\n", "auto", au.tps, au.tps / plain.tps,
               au.st.steps ? (double)au.st.accepted / au.st.steps : 0.0, au.identical ? "yes" : "NO");
        printf("%-22s %10.2f %8.2f %14.2f %10s\n", "auto, P5 reuse off", au_noreuse.tps, au_noreuse.tps / plain.tps,
               au_noreuse.st.steps ? (double)au_noreuse.st.accepted / au_noreuse.st.steps : 0.0,
               au_noreuse.identical ? "yes" : "NO");
        printf("acceptance by draft position (fixed:%d):", B);
        for (int i = 0; i < B; i++)
            printf(" %.3f", fx[B].st.drafted_at[i] ? (double)fx[B].st.accepted_at[i] / fx[B].st.drafted_at[i] : 0.0);
        printf("\nscheduler (auto) chose K = 0..%d:", B);
        for (int k = 0; k <= B; k++) printf(" %lld", au.chose[k]);
        printf(" steps\n");
    }
    rc = 0;
done:
    free(ref);
    free(toks);
    free(prompt);
    return rc;
}
