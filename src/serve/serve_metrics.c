/* ds41 serve: Prometheus metrics (serve_metrics.h). Names follow vLLM's /metrics so that
 * dashboards and `vllm bench` style tooling read them unchanged; ds41-only ones use ds41:. */
#define _GNU_SOURCE
#include "serve_metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void hist_init(ds41_hist *h, const char *name, const char *help, const double *b, int nb) {
    memset(h, 0, sizeof *h);
    h->name = name;
    h->help = help;
    h->nb = nb < DS41_HIST_MAX ? nb : DS41_HIST_MAX;
    memcpy(h->bounds, b, (size_t)h->nb * sizeof *b);
}

void ds41_metrics_init(ds41_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    static const double lat[] = { 0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                  2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0 };
    static const double itl[] = { 0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                  0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0 };
    static const double tok[] = { 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000,
                                  100000, 200000, 500000, 1000000 };
    int nl = sizeof lat / sizeof lat[0], ni = sizeof itl / sizeof itl[0], nt = sizeof tok / sizeof tok[0];
    hist_init(&m->ttft, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", lat, nl);
    hist_init(&m->itl, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itl, ni);
    hist_init(&m->e2e, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", lat, nl);
    hist_init(&m->queue, "vllm:request_queue_time_seconds", "Histogram of time spent in the waiting queue in seconds.", lat, nl);
    hist_init(&m->prefill, "vllm:request_prefill_time_seconds", "Histogram of time spent in prefill in seconds.", lat, nl);
    hist_init(&m->decode, "vllm:request_decode_time_seconds", "Histogram of time spent in decode in seconds.", lat, nl);
    hist_init(&m->prompt_len, "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tok, nt);
    hist_init(&m->gen_len, "vllm:request_generation_tokens", "Number of generation tokens processed.", tok, nt);
    hist_init(&m->iter_tokens, "vllm:iteration_tokens_total", "Histogram of number of tokens per engine step.", tok, nt);
    hist_init(&m->kv_transfer, "ds41:kv_transfer_seconds",
              "Remote prefills: seconds from the first KV layer frame received to the last (DONE).", lat, nl);
}

void ds41_metrics_free(ds41_metrics *m) { pthread_mutex_destroy(&m->mu); }

void ds41_metrics_observe(ds41_metrics *m, ds41_hist *h, double v) {
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < h->nb && v > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
    pthread_mutex_unlock(&m->mu);
}

void ds41_metrics_status(ds41_metrics *m, int status) {
    if (status < 100 || status >= 600) return;
    pthread_mutex_lock(&m->mu);
    m->status[status]++;
    pthread_mutex_unlock(&m->mu);
}

typedef struct out { char *p; size_t n, cap; } out;

static void outf(out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void outf(out *o, const char *fmt, ...) {
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(o->p ? o->p + o->n : NULL, o->p ? o->cap - o->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (o->p && o->n + (size_t)k < o->cap) { o->n += (size_t)k; return; }
        size_t nc = (o->cap ? o->cap * 2 : 8192) + (size_t)k;
        char *np = realloc(o->p, nc);
        if (!np) return;
        o->p = np;
        o->cap = nc;
    }
}

static void gauge(out *o, const char *name, const char *help, const char *lbl, double v) {
    outf(o, "# HELP %s %s\n# TYPE %s gauge\n%s{%s} %.17g\n", name, help, name, name, lbl, v);
}
static void counter(out *o, const char *name, const char *help, const char *lbl, unsigned long long v) {
    outf(o, "# HELP %s %s\n# TYPE %s counter\n%s{%s} %llu\n", name, help, name, name, lbl, v);
}
static void hist(out *o, const ds41_hist *h, const char *lbl) {
    outf(o, "# HELP %s %s\n# TYPE %s histogram\n", h->name, h->help, h->name);
    unsigned long long c = 0;
    for (int i = 0; i < h->nb; i++) {
        c += h->counts[i];
        outf(o, "%s_bucket{%s,le=\"%g\"} %llu\n", h->name, lbl, h->bounds[i], c);
    }
    c += h->counts[h->nb];
    outf(o, "%s_bucket{%s,le=\"+Inf\"} %llu\n%s_sum{%s} %.17g\n%s_count{%s} %llu\n", h->name, lbl, c, h->name, lbl,
         h->sum, h->name, lbl, h->count);
}

void ds41_metrics_label(const char *model_name, char *lbl, size_t cap) {
    /* a label value: backslash, quote and newline escaped */
    char mn[200];
    size_t k = 0;
    for (const char *p = model_name; *p && k + 2 < sizeof mn; p++) {
        if (*p == '\\' || *p == '"') mn[k++] = '\\';
        if (*p == '\n') { mn[k++] = '\\'; mn[k++] = 'n'; continue; }
        mn[k++] = *p;
    }
    mn[k] = 0;
    snprintf(lbl, cap, "model_name=\"%s\"", mn);
}

char *ds41_metrics_text(ds41_metrics *m, const ds41_gauges *g, const char *model_name, size_t *len) {
    out o = { 0 };
    char lbl[300];
    ds41_metrics_label(model_name, lbl, sizeof lbl);
    pthread_mutex_lock(&m->mu);
    gauge(&o, "vllm:num_requests_running", "Number of requests in model execution batches.", lbl, (double)g->running);
    gauge(&o, "vllm:num_requests_waiting", "Number of requests waiting to be processed.", lbl, (double)g->waiting);
    gauge(&o, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage (reserved bytes / --kv-budget).", lbl,
          g->kv_budget > 0 ? (double)g->kv_reserved / (double)g->kv_budget : 0.0);
    counter(&o, "vllm:num_preemptions_total", "Cumulative number of preemptions (ds41 reserves up front: always 0).", lbl, m->preempted);
    counter(&o, "vllm:prompt_tokens_total", "Number of prefill tokens processed.", lbl, m->prompt_tokens);
    counter(&o, "vllm:generation_tokens_total", "Number of generation tokens processed.", lbl, m->generation_tokens);
    static const char *fin[DS41_FIN_N] = { "stop", "length", "abort", "error" };
    outf(&o, "# HELP vllm:request_success_total Count of finished requests by finish reason.\n"
             "# TYPE vllm:request_success_total counter\n");
    for (int i = 0; i < DS41_FIN_N; i++)
        outf(&o, "vllm:request_success_total{%s,finished_reason=\"%s\"} %llu\n", lbl, fin[i], m->finished[i]);
    hist(&o, &m->ttft, lbl);
    hist(&o, &m->itl, lbl);
    hist(&o, &m->e2e, lbl);
    hist(&o, &m->queue, lbl);
    hist(&o, &m->prefill, lbl);
    hist(&o, &m->decode, lbl);
    hist(&o, &m->prompt_len, lbl);
    hist(&o, &m->gen_len, lbl);
    hist(&o, &m->iter_tokens, lbl);
    if (m->prefix_cache) {
        counter(&o, "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", lbl,
                m->prefix_queries);
        counter(&o, "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", lbl, m->prefix_hits);
        gauge(&o, "ds41:prefix_cache_bytes", "Bytes of prefix-cache blocks held in memory (inside --kv-budget).", lbl,
              (double)g->prefix_bytes);
    }
    if (m->pd) {
        counter(&o, "ds41:remote_prefills_total", "Prompts prefilled by a prefill node (their KV received).", lbl,
                m->remote_prefills);
        counter(&o, "ds41:remote_prefill_fallbacks_total",
                "Remote prefills that failed and were prefilled locally instead (--on-prefill-failure local).", lbl,
                m->remote_fallbacks);
        counter(&o, "ds41:kv_transfer_bytes_total", "Bytes of KV transfer frames received from prefill nodes.", lbl,
                m->kv_transfer_bytes);
        hist(&o, &m->kv_transfer, lbl);
    }
    gauge(&o, "ds41:sessions_open", "Engine sessions open (one per running sequence; 0 when idle).", lbl, (double)g->sessions_open);
    gauge(&o, "ds41:kv_budget_bytes", "KV byte budget for admission control (--kv-budget).", lbl, (double)g->kv_budget);
    gauge(&o, "ds41:kv_reserved_bytes", "Bytes reserved by admitted sequences.", lbl, (double)g->kv_reserved);
    gauge(&o, "ds41:kv_used_bytes", "Bytes of sequence state held by open sessions.", lbl, (double)g->kv_used);
    gauge(&o, "ds41:http_connections", "Open HTTP connections.", lbl, (double)g->connections);
    counter(&o, "ds41:engine_steps_total", "Engine steps (one ds41_batch_step call each).", lbl, m->steps);
    if (g->eg_table_bytes > 0) {
        gauge(&o, "ds41:engram_table_bytes", "Bytes of the Engram tables.", lbl, (double)g->eg_table_bytes);
        gauge(&o, "ds41:engram_prefetch", "1 when the Engram rows are prefetched from disk (--engram-mode prefetch).", lbl,
              (double)g->eg_prefetch);
    }
    if (g->eg_prefetch) {
        gauge(&o, "ds41:engram_row_cache_bytes", "Capacity of the Engram row cache (--engram-cache).", lbl,
              (double)g->eg_cache_bytes);
        counter(&o, "ds41:engram_steps_total", "Forwards that looked up Engram rows.", lbl, (unsigned long long)g->eg_steps);
        counter(&o, "ds41:engram_row_lookups_total", "Distinct Engram rows per forward, summed.", lbl,
                (unsigned long long)g->eg_lookups);
        counter(&o, "ds41:engram_row_cache_hits_total", "Engram row lookups served by the row cache.", lbl,
                (unsigned long long)g->eg_hits);
        counter(&o, "ds41:engram_rows_read_total", "Engram rows read from disk.", lbl, (unsigned long long)g->eg_rows_read);
        counter(&o, "ds41:engram_bytes_read_total", "Bytes of Engram rows read from disk.", lbl,
                (unsigned long long)g->eg_bytes_read);
        counter(&o, "ds41:engram_read_retries_total", "Engram reads retried (failed or short).", lbl,
                (unsigned long long)g->eg_retries);
        counter(&o, "ds41:engram_read_errors_total", "Engram rows whose reads failed for good (the forward failed).", lbl,
                (unsigned long long)g->eg_errors);
        outf(&o, "# HELP ds41:engram_stall_seconds_total Time forwards waited for Engram rows.\n"
                 "# TYPE ds41:engram_stall_seconds_total counter\nds41:engram_stall_seconds_total{%s} %.9f\n", lbl,
             g->eg_stall_s);
    }
    if (g->grammar) {
        counter(&o, "ds41:grammar_tables_builds_total", "Grammar token-class tables built (once per distinct grammar cached).",
                lbl, (unsigned long long)g->gt.builds);
        counter(&o, "ds41:grammar_tables_hits_total", "Constrained requests whose grammar's tables were cached already.", lbl,
                (unsigned long long)g->gt.hits);
        counter(&o, "ds41:grammar_masks_prefetched_total", "Grammar masks computed beside the step's forward.", lbl,
                (unsigned long long)g->gt_prefetched);
        gauge(&o, "ds41:grammar_tables_cached", "Grammars in the table cache.", lbl, (double)g->gt.entries);
        gauge(&o, "ds41:grammar_tables_bytes", "Bytes of grammar tables in the cache.", lbl, (double)g->gt.bytes);
        outf(&o, "# HELP ds41:grammar_tables_build_seconds_total Time spent building grammar tables.\n"
                 "# TYPE ds41:grammar_tables_build_seconds_total counter\nds41:grammar_tables_build_seconds_total{%s} %.6f\n",
             lbl, g->gt.build_s);
    }
    if (g->vision) {
        counter(&o, "ds41:images_encoded_total", "Images whose embeddings the vision tower computed.", lbl,
                (unsigned long long)g->vc.encoded);
        counter(&o, "ds41:images_reused_total", "Images whose embeddings came from the image cache (no tower).", lbl,
                (unsigned long long)g->vc.reused);
        counter(&o, "ds41:image_cache_evictions_total", "Images dropped from the image cache for room.", lbl,
                (unsigned long long)g->vc.evicted);
        gauge(&o, "ds41:image_cache_entries", "Images whose embeddings the image cache holds.", lbl, (double)g->vc.entries);
        gauge(&o, "ds41:image_cache_bytes", "Bytes of embeddings in the image cache (--image-cache).", lbl, (double)g->vc.bytes);
    }
    if (m->spec_positions > 0) {
        counter(&o, "vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts (verify blocks with K >= 1).", lbl,
                m->spec_drafts);
        counter(&o, "vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens verified.", lbl, m->spec_draft_tokens);
        counter(&o, "vllm:spec_decode_num_accepted_tokens_total", "Number of accepted draft tokens.", lbl,
                m->spec_accepted_tokens);
        outf(&o, "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted draft tokens by draft position.\n"
                 "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter\n");
        for (int i = 0; i < m->spec_positions && i < 64; i++)
            outf(&o, "vllm:spec_decode_num_accepted_tokens_per_pos_total{%s,position=\"%d\"} %llu\n", lbl, i,
                 m->spec_accepted_at[i]);
        outf(&o, "# HELP ds41:spec_decode_num_draft_tokens_per_pos_total Verified draft tokens by draft position.\n"
                 "# TYPE ds41:spec_decode_num_draft_tokens_per_pos_total counter\n");
        for (int i = 0; i < m->spec_positions && i < 64; i++)
            outf(&o, "ds41:spec_decode_num_draft_tokens_per_pos_total{%s,position=\"%d\"} %llu\n", lbl, i,
                 m->spec_drafted_at[i]);
        counter(&o, "ds41:spec_decode_verify_steps_total", "Decode rows run as verify blocks (K >= 0).", lbl,
                m->spec_verify_steps);
    }
    outf(&o, "# HELP ds41:http_responses_total HTTP responses by status code.\n# TYPE ds41:http_responses_total counter\n");
    for (int s = 100; s < 600; s++)
        if (m->status[s]) outf(&o, "ds41:http_responses_total{%s,code=\"%d\"} %llu\n", lbl, s, m->status[s]);
    pthread_mutex_unlock(&m->mu);
    *len = o.n;
    return o.p;
}
