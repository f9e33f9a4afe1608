/* ds41 serve: HTTP (libmicrohttpd, one thread per connection), routes, OpenAI responses, SSE.
 *
 * A request's life: the access handler collects the body (refusing it early with 413 from
 * Content-Length, and dropping the connection when the body does not arrive within
 * --body-timeout), parses it (serve_req.c), tokenizes, checks the context and the KV budget,
 * and submits one group of sequences to the scheduler. A non-streamed request then waits on
 * the group's condition variable; a streamed one returns a callback response whose reader
 * blocks on it and turns new output into SSE events. Either way the client's socket is
 * polled while waiting: a vanished client cancels its sequences (the scheduler closes their
 * sessions at the next step). Every error is an OpenAI error object. */
#define _GNU_SOURCE
#include "serve.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "config.h"
#include "dist.h"
#include "dist_pipe.h"
#include "serve_anth.h"
#include "serve_metrics.h"
#include "serve_conn.h"
#include "serve_gcache.h"
#include "serve_mpi.h"
#include "serve_lproc.h"
#include "serve_req.h"
#include "serve_resp.h"
#include "serve_sched.h"
#include "cli_vprompt.h"
#include "serve_text.h"
#include "tokenizer.h"

/* The grammar table cache's bound: the tables of a nested json_schema at the production
 * vocabulary take about 7 MB. */
enum { GCACHE_BYTES = 256 << 20 };

typedef struct server {
    const ds41_serve_opts *o;
    char model_name[256];
    ds41_engine *e;
    ds41_tokenizer *tok;
    ds41_gvocab *gv;         /* the vocabulary's bytes for grammars (NULL without a tokenizer) */
    ds41_gcache *gc;         /* grammar tables per distinct grammar (NULL without gv) */
    ds41_vcache *vc;         /* the image embedding cache (NULL: no tower, or --no-image-cache) */
    int think_end;           /* </think>: a thinking reply's grammar starts after it (-1: none) */
    ds41_sched *S;
    ds41_prefix_cache *pc;   /* NULL with --no-prefix-cache */
    void *pdc;               /* --role decode: the prefill nodes' client (serve_pd.c) */
    ds41_smirror *mirror;    /* rank 0 under mpiexec: the followers' record (serve_mpi.h) */
    int guard;               /* rank 0 under mpiexec: the 503 guard runs (serve_mpi_guard.c) */
    ds41_metrics m;
    int V;
    long long ctx;
    time_t created;
    atomic_long connections;
    ds41_conn_limit *climit;
    atomic_ullong id_counter;
} server;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t fresh_u64(server *sv) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ (atomic_fetch_add(&sv->id_counter, 1) * 0x9E37ull);
    return splitmix(&x);
}

/* ---------------------------------------------------------------- responses */

static enum MHD_Result send_text(server *sv, struct MHD_Connection *c, int status, const char *ctype, const char *body,
                                 size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (status == 405) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, POST");
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    ds41_metrics_status(&sv->m, status);
    return rc;
}

static enum MHD_Result send_json(server *sv, struct MHD_Connection *c, int status, json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) return send_text(sv, c, 500, "application/json",
                             "{\"error\":{\"message\":\"out of memory\",\"type\":\"internal_error\",\"param\":null,\"code\":null}}", 84);
    enum MHD_Result rc = send_text(sv, c, status, "application/json", s, strlen(s));
    free(s);
    return rc;
}

static json_t *str_or_null(const char *s) { return s && *s ? json_string(s) : json_null(); }

static json_t *error_json(const ds41_req_error *e) {
    json_t *msg = json_string(e->message);
    if (!msg) msg = json_string("invalid request");   /* not valid UTF-8: quoted request bytes */
    return json_pack("{s:{s:o,s:s,s:o,s:o}}", "error", "message", msg, "type", e->type, "param",
                     str_or_null(e->param), "code", str_or_null(e->code));
}

static enum MHD_Result send_error(server *sv, struct MHD_Connection *c, const ds41_req_error *e) {
    return send_json(sv, c, e->status, error_json(e));
}

static enum MHD_Result fail(server *sv, struct MHD_Connection *c, int status, const char *type, const char *param,
                            const char *code, const char *msg) {
    ds41_req_error e;
    ds41_req_fail(&e, status, type, param, code, "%s", msg);
    return send_error(sv, c, &e);
}

/* A logprob as JSON (-inf -> -9999.0 as vLLM reports it). */
static json_t *jlp(float v) { return json_real(isfinite(v) ? (double)v : -9999.0); }

/* ---------------------------------------------------------------- client liveness */

static int client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 1;
    struct pollfd p = { .fd = ci->connect_fd, .events = POLLRDHUP };
    if (poll(&p, 1, 0) < 0) return errno != EINTR;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static void timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, double secs) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long ns = ts.tv_nsec + (long long)(secs * 1e9);
    ts.tv_sec += ns / 1000000000LL;
    ts.tv_nsec = ns % 1000000000LL;
    pthread_cond_timedwait(cv, mu, &ts);
}

/* ---------------------------------------------------------------- token strings */

static char *token_text(server *sv, int32_t id, int as_id) {
    char *t = NULL;
    size_t n = 0;
    ds41_err err;
    if (!as_id && sv->tok && ds41_detokenize(sv->tok, &id, 1, 0, &t, &n, &err) == 0) return t;
    free(t);
    char b[32];
    snprintf(b, sizeof b, "token_id:%d", id);
    return strdup(b);
}

static json_t *bytes_json(const char *s) {
    json_t *a = json_array();
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) json_array_append_new(a, json_integer(*p));
    return a;
}

/* Chat logprobs entries of tokens [i0, i1). */
static json_t *chat_logprobs(server *sv, const ds41_sseq *q, size_t i0, size_t i1, int as_id) {
    json_t *arr = json_array();
    for (size_t i = i0; i < i1; i++) {
        char *t = token_text(sv, q->ids[i], as_id);
        json_t *top = json_array();
        for (int k = 0; k < q->n_top; k++) {
            int32_t id = q->top_id[i * (size_t)q->n_top + (size_t)k];
            char *tt = token_text(sv, id, as_id);
            json_array_append_new(top, json_pack("{s:s?,s:o,s:o}", "token", tt, "logprob",
                                                 jlp(q->top_lp[i * (size_t)q->n_top + (size_t)k]), "bytes", bytes_json(tt ? tt : "")));
            free(tt);
        }
        json_array_append_new(arr, json_pack("{s:s?,s:o,s:o,s:o}", "token", t, "logprob", jlp(q->lp[i]), "bytes",
                                             bytes_json(t ? t : ""), "top_logprobs", top));
        free(t);
    }
    return json_pack("{s:o}", "content", arr);
}

/* Completions logprobs of tokens [i0, i1); text offsets shifted by base. */
static json_t *completion_logprobs(server *sv, const ds41_sseq *q, size_t i0, size_t i1, size_t base, int as_id) {
    json_t *tokens = json_array(), *tlp = json_array(), *top = json_array(), *off = json_array();
    for (size_t i = i0; i < i1; i++) {
        char *t = token_text(sv, q->ids[i], as_id);
        json_array_append_new(tokens, json_string(t ? t : ""));
        json_array_append_new(tlp, jlp(q->lp[i]));
        json_array_append_new(off, json_integer((json_int_t)(base + q->off[i])));
        json_t *d = json_object();
        for (int k = 0; k < q->n_top; k++) {
            int32_t id = q->top_id[i * (size_t)q->n_top + (size_t)k];
            char *tt = token_text(sv, id, as_id);
            if (tt && !json_object_get(d, tt)) json_object_set_new(d, tt, jlp(q->top_lp[i * (size_t)q->n_top + (size_t)k]));
            free(tt);
        }
        json_array_append_new(top, q->n_top > 0 ? d : json_null());
        if (q->n_top <= 0) json_decref(d);
        free(t);
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", tlp, "top_logprobs", top, "text_offset", off);
}

/* ---------------------------------------------------------------- a request in flight */

typedef struct choice_state {
    ds41_text_view view;
    size_t tok_cur;     /* tokens whose logprobs were sent */
    size_t text_cur;    /* completions: text sent */
    int started, closed;
} choice_state;

typedef struct job {
    server *sv;
    ds41_req r;
    ds41_sgroup *g;
    char id[48];
    time_t created;
    size_t prompt_tokens;
    char **prompt_text;    /* completions echo: per prompt */
    choice_state *cs;
    struct MHD_Connection *conn;
    /* SSE output */
    char *buf;
    size_t len, pos, cap;
    int ended;
    /* the route's own reply shape; NULL for the OpenAI routes. They point into the job (a
     * streamed job outlives the handler that parsed the request). */
    const ds41_anth_info *anth;   /* /v1/messages: Anthropic's reply and errors (serve_anth.c) */
    ds41_anth_info anth_v;
    ds41_anth_stream as;
    const ds41_resp_info *resp;   /* /v1/responses: the response object and its events (serve_resp.c) */
    ds41_resp_info resp_v;        /* owned */
    ds41_resp_stream rs;
} job;

static void job_free(job *j) {
    if (!j) return;
    if (j->g) {
        pthread_mutex_lock(&j->g->mu);
        int unfinished = j->g->n_finished < j->g->n_seq;
        pthread_mutex_unlock(&j->g->mu);
        if (unfinished) ds41_sched_cancel(j->sv->S, j->g);
        ds41_sgroup_release(j->g);
    }
    if (j->prompt_text)
        for (size_t i = 0; i < j->r.n_prompts; i++) free(j->prompt_text[i]);
    free(j->prompt_text);
    free(j->cs);
    free(j->buf);
    ds41_resp_stream_free(&j->rs);
    ds41_resp_info_free(&j->resp_v);
    ds41_req_free(&j->r);
    free(j);
}

static const char *finish_name(int f, int tools) {
    switch (f) {
    case DS41_FIN_STOP: return tools ? "tool_calls" : "stop";
    case DS41_FIN_LENGTH: return "length";
    case DS41_FIN_ABORT: return "abort";
    default: return "error";
    }
}

/* Text of a sequence that can be shown now (stop strings may still cut the tail). */
static size_t seq_avail(const ds41_sgroup *g, const ds41_sseq *q) {
    if (q->finished) return q->text_len;
    size_t a = q->text_len > g->stop_hold ? q->text_len - g->stop_hold : 0;
    return ds41_utf8_floor(q->text, a);
}

static json_t *tool_calls_json(job *j, const ds41_tool_call *tc, size_t n, int stream) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) {
        char id[40];
        snprintf(id, sizeof id, "call_%016llx", (unsigned long long)fresh_u64(j->sv));
        json_t *o = json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", id, "type", "function", "function", "name", tc[i].name,
                              "arguments", tc[i].arguments);
        if (o && stream) json_object_set_new(o, "index", json_integer((json_int_t)i));
        if (o) json_array_append_new(a, o);
    }
    return a;
}

