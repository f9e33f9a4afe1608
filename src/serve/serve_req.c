/* ds41 serve: OpenAI request bodies -> ds41_req (see serve_req.h).
 *
 * Validation follows the OpenAI API's ranges (temperature 0..2, top_p (0, 1], n >= 1,
 * top_logprobs 0..20, penalties -2..2, logit_bias -100..100, at most 4 stop strings in OpenAI,
 * 16 here) and shape rules (a user message needs content, a tool message a tool_call_id, ...;
 * check_messages), and vLLM's extensions (top_k, min_p, repetition_penalty, min_tokens,
 * ignore_eos, stop_token_ids, skip_special_tokens, chat_template_kwargs). Members this
 * server does not implement but that do not change the output (user, metadata, store, ...)
 * are accepted and ignored; members that would change it and are not implemented (best_of >
 * n, suffix) are refused with 400 rather than silently ignored. */
#include "serve_req.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "common.h"
#include "image.h"

int ds41_req_fail(ds41_req_error *e, int status, const char *type, const char *param, const char *code,
                  const char *fmt, ...) {
    if (!e) return -1;
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type ? type : "invalid_request_error");
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    /* one line, printable ASCII controls removed (messages quote request text) */
    for (char *p = e->message; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = ' ';
    return -1;
}

#define BAD(param, ...) ds41_req_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

int ds41_req_json_depth(const char *b, size_t len) {
    int depth = 0, max = 0, in_str = 0;
    for (size_t i = 0; i < len; i++) {
        char c = b[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = 0;
        } else if (c == '"') in_str = 1;
        else if (c == '[' || c == '{') { if (++depth > max) max = depth; }
        else if (c == ']' || c == '}') depth--;
    }
    return max;
}

