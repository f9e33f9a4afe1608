/* ds41 bench-serve: a load generator for `ds41 serve` (or any OpenAI-compatible server) in the
 * convention of `vllm bench serve`: streamed /v1/completions requests with random token-id
 * prompts of --input-len tokens and --output-len generated tokens (ignore_eos), at most C in
 * flight for each concurrency C; per request the time to first token (TTFT), the gaps between
 * tokens (ITL; a chunk carrying k tokens counts as k gaps, the first of its full gap and the
 * rest 0, as vLLM counts them), the time per output token after the first (TPOT), and
 * overall request and output-token throughput. Tokens are counted from the stream's
 * logprobs (return_tokens_as_token_ids), not from text. */
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cli_args.h"

static const char *BS_USAGE =
    "usage: ds41 bench-serve [options]\n"
    "  --host ADDR            server address (default 127.0.0.1)\n"
    "  --port N               server port (default 8000)\n"
    "  --api-key KEY          Bearer token (also DS41_API_KEY)\n"
    "  --model NAME           model field of the requests (default: none sent)\n"
    "  --concurrency LIST     comma-separated in-flight limits (default 1,4,16,64)\n"
    "  --num-prompts N        requests per concurrency (default max(16, 2 x concurrency))\n"
    "  --input-len N          prompt tokens (random ids, default 128)\n"
    "  --output-len N         generated tokens per request (default 64)\n"
    "  --vocab N              prompt ids are drawn from 2..N-1 (default 500)\n"
    "  --seed S               prompt and sampling seed (default 0)\n"
    "  --temperature T        sampling temperature (default 0)\n"
    "  --json                 one JSON object per concurrency instead of the tables\n";

typedef struct result {
    int ok;
    int out_tokens;
    double ttft, e2e;
    double *itl;
    int n_itl, cap_itl;
    char err[160];
} result;

typedef struct bench {
    const char *host, *port, *key, *model;
    int input_len, output_len, vocab, n_req;
    unsigned long long seed;
    double temperature;
    atomic_int next;
    result *res;
} bench;

static void itl_add(result *r, double v) {
    if (r->n_itl == r->cap_itl) {
        int nc = r->cap_itl ? r->cap_itl * 2 : 64;
        double *p = realloc(r->itl, (size_t)nc * sizeof *p);
        if (!p) return;
        r->itl = p;
        r->cap_itl = nc;
    }
    r->itl[r->n_itl++] = v;
}

static int dial(const char *host, const char *port) {
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *ai = NULL;
    if (getaddrinfo(host, port, &hints, &ai)) return -1;
    int fd = socket(ai->ai_family, ai->ai_socktype, 0);
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen)) { close(fd); fd = -1; }
    freeaddrinfo(ai);
    return fd;
}

/* One SSE event's payload (after "data: "). */
static void on_event(result *r, const char *js, size_t n, double t0, double *t_last) {
    if (n == 6 && !memcmp(js, "[DONE]", 6)) return;
    json_t *o = json_loadb(js, n, 0, NULL);
    if (!o) return;
    json_t *err = json_object_get(o, "error");
    if (err) { snprintf(r->err, sizeof r->err, "%s", json_string_value(json_object_get(err, "message")) ?: "error"); r->ok = 0; }
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
    json_t *toks = json_object_get(json_object_get(ch, "logprobs"), "tokens");
    int k = (int)json_array_size(toks);
    if (k > 0) {
        double t = ds41_cli_now();
        if (r->out_tokens == 0) r->ttft = t - t0;
        else itl_add(r, t - *t_last);
        for (int i = 1; i < k; i++) if (r->out_tokens + i > 0) itl_add(r, 0.0);
        r->out_tokens += k;
        *t_last = t;
    }
    json_decref(o);
}

