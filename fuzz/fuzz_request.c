/* libFuzzer harness for the ds41 serve request parser (src/serve/serve_req.c): each input is a
 * request body given to the chat, completions, /tokenize and /detokenize parsers, and to the
 * Anthropic Messages and OpenAI Responses conversions (src/serve/serve_anth.c, serve_resp.c;
 * the chat body they give must then parse or be refused with an error; Anthropic's own errors
 * are Anthropic-shaped). A rejected
 * body must come with an OpenAI error of status 4xx/5xx, a known type and a one-line message;
 * an accepted one must satisfy the documented ranges (n, choices, stop strings, logprobs) and
 * carry prompts that are NUL-terminated text of the stated length or id lists. Violations
 * abort. The DSML tool-call parser and the text view run on the input too. */
#include "serve_anth.h"
#include "serve_req.h"
#include "serve_resp.h"
#include "serve_text.h"
#include "image.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_err(const ds41_req_error *e) {
    if (e->status < 400 || e->status > 599 || !e->type[0] || !e->message[0]) abort();
    for (const char *p = e->message; *p; p++)
        if ((unsigned char)*p < 0x20) abort();
}

static void check_req(const ds41_req *r) {
    if (r->n < 1 || r->n > DS41_REQ_MAX_N || r->n_prompts < 1 || r->n_prompts * (size_t)r->n > DS41_REQ_MAX_CHOICES) abort();
    if (r->n_stop < 0 || r->n_stop > DS41_REQ_MAX_STOP || r->top_logprobs < 0 || r->top_logprobs > DS41_REQ_MAX_TOP_LOGPROBS) abort();
    if (!(r->temperature >= 0 && r->temperature <= 2) || !(r->top_p > 0 && r->top_p <= 1)) abort();
    for (size_t i = 0; i < r->n_prompts; i++) {
        const ds41_req_prompt *p = &r->prompts[i];
        if (!p->text == !p->ids) abort();
        if (p->text && p->text[p->text_len] != 0) abort();
        if (p->ids && p->n_ids == 0) abort();
        for (size_t k = 0; p->ids && k < p->n_ids; k++) if (p->ids[k] < 0) abort();
    }
    for (int i = 0; i < r->n_stop; i++) if (!r->stop[i] || !r->stop[i][0]) abort();
    /* an accepted image part is a PNG or JPEG by its signature, within the image limits */
    if (r->n_images < 0 || (r->n_images && r->kind != DS41_REQ_CHAT)) abort();
    for (int i = 0; i < r->n_images; i++) {
        const uint8_t *b = r->images[i];
        if (!b || r->image_len[i] < 2 || r->image_len[i] > DS41_IMAGE_MAX_BYTES) abort();
        if (r->image_w[i] < 1 || r->image_h[i] < 1 || r->image_w[i] > DS41_IMAGE_MAX_SIDE || r->image_h[i] > DS41_IMAGE_MAX_SIDE) abort();
        if (memcmp(b, "\x89PNG", r->image_len[i] < 4 ? r->image_len[i] : 4) && !(b[0] == 0xFF && b[1] == 0xD8)) abort();
    }
}