json_t *ds41_req_load_body(const char *body, size_t len, ds41_req_error *e) {
    if (len == 0) { BAD(NULL, "the request body is empty: expected a JSON object"); return NULL; }
    if (ds41_req_json_depth(body, len) > DS41_REQ_MAX_DEPTH) {
        BAD(NULL, "the request JSON nests deeper than %d levels", DS41_REQ_MAX_DEPTH);
        return NULL;
    }
    json_error_t je;
    json_t *root = json_loadb(body, len, 0, &je);
    if (!root) {
        BAD(NULL, "invalid JSON at line %d column %d: %s", je.line, je.column, je.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        BAD(NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

static char *dupn(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) { memcpy(p, s, n); p[n] = 0; }
    return p;
}

/* Optional number member in [lo, hi]; absent or null leaves *dst. */
static int opt_num(const json_t *o, const char *k, double lo, double hi, double *dst, ds41_req_error *e) {
    const json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return BAD(k, "%s: expected a number", k);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return BAD(k, "%s: %g is outside %g..%g", k, x, lo, hi);
    *dst = x;
    return 0;
}

static int opt_int(const json_t *o, const char *k, long long lo, long long hi, long long *dst, ds41_req_error *e) {
    const json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return BAD(k, "%s: expected an integer", k);
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return BAD(k, "%s: %lld is outside %lld..%lld", k, x, lo, hi);
    *dst = x;
    return 0;
}

static int opt_bool(const json_t *o, const char *k, int *dst, ds41_req_error *e) {
    const json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return BAD(k, "%s: expected true or false", k);
    *dst = json_is_true(v);
    return 0;
}

/* An array of token ids (each 0 .. 2^31-1; the vocabulary check comes later). */
static int id_array(const json_t *a, const char *what, int32_t **ids, size_t *n, ds41_req_error *e) {
    size_t m = json_array_size(a);
    *ids = malloc((m ? m : 1) * sizeof **ids);
    if (!*ids) return ds41_req_fail(e, 500, "internal_error", NULL, NULL, "out of memory");
    for (size_t i = 0; i < m; i++) {
        const json_t *x = json_array_get(a, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX) {
            free(*ids);
            *ids = NULL;
            return BAD(what, "%s[%zu]: expected a token id (an integer >= 0)", what, i);
        }
        (*ids)[i] = (int32_t)json_integer_value(x);
    }
    *n = m;
    return 0;
}

static int add_prompt(ds41_req *r, const json_t *v, size_t idx, ds41_req_error *e) {
    ds41_req_prompt *p = &r->prompts[r->n_prompts];
    memset(p, 0, sizeof *p);
    if (json_is_string(v)) {
        p->text = dupn(json_string_value(v), json_string_length(v));
        p->text_len = json_string_length(v);
        if (!p->text) return ds41_req_fail(e, 500, "internal_error", NULL, NULL, "out of memory");
    } else if (json_is_array(v)) {
        if (json_array_size(v) == 0) return BAD("prompt", "prompt[%zu]: empty token list", idx);
        if (id_array(v, "prompt", &p->ids, &p->n_ids, e)) return -1;
    } else {
        return BAD("prompt", "prompt: expected a string, an array of strings, an array of token ids or an array of those");
    }
    r->n_prompts++;
    return 0;
}

static int parse_prompts(ds41_req *r, const json_t *root, ds41_req_error *e) {
    const json_t *p = json_object_get(root, "prompt");
    if (!p || json_is_null(p)) return BAD("prompt", "prompt: required");
    size_t np = 1;
    int list = 0;   /* an array of prompts (strings or id arrays), not one id array */
    if (json_is_array(p)) {
        if (json_array_size(p) == 0) return BAD("prompt", "prompt: empty array");
        const json_t *f = json_array_get(p, 0);
        list = json_is_string(f) || json_is_array(f);
        if (list) np = json_array_size(p);
    }
    if (np > DS41_REQ_MAX_CHOICES) return BAD("prompt", "prompt: %zu prompts, more than %d", np, DS41_REQ_MAX_CHOICES);
    r->prompts = calloc(np, sizeof *r->prompts);
    if (!r->prompts) return ds41_req_fail(e, 500, "internal_error", NULL, NULL, "out of memory");
    if (!list) return add_prompt(r, p, 0, e);
    for (size_t i = 0; i < np; i++) {
        const json_t *x = json_array_get(p, i);
        if (!json_is_string(x) && !json_is_array(x))
            return BAD("prompt", "prompt[%zu]: expected a string or an array of token ids", i);
        if (add_prompt(r, x, i, e)) return -1;
    }
    return 0;
}

/* OpenAI reasoning_effort names -> the V4.1 encoder's (low 25, high 50, xhigh 75, max 100). */
static const char *effort_name(const char *s) {
    if (!strcmp(s, "minimal")) return "low";
    if (!strcmp(s, "medium")) return "high";
    return s;
}

/* The 6-bit value of a base64 character (RFC 4648 alphabet), -1: not one. */
static int b64_val(unsigned char ch) {
    if (ch >= 'A' && ch <= 'Z') return ch - 'A';
    if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9') return ch - '0' + 52;
    if (ch == '+') return 62;
    if (ch == '/') return 63;
    return -1;
}

/* Strict base64 of s[0..n) (padding optional, nothing after it) into a fresh buffer; a message
 * in msg on error. */
static int b64_decode(const char *s, size_t n, uint8_t **out, size_t *out_len, char *msg, size_t cap) {
    size_t pad = 0;
    while (pad < 2 && n > pad && s[n - 1 - pad] == '=') pad++;
    size_t m = n - pad;
    if (m % 4 == 1 || (pad && (m + pad) % 4)) return snprintf(msg, cap, "base64 of %zu characters is truncated", n), -1;
    uint8_t *b = malloc(m / 4 * 3 + 3);
    if (!b) return snprintf(msg, cap, "out of memory for %zu bytes", m / 4 * 3), -1;
    size_t k = 0;
    uint32_t acc = 0;
    for (size_t i = 0; i < m; i++) {
        int v = b64_val((unsigned char)s[i]);
        if (v < 0) {
            free(b);
            return snprintf(msg, cap, "base64: character %zu (0x%02x) is not in the alphabet", i, (unsigned char)s[i]), -1;
        }
        acc = acc << 6 | (uint32_t)v;
        if (i % 4 == 3) { b[k++] = (uint8_t)(acc >> 16); b[k++] = (uint8_t)(acc >> 8); b[k++] = (uint8_t)acc; acc = 0; }
    }
    if (m % 4 == 2) b[k++] = (uint8_t)(acc >> 4);
    if (m % 4 == 3) { b[k++] = (uint8_t)(acc >> 10); b[k++] = (uint8_t)(acc >> 2); }
    *out = b;
    *out_len = k;
    return 0;
}

int ds41_req_image_kind(const char *mime) {
    if (!mime) return -1;
    return !strcmp(mime, "image/png") ? 0 : !strcmp(mime, "image/jpeg") ? 1 : -1;
}

int ds41_req_image_b64(int kind, const char *b64, size_t n, const char *param, const char *field, uint8_t **data,
                       size_t *len, int *w, int *h, ds41_req_error *e) {
    char msg[256];
    uint8_t *d = NULL;
    size_t dl = 0;
    if (n / 4 * 3 > DS41_IMAGE_MAX_BYTES) return BAD(param, "%s: the image is larger than %d bytes", field, DS41_IMAGE_MAX_BYTES);
    if (b64_decode(b64, n, &d, &dl, msg, sizeof msg)) return BAD(param, "%s: %s", field, msg);
    int png = dl >= 4 && !memcmp(d, "\x89PNG", 4), jpeg = dl >= 2 && d[0] == 0xFF && d[1] == 0xD8;
    if (!(kind == 0 ? png : jpeg)) {
        free(d);
        return BAD(param, "%s: the data is not a %s file", field, kind == 0 ? "PNG" : "JPEG");
    }
    ds41_image_limits lim;
    ds41_rgb_image im;
    ds41_err err = { 0 };
    ds41_image_limits_default(&lim);
    if (ds41_image_decode(d, dl, &lim, &im, &err)) {
        free(d);
        return BAD(param, "%s: %s", field, err.msg);
    }
    if (w) *w = im.width;
    if (h) *h = im.height;
    ds41_rgb_image_free(&im);
    if (data) { *data = d; *len = dl; }
    else free(d);
    return 0;
}

int ds41_req_image_url(const char *url, const char *param, const char *field, uint8_t **data, size_t *len, int *w,
                       int *h, ds41_req_error *e) {
    static const char *const mime[] = { "data:image/png;base64,", "data:image/jpeg;base64," };
    for (int k = 0; k < 2; k++)
        if (!strncmp(url, mime[k], strlen(mime[k])))
            return ds41_req_image_b64(k, url + strlen(mime[k]), strlen(url + strlen(mime[k])), param, field, data, len, w, h, e);
    if (!strncmp(url, "http://", 7) || !strncmp(url, "https://", 8))
        return BAD(param, "%s: http(s) URLs are not fetched (this server fetches nothing): send the image as a "
                   "data:image/png;base64 or data:image/jpeg;base64 URL", field);
    return BAD(param, "%s: only data:image/png;base64 and data:image/jpeg;base64 URLs are served", field);
}

/* An image_url part (url a data: URL, see ds41_req_image_url): its bytes and size join r's
 * images (the scheduler runs the tower). */
static int add_image(ds41_req *r, const json_t *part, const char *path, size_t j, ds41_req_error *e) {
    const json_t *iu = json_object_get(part, "image_url");
    const char *url = json_string_value(json_is_object(iu) ? json_object_get(iu, "url") : iu);
    char field[128];
    snprintf(field, sizeof field, "%s.content[%zu].image_url.url", path, j);
    if (!url) return BAD("messages", "%s: required, a string", field);
    int k = r->n_images;
    uint8_t **ni = realloc(r->images, (size_t)(k + 1) * sizeof *ni);
    if (ni) r->images = ni;
    size_t *nl = ni ? realloc(r->image_len, (size_t)(k + 1) * sizeof *nl) : NULL;
    if (nl) r->image_len = nl;
    int *nw = nl ? realloc(r->image_w, (size_t)(k + 1) * sizeof *nw) : NULL;
    if (nw) r->image_w = nw;
    int *nh = nw ? realloc(r->image_h, (size_t)(k + 1) * sizeof *nh) : NULL;
    if (nh) r->image_h = nh;
    if (!nh) return ds41_req_fail(e, 500, "internal_error", NULL, NULL, "out of memory");
    if (ds41_req_image_url(url, "messages", field, &r->images[k], &r->image_len[k], &r->image_w[k], &r->image_h[k], e)) return -1;
    r->n_images++;
    return 0;
}

/* OpenAI's shape rules for messages, before the renderer (which is lenient for templates):
 * every message an object with a known role; system, developer, user and tool messages need
 * content (a string or a non-empty array); a tool message needs tool_call_id; an assistant
 * message needs content, tool_calls or reasoning; tool calls need a function name. */
static int check_messages(ds41_req *r, const json_t *msgs, ds41_req_error *e) {
    static const char *roles[] = { "system", "developer", "user", "assistant", "tool", "latest_reminder" };
    char path[64];
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        snprintf(path, sizeof path, "messages[%zu]", i);
        if (!json_is_object(m)) return BAD("messages", "%s: expected an object", path);
        const json_t *jr = json_object_get(m, "role");
        if (!jr) return BAD("messages", "%s.role: required", path);
        const char *role = json_string_value(jr);
        size_t k = 0;
        while (role && k < sizeof roles / sizeof roles[0] && strcmp(role, roles[k])) k++;
        if (!role || k == sizeof roles / sizeof roles[0])
            return BAD("messages", "%s.role: expected one of system, developer, user, assistant, tool", path);
        const json_t *c = json_object_get(m, "content");
        int has_c = c && !json_is_null(c);
        if (has_c && !json_is_string(c) && !json_is_array(c))
            return BAD("messages", "%s.content: expected a string or an array of content parts", path);
        if (has_c && json_is_array(c) && json_array_size(c) == 0)
            return BAD("messages", "%s.content: empty array, expected at least one content part", path);
        for (size_t j = 0; has_c && json_is_array(c) && j < json_array_size(c); j++) {
            const json_t *part = json_array_get(c, j);
            const char *ty = json_string_value(json_object_get(part, "type"));
            if (ty && !strcmp(ty, "image"))
                return BAD("messages", "%s.content[%zu]: image parts are not served (give an image_url part with a "
                           "data: URL)", path, j);
            if (ty && !strcmp(ty, "image_url") && add_image(r, part, path, j, e)) return -1;
        }
        const json_t *nm = json_object_get(m, "name");
        if (nm && !json_is_null(nm) && !json_is_string(nm)) return BAD("messages", "%s.name: expected a string", path);
        if (!strcmp(role, "assistant")) {
            const json_t *tc = json_object_get(m, "tool_calls");
            int has_tc = tc && !json_is_null(tc);
            if (has_tc && !json_is_array(tc)) return BAD("messages", "%s.tool_calls: expected an array", path);
            for (size_t j = 0; has_tc && j < json_array_size(tc); j++) {
                const json_t *t = json_array_get(tc, j), *fn = json_object_get(t, "function");
                if (!json_is_object(t) || !json_is_object(fn) || !json_is_string(json_object_get(fn, "name")))
                    return BAD("messages", "%s.tool_calls[%zu].function.name: required", path, j);
                const json_t *a = json_object_get(fn, "arguments");
                if (a && !json_is_string(a) && !json_is_object(a))
                    return BAD("messages", "%s.tool_calls[%zu].function.arguments: expected a JSON string", path, j);
            }
            int has_r = json_is_string(json_object_get(m, "reasoning_content")) || json_is_string(json_object_get(m, "reasoning"));
            if (!has_c && !(has_tc && json_array_size(tc) > 0) && !has_r)
                return BAD("messages", "%s: an assistant message needs content or tool_calls", path);
        } else if (!has_c) {
            return BAD("messages", "%s.content: required for a %s message", path, role);
        }
        if (!strcmp(role, "tool") && !json_is_string(json_object_get(m, "tool_call_id")))
            return BAD("messages", "%s.tool_call_id: required for a tool message (a string)", path);
    }
    return 0;
}

/* A function name as OpenAI allows it: 1..64 of [a-zA-Z0-9_-]. */
static int fn_name_ok(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n > 64) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_' ||
              s[i] == '-'))
            return 0;
    return 1;
}