static void run_one(bench *b, int idx, result *r) {
    memset(r, 0, sizeof *r);
    /* prompt: random ids (splitmix64 of seed and request index) */
    uint64_t x = b->seed * 0x9E3779B97F4A7C15ull + (uint64_t)idx * 0xBF58476D1CE4E5B9ull + 1;
    size_t cap = (size_t)b->input_len * 8 + 512;
    char *body = malloc(cap);
    if (!body) return;
    size_t o = (size_t)snprintf(body, cap, "{%s%s%s\"prompt\":[", b->model ? "\"model\":\"" : "", b->model ? b->model : "",
                                b->model ? "\"," : "");
    for (int i = 0; i < b->input_len; i++) {
        x += 0x9E3779B97F4A7C15ull;
        uint64_t z = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        o += (size_t)snprintf(body + o, cap - o, "%s%d", i ? "," : "", 2 + (int)(z % (uint64_t)(b->vocab - 2)));
    }
    o += (size_t)snprintf(body + o, cap - o, "],\"max_tokens\":%d,\"ignore_eos\":true,\"stream\":true,\"logprobs\":0,"
                          "\"return_tokens_as_token_ids\":true,\"temperature\":%g,\"seed\":%d}", b->output_len, b->temperature,
                          idx + (int)b->seed);
    char head[512];
    int hl = snprintf(head, sizeof head, "POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                      "Connection: close\r\n%s%s%sContent-Length: %zu\r\n\r\n", b->host, b->key ? "Authorization: Bearer " : "",
                      b->key ? b->key : "", b->key ? "\r\n" : "", o);
    double t0 = ds41_cli_now(), t_last = t0;
    int fd = dial(b->host, b->port);
    if (fd < 0) { snprintf(r->err, sizeof r->err, "connect: %s", strerror(errno)); free(body); return; }
    if (write(fd, head, (size_t)hl) != hl || write(fd, body, o) != (ssize_t)o) {
        snprintf(r->err, sizeof r->err, "write failed");
        close(fd);
        free(body);
        return;
    }
    free(body);
    /* read everything, decoding chunked transfer and SSE lines as they come */
    size_t bc = 1 << 16, bl = 0, scan = 0;
    char *buf = malloc(bc);
    int status = 0, headers_done = 0, chunked = 0;
    size_t chunk_left = 0;
    char *ev = malloc(1 << 16);
    size_t evl = 0, evc = 1 << 16;
    r->ok = 1;
    for (;;) {
        if (bl == bc) { bc *= 2; buf = realloc(buf, bc); }
        ssize_t k = read(fd, buf + bl, bc - bl);
        if (k <= 0) break;
        bl += (size_t)k;
        if (!headers_done) {
            char *e = memmem(buf, bl, "\r\n\r\n", 4);
            if (!e) continue;
            sscanf(buf, "HTTP/1.%*d %d", &status);
            *e = 0;
            chunked = strcasestr(buf, "transfer-encoding: chunked") != NULL;
            scan = (size_t)(e - buf) + 4;
            headers_done = 1;
        }
        /* body bytes buf[scan..bl) -> payload appended to ev, SSE events cut at "\n\n" */
        while (scan < bl) {
            size_t take;
            if (chunked) {
                if (chunk_left == 0) {
                    char *nl = memmem(buf + scan, bl - scan, "\r\n", 2);
                    if (!nl) break;
                    chunk_left = strtoul(buf + scan, NULL, 16);
                    scan = (size_t)(nl - buf) + 2;
                    if (chunk_left == 0) { scan = bl; break; }
                    chunk_left += 2;   /* the CRLF after the data */
                }
                take = bl - scan < chunk_left ? bl - scan : chunk_left;
                size_t data = chunk_left > 2 ? (take < chunk_left - 2 ? take : chunk_left - 2) : 0;
                if (evl + data > evc) { evc = (evl + data) * 2; ev = realloc(ev, evc); }
                memcpy(ev + evl, buf + scan, data);
                evl += data;
                chunk_left -= take;
            } else {
                take = bl - scan;
                if (evl + take > evc) { evc = (evl + take) * 2; ev = realloc(ev, evc); }
                memcpy(ev + evl, buf + scan, take);
                evl += take;
            }
            scan += take;
        }
        char *p;
        while ((p = memmem(ev, evl, "\n\n", 2))) {
            size_t n = (size_t)(p - ev);
            if (n > 6 && !memcmp(ev, "data: ", 6)) on_event(r, ev + 6, n - 6, t0, &t_last);
            memmove(ev, p + 2, evl - n - 2);
            evl -= n + 2;
        }
        if (scan == bl) { bl = scan = 0; }
    }
    close(fd);
    r->e2e = ds41_cli_now() - t0;
    if (status != 200) {
        r->ok = 0;
        if (!r->err[0]) snprintf(r->err, sizeof r->err, "HTTP status %d", status);
    } else if (r->out_tokens == 0 && r->ok) {
        r->ok = 0;
        snprintf(r->err, sizeof r->err, "no tokens");
    }
    free(buf);
    free(ev);
}

static void *worker(void *arg) {
    bench *b = arg;
    for (;;) {
        int i = atomic_fetch_add(&b->next, 1);
        if (i >= b->n_req) break;
        run_one(b, i, &b->res[i]);
    }
    return NULL;
}