/* One SSE write: "event: NAME\ndata: JSON\n\n" in three calls; the data part must parse. */
static void sse_check(void *ctx, const char *s, size_t n) {
    (void)ctx;
    if (n > 2 && s[0] == '{') {
        json_t *o = json_loadb(s, n, JSON_ALLOW_NUL, NULL);   /* generated text may hold NUL bytes (sent escaped) */
        if (!json_is_object(o)) abort();
        json_decref(o);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *b = (const char *)data;
    for (int kind = 0; kind < 2; kind++) {
        ds41_req r;
        ds41_req_error e;
        memset(&e, 0, sizeof e);
        if (ds41_req_parse(kind ? DS41_REQ_COMPLETION : DS41_REQ_CHAT, b, size, &r, &e)) check_err(&e);
        else { check_req(&r); ds41_req_free(&r); }
    }
    char *text = NULL;
    size_t tl = 0;
    int add = 0;
    ds41_req_error e;
    memset(&e, 0, sizeof e);
    if (ds41_req_parse_tokenize(b, size, &text, &tl, &add, &e)) { if (text) abort(); check_err(&e); }
    else { if (!text || text[tl]) abort(); free(text); }
    int32_t *ids = NULL;
    size_t n = 0;
    memset(&e, 0, sizeof e);
    if (ds41_req_parse_detokenize(b, size, &ids, &n, &e)) check_err(&e);
    free(ids);
    /* Anthropic Messages bodies (/v1/messages and count_tokens) */
    for (int count = 0; count < 2; count++) {
        char *chat = NULL;
        size_t cl = 0;
        ds41_anth_info ai;
        memset(&e, 0, sizeof e);
        if (ds41_anth_to_chat(b, size, count, &chat, &cl, &ai, &e)) {
            if (chat) abort();
            check_err(&e);
            json_t *o = ds41_anth_error_json(&e);
            const char *m = json_string_value(json_object_get(json_object_get(o, "error"), "message"));
            if (!m || !m[0] || strcmp(json_string_value(json_object_get(o, "type")), "error")) abort();
            json_decref(o);
            continue;
        }
        if (!chat || chat[cl]) abort();
        ds41_req r;
        memset(&e, 0, sizeof e);
        if (ds41_req_parse(DS41_REQ_CHAT, chat, cl, &r, &e)) check_err(&e);
        else {
            check_req(&r);
            if (r.n != 1 || r.n_prompts != 1) abort();
            ds41_req_free(&r);
        }
        free(chat);
    }
    /* OpenAI Responses bodies */
    {
        char *chat = NULL;
        size_t cl = 0;
        ds41_resp_info ri;
        memset(&e, 0, sizeof e);
        if (ds41_resp_to_chat(b, size, &chat, &cl, &ri, &e)) {
            if (chat || ri.tools_json || ri.instructions) abort();
            check_err(&e);
        } else {
            if (!chat || chat[cl] || !ri.tools_json) abort();
            ds41_req r;
            memset(&e, 0, sizeof e);
            if (ds41_req_parse(DS41_REQ_CHAT, chat, cl, &r, &e)) check_err(&e);
            else { check_req(&r); ds41_req_free(&r); }
            free(chat);
            ds41_resp_info_free(&ri);
        }
    }
    /* generated text: tool calls and the reasoning / content split never read out of bounds */
    ds41_tool_call *tc = NULL;
    size_t nc = ds41_dsml_parse(b, size, &tc);
    for (size_t i = 0; i < nc; i++) if (!tc[i].name || !tc[i].arguments || tc[i].arguments[0] != '{') abort();
    ds41_tool_calls_free(tc, nc);
    ds41_text_view v;
    ds41_text_view_init(&v, size & 1, 1);
    for (size_t a = 0; a <= size; a += 1 + a / 3) {
        ds41_text_delta d;
        ds41_text_view_step(&v, b, a, 0, &d);
        if (d.r0 > d.r1 || d.c0 > d.c1 || d.r1 > a || d.c1 > a || v.cur > a) abort();
    }
    /* the same text as an Anthropic reply, whole and streamed: every event is valid JSON */
    ds41_anth_info ai = { .stream = 1, .thinking = (int)(size & 1), .tools = 1 };
    ds41_anth_seq sq = { .text = b, .text_len = size, .finish = (int)(size % 4), .stop_hit = (int)(size & 2) / 2,
                         .stop_str = "x", .input_tokens = 9, .cached_tokens = 3, .output_tokens = (long long)size };
    sq.finished = 1;
    json_t *msg = ds41_anth_message("msg_1", "m", &ai, &sq);
    if (!msg || !json_is_array(json_object_get(msg, "content"))) abort();
    json_decref(msg);
    ds41_anth_stream st;
    ds41_anth_stream_init(&st, &ai);
    sq.finished = 0;
    for (size_t a = 0; a < size; a += 1 + a / 3) ds41_anth_stream_step(&st, "msg_1", "m", &ai, &sq, a, sse_check, NULL);
    sq.finished = 1;
    ds41_anth_stream_step(&st, "msg_1", "m", &ai, &sq, size, sse_check, NULL);
    if (!st.ended) abort();
    /* and as a Responses reply */
    ds41_resp_info ri = { .thinking = ai.thinking, .tools = 1, .max_output_tokens = -1, .temperature = 1, .top_p = 1 };
    json_t *ro = ds41_resp_object("resp_1", "m", &ri, &sq);
    if (!ro || !json_is_array(json_object_get(ro, "output"))) abort();
    json_decref(ro);
    ds41_resp_stream rs;
    ds41_resp_stream_init(&rs, &ri);
    sq.finished = 0;
    for (size_t a = 0; a < size; a += 1 + a / 3) ds41_resp_stream_step(&rs, "resp_1", "m", &ri, &sq, a, sse_check, NULL);
    sq.finished = 1;
    ds41_resp_stream_step(&rs, "resp_1", "m", &ri, &sq, size, sse_check, NULL);
    if (!rs.ended) abort();
    ds41_resp_stream_free(&rs);
    return 0;
}