/* usage, with OpenAI's details: cached_tokens (the prompt tokens the prefix cache restored, for
 * each prompt its first choice's) and reasoning_tokens (in thinking mode the tokens up to and
 * including the one that completes </think>; all of them when the reasoning never ended). */
static json_t *usage_json(job *j) {
    size_t gen = 0, reasoning = 0, cached = 0;
    for (int i = 0; i < j->g->n_seq; i++) {
        const ds41_sseq *q = &j->g->seq[i];
        gen += q->n_ids;
        if (i % j->r.n == 0) cached += (size_t)q->cached;
        if (!j->r.thinking) continue;
        const char *m = q->text ? memmem(q->text, q->text_len, DS41_THINK_END, strlen(DS41_THINK_END)) : NULL;
        size_t end = m ? (size_t)(m - q->text) + strlen(DS41_THINK_END) : (size_t)-1;
        for (size_t k = 0; k < q->n_ids && q->off[k] < end; k++) reasoning++;
    }
    size_t pt = j->prompt_tokens;   /* image span positions included */
    return json_pack("{s:I,s:I,s:I,s:{s:I},s:{s:I}}", "prompt_tokens", (json_int_t)pt, "completion_tokens",
                     (json_int_t)gen, "total_tokens", (json_int_t)(pt + gen), "prompt_tokens_details",
                     "cached_tokens", (json_int_t)cached, "completion_tokens_details", "reasoning_tokens", (json_int_t)reasoning);
}

static json_t *jstrn(const char *s, size_t n) {
    json_t *v = json_stringn(s ? s : "", s ? n : 0);
    return v ? v : json_string("\xef\xbf\xbd");
}

/* The whole reply of a finished group (non-streamed). */
static json_t *final_json(job *j) {
    json_t *choices = json_array();
    ds41_sgroup *g = j->g;
    for (int i = 0; i < g->n_seq; i++) {
        ds41_sseq *q = &g->seq[i];
        if (j->r.kind == DS41_REQ_CHAT) {
            ds41_text_view v;
            ds41_text_view_init(&v, j->r.thinking, j->r.tools);
            ds41_text_delta d;
            ds41_text_view_step(&v, q->text ? q->text : "", q->text_len, 1, &d);
            ds41_tool_call *tc = NULL;
            size_t ntc = v.phase == 2 ? ds41_dsml_parse(q->text + v.dsml_at, q->text_len - v.dsml_at, &tc) : 0;
            json_t *msg = json_object();
            json_object_set_new(msg, "role", json_string("assistant"));
            size_t c0 = d.c0, c1 = d.c1;
            /* a calls block without a complete call (cut by max_tokens) is dropped, as the stream
             * drops it: tool-call markup never reaches content */
            json_object_set_new(msg, "content", ntc && c1 == c0 ? json_null() : jstrn(q->text + c0, c1 - c0));
            if (j->r.thinking) json_object_set_new(msg, "reasoning_content", jstrn(q->text + d.r0, d.r1 - d.r0));
            if (ntc) json_object_set_new(msg, "tool_calls", tool_calls_json(j, tc, ntc, 0));
            ds41_tool_calls_free(tc, ntc);
            json_t *ch = json_pack("{s:i,s:o,s:o,s:s}", "index", i, "message", msg, "logprobs",
                                   q->n_top >= 0 ? chat_logprobs(j->sv, q, 0, q->n_ids, j->r.tokens_as_ids) : json_null(), "finish_reason",
                                   finish_name(q->finish, ntc > 0));
            json_array_append_new(choices, ch);
        } else {
            size_t p = (size_t)i / (size_t)j->r.n;
            const char *pt = j->r.echo && j->prompt_text ? j->prompt_text[p] : "";
            size_t pl = strlen(pt);
            char *t = malloc(pl + q->text_len + 1);
            if (!t) continue;
            memcpy(t, pt, pl);
            if (q->text_len) memcpy(t + pl, q->text, q->text_len);
            json_t *ch = json_pack("{s:i,s:o,s:o,s:s}", "index", i, "text", jstrn(t, pl + q->text_len), "logprobs",
                                   q->n_top >= 0 ? completion_logprobs(j->sv, q, 0, q->n_ids, pl, j->r.tokens_as_ids) : json_null(),
                                   "finish_reason", finish_name(q->finish, 0));
            free(t);
            json_array_append_new(choices, ch);
        }
    }
    return json_pack("{s:s,s:s,s:I,s:s,s:o,s:o,s:s}", "id", j->id, "object",
                     j->r.kind == DS41_REQ_CHAT ? "chat.completion" : "text_completion", "created", (json_int_t)j->created,
                     "model", j->sv->model_name, "choices", choices, "usage", usage_json(j), "system_fingerprint", "ds41");
}

/* ---------------------------------------------------------------- SSE */

static void emit(job *j, const char *s, size_t n) {
    if (j->len + n > j->cap) {
        size_t nc = (j->cap ? j->cap * 2 : 4096) + n;
        char *b = realloc(j->buf, nc);
        if (!b) return;
        j->buf = b;
        j->cap = nc;
    }
    memcpy(j->buf + j->len, s, n);
    j->len += n;
}

static void anth_emit(void *ctx, const char *s, size_t n) { emit(ctx, s, n); }

static ds41_anth_seq anth_seq(const job *j, const ds41_sseq *q) {
    long long rt = 0;
    const char *m = j->r.thinking && q->text ? memmem(q->text, q->text_len, DS41_THINK_END, strlen(DS41_THINK_END)) : NULL;
    size_t end = m ? (size_t)(m - q->text) + strlen(DS41_THINK_END) : (size_t)-1;
    for (size_t k = 0; j->r.thinking && k < q->n_ids && q->off[k] < end; k++) rt++;
    return (ds41_anth_seq){ .reasoning_tokens = rt, .text = q->text, .text_len = q->text_len, .finished = q->finished, .finish = q->finish,
                            .stop_hit = q->stop_hit, .stop_str = q->stop_hit ? j->g->stop[q->stop_hit - 1] : NULL,
                            .input_tokens = (long long)j->prompt_tokens, .cached_tokens = q->cached, .output_tokens = (long long)q->n_ids };
}

static void emit_event(job *j, json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) return;
    emit(j, "data: ", 6);
    emit(j, s, strlen(s));
    emit(j, "\n\n", 2);
    free(s);
}

static json_t *chunk(job *j, json_t *choices) {
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:o,s:s}", "id", j->id, "object",
                          j->r.kind == DS41_REQ_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                          (json_int_t)j->created, "model", j->sv->model_name, "choices", choices, "system_fingerprint", "ds41");
    if (o && j->r.include_usage) json_object_set_new(o, "usage", json_null());
    return o;
}