static double pct(double *v, int n, double p) {
    if (n == 0) return 0;
    double k = p / 100.0 * (n - 1);
    int lo = (int)floor(k), hi = (int)ceil(k);
    return v[lo] + (v[hi] - v[lo]) * (k - lo);
}
static double mean(const double *v, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return n ? s / n : 0;
}

int ds41_cli_bench_serve(int argc, char **argv) {
    bench b;
    memset(&b, 0, sizeof b);
    b.host = "127.0.0.1";
    b.port = "8000";
    b.key = getenv("DS41_API_KEY") && *getenv("DS41_API_KEY") ? getenv("DS41_API_KEY") : NULL;
    b.input_len = 128;
    b.output_len = 64;
    b.vocab = 500;
    const char *conc = "1,4,16,64";
    int n_prompts = 0, json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long long iv;
        double dv;
#define IS(s) (!strcmp(a, s))
#define NEED() do { if (i + 1 >= argc) { fprintf(stderr, "ds41 bench-serve: %s needs a value\n", a); return 2; } } while (0)
#define INT(lo, hi) do { NEED(); if (ds41_cli_int("bench-serve", a, argv[++i], (lo), (hi), &iv)) return 2; } while (0)
        if (IS("--help") || IS("-h")) { fputs(BS_USAGE, stdout); return 0; }
        else if (IS("--host")) { NEED(); b.host = argv[++i]; }
        else if (IS("--port")) { NEED(); if (ds41_cli_int("bench-serve", a, argv[i + 1], 1, 65535, &iv)) return 2; b.port = argv[++i]; }
        else if (IS("--api-key")) { NEED(); b.key = argv[++i]; }
        else if (IS("--model")) { NEED(); b.model = argv[++i]; }
        else if (IS("--concurrency")) { NEED(); conc = argv[++i]; }
        else if (IS("--num-prompts")) { INT(1, 1000000); n_prompts = (int)iv; }
        else if (IS("--input-len")) { INT(1, 1 << 24); b.input_len = (int)iv; }
        else if (IS("--output-len")) { INT(1, 1 << 24); b.output_len = (int)iv; }
        else if (IS("--vocab")) { INT(3, INT32_MAX); b.vocab = (int)iv; }
        else if (IS("--seed")) { NEED(); if (ds41_cli_u64("bench-serve", a, argv[++i], &b.seed)) return 2; }
        else if (IS("--temperature")) { NEED(); if (ds41_cli_double("bench-serve", a, argv[++i], 0, 2, &dv)) return 2; b.temperature = dv; }
        else if (IS("--json")) json = 1;
        else { fprintf(stderr, "ds41 bench-serve: unknown option '%s'\n%s", a, BS_USAGE); return 2; }
#undef IS
#undef NEED
#undef INT
    }
    int rc = 0;
    char *list = strdup(conc), *save = NULL;
    for (char *tk = strtok_r(list, ",", &save); tk; tk = strtok_r(NULL, ",", &save)) {
        long long c;
        if (ds41_cli_int("bench-serve", "--concurrency", tk, 1, 4096, &c)) { free(list); return 2; }
        b.n_req = n_prompts ? n_prompts : (int)(2 * c > 16 ? 2 * c : 16);
        b.res = calloc((size_t)b.n_req, sizeof *b.res);
        atomic_store(&b.next, 0);
        pthread_t *th = calloc((size_t)c, sizeof *th);
        double t0 = ds41_cli_now();
        for (long long i = 0; i < c; i++) pthread_create(&th[i], NULL, worker, &b);
        for (long long i = 0; i < c; i++) pthread_join(th[i], NULL);
        double dur = ds41_cli_now() - t0;
        int ok = 0, n_itl = 0;
        long long out = 0;
        double *ttft = calloc((size_t)b.n_req, sizeof *ttft), *tpot = calloc((size_t)b.n_req, sizeof *tpot),
               *e2e = calloc((size_t)b.n_req, sizeof *e2e);
        for (int i = 0; i < b.n_req; i++) n_itl += b.res[i].n_itl;
        double *itl = calloc((size_t)(n_itl ? n_itl : 1), sizeof *itl);
        n_itl = 0;
        const char *first_err = NULL;
        for (int i = 0; i < b.n_req; i++) {
            result *r = &b.res[i];
            if (!r->ok) { if (!first_err) first_err = r->err; continue; }
            ttft[ok] = r->ttft;
            e2e[ok] = r->e2e;
            tpot[ok] = r->out_tokens > 1 ? (r->e2e - r->ttft) / (r->out_tokens - 1) : 0;
            ok++;
            out += r->out_tokens;
            memcpy(itl + n_itl, r->itl, (size_t)r->n_itl * sizeof *itl);
            n_itl += r->n_itl;
        }
        qsort(ttft, (size_t)ok, sizeof *ttft, ds41_cli_cmp_double);
        qsort(tpot, (size_t)ok, sizeof *tpot, ds41_cli_cmp_double);
        qsort(e2e, (size_t)ok, sizeof *e2e, ds41_cli_cmp_double);
        qsort(itl, (size_t)n_itl, sizeof *itl, ds41_cli_cmp_double);
        if (json) {
            printf("{\"concurrency\":%lld,\"num_prompts\":%d,\"completed\":%d,\"duration_s\":%.4f,\"input_len\":%d,"
                   "\"output_len\":%d,\"total_output_tokens\":%lld,\"request_throughput\":%.4f,\"output_throughput\":%.4f,"
                   "\"mean_ttft_ms\":%.3f,\"median_ttft_ms\":%.3f,\"p99_ttft_ms\":%.3f,\"mean_tpot_ms\":%.3f,"
                   "\"median_tpot_ms\":%.3f,\"p99_tpot_ms\":%.3f,\"mean_itl_ms\":%.3f,\"median_itl_ms\":%.3f,"
                   "\"p99_itl_ms\":%.3f,\"mean_e2el_ms\":%.3f,\"median_e2el_ms\":%.3f,\"p99_e2el_ms\":%.3f}\n",
                   c, b.n_req, ok, dur, b.input_len, b.output_len, out, ok / dur, out / dur, 1e3 * mean(ttft, ok),
                   1e3 * pct(ttft, ok, 50), 1e3 * pct(ttft, ok, 99), 1e3 * mean(tpot, ok), 1e3 * pct(tpot, ok, 50),
                   1e3 * pct(tpot, ok, 99), 1e3 * mean(itl, n_itl), 1e3 * pct(itl, n_itl, 50), 1e3 * pct(itl, n_itl, 99),
                   1e3 * mean(e2e, ok), 1e3 * pct(e2e, ok, 50), 1e3 * pct(e2e, ok, 99));
        } else {
            printf("============ Serving Benchmark Result ============\n");
            printf("%-40s %lld\n%-40s %d\n%-40s %d\n%-40s %.2f\n", "Concurrency:", c, "Successful requests:", ok,
                   "Failed requests:", b.n_req - ok, "Benchmark duration (s):", dur);
            printf("%-40s %lld\n%-40s %lld\n", "Total input tokens:", (long long)ok * b.input_len, "Total generated tokens:", out);
            printf("%-40s %.2f\n%-40s %.2f\n", "Request throughput (req/s):", ok / dur, "Output token throughput (tok/s):", out / dur);
            printf("---------------Time to First Token----------------\n");
            printf("%-40s %.2f\n%-40s %.2f\n%-40s %.2f\n", "Mean TTFT (ms):", 1e3 * mean(ttft, ok), "Median TTFT (ms):",
                   1e3 * pct(ttft, ok, 50), "P99 TTFT (ms):", 1e3 * pct(ttft, ok, 99));
            printf("-----Time per Output Token (excl. 1st token)------\n");
            printf("%-40s %.2f\n%-40s %.2f\n%-40s %.2f\n", "Mean TPOT (ms):", 1e3 * mean(tpot, ok), "Median TPOT (ms):",
                   1e3 * pct(tpot, ok, 50), "P99 TPOT (ms):", 1e3 * pct(tpot, ok, 99));
            printf("---------------Inter-token Latency----------------\n");
            printf("%-40s %.2f\n%-40s %.2f\n%-40s %.2f\n", "Mean ITL (ms):", 1e3 * mean(itl, n_itl), "Median ITL (ms):",
                   1e3 * pct(itl, n_itl, 50), "P99 ITL (ms):", 1e3 * pct(itl, n_itl, 99));
            printf("==================================================\n");
        }
        fflush(stdout);
        if (ok < b.n_req) {
            fprintf(stderr, "ds41 bench-serve: %d of %d requests failed (first: %s)\n", b.n_req - ok, b.n_req, first_err ? first_err : "?");
            rc = 1;
        }
        for (int i = 0; i < b.n_req; i++) free(b.res[i].itl);
        free(b.res); free(th); free(ttft); free(tpot); free(e2e); free(itl);
    }
    free(list);
    return rc;
}