/* Renders messages (+ tools and thinking options) to the prompt text. */
static int parse_chat(ds41_req *r, json_t *root, ds41_req_error *e) {
    const json_t *msgs = json_object_get(root, "messages");
    if (!json_is_array(msgs)) return BAD("messages", "messages: required, an array of messages");
    if (json_array_size(msgs) == 0) return BAD("messages", "messages: empty");
    if (check_messages(r, msgs, e)) return -1;
    /* the subset the renderer reads, rebuilt so that OpenAI spellings map onto it */
    json_t *sub = json_object();
    json_object_set(sub, "messages", (json_t *)msgs);
    int rc = -1;
    const json_t *tc = json_object_get(root, "tool_choice");
    int choice_none = 0, choice_required = 0;
    if (tc && !json_is_null(tc)) {
        if (json_is_string(tc)) {
            const char *s = json_string_value(tc);
            if (!strcmp(s, "none")) choice_none = 1;
            else if (!strcmp(s, "required")) choice_required = 1;
            else if (strcmp(s, "auto") && strcmp(s, "required")) {
                BAD("tool_choice", "tool_choice: expected none, auto, required or {\"type\": \"function\", ...}");
                goto out;
            }
        } else if (json_is_object(tc)) {
            const json_t *fn = json_object_get(tc, "function");
            const json_t *ty = json_object_get(tc, "type");
            if (ty && (!json_is_string(ty) || strcmp(json_string_value(ty), "function"))) {
                BAD("tool_choice", "tool_choice.type: expected \"function\"");
                goto out;
            }
            const char *name = json_string_value(json_object_get(fn, "name"));
            if (!name) { BAD("tool_choice", "tool_choice.function.name: required"); goto out; }
            r->tool_choice_name = dupn(name, strlen(name));
        } else {
            BAD("tool_choice", "tool_choice: expected a string or an object");
            goto out;
        }
    }
    const json_t *tools = json_object_get(root, "tools");
    int named_found = 0;
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) { BAD("tools", "tools: expected an array of tools"); goto out; }
        for (size_t i = 0; i < json_array_size(tools); i++) {
            const json_t *t = json_array_get(tools, i);
            const json_t *fn = json_object_get(t, "function");
            if (!json_is_object(t) || !json_is_object(fn) || !json_is_string(json_object_get(fn, "name"))) {
                BAD("tools", "tools[%zu]: expected {\"type\": \"function\", \"function\": {\"name\": ..., ...}}", i);
                goto out;
            }
            const json_t *ty = json_object_get(t, "type");
            if (ty && (!json_is_string(ty) || strcmp(json_string_value(ty), "function"))) {
                BAD("tools", "tools[%zu].type: expected \"function\"", i);
                goto out;
            }
            if (!fn_name_ok(json_string_value(json_object_get(fn, "name")))) {
                BAD("tools", "tools[%zu].function.name: expected 1 to 64 letters, digits, _ or -", i);
                goto out;
            }
            const json_t *pa = json_object_get(fn, "parameters");
            if (pa && !json_is_null(pa) && !json_is_object(pa)) {
                BAD("tools", "tools[%zu].function.parameters: expected a JSON Schema object", i);
                goto out;
            }
            const json_t *st = json_object_get(fn, "strict");
            if (st && !json_is_null(st) && !json_is_boolean(st)) {
                BAD("tools", "tools[%zu].function.strict: expected true or false", i);
                goto out;
            }
            if (r->tool_choice_name && !strcmp(r->tool_choice_name, json_string_value(json_object_get(fn, "name"))))
                named_found = 1;
        }
        if (json_array_size(tools) > 0 && !choice_none) {
            json_object_set(sub, "tools", (json_t *)tools);
            r->tools = 1;
        }
    }
    if (r->tool_choice_name && !r->tools) { BAD("tool_choice", "tool_choice names a function but no tools are given"); goto out; }
    if (r->tool_choice_name && !named_found) {
        BAD("tool_choice", "tool_choice: function '%.64s' is not among the tools", r->tool_choice_name);
        goto out;
    }
    if (choice_required && !r->tools) { BAD("tool_choice", "tool_choice: \"required\" needs tools"); goto out; }
    r->tool_required = choice_required;
    {
        int ptc = 1;
        if (opt_bool(root, "parallel_tool_calls", &ptc, e)) goto out;
        r->parallel_tool_calls = ptc;
    }
    /* thinking: chat_template_kwargs.{thinking, enable_thinking}, else reasoning_effort
     * (anything but "none" turns thinking on), else chat mode */
    const json_t *kw = json_object_get(root, "chat_template_kwargs");
    if (kw && !json_is_null(kw) && !json_is_object(kw)) { BAD("chat_template_kwargs", "chat_template_kwargs: expected an object"); goto out; }
    json_t *kw2 = json_object();
    json_object_set_new(sub, "chat_template_kwargs", kw2);
    int thinking_set = 0;
    if (json_is_object(kw)) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)kw, k, v) {
            if (!strcmp(k, "enable_thinking")) k = "thinking";
            if (!strcmp(k, "thinking") || !strcmp(k, "reasoning_effort") || !strcmp(k, "drop_thinking")) {
                if (!strcmp(k, "thinking")) thinking_set = 1;
                json_object_set(kw2, k, v);
            }
        }
    }
    const json_t *eff = json_object_get(root, "reasoning_effort");
    if (eff && !json_is_null(eff)) {
        if (json_is_string(eff) && !strcmp(json_string_value(eff), "none")) {
            if (!thinking_set) json_object_set_new(kw2, "thinking", json_false());
        } else {
            if (json_is_string(eff)) json_object_set_new(sub, "reasoning_effort", json_string(effort_name(json_string_value(eff))));
            else json_object_set(sub, "reasoning_effort", (json_t *)eff);
            if (!thinking_set) json_object_set_new(kw2, "thinking", json_true());
        }
    }
    static const char *pass[] = { "add_generation_prompt", "continue_final_message", "thinking" };
    for (size_t i = 0; i < sizeof pass / sizeof pass[0]; i++) {
        json_t *v = json_object_get(root, pass[i]);
        if (v) json_object_set(sub, pass[i], v);
    }
    char *txt = json_dumps(sub, JSON_COMPACT);
    if (!txt) { ds41_req_fail(e, 500, "internal_error", NULL, NULL, "out of memory"); goto out; }
    ds41_chat c;
    ds41_chat_init(&c);
    ds41_chat_options o;
    ds41_chat_options_init(&o);
    ds41_err err;
    err.msg[0] = 0;
    int prc = ds41_chat_parse_json(txt, strlen(txt), "request", &c, &o, &err);
    free(txt);
    if (prc) {
        const char *m = err.msg;
        if (!strncmp(m, "request: ", 9)) m += 9;
        BAD(!strncmp(m, "messages", 8) ? "messages" : !strncmp(m, "tools", 5) ? "tools" : NULL, "%s", m);
        ds41_chat_free(&c);
        goto out;
    }
    if (o.continue_final_message && (c.n == 0 || c.msgs[c.n - 1].role != DS41_ROLE_ASSISTANT)) {
        BAD("messages", "continue_final_message: the last message must be an assistant message");
        ds41_chat_free(&c);
        goto out;
    }
    if (o.continue_final_message) o.add_generation_prompt = 0;
    char *out = NULL;
    size_t olen = 0;
    int rrc = ds41_chat_render(&c, &o, &out, &olen, &err);
    ds41_chat_free(&c);
    if (rrc) {
        const char *m = err.msg;
        BAD("messages", "%s", m);
        goto out;
    }
    r->prompts = calloc(1, sizeof *r->prompts);
    if (!r->prompts) { free(out); ds41_req_fail(e, 500, "internal_error", NULL, NULL, "out of memory"); goto out; }
    r->prompts[0].text = out;
    r->prompts[0].text_len = olen;
    r->n_prompts = 1;
    /* the generation prompt of thinking mode ends in <think>: output starts as reasoning */
    r->thinking = o.thinking && o.add_generation_prompt;
    rc = 0;