/* A stream's error event for a sequence that failed (500) or was aborted by a shutdown or a
 * lost rank (503), as the non-streamed reply's status. */
static void emit_failure(job *j, const ds41_sseq *q) {
    if (q->finish != DS41_FIN_ERROR && q->finish != DS41_FIN_ABORT) return;
    int st = q->finish == DS41_FIN_ABORT ? 503 : 500;
    ds41_req_error e;
    ds41_req_fail(&e, st, st == 503 ? "service_unavailable" : "internal_error", NULL, NULL, "generation failed: %s", q->err);
    emit_event(j, error_json(&e));
}

static void emit_choice(job *j, int i, json_t *delta_or_text, json_t *logprobs, const char *finish) {
    json_t *ch;
    if (j->r.kind == DS41_REQ_CHAT)
        ch = json_pack("{s:i,s:o,s:o,s:o}", "index", i, "delta", delta_or_text, "logprobs", logprobs ? logprobs : json_null(),
                       "finish_reason", finish ? json_string(finish) : json_null());
    else
        ch = json_pack("{s:i,s:o,s:o,s:o}", "index", i, "text", delta_or_text, "logprobs", logprobs ? logprobs : json_null(),
                       "finish_reason", finish ? json_string(finish) : json_null());
    json_t *a = json_array();
    json_array_append_new(a, ch);
    emit_event(j, chunk(j, a));
}

