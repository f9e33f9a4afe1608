/* ds41 run's speculative decoding (--spec off|fixed:K|auto): the generation loop over
 * ds41_spec_step, per-step JSON, the final statistics, the throughput curve cache. */
#ifndef DS41_CLI_SPEC_H
#define DS41_CLI_SPEC_H

#include <stdio.h>

#include "ds41.h"
#include "tokenizer.h"

typedef struct ds41_cli_spec {
    int mode, k;                  /* DS41_SPEC_*, fixed K */
    int explicit_arg;             /* --spec was given */
} ds41_cli_spec;

/* NULL arg: auto when the model has DSpark stages (block > 0), else off; `plain_only`
 * (--trace, --draft-trace, --force-ids) makes the default off and an explicit --spec other
 * than off an error. Returns 0, or 2 (usage error printed). */
int ds41_cli_spec_parse(const char *cmd, const char *arg, int block, int plain_only, ds41_cli_spec *out);

/* The curve for --spec auto: the cache file, else a start-up calibration (saved). */
int ds41_cli_spec_curve(ds41_engine *e, const char *dir, int threads, int exact, int quiet, ds41_spec_curve *c);

typedef struct ds41_cli_spec_run {
    ds41_cli_spec spec;
    ds41_engine *e;
    ds41_session *s;
    const char *dir;
    int threads, exact;
    ds41_tokenizer *tok;          /* or NULL: ids printed */
    ds41_detok_stream *ds;
    int json, top_lp, n_predict, eos, ignore_eos;
    FILE *fdump;
    /* out */
    int n_gen, n_dec;
    char stats_line[512];         /* else the statistics' stderr line, without its newline */
    double t_decode;
    void *stats_json;             /* --json: the statistics object (a jansson json_t *, owned by the caller) */
} ds41_cli_spec_run;
/* Generates after the prompt was fed; prints tokens as ds41 run does (--json: the last token
 * object of each step carries "spec_step": {proposal, proposed, drafted, accepted, emitted, expected,
 * conf}), and the statistics (--json: stats_json, else stats_line, which ds41 run prints on stderr
 * after the text's line ends). */
int ds41_cli_spec_generate(ds41_cli_spec_run *r);

#endif

/* ds41 bench --spec: on a prompt (spec_prompt tokenized with DIR/tokenizer.json, else
 * prompt_ids), greedy decode of n tokens plain (a session without the drafter, what --spec off
 * runs), plain with the drafter's context rings kept, --spec fixed:1..B, auto, and auto with
 * P5 metadata reuse off, `rounds` times interleaved: median tokens/s and median of each
 * round's ratio to plain, acceptance per position, mean accepted length, the K the scheduler
 * chose, whether the tokens equal plain decoding; the verify-width curve and the proposal's
 * cost (measured now, also saved to the cache), and what a step costs against a plain one
 * (the break-even and 1.8x acceptance). root != NULL: adds "spec" to it (--json). */
int ds41_cli_bench_spec(ds41_engine *e, const char *dir, int threads, int exact, const char *spec_prompt,
                        const int32_t *prompt_ids, int n_prompt, int n, int rounds, void *json_root);