out:
    json_decref(sub);
    return rc;
}

static int parse_stop(ds41_req *r, const json_t *root, ds41_req_error *e) {
    const json_t *s = json_object_get(root, "stop");
    if (!s || json_is_null(s)) return 0;
    if (json_is_string(s)) {
        if (json_string_length(s) == 0) return 0;
        r->stop[r->n_stop++] = dupn(json_string_value(s), json_string_length(s));
        return 0;
    }
    if (!json_is_array(s)) return BAD("stop", "stop: expected a string or an array of strings");
    if (json_array_size(s) > DS41_REQ_MAX_STOP) return BAD("stop", "stop: more than %d strings", DS41_REQ_MAX_STOP);
    for (size_t i = 0; i < json_array_size(s); i++) {
        const json_t *x = json_array_get(s, i);
        if (!json_is_string(x)) return BAD("stop", "stop[%zu]: expected a string", i);
        if (json_string_length(x) == 0) continue;
        if (json_string_length(x) > 1024) return BAD("stop", "stop[%zu]: longer than 1024 bytes", i);
        r->stop[r->n_stop++] = dupn(json_string_value(x), json_string_length(x));
    }
    return 0;
}

/* logit_bias: {"token id": bias} with bias in -100..100 (OpenAI); ids are strings of digits. */
static int parse_logit_bias(ds41_req *r, const json_t *root, ds41_req_error *e) {
    const json_t *lb = json_object_get(root, "logit_bias");
    if (!lb || json_is_null(lb)) return 0;
    if (!json_is_object(lb)) return BAD("logit_bias", "logit_bias: expected an object mapping token ids to biases");
    size_t n = json_object_size(lb);
    if (n > DS41_REQ_MAX_BIAS) return BAD("logit_bias", "logit_bias: %zu entries, more than %d", n, DS41_REQ_MAX_BIAS);
    if (!n) return 0;
    r->bias_id = malloc(n * sizeof *r->bias_id);
    r->bias_val = malloc(n * sizeof *r->bias_val);
    if (!r->bias_id || !r->bias_val) return ds41_req_fail(e, 500, "internal_error", NULL, NULL, "out of memory");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)lb, k, v) {
        char *end = NULL;
        long long id = -1;
        if (k[0] >= '0' && k[0] <= '9' && strlen(k) <= 10) id = strtoll(k, &end, 10);
        if (id < 0 || id > INT32_MAX || !end || *end)
            return BAD("logit_bias", "logit_bias: key '%.40s' is not a token id", k);
        if (!json_is_number(v)) return BAD("logit_bias", "logit_bias[%s]: expected a number", k);
        double b = json_number_value(v);
        if (!(b >= -100 && b <= 100)) return BAD("logit_bias", "logit_bias[%s]: %g is outside -100..100", k, b);
        r->bias_id[r->n_bias] = (int32_t)id;
        r->bias_val[r->n_bias++] = (float)b;
    }
    return 0;
}