/* Turns the group's new output into events (g->mu held). Returns 1 if anything was added. */
static int produce(job *j) {
    ds41_sgroup *g = j->g;
    size_t before = j->len;
    int open = 0;
    if (j->resp) {
        ds41_anth_seq a = anth_seq(j, &g->seq[0]);
        ds41_resp_stream_step(&j->rs, j->id, j->sv->model_name, j->resp, &a, seq_avail(g, &g->seq[0]), anth_emit, j);
        j->ended = j->rs.ended;
        return j->len > before || j->ended;
    }
    if (j->anth) {
        ds41_anth_seq a = anth_seq(j, &g->seq[0]);
        ds41_anth_stream_step(&j->as, j->id, j->sv->model_name, j->anth, &a, seq_avail(g, &g->seq[0]), anth_emit, j);
        j->ended = j->as.ended;
        return j->len > before || j->ended;
    }
    for (int i = 0; i < g->n_seq; i++) {
        ds41_sseq *q = &g->seq[i];
        choice_state *cs = &j->cs[i];
        if (cs->closed) continue;
        size_t avail = seq_avail(g, q);
        const char *t = q->text ? q->text : "";
        size_t ntok = q->n_ids;
        if (j->r.kind == DS41_REQ_CHAT) {
            if (!cs->started) {
                cs->started = 1;
                emit_choice(j, i, json_pack("{s:s,s:s}", "role", "assistant", "content", ""), NULL, NULL);
            }
            ds41_text_delta d;
            ds41_text_view_step(&cs->view, t, avail, q->finished, &d);
            json_t *lp = q->n_top >= 0 && ntok > cs->tok_cur ? chat_logprobs(j->sv, q, cs->tok_cur, ntok, j->r.tokens_as_ids) : NULL;
            cs->tok_cur = ntok;
            if (d.r1 > d.r0) {
                emit_choice(j, i, json_pack("{s:o}", "reasoning_content", jstrn(t + d.r0, d.r1 - d.r0)),
                            d.c1 > d.c0 ? NULL : lp, NULL);
                if (d.c1 <= d.c0) lp = NULL;
            }
            if (d.c1 > d.c0 || lp) {
                emit_choice(j, i, json_pack("{s:o}", "content", jstrn(t + d.c0, d.c1 - d.c0)), lp, NULL);
                lp = NULL;
            }
            if (q->finished) {
                ds41_tool_call *tc = NULL;
                size_t ntc = cs->view.phase == 2 ? ds41_dsml_parse(t + cs->view.dsml_at, q->text_len - cs->view.dsml_at, &tc) : 0;
                if (cs->view.phase == 2 && !ntc)
                    emit_choice(j, i, json_pack("{s:o}", "content", jstrn(t + cs->view.dsml_at, q->text_len - cs->view.dsml_at)),
                                NULL, NULL);
                if (ntc) emit_choice(j, i, json_pack("{s:o}", "tool_calls", tool_calls_json(j, tc, ntc, 1)), NULL, NULL);
                ds41_tool_calls_free(tc, ntc);
                emit_failure(j, q);
                emit_choice(j, i, json_object(), NULL, finish_name(q->finish, ntc > 0));
                cs->closed = 1;
            }
        } else {
            size_t p = (size_t)i / (size_t)j->r.n;
            if (!cs->started) {
                cs->started = 1;
                if (j->r.echo && j->prompt_text) emit_choice(j, i, json_string(j->prompt_text[p]), NULL, NULL);
            }
            size_t base = j->r.echo && j->prompt_text ? strlen(j->prompt_text[p]) : 0;
            /* tokens whose text is all shown */
            size_t nt = cs->tok_cur;
            while (nt < ntok && (q->finished || (nt + 1 < ntok ? q->off[nt + 1] <= avail : 0))) nt++;
            if (q->finished) nt = ntok;
            json_t *lp = q->n_top >= 0 && nt > cs->tok_cur ? completion_logprobs(j->sv, q, cs->tok_cur, nt, base, j->r.tokens_as_ids) : NULL;
            cs->tok_cur = nt;
            if (avail > cs->text_cur || lp) {
                emit_choice(j, i, jstrn(t + cs->text_cur, avail - cs->text_cur), lp, NULL);
                cs->text_cur = avail;
            }
            if (q->finished) {
                emit_failure(j, q);
                emit_choice(j, i, json_string(""), NULL, finish_name(q->finish, 0));
                cs->closed = 1;
            }
        }
        if (!cs->closed) open = 1;
    }
    if (!open) {
        if (j->r.include_usage) {
            json_t *o = chunk(j, json_array());
            if (o) json_object_set_new(o, "usage", usage_json(j));
            emit_event(j, o);
        }
        emit(j, "data: [DONE]\n\n", 14);
        j->ended = 1;
    }
    return j->len > before || j->ended;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    job *j = cls;
    for (;;) {
        if (j->pos < j->len) {
            size_t n = j->len - j->pos < max ? j->len - j->pos : max;
            memcpy(buf, j->buf + j->pos, n);
            j->pos += n;
            if (j->pos == j->len) j->pos = j->len = 0;
            return (ssize_t)n;
        }
        if (j->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_lock(&j->g->mu);
        int got = produce(j);
        if (!got) timed_wait(&j->g->cv, &j->g->mu, 0.1);
        pthread_mutex_unlock(&j->g->mu);
        if (!got && client_gone(j->conn)) {
            ds41_sched_cancel(j->sv->S, j->g);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void stream_free(void *cls) { job_free(cls); }

/* ---------------------------------------------------------------- generation endpoints */

/* The grammar vocabulary: each plain token's bytes (added and special tokens match nothing). */
static ds41_gvocab *serve_gvocab(const ds41_tokenizer *tok, int V) {
    const char **p = calloc((size_t)V, sizeof *p);
    size_t *l = calloc((size_t)V, sizeof *l);
    ds41_gvocab *gv = NULL;
    if (p && l) {
        for (int i = 0; i < V; i++) ds41_token_plain_bytes(tok, i, &p[i], &l[i]);
        gv = ds41_gvocab_new(V, p, l);
    }
    free(p);
    free(l);
    return gv;
}

/* The positions r's images add past the one placeholder id each: every span's length from the
 * image's size and the checkpoint's preprocessing plan, known before the tower runs, so that the
 * context and budget checks and usage count what is prefilled. param names the request member
 * the images came in (messages, input). */
static int image_extra(server *sv, const ds41_req *r, const char *param, long long *extra, ds41_req_error *e) {
    *extra = 0;
    if (!r->n_images) return 0;
    if (!ds41_has_vision(sv->e))
        return ds41_req_fail(e, 400, "invalid_request_error", param, NULL, "%s: images need a checkpoint with a vision tower, "
                             "and %s has none", param, sv->model_name);
    for (int k = 0; k < r->n_images; k++) {
        char msg[300];
        int rows = ds41_image_span_positions(sv->e, r->image_w[k], r->image_h[k], msg, sizeof msg);
        if (rows < 1) return ds41_req_fail(e, 400, "invalid_request_error", param, NULL, "%s: image %d: %s", param, k + 1, msg);
        *extra += rows - 1;
    }
    return 0;
}

/* A prompt's ids: given, or the text tokenized (with images, the text around each placeholder
 * tokenized apart, as ds41 run --image does, and one placeholder id per image). */
static int prompt_ids(server *sv, const ds41_req *r, const ds41_req_prompt *pr, const char *param, int32_t **ids, size_t *n,
                      ds41_req_error *e) {
    *ids = NULL;
    *n = 0;
    if (pr->ids) {
        *ids = malloc(pr->n_ids * sizeof **ids);
        if (!*ids) return ds41_req_fail(e, 500, "internal_error", NULL, NULL, "out of memory");
        memcpy(*ids, pr->ids, pr->n_ids * sizeof **ids);
        *n = pr->n_ids;
        return 0;
    }
    if (!sv->tok) return ds41_req_fail(e, 400, "invalid_request_error", "prompt", NULL, "the model has no tokenizer.json: give the prompt as token ids");
    ds41_err err;
    if (!r->n_images) {
        if (ds41_tokenize(sv->tok, pr->text, pr->text_len, 1, r->kind == DS41_REQ_COMPLETION, ids, n, &err))
            return ds41_req_fail(e, 400, "invalid_request_error", "prompt", NULL, "%s", err.msg);
        return 0;
    }
    ds41_cli_vprompt vp = { 0 };
    int rc = ds41_cli_vprompt_split(&vp, sv->tok, pr->text, pr->text_len, 0, r->n_images, ds41_image_token_id(sv->e), &err);
    if (!rc) { *ids = vp.ids, *n = vp.n, vp.ids = NULL; }
    ds41_cli_vprompt_free(&vp);
    if (rc) return ds41_req_fail(e, 400, "invalid_request_error", param, NULL, "%s: %s", param, err.msg);
    size_t found = 0;
    for (size_t i = 0; i < *n; i++) found += (*ids)[i] == ds41_image_token_id(sv->e);
    if (found != (size_t)r->n_images) {
        free(*ids);
        *ids = NULL;
        return ds41_req_fail(e, 400, "invalid_request_error", param, NULL, "%s: %d images but the rendered prompt has %zu "
                             "image placeholders", param, r->n_images, found);
    }
    return 0;
}

/* ---------------------------------------------------------------- the 503 guard (under mpiexec)
 * Per connection (microhttpd's socket context): the guard's id of the request in flight and
 * whether the request was HTTP/1.1 (a reply of unknown length is then chunked). */
typedef struct conn_sock { uint32_t guard; int http11; } conn_sock;

static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static conn_sock *sock_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* Hands the guard this request's socket with its two answers, in the route's shape: the whole
 * 503 reply and, for a stream, its error event (framed as the last chunk of a chunked reply). */
static void guard_register(server *sv, struct MHD_Connection *c, const job *j) {
    conn_sock *cs = sock_of(c);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!sv->guard || !cs || !ci) return;
    double t0 = thread_cpu_s();
    ds41_req_error e;
    ds41_req_fail(&e, 503, "service_unavailable", NULL, NULL, "generation failed: the MPI job ended before this request "
                  "finished (rank 0 was killed with the job, as MPICH's launcher does when a rank dies)");
    json_t *body = j->anth ? ds41_anth_error_json(&e) : error_json(&e), *ev = NULL;
    if (j->r.stream)
        ev = j->anth ? json_incref(body)
           : j->resp ? json_pack("{s:s,s:s,s:s,s:n}", "type", "error", "code", "server_shutting_down", "message", e.message, "param")
           : json_incref(body);
    char *bs = body ? json_dumps(body, JSON_COMPACT) : NULL, *es = ev ? json_dumps(ev, JSON_COMPACT) : NULL;
    json_decref(body);
    json_decref(ev);
    char *full = NULL, *tail = NULL, *sse = NULL;
    int nf = -1, nt = 0, ns = 0;
    if (bs) nf = asprintf(&full, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                                 "Connection: close\r\n\r\n%s", strlen(bs), bs);
    if (es) {
        ns = asprintf(&sse, "%s%s\n\n", j->anth || j->resp ? "event: error\ndata: " : "data: ", es);
        if (ns > 0) nt = cs->http11 ? asprintf(&tail, "%x\r\n%s\r\n0\r\n\r\n", (unsigned)ns, sse) : (tail = sse, sse = NULL, ns);
    }
    if (nf > 0 && (!j->r.stream || nt > 0))
        cs->guard = ds41_sguard_open(ci->connect_fd, j->r.stream, full, (size_t)nf, tail, nt > 0 ? (size_t)nt : 0);
    if (nf > 0) free(full);
    if (nt > 0) free(tail);
    if (ns > 0) free(sse);
    free(bs);
    free(es);
    ds41_sguard_note(thread_cpu_s() - t0);
}

static void guard_done(struct MHD_Connection *c) {
    conn_sock *cs = sock_of(c);
    if (cs && cs->guard) {
        double t0 = thread_cpu_s();
        ds41_sguard_done(cs->guard);
        cs->guard = 0;
        ds41_sguard_note(thread_cpu_s() - t0);
    }
}

static enum MHD_Result send_error_for(server *sv, struct MHD_Connection *c, const ds41_req_error *e, const ds41_anth_info *anth) {
    return anth ? send_json(sv, c, e->status, ds41_anth_error_json(e)) : send_error(sv, c, e);
}

static enum MHD_Result generate(server *sv, struct MHD_Connection *c, ds41_req_kind kind, const char *body, size_t len,
                                const ds41_anth_info *anth, const ds41_resp_info *resp) {
    job *j = calloc(1, sizeof *j);
    if (!j) return fail(sv, c, 500, "internal_error", NULL, NULL, "out of memory");
    j->sv = sv;
    j->conn = c;
    if (anth) { j->anth_v = *anth; j->anth = anth = &j->anth_v; ds41_anth_stream_init(&j->as, anth); }
    if (resp) { j->resp_v = *resp; j->resp = resp = &j->resp_v; ds41_resp_stream_init(&j->rs, resp); }   /* owns it now */
    ds41_req_error e;
    if (ds41_req_parse(kind, body, len, &j->r, &e)) {
        enum MHD_Result rc0 = send_error_for(sv, c, &e, anth);
        job_free(j);
        return rc0;
    }
    ds41_req *r = &j->r;
    enum MHD_Result rc;
#define JFAIL(...) do { ds41_req_fail(&e, __VA_ARGS__); rc = send_error_for(sv, c, &e, anth); job_free(j); return rc; } while (0)
    if (r->model && strcmp(r->model, sv->model_name))
        JFAIL(404, "invalid_request_error", "model", "model_not_found", "The model `%.200s` does not exist.", r->model);
    const char *img_param = resp ? "input" : "messages";
    long long img_extra = 0;
    if (image_extra(sv, r, img_param, &img_extra, &e)) { rc = send_error_for(sv, c, &e, anth); job_free(j); return rc; }
    /* prompts -> ids */
    int nseq = (int)r->n_prompts * r->n;
    j->g = ds41_sgroup_new(nseq);
    j->cs = calloc((size_t)nseq, sizeof *j->cs);
    if (r->echo) j->prompt_text = calloc(r->n_prompts, sizeof *j->prompt_text);
    if (!j->g || !j->cs || (r->echo && !j->prompt_text)) JFAIL(500, "internal_error", NULL, NULL, "out of memory");
    ds41_sgroup *g = j->g;
    if (r->grammar) {
        /* one matcher for the request's choices: its states and masks are shared */
        if (!sv->gv) JFAIL(400, "invalid_request_error", r->grammar_src, NULL, "%s: the model has no tokenizer.json", r->grammar_src);
        /* the grammar's tables come from the cache: built by the first request with this
         * grammar (here, on the handler's thread), shared by the rest */
        g->gent = ds41_gcache_get(sv->gc, r->grammar_text, strlen(r->grammar_text), &r->grammar);
        if (!g->gent) JFAIL(500, "internal_error", NULL, NULL, "out of memory");
        g->gm = ds41_gmatch_new(ds41_gentry_grammar(g->gent), sv->gv);
        if (!g->gm) JFAIL(500, "internal_error", NULL, NULL, "out of memory");
        const ds41_gtables *gt = ds41_gentry_tables(g->gent);
        if (gt && ds41_gmatch_use_tables(g->gm, gt)) JFAIL(500, "internal_error", NULL, NULL, "out of memory");
        if (ds41_gmatch_start(g->gm) < 0)
            JFAIL(400, "invalid_request_error", r->grammar_src, NULL, "%s: %s", r->grammar_src, ds41_gmatch_error(g->gm));
    }
    for (size_t p = 0; p < r->n_prompts; p++) {
        ds41_req_prompt *pr = &r->prompts[p];
        int32_t *ids = NULL;
        size_t n = 0;
        if (prompt_ids(sv, r, pr, img_param, &ids, &n, &e)) { rc = send_error_for(sv, c, &e, anth); job_free(j); return rc; }
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= sv->V) {
                int32_t bad = ids[i];
                free(ids);
                JFAIL(400, "invalid_request_error", "prompt", NULL, "prompt token %zu is %d, outside the vocabulary 0..%d", i, bad, sv->V - 1);
            }
        if (n == 0) { free(ids); JFAIL(400, "invalid_request_error", "prompt", NULL, "the prompt is empty"); }
        /* np: the positions prefilled (each image's span in place of its placeholder) */
        size_t np = n + (size_t)img_extra;
        long long mt = r->max_tokens;
        if ((long long)np > sv->ctx) {
            free(ids);
            JFAIL(400, "invalid_request_error", "messages", "context_length_exceeded",
                  "This model's maximum context length is %lld tokens. However, your prompt has %zu tokens.", sv->ctx, np);
        }
        if (mt < 0) mt = sv->ctx - (long long)np + 1;
        if ((long long)np + mt - 1 > sv->ctx) {
            free(ids);
            JFAIL(400, "invalid_request_error", "max_tokens", "context_length_exceeded",
                  "This model's maximum context length is %lld tokens. However, you requested %lld tokens (%zu in the "
                  "prompt, %lld for the completion).", sv->ctx, (long long)np + mt, np, mt);
        }
        long long need = ds41_sched_reserve_bytes(sv->S, np, mt);
        ds41_gauges gg;
        ds41_sched_gauges(sv->S, &gg);
        if (need > gg.kv_budget) {
            free(ids);
            JFAIL(400, "invalid_request_error", "max_tokens", "kv_budget_exceeded",
                  "the request needs %lld bytes of sequence state, more than the whole --kv-budget of %lld bytes", need, gg.kv_budget);
        }
        if (r->echo) {
            char *t = NULL;
            size_t tl = 0;
            ds41_err err;
            if (pr->text) t = strdup(pr->text);
            else if (sv->tok && !ds41_detokenize(sv->tok, ids, n, 0, &t, &tl, &err)) {}
            j->prompt_text[p] = t ? t : strdup("");
        }
        j->prompt_tokens += np;
        for (int k = 0; k < r->n; k++) {
            ds41_sseq *q = &g->seq[p * (size_t)r->n + (size_t)k];
            q->prompt = malloc(n * sizeof *ids);
            if (!q->prompt) { free(ids); JFAIL(500, "internal_error", NULL, NULL, "out of memory"); }
            memcpy(q->prompt, ids, n * sizeof *ids);
            q->n_prompt = n;
            q->temperature = (float)r->temperature;
            q->top_p = (float)r->top_p;
            q->min_p = (float)r->min_p;
            q->top_k = r->top_k;
            q->seed = r->has_seed ? r->seed + p * (size_t)r->n + (size_t)k : fresh_u64(sv);
            q->max_tokens = mt;
            q->n_top = r->logprobs ? r->top_logprobs : -1;
            if (ds41_serve_lproc(r, sv->V, sv->tok ? ds41_tokenizer_eos(sv->tok) : -1, g->gm, r->thinking ? sv->think_end : -1,
                                 &q->proc, &e)) {
                free(ids);
                rc = send_error_for(sv, c, &e, anth);
                job_free(j);
                return rc;
            }
        }
        free(ids);
    }
    for (int i = 0; i < nseq; i++) ds41_text_view_init(&j->cs[i].view, r->thinking, r->tools);
    /* the images go with the group (the scheduler encodes them) */
    g->img = r->images; g->img_len = r->image_len; g->n_img = r->n_images; g->img_extra = img_extra;
    r->images = NULL; r->image_len = NULL; r->n_images = 0;
    /* stop conditions */
    g->ignore_eos = r->ignore_eos;
    g->one_call = kind == DS41_REQ_CHAT && r->tools && !r->parallel_tool_calls;
    g->skip_special = r->skip_special_tokens;
    if (r->n_stop) {
        g->stop = calloc((size_t)r->n_stop, sizeof *g->stop);
        if (!g->stop) JFAIL(500, "internal_error", NULL, NULL, "out of memory");
        for (int i = 0; i < r->n_stop; i++) {
            g->stop[i] = strdup(r->stop[i]);
            if (!g->stop[i]) JFAIL(500, "internal_error", NULL, NULL, "out of memory");
            g->n_stop++;
            size_t l = strlen(r->stop[i]);
            if (l - 1 > g->stop_hold) g->stop_hold = l - 1;
        }
    }
    if (r->n_stop_token_ids) {
        g->stop_ids = malloc(r->n_stop_token_ids * sizeof *g->stop_ids);
        if (!g->stop_ids) JFAIL(500, "internal_error", NULL, NULL, "out of memory");
        memcpy(g->stop_ids, r->stop_token_ids, r->n_stop_token_ids * sizeof *g->stop_ids);
        g->n_stop_ids = r->n_stop_token_ids;
    }
    snprintf(j->id, sizeof j->id, "%s%016llx", resp ? "resp_" : anth ? "msg_" : kind == DS41_REQ_CHAT ? "chatcmpl-" : "cmpl-", (unsigned long long)fresh_u64(sv));
    j->created = time(NULL);
    int status = 0;
    if (ds41_sched_submit(sv->S, g, &status)) {
        if (status == 429) JFAIL(429, "rate_limit_error", NULL, "queue_full", "the server's request queue is full; retry later");
        JFAIL(503, "service_unavailable", NULL, NULL, "the server is shutting down");
    }
    guard_register(sv, c, j);
    /* --timeout is for idle clients; from here the engine is the slow side (a queued or long
     * prompt can take longer than the timeout before its first byte, and microhttpd would
     * close the connection for the time spent in this handler or the stream reader). A client
     * that goes away is still seen within 0.1 s (client_gone). */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    if (r->stream) {
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, j, stream_free);
        if (!resp) { job_free(j); return MHD_NO; }
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        rc = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        ds41_metrics_status(&sv->m, 200);
        return rc;
    }
    pthread_mutex_lock(&g->mu);
    int gone = 0;
    while (g->n_finished < g->n_seq) {
        timed_wait(&g->cv, &g->mu, 0.1);
        if (g->n_finished < g->n_seq && client_gone(c)) { gone = 1; break; }
    }
    pthread_mutex_unlock(&g->mu);
    if (gone) { job_free(j); return MHD_NO; }   /* job_free cancels */
    for (int i = 0; i < g->n_seq; i++)
        if (g->seq[i].finish == DS41_FIN_ERROR || g->seq[i].finish == DS41_FIN_ABORT) {
            int st = g->seq[i].finish == DS41_FIN_ABORT ? 503 : 500;
            JFAIL(st, st == 503 ? "service_unavailable" : "internal_error", NULL, NULL, "generation failed: %s", g->seq[i].err);
        }
    if (resp) {
        ds41_anth_seq a = anth_seq(j, &g->seq[0]);
        rc = send_json(sv, c, 200, ds41_resp_object(j->id, sv->model_name, resp, &a));
    } else if (anth) {
        ds41_anth_seq a = anth_seq(j, &g->seq[0]);
        rc = send_json(sv, c, 200, ds41_anth_message(j->id, sv->model_name, anth, &a));
    } else {
        rc = send_json(sv, c, 200, final_json(j));
    }
    job_free(j);
    return rc;
#undef JFAIL
}

/* ---------------------------------------------------------------- other endpoints */

static enum MHD_Result models(server *sv, struct MHD_Connection *c, const char *one) {
    json_t *m = json_pack("{s:s,s:s,s:I,s:s,s:s,s:I}", "id", sv->model_name, "object", "model", "created",
                          (json_int_t)sv->created, "owned_by", "ds41", "root", sv->o->model_dir, "max_model_len", (json_int_t)sv->ctx);
    if (one) {
        if (strcmp(one, sv->model_name)) {
            json_decref(m);
            return fail(sv, c, 404, "invalid_request_error", "model", "model_not_found", "The model does not exist.");
        }
        return send_json(sv, c, 200, m);
    }
    return send_json(sv, c, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", m));
}

static enum MHD_Result tokenize(server *sv, struct MHD_Connection *c, const char *body, size_t len) {
    char *text = NULL;
    size_t tl = 0;
    int add = 1;
    ds41_req_error e;
    if (ds41_req_parse_tokenize(body, len, &text, &tl, &add, &e)) return send_error(sv, c, &e);
    if (!sv->tok) { free(text); return fail(sv, c, 400, "invalid_request_error", NULL, NULL, "the model has no tokenizer.json"); }
    int32_t *ids = NULL;
    size_t n = 0;
    ds41_err err;
    if (ds41_tokenize(sv->tok, text, tl, 1, add, &ids, &n, &err)) {
        free(text);
        return fail(sv, c, 400, "invalid_request_error", "prompt", NULL, err.msg);
    }
    free(text);
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    free(ids);
    return send_json(sv, c, 200, json_pack("{s:I,s:I,s:o,s:n}", "count", (json_int_t)n, "max_model_len", (json_int_t)sv->ctx,
                                           "tokens", a, "token_strs"));
}

static enum MHD_Result detokenize(server *sv, struct MHD_Connection *c, const char *body, size_t len) {
    int32_t *ids = NULL;
    size_t n = 0;
    ds41_req_error e;
    if (ds41_req_parse_detokenize(body, len, &ids, &n, &e)) return send_error(sv, c, &e);
    if (!sv->tok) { free(ids); return fail(sv, c, 400, "invalid_request_error", NULL, NULL, "the model has no tokenizer.json"); }
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= sv->V) {
            free(ids);
            return fail(sv, c, 400, "invalid_request_error", "tokens", NULL, "a token id is outside the vocabulary");
        }
    char *t = NULL;
    size_t tl = 0;
    ds41_err err;
    int rc = ds41_detokenize(sv->tok, ids, n, 0, &t, &tl, &err);
    free(ids);
    if (rc) { free(t); return fail(sv, c, 400, "invalid_request_error", "tokens", NULL, err.msg); }
    json_t *o = json_pack("{s:o}", "prompt", jstrn(t, tl));
    free(t);
    return send_json(sv, c, 200, o);
}

/* /v1/messages and /v1/messages/count_tokens: the body becomes the chat request it means
 * (serve_anth.c), so the prompt and its token count are the chat route's */
static enum MHD_Result anthropic(server *sv, struct MHD_Connection *c, int count, const char *body, size_t len) {
    char *chat = NULL;
    size_t cl = 0;
    ds41_anth_info ai;
    ds41_req_error e;
    if (ds41_anth_to_chat(body, len, count, &chat, &cl, &ai, &e)) return send_json(sv, c, e.status, ds41_anth_error_json(&e));
    if (!count) {
        enum MHD_Result rc = generate(sv, c, DS41_REQ_CHAT, chat, cl, &ai, NULL);
        free(chat);
        return rc;
    }
    ds41_req r;
    int prc = ds41_req_parse(DS41_REQ_CHAT, chat, cl, &r, &e);
    free(chat);
    if (prc) return send_json(sv, c, e.status, ds41_anth_error_json(&e));
    /* the count generate() admits: the ids, each image's span in place of its placeholder */
    int32_t *ids = NULL;
    size_t n = 0;
    long long extra = 0;
    int trc = image_extra(sv, &r, "messages", &extra, &e) || prompt_ids(sv, &r, &r.prompts[0], "messages", &ids, &n, &e);
    ds41_req_free(&r);
    free(ids);
    if (trc) return send_json(sv, c, e.status, ds41_anth_error_json(&e));
    n += (size_t)extra;
    return send_json(sv, c, 200, json_pack("{s:I}", "input_tokens", (json_int_t)n));
}

/* /v1/responses: the body becomes the chat request it means (serve_resp.c); nothing is kept */
static enum MHD_Result responses(server *sv, struct MHD_Connection *c, const char *body, size_t len) {
    char *chat = NULL;
    size_t cl = 0;
    ds41_resp_info ri;
    ds41_req_error e;
    if (ds41_resp_to_chat(body, len, &chat, &cl, &ri, &e)) return send_error(sv, c, &e);
    ri.created_at = (long long)time(NULL);
    enum MHD_Result rc = generate(sv, c, DS41_REQ_CHAT, chat, cl, NULL, &ri);   /* the job takes ri's strings */
    free(chat);
    return rc;
}

static enum MHD_Result metrics(server *sv, struct MHD_Connection *c) {
    ds41_gauges g;
    ds41_sched_gauges(sv->S, &g);
    g.connections = atomic_load(&sv->connections);
    ds41_engram_stats es;
    ds41_engram_get_stats(sv->e, &es);
    g.eg_mode = es.mode;
    g.eg_prefetch = es.mode == DS41_ENGRAM_PREFETCH;
    g.eg_table_bytes = es.table_bytes;
    g.eg_cache_bytes = es.cache_bytes;
    g.eg_steps = es.steps;
    g.eg_lookups = es.lookups;
    g.eg_hits = es.hits;
    g.eg_rows_read = es.rows_read;
    g.eg_bytes_read = es.bytes_read;
    g.eg_retries = es.retries;
    g.eg_errors = es.errors;
    g.eg_stall_s = es.stall_s;
    g.grammar = sv->gc != NULL;
    if (sv->gc) ds41_gcache_get_stats(sv->gc, &g.gt);
    size_t n = 0;
    char *t = ds41_metrics_text(&sv->m, &g, sv->model_name, &n);
    if (!t) return fail(sv, c, 500, "internal_error", NULL, NULL, "out of memory");
    enum MHD_Result rc = send_text(sv, c, 200, "text/plain; version=0.0.4; charset=utf-8", t, n);
    free(t);
    return rc;
}

/* ---------------------------------------------------------------- routing */

enum { R_NONE, R_HEALTH, R_MODELS, R_MODEL, R_CHAT, R_COMPLETIONS, R_TOKENIZE, R_DETOKENIZE, R_METRICS, R_VERSION, R_MESSAGES,
       R_COUNT_TOKENS, R_RESPONSES };

typedef struct conn_ctx {
    int route;
    int post;
    char *body;
    size_t len, cap;
    int refused;          /* a response is queued already */
    int too_big;          /* the body passed --max-body: the rest is discarded, 413 at the end */
    double t0;
} conn_ctx;

static int route_of(const char *url, int *post) {
    static const struct { const char *path; int route, post; } routes[] = {
        { "/health", R_HEALTH, 0 }, { "/v1/models", R_MODELS, 0 }, { "/v1/chat/completions", R_CHAT, 1 },
        { "/v1/completions", R_COMPLETIONS, 1 }, { "/tokenize", R_TOKENIZE, 1 }, { "/detokenize", R_DETOKENIZE, 1 },
        { "/v1/tokenize", R_TOKENIZE, 1 }, { "/v1/detokenize", R_DETOKENIZE, 1 }, { "/metrics", R_METRICS, 0 },
        { "/version", R_VERSION, 0 }, { "/ping", R_HEALTH, 0 }, { "/v1/messages", R_MESSAGES, 1 },
        { "/v1/messages/count_tokens", R_COUNT_TOKENS, 1 }, { "/v1/responses", R_RESPONSES, 1 },
    };
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (!strcmp(url, routes[i].path)) { *post = routes[i].post; return routes[i].route; }
    if (!strncmp(url, "/v1/models/", 11) && url[11]) { *post = 0; return R_MODEL; }
    return R_NONE;
}

static int authorized(server *sv, struct MHD_Connection *c) {
    if (!sv->o->api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (h && !strncasecmp(h, "Bearer ", 7)) h += 7;
    else if (!(h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key"))) return 0;   /* Anthropic's SDK */
    const char *k = sv->o->api_key;
    size_t hl = strlen(h), kl = strlen(k);
    unsigned d = hl != kl;
    for (size_t i = 0; i < kl; i++) d |= (unsigned)(unsigned char)k[i] ^ (unsigned)(unsigned char)(i < hl ? h[i] : 0);
    return d == 0;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    server *sv = cls;
    conn_ctx *x = *con_cls;
    if (!x) {
        x = calloc(1, sizeof *x);
        if (!x) return MHD_NO;
        *con_cls = x;
        conn_sock *cs = sock_of(c);
        if (cs) cs->http11 = !strcmp(version, MHD_HTTP_VERSION_1_1);
        x->t0 = now_s();
        int post = 0;
        x->route = route_of(url, &post);
        int is_post = !strcmp(method, "POST"), is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
        enum MHD_Result rc = MHD_YES;
        if (x->route == R_NONE) {
            char m[300];
            snprintf(m, sizeof m, "no route %.200s %.40s", method, url);
            rc = fail(sv, c, 404, "invalid_request_error", NULL, "not_found", m);
            x->refused = 1;
        } else if ((post && !is_post) || (!post && !is_get)) {
            char m[300];
            snprintf(m, sizeof m, "method %.40s is not allowed on %.200s", method, url);
            rc = fail(sv, c, 405, "invalid_request_error", NULL, "method_not_allowed", m);
            x->refused = 1;
        } else if (x->route != R_HEALTH && x->route != R_METRICS && x->route != R_VERSION && !authorized(sv, c)) {
            rc = fail(sv, c, 401, "invalid_request_error", NULL, "invalid_api_key", "Incorrect API key provided.");
            x->refused = 1;
        } else if (post) {
            const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
            if (cl && strtoull(cl, NULL, 10) > sv->o->max_body) {
                char m[200];
                snprintf(m, sizeof m, "the request body is larger than the limit of %zu bytes (--max-body)", sv->o->max_body);
                rc = fail(sv, c, 413, "invalid_request_error", NULL, "request_too_large", m);
                x->refused = 1;
            }
        }
        return rc;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (now_s() - x->t0 > sv->o->body_timeout_s) return MHD_NO;   /* a trickling client: drop it */
        if (x->refused || x->too_big) return MHD_YES;
        if (x->len + n > sv->o->max_body) {
            /* microhttpd takes a response only before the body or after all of it */
            x->too_big = 1;
            free(x->body);
            x->body = NULL;
            x->len = x->cap = 0;
            return MHD_YES;
        }
        if (x->len + n > x->cap) {
            size_t nc = x->cap ? x->cap : 4096;
            while (nc < x->len + n) nc *= 2;
            if (nc > sv->o->max_body) nc = sv->o->max_body;
            char *b = realloc(x->body, nc);
            if (!b) return MHD_NO;
            x->body = b;
            x->cap = nc;
        }
        memcpy(x->body + x->len, upload, n);
        x->len += n;
        return MHD_YES;
    }
    if (x->refused) return MHD_YES;
    x->refused = 1;   /* answered below */
    if (x->too_big) {
        char m[200];
        snprintf(m, sizeof m, "the request body is larger than the limit of %zu bytes (--max-body)", sv->o->max_body);
        return fail(sv, c, 413, "invalid_request_error", NULL, "request_too_large", m);
    }
    switch (x->route) {
    case R_HEALTH: return send_text(sv, c, 200, "application/json", "{}", 2);
    case R_VERSION: return send_text(sv, c, 200, "application/json", "{\"version\":\"ds41\"}", 18);
    case R_MODELS: return models(sv, c, NULL);
    case R_MODEL: return models(sv, c, url + 11);
    case R_METRICS: return metrics(sv, c);
    case R_TOKENIZE: return tokenize(sv, c, x->body ? x->body : "", x->len);
    case R_DETOKENIZE: return detokenize(sv, c, x->body ? x->body : "", x->len);
    case R_CHAT: return generate(sv, c, DS41_REQ_CHAT, x->body ? x->body : "", x->len, NULL, NULL);
    case R_COMPLETIONS: return generate(sv, c, DS41_REQ_COMPLETION, x->body ? x->body : "", x->len, NULL, NULL);
    case R_MESSAGES: return anthropic(sv, c, 0, x->body ? x->body : "", x->len);
    case R_COUNT_TOKENS: return anthropic(sv, c, 1, x->body ? x->body : "", x->len);
    case R_RESPONSES: return responses(sv, c, x->body ? x->body : "", x->len);
    }
    return fail(sv, c, 500, "internal_error", NULL, NULL, "unhandled route");
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls; (void)toe;
    guard_done(c);   /* the reply went out (or the client went away) */
    conn_ctx *x = *con_cls;
    if (!x) return;
    free(x->body);
    free(x);
    *con_cls = NULL;
}

static void notify_conn(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode t) {
    server *sv = cls;
    if (t == MHD_CONNECTION_NOTIFY_STARTED) {
        atomic_fetch_add(&sv->connections, 1);
        *socket_context = sv->guard ? calloc(1, sizeof(conn_sock)) : NULL;   /* NULL: no guard for it */
    } else {
        atomic_fetch_sub(&sv->connections, 1);
        conn_sock *cs = *socket_context;
        if (cs && cs->guard) ds41_sguard_done(cs->guard);
        free(cs);
        *socket_context = NULL;
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    ds41_conn_limit_count(sv->climit, ci ? ci->client_addr : NULL, t == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1);
}

/* microhttpd's accept policy: over --max-connections or --max-connections-per-ip the new
 * connection is closed at once */
static enum MHD_Result accept_conn(void *cls, const struct sockaddr *addr, socklen_t len) {
    server *sv = cls;
    return ds41_conn_limit_allow(sv->climit, addr, len) ? MHD_YES : MHD_NO;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    const server *sv = cls;
    if (!sv->o->verbose) return;
    fputs("ds41 serve: microhttpd: ", stderr);
    vfprintf(stderr, fmt, ap);
}

/* ---------------------------------------------------------------- startup */

void ds41_serve_opts_default(ds41_serve_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8000;
    ds41_load_params_default(&o->lp);
    ds41_session_params_default(&o->sp);
    o->parallel = 16;
    o->batch_tokens = 512;
    o->max_queue = 256;
    o->max_body = 8u << 20;
    o->timeout_s = 60;
    o->body_timeout_s = 30;
    o->max_connections = 256;
    o->max_connections_per_ip = 32;
    o->spec_mode = DS41_SPEC_AUTO;
    o->spec_default = 1;
    o->remote_min = 128;
    o->prefill_timeout_ms = 30000;
    o->lease_ms = 10000;
    o->pd_http_port = -1;
}

static long long default_kv_budget(void) {
    long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || psz <= 0) return 1LL << 30;
    return (long long)pages * psz / 2;
}

int ds41_serve(const ds41_serve_opts *o) {
    server *sv = calloc(1, sizeof *sv);
    if (!sv) return 1;
    sv->o = o;
    int rc = 1;
    struct MHD_Daemon *d = NULL;
    ds41_config cfg;
    int have_cfg = 0;
    ds41_err err;
    char eb[1024];
    /* SIGINT / SIGTERM are taken by sigwait below: blocked before any thread starts (the
     * engine's pool, the scheduler, microhttpd's) so that they inherit the mask */
    sigset_t ss;
    sigemptyset(&ss);
    sigaddset(&ss, SIGINT);
    sigaddset(&ss, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &ss, NULL);
    signal(SIGPIPE, SIG_IGN);
    ds41_metrics_init(&sv->m);
    sv->created = time(NULL);
    if (o->model_name) snprintf(sv->model_name, sizeof sv->model_name, "%s", o->model_name);
    else {
        char tmp[256];
        snprintf(tmp, sizeof tmp, "%s", o->model_dir);
        size_t l = strlen(tmp);
        while (l > 1 && tmp[l - 1] == '/') tmp[--l] = 0;
        const char *b = strrchr(tmp, '/');
        snprintf(sv->model_name, sizeof sv->model_name, "%s", b ? b + 1 : tmp);
    }
    char *tp = ds41_path_join(o->model_dir, "tokenizer.json");
    struct stat sb;
    int has_tok = tp && stat(tp, &sb) == 0;
    free(tp);
    if (has_tok && ds41_tokenizer_load(o->model_dir, &sv->tok, &err)) { fprintf(stderr, "ds41 serve: %s\n", err.msg); goto out; }
    if (ds41_config_load(o->model_dir, &cfg, &err)) { fprintf(stderr, "ds41 serve: %s\n", err.msg); goto out; }
    have_cfg = 1;
    sv->e = ds41_load(o->model_dir, &o->lp, eb, sizeof eb);
    if (!sv->e) { fprintf(stderr, "ds41 serve: %s\n", eb); goto out; }
    sv->V = ds41_vocab_size(sv->e);
    sv->think_end = -1;
    if (sv->tok && !(sv->gv = serve_gvocab(sv->tok, sv->V))) { fprintf(stderr, "ds41 serve: out of memory\n"); goto out; }
    if (sv->gv && !(sv->gc = ds41_gcache_new(sv->gv, GCACHE_BYTES))) { fprintf(stderr, "ds41 serve: out of memory\n"); goto out; }
    if (sv->tok) sv->think_end = ds41_token_id(sv->tok, DS41_THINK_END);
    sv->ctx = ds41_ctx_size(sv->e);
    if (sv->tok && ds41_tokenizer_vocab_size(sv->tok) > sv->V) {
        fprintf(stderr, "ds41 serve: %s/tokenizer.json has ids up to %d but the model's vocabulary is 0..%d: "
                "the tokenizer does not belong to this checkpoint\n", o->model_dir, ds41_tokenizer_vocab_size(sv->tok) - 1, sv->V - 1);
        goto out;
    }
    ds41_budgets bu;
    ds41_config_budgets(&cfg, &bu);
    ds41_sched_params sp;
    memset(&sp, 0, sizeof sp);
    sp.parallel = o->parallel;
    sp.batch_tokens = o->batch_tokens;
    sp.max_queue = o->max_queue;
    sp.min_chunk = cfg.window > 0 ? cfg.window : 1;
    sp.kv_budget = o->kv_budget > 0 ? o->kv_budget : default_kv_budget();
    sp.kv_per_token = bu.global_kv_bytes_per_token;
    sp.bounded_bytes = bu.bounded_state_bytes;
    sp.sp = o->sp;
    sp.sp.chunk = 0;   /* the scheduler chunks prefill itself (a part over DS41_CHUNK_AUTO is chunked again) */
    int B = ds41_draft_block_size(sv->e);
    sp.spec_mode = B > 0 ? o->spec_mode : DS41_SPEC_OFF;
    sp.spec_k = o->spec_k;
    if (B == 0 && o->spec_mode != DS41_SPEC_OFF && !o->spec_default) {
        fprintf(stderr, "ds41 serve: --spec: %s has no DSpark stages\n", o->model_dir);
        goto out;
    }
    if (sp.spec_mode == DS41_SPEC_AUTO &&
        ds41_spec_curve_path(o->model_dir, o->lp.n_threads > 0 ? o->lp.n_threads : 1, o->lp.exact, sp.curve_path,
                             sizeof sp.curve_path))
        sp.curve_path[0] = 0;
    char rank_dir[4096];
    if (!o->no_prefix_cache) {
        ds41_prefix_params pp;
        memset(&pp, 0, sizeof pp);
        pp.mem_bytes = o->cache_mem;
        /* under mpiexec rank 0 alone reads and writes the store; the other ranks' caches stay
         * in memory and get the blocks it reads from disk in the record (serve_mpi.h, BLOCKS).
         * Under --dp-attention each rank caches its own sequences: a store per rank, DIR/rank-R
         * (DIR a per-host disk or a shared one), which it reads for its PROBE answers and
         * restores and writes when it publishes. Under --split layers each stage keeps its
         * layers' part of every block: a store per rank too, a restore agreed by every stage
         * (ds41_prefix_restore_job) */
        if (ds41_prefix_job_dir(o->cache_dir, ds41_dist_dp() || ds41_pipe_on(), rank_dir, sizeof rank_dir, &pp.dir)) {
            fprintf(stderr, "ds41 serve: --cache-dir %s: the path is too long for a store per rank\n", o->cache_dir);
            goto out;
        }
        pp.disk_bytes = o->cache_bytes;
        pp.replay = o->replay;
        pp.index_k = o->sp.index_k;
        sv->pc = ds41_prefix_open(sv->e, &pp, eb, sizeof eb);
        if (!sv->pc) { fprintf(stderr, "ds41 serve: %s\n", eb); goto out; }
        /* a job restarted with fewer ranks: the stores of the ranks past the new count move to
         * the ranks that take them (every rank at this point) */
        if (o->cache_dir && ds41_dist_dp() && !ds41_pipe_on()) ds41_prefix_job_adopt(sv->pc, o->cache_dir);
        sp.pc = sv->pc;
        sv->m.prefix_cache = 1;
    }
    if (cfg.vision_n_layers > 0 && !o->no_image_cache) {
        sv->vc = ds41_vcache_new(o->image_cache > 0 ? o->image_cache : 256LL << 20);
        if (!sv->vc) { fprintf(stderr, "ds41 serve: out of memory\n"); goto out; }
        sp.vcache = sv->vc;
    }
    if (ds41_dist_size() > 1) {
        /* under mpiexec: the other ranks replay rank 0's engine calls (serve_mpi.h) */
        if (ds41_dist_rank() > 0) {
            if (sp.spec_mode != DS41_SPEC_OFF) sp.sp.draft = 1;   /* as rank 0's scheduler keeps the DSpark rings */
            /* a prefill node's sessions take the node's parameters (pd_prefill.c), not the scheduler's */
            rc = ds41_smirror_follow(sv->e, sv->pc, o->role == DS41_SERVE_ROLE_PREFILL ? &o->sp : &sp.sp, eb, sizeof eb) ? 1 : 0;
            if (rc) fprintf(stderr, "ds41 serve: %s\n", eb);
            goto out;
        }
        sv->mirror = sp.mirror = ds41_smirror_new();
        if (!sv->mirror) { fprintf(stderr, "ds41 serve: out of memory\n"); goto out; }
        /* rank 0's store shipped in BLOCKS records; not under --split layers (a store per stage) */
        if (sv->pc && o->cache_dir && !ds41_pipe_on()) ds41_smirror_store(sv->mirror);
    }
    if (o->role == DS41_SERVE_ROLE_PREFILL) { rc = ds41_serve_pd_prefill(sv->e, sv->pc, o, sv->model_name, &ss, sv->mirror); goto out; }
    if (o->role == DS41_SERVE_ROLE_DECODE) {
        if (ds41_serve_pd_decode(sv->e, sv->pc, o, &sp, &sv->pdc)) goto out;
        sv->m.pd = 1;
    }
    sv->S = ds41_sched_start(sv->e, sv->tok, &sp, &sv->m, eb, sizeof eb);
    if (!sv->S) { fprintf(stderr, "ds41 serve: %s\n", eb); goto out; }
    if (sv->mirror) {
        ds41_smirror_on_fault(sv->S);
        char ge[300];
        if (ds41_sguard_start(ge, sizeof ge) == 0) sv->guard = 1;
        else fprintf(stderr, "ds41 serve: the 503 guard did not start (%s): if the job is killed, requests in flight see "
                             "their connections close\n", ge);
    }

    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV | AI_PASSIVE }, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    int gai = getaddrinfo(o->host, port, &hints, &ai);
    if (gai) { fprintf(stderr, "ds41 serve: --host %s: %s\n", o->host, gai_strerror(gai)); goto out; }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
                     (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    sv->climit = ds41_conn_limit_new(o->max_connections, o->max_connections_per_ip);
    if (!sv->climit) { fprintf(stderr, "ds41 serve: out of memory\n"); freeaddrinfo(ai); goto out; }
    /* microhttpd's own limit sits above ours: at it microhttpd stops accepting and clients wait
     * in the backlog, while accept_conn closes them at once */
    d = MHD_start_daemon(flags, 0, accept_conn, sv, handler, sv, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, sv,
                         MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                         MHD_OPTION_NOTIFY_COMPLETED, completed, sv, MHD_OPTION_NOTIFY_CONNECTION, notify_conn, sv,
                         MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_connections + 16u, MHD_OPTION_CONNECTION_TIMEOUT,
                         (unsigned)o->timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)65536,
                         MHD_OPTION_PER_IP_CONNECTION_LIMIT, 0u, MHD_OPTION_THREAD_STACK_SIZE, (size_t)(4u << 20),
                         MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) { fprintf(stderr, "ds41 serve: cannot listen on %s:%d: %s\n", o->host, o->port, strerror(errno)); goto out; }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    char spec_name[32];
    if (sp.spec_mode == DS41_SPEC_FIXED) snprintf(spec_name, sizeof spec_name, "fixed:%d", sp.spec_k);
    else snprintf(spec_name, sizeof spec_name, "%s", sp.spec_mode == DS41_SPEC_AUTO ? "auto" : "off");
    fprintf(stderr, "ds41 serve: listening on http://%s:%u (model %s, context %lld, %s kernels, parallel %d, batch tokens %d, "
            "kv budget %lld B = %lld B/sequence at full context, spec %s, prefix cache %s%s%s%s)\n", o->host, di ? di->port : (unsigned)o->port, sv->model_name,
            sv->ctx, o->lp.exact ? "exact" : "fast", sp.parallel, sp.batch_tokens, sp.kv_budget,
            ds41_sched_reserve_bytes(sv->S, 0, sv->ctx), spec_name,
            !sv->pc ? "off" : o->replay == DS41_REPLAY_APPROX ? "on (approx replay)" : "on (exact replay)",
            o->cache_dir && sv->pc ? ", store " : "", o->cache_dir && sv->pc ? o->cache_dir : "",
            o->cache_dir && sv->pc && ds41_dist_dp() ? "/rank-R on each rank R" : "");
    fflush(stderr);
    int sig = 0;
    sigwait(&ss, &sig);
    fprintf(stderr, "ds41 serve: signal %d, shutting down\n", sig);
    rc = 0;
out:
    /* the scheduler first: it aborts what runs or waits, which wakes the handlers; then the
     * daemon joins its connection threads; the scheduler's memory goes last */
    if (sv->S) ds41_sched_stop(sv->S);
    if (sv->mirror) {
        /* the scheduler's last records (sessions closed), then the followers leave */
        ds41_smirror_on_fault(NULL);
        ds41_smirror_end(sv->mirror);
        ds41_smirror_free(sv->mirror);
    }
    if (d) MHD_stop_daemon(d);
    if (sv->guard) {   /* every reply is out: the guard leaves */
        if (getenv("DS41_MPI_VERBOSE")) {
            long long go, gd;
            double gs;
            ds41_sguard_stats(&go, &gd, &gs);
            fprintf(stderr, "ds41 serve: 503 guard: %lld requests handed over, %lld not (its queue full), %.1f us of CPU each on the "
                            "request's thread (answers built, handed over, ended)\n", go, gd, go + gd ? gs * 1e6 / (double)(go + gd) : 0.0);
        }
        ds41_sguard_release();
    }
    ds41_sched_free(sv->S);
    ds41_serve_pd_close(sv->pdc);
    ds41_prefix_close(sv->pc);
    ds41_unload(sv->e);
    if (sv->tok) ds41_tokenizer_free(sv->tok);
    ds41_gcache_free(sv->gc);
    ds41_vcache_free(sv->vc);
    ds41_gvocab_free(sv->gv);
    ds41_conn_limit_free(sv->climit);
    if (have_cfg) ds41_config_free(&cfg);
    ds41_metrics_free(&sv->m);
    free(sv);
    return rc;
}