/* Compiles GBNF text (owned: kept in r->grammar_text, the grammar table cache's key) into
 * r->grammar; a compile error is a 400 naming src. */
static int set_grammar(ds41_req *r, char *gbnf, const char *src, const char *err, ds41_req_error *e) {
    if (!gbnf) return BAD(src, "%s: %s", src, err);
    char e2[300];
    r->grammar = ds41_grammar_gbnf(gbnf, strlen(gbnf), e2, sizeof e2);
    if (!r->grammar) {
        free(gbnf);
        return BAD(src, "%s: %s", src, e2);
    }
    free(r->grammar_text);
    r->grammar_text = gbnf;
    r->grammar_src = src;
    return 0;
}

/* A schema given as an object or as JSON text. */
static int schema_grammar(ds41_req *r, const json_t *sc, const char *src, ds41_req_error *e) {
    char err[300] = "";
    if (json_is_string(sc)) return set_grammar(r, ds41_schema_to_gbnf(json_string_value(sc), json_string_length(sc), err, sizeof err), src, err, e);
    if (!json_is_object(sc) && !json_is_boolean(sc)) return BAD(src, "%s: expected a JSON Schema object", src);
    char *t = json_dumps(sc, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!t) return ds41_req_fail(e, 500, "internal_error", NULL, NULL, "out of memory");
    char *g = ds41_schema_to_gbnf(t, strlen(t), err, sizeof err);
    free(t);
    return set_grammar(r, g, src, err, e);
}

static int choice_grammar(ds41_req *r, const json_t *ch, const char *src, ds41_req_error *e) {
    if (!json_is_array(ch) || json_array_size(ch) == 0 || json_array_size(ch) > 4096)
        return BAD(src, "%s: expected an array of 1 to 4096 strings", src);
    size_t n = json_array_size(ch);
    const char **s = malloc(n * sizeof *s);
    size_t *l = malloc(n * sizeof *l);
    if (!s || !l) { free(s); free(l); return ds41_req_fail(e, 500, "internal_error", NULL, NULL, "out of memory"); }
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(ch, i);
        if (!json_is_string(x)) { free(s); free(l); return BAD(src, "%s[%zu]: expected a string", src, i); }
        s[i] = json_string_value(x);
        l[i] = json_string_length(x);
    }
    char err[300] = "";
    char *g = ds41_choice_to_gbnf(s, l, (int)n, err, sizeof err);
    free(s);
    free(l);
    return set_grammar(r, g, src, err, e);
}

static int text_grammar(ds41_req *r, const json_t *v, const char *src, int regex, ds41_req_error *e) {
    if (!json_is_string(v)) return BAD(src, "%s: expected a string", src);
    if (!regex) {
        char *t = dupn(json_string_value(v), json_string_length(v));
        if (!t) return ds41_req_fail(e, 500, "internal_error", NULL, NULL, "out of memory");
        return set_grammar(r, t, src, "", e);
    }
    char err[300] = "";
    return set_grammar(r, ds41_regex_to_gbnf(json_string_value(v), json_string_length(v), err, sizeof err), src, err, e);
}

/* The output constraints; at most one may be given. */
static int parse_constraint(ds41_req *r, const json_t *root, ds41_req_error *e) {
    static const char *members[] = { "response_format", "structured_outputs", "guided_json", "guided_regex",
                                     "guided_choice", "grammar", "guided_grammar" };
    const char *given = NULL;
    for (size_t i = 0; i < sizeof members / sizeof members[0]; i++) {
        const json_t *v = json_object_get(root, members[i]);
        if (!v || json_is_null(v)) continue;
        if (!strcmp(members[i], "response_format")) {
            const char *t = json_is_object(v) ? json_string_value(json_object_get(v, "type")) : NULL;
            if (!t) return BAD("response_format", "response_format: expected {\"type\": \"text\" | \"json_object\" | \"json_schema\"}");
            if (!strcmp(t, "text")) continue;
            if (strcmp(t, "json_object") && strcmp(t, "json_schema"))
                return BAD("response_format", "response_format.type: '%.40s' is not one of text, json_object, json_schema", t);
        }
        if (given) return BAD(members[i], "%s: only one of %s and %s may be given", members[i], given, members[i]);
        given = members[i];
        if (!strcmp(given, "response_format")) {
            const char *t = json_string_value(json_object_get(v, "type"));
            if (!strcmp(t, "json_object")) {
                char err[300] = "";
                if (set_grammar(r, ds41_schema_to_gbnf(NULL, 0, err, sizeof err), "response_format", err, e)) return -1;
                continue;
            }
            const json_t *js = json_object_get(v, "json_schema");
            if (!json_is_object(js)) return BAD("response_format", "response_format.json_schema: required, an object with a schema");
            const json_t *nm = json_object_get(js, "name");
            if (nm && !json_is_string(nm)) return BAD("response_format", "response_format.json_schema.name: expected a string");
            const json_t *st = json_object_get(js, "strict");
            if (st && !json_is_null(st) && !json_is_boolean(st)) return BAD("response_format", "response_format.json_schema.strict: expected true or false");
            const json_t *sc = json_object_get(js, "schema");
            if (!sc) return BAD("response_format", "response_format.json_schema.schema: required");
            if (schema_grammar(r, sc, "response_format", e)) return -1;
        } else if (!strcmp(given, "structured_outputs")) {
            /* vLLM: {"json": schema} | {"regex": ...} | {"choice": [...]} | {"grammar": GBNF} */
            if (!json_is_object(v) || json_object_size(v) != 1)
                return BAD(given, "structured_outputs: expected an object with one of json, regex, choice, grammar");
            const json_t *x;
            if ((x = json_object_get(v, "json"))) { if (schema_grammar(r, x, "structured_outputs", e)) return -1; }
            else if ((x = json_object_get(v, "regex"))) { if (text_grammar(r, x, "structured_outputs", 1, e)) return -1; }
            else if ((x = json_object_get(v, "choice"))) { if (choice_grammar(r, x, "structured_outputs", e)) return -1; }
            else if ((x = json_object_get(v, "grammar"))) { if (text_grammar(r, x, "structured_outputs", 0, e)) return -1; }
            else return BAD(given, "structured_outputs: expected one of json, regex, choice, grammar");
        } else if (!strcmp(given, "guided_json")) {
            if (schema_grammar(r, v, "guided_json", e)) return -1;
        } else if (!strcmp(given, "guided_regex")) {
            if (text_grammar(r, v, "guided_regex", 1, e)) return -1;
        } else if (!strcmp(given, "guided_choice")) {
            if (choice_grammar(r, v, "guided_choice", e)) return -1;
        } else {
            if (text_grammar(r, v, given, 0, e)) return -1;
        }
    }
    return 0;
}

static int parse_sampling(ds41_req *r, const json_t *root, ds41_req_error *e) {
    long long n = 1, topk = 0, mt = -1, tl = 0;
    if (opt_num(root, "temperature", 0, 2, &r->temperature, e) || opt_num(root, "top_p", 0, 1, &r->top_p, e) ||
        opt_num(root, "min_p", 0, 1, &r->min_p, e) || opt_int(root, "top_k", -1, INT32_MAX, &topk, e) ||
        opt_int(root, "n", 1, DS41_REQ_MAX_N, &n, e))
        return -1;
    if (r->top_p <= 0) return BAD("top_p", "top_p: must be in (0, 1]");
    r->top_k = topk < 0 ? 0 : (int)topk;
    r->n = (int)n;
    /* max_completion_tokens is OpenAI's newer name; when both are given it wins */
    const char *mt_name = json_object_get(root, "max_completion_tokens") &&
                          !json_is_null(json_object_get(root, "max_completion_tokens")) ? "max_completion_tokens" : "max_tokens";
    if (opt_int(root, "max_tokens", 0, INT32_MAX, &mt, e) ||
        opt_int(root, "max_completion_tokens", 0, INT32_MAX, &mt, e))
        return -1;
    if (mt == 0 && !(r->kind == DS41_REQ_COMPLETION)) return BAD(mt_name, "%s: must be at least 1", mt_name);
    r->max_tokens = mt;
    const json_t *sd = json_object_get(root, "seed");
    if (sd && !json_is_null(sd)) {
        if (!json_is_integer(sd)) return BAD("seed", "seed: expected an integer");
        r->has_seed = 1;
        r->seed = (uint64_t)json_integer_value(sd);
    }
    if (parse_stop(r, root, e)) return -1;
    const json_t *sti = json_object_get(root, "stop_token_ids");
    if (sti && !json_is_null(sti)) {
        if (!json_is_array(sti) || json_array_size(sti) > 64) return BAD("stop_token_ids", "stop_token_ids: expected an array of at most 64 ids");
        if (id_array(sti, "stop_token_ids", &r->stop_token_ids, &r->n_stop_token_ids, e)) return -1;
    }
    /* logprobs: chat -> bool + top_logprobs; completions -> an integer 0..20 */
    const json_t *lp = json_object_get(root, "logprobs");
    if (r->kind == DS41_REQ_CHAT) {
        if (opt_bool(root, "logprobs", &r->logprobs, e)) return -1;
        if (opt_int(root, "top_logprobs", 0, DS41_REQ_MAX_TOP_LOGPROBS, &tl, e)) return -1;
        if (tl > 0 && !r->logprobs) return BAD("top_logprobs", "top_logprobs: needs logprobs: true");
        r->top_logprobs = (int)tl;
    } else if (lp && !json_is_null(lp)) {
        if (!json_is_integer(lp) || json_integer_value(lp) < 0 || json_integer_value(lp) > DS41_REQ_MAX_TOP_LOGPROBS)
            return BAD("logprobs", "logprobs: expected an integer 0..%d", DS41_REQ_MAX_TOP_LOGPROBS);
        r->logprobs = 1;
        r->top_logprobs = (int)json_integer_value(lp);
    }
    if (opt_bool(root, "stream", &r->stream, e) || opt_bool(root, "ignore_eos", &r->ignore_eos, e) ||
        opt_bool(root, "skip_special_tokens", &r->skip_special_tokens, e) ||
        opt_bool(root, "return_tokens_as_token_ids", &r->tokens_as_ids, e))
        return -1;
    const json_t *so = json_object_get(root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return BAD("stream_options", "stream_options: expected an object");
        if (!r->stream) return BAD("stream_options", "stream_options: only allowed with stream: true");
        if (opt_bool(so, "include_usage", &r->include_usage, e)) return -1;
    }
    if (r->kind == DS41_REQ_COMPLETION && opt_bool(root, "echo", &r->echo, e)) return -1;
    if (r->kind == DS41_REQ_COMPLETION && r->max_tokens == 0 && !r->echo)
        return BAD("max_tokens", "max_tokens: 0 is only allowed with echo");
    if (opt_num(root, "presence_penalty", -2, 2, &r->presence_penalty, e) ||
        opt_num(root, "frequency_penalty", -2, 2, &r->frequency_penalty, e) ||
        opt_num(root, "repetition_penalty", 0, 2, &r->repetition_penalty, e))
        return -1;
    if (!(r->repetition_penalty > 0)) return BAD("repetition_penalty", "repetition_penalty: must be in (0, 2]");
    if (opt_int(root, "min_tokens", 0, INT32_MAX, &r->min_tokens, e)) return -1;
    if (r->kind == DS41_REQ_CHAT && opt_int(root, "thinking_token_budget", 0, INT32_MAX, &r->think_budget, e)) return -1;
    if (r->max_tokens >= 0 && r->min_tokens > r->max_tokens)
        return BAD("min_tokens", "min_tokens: %lld is more than max_tokens %lld", r->min_tokens, r->max_tokens);
    if (parse_logit_bias(r, root, e)) return -1;
    if (parse_constraint(r, root, e)) return -1;
    long long best = n;
    if (opt_int(root, "best_of", 1, DS41_REQ_MAX_N, &best, e)) return -1;
    if (best != n) return BAD("best_of", "best_of: only equal to n is supported");
    const json_t *sfx = json_object_get(root, "suffix");
    if (sfx && !json_is_null(sfx)) return BAD("suffix", "suffix: not supported");
    return 0;
}

int ds41_req_parse(ds41_req_kind kind, const char *body, size_t len, ds41_req *r, ds41_req_error *e) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->n = 1;
    r->max_tokens = -1;
    r->temperature = 1.0;
    r->top_p = 1.0;
    r->skip_special_tokens = 1;
    r->repetition_penalty = 1.0;
    r->think_budget = -1;
    json_t *root = ds41_req_load_body(body, len, e);
    if (!root) return -1;
    int rc = -1;
    const json_t *m = json_object_get(root, "model");
    if (m && !json_is_null(m)) {
        if (!json_is_string(m)) { BAD("model", "model: expected a string"); goto out; }
        r->model = dupn(json_string_value(m), json_string_length(m));
    }
    const json_t *u = json_object_get(root, "user");
    if (u && !json_is_null(u) && !json_is_string(u)) { BAD("user", "user: expected a string"); goto out; }
    if (parse_sampling(r, root, e)) goto out;
    if (kind == DS41_REQ_CHAT ? parse_chat(r, root, e) : parse_prompts(r, root, e)) goto out;
    if (kind == DS41_REQ_CHAT && r->tools && (r->tool_required || r->tool_choice_name)) {
        /* a forced call: the grammar of V4.1's calls block over the offered functions */
        if (r->grammar) { BAD(r->grammar_src, "%s: not supported together with a forced tool call (tool_choice)", r->grammar_src); goto out; }
        char *tj = json_dumps(json_object_get(root, "tools"), JSON_COMPACT);
        char err[300] = "";
        char *gb = tj ? ds41_tools_to_gbnf(tj, strlen(tj), r->tool_choice_name, r->parallel_tool_calls, err, sizeof err) : NULL;
        free(tj);
        if (!gb && !err[0]) { ds41_req_fail(e, 500, "internal_error", NULL, NULL, "out of memory"); goto out; }
        if (set_grammar(r, gb, "tools", err, e)) goto out;
    }
    if (r->n_prompts * (size_t)r->n > DS41_REQ_MAX_CHOICES) {
        BAD("n", "%zu prompts x n %d is more than %d choices", r->n_prompts, r->n, DS41_REQ_MAX_CHOICES);
        goto out;
    }
    rc = 0;
out:
    json_decref(root);
    if (rc) ds41_req_free(r);
    return rc;
}

void ds41_req_free(ds41_req *r) {
    if (!r) return;
    for (size_t i = 0; i < r->n_prompts; i++) { free(r->prompts[i].text); free(r->prompts[i].ids); }
    free(r->prompts);
    for (int i = 0; i < r->n_images; i++) free(r->images[i]);
    free(r->images);
    free(r->image_len);
    free(r->image_w);
    free(r->image_h);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop_token_ids);
    free(r->bias_id);
    free(r->bias_val);
    ds41_grammar_free(r->grammar);
    free(r->grammar_text);
    free(r->model);
    free(r->tool_choice_name);
    free(r->user);
    memset(r, 0, sizeof *r);
}

int ds41_req_parse_tokenize(const char *body, size_t len, char **text, size_t *text_len, int *add_special,
                            ds41_req_error *e) {
    *text = NULL;
    json_t *root = ds41_req_load_body(body, len, e);
    if (!root) return -1;
    int rc = -1;
    *add_special = 1;
    if (json_object_get(root, "messages")) {
        ds41_req r;
        char *txt = json_dumps(root, JSON_COMPACT);
        json_decref(root);
        root = NULL;
        if (!txt) return ds41_req_fail(e, 500, "internal_error", NULL, NULL, "out of memory");
        /* the same rendering as a chat request */
        int prc = ds41_req_parse(DS41_REQ_CHAT, txt, strlen(txt), &r, e);
        free(txt);
        if (prc) return -1;
        *text = r.prompts[0].text;
        *text_len = r.prompts[0].text_len;
        r.prompts[0].text = NULL;
        ds41_req_free(&r);
        *add_special = 0;
        return 0;
    }
    const json_t *p = json_object_get(root, "prompt");
    if (!json_is_string(p)) { BAD("prompt", "prompt: required, a string (or give messages)"); goto out; }
    int as = 1;
    if (opt_bool(root, "add_special_tokens", &as, e)) goto out;
    *add_special = as;
    *text = dupn(json_string_value(p), json_string_length(p));
    *text_len = json_string_length(p);
    rc = *text ? 0 : ds41_req_fail(e, 500, "internal_error", NULL, NULL, "out of memory");
out:
    json_decref(root);
    return rc;
}

int ds41_req_parse_detokenize(const char *body, size_t len, int32_t **ids, size_t *n, ds41_req_error *e) {
    *ids = NULL;
    *n = 0;
    json_t *root = ds41_req_load_body(body, len, e);
    if (!root) return -1;
    const json_t *t = json_object_get(root, "tokens");
    int rc = json_is_array(t) ? id_array(t, "tokens", ids, n, e) : BAD("tokens", "tokens: required, an array of token ids");
    json_decref(root);
    return rc;
}
