/* ds41 serve: OpenAI Responses <-> the chat request and the V4.1 reply (serve_resp.h).
 *
 * input_image parts (a data: URL of a PNG or JPEG) in user messages and function_call_output
 * become image_url parts, checked here so that errors name the part; file_id and http(s) URLs
 * are refused (this server keeps no files and fetches nothing). */
#include "serve_resp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_metrics.h"

#define BAD(param, ...) ds41_req_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

static int oom(ds41_req_error *e) { return ds41_req_fail(e, 500, "internal_error", NULL, NULL, "out of memory"); }

/* An input_image part -> an image_url part; the image is checked in full here. detail is
 * accepted and does not change anything: V4.1's processor has one resize plan. */
static json_t *image_part(const json_t *p, const char *path, size_t i, ds41_req_error *e) {
    char f[96];
    const json_t *fid = json_object_get(p, "file_id"), *u = json_object_get(p, "image_url"), *d = json_object_get(p, "detail");
    if (fid && !json_is_null(fid)) {
        BAD("input", "%s[%zu].file_id: this server keeps no files: send the image as a data: URL in image_url", path, i);
        return NULL;
    }
    if (d && !json_is_null(d) &&
        (!json_is_string(d) || (strcmp(json_string_value(d), "auto") && strcmp(json_string_value(d), "low") &&
                                strcmp(json_string_value(d), "high")))) {
        BAD("input", "%s[%zu].detail: expected auto, low or high", path, i);
        return NULL;
    }
    snprintf(f, sizeof f, "%s[%zu].image_url", path, i);
    if (!json_is_string(u)) { BAD("input", "%s: required, a data: URL string", f); return NULL; }
    if (ds41_req_image_url(json_string_value(u), "input", f, NULL, NULL, NULL, NULL, e)) return NULL;
    json_t *o = json_pack("{s:s,s:{s:O}}", "type", "image_url", "image_url", "url", u);
    if (!o) oom(e);
    return o;
}

/* A message item's content: a string, or input_text / output_text parts joined, with
 * input_image parts where images are allowed. */
static json_t *item_text(const json_t *c, const char *path, int images, ds41_req_error *e) {
    if (json_is_string(c)) return json_incref((json_t *)c);
    if (!json_is_array(c)) { BAD("input", "%s: expected a string or an array of content parts", path); return NULL; }
    json_t *parts = json_array();
    for (size_t i = 0; i < json_array_size(c); i++) {
        const json_t *p = json_array_get(c, i);
        const char *ty = json_string_value(json_object_get(p, "type"));
        if (!json_is_object(p) || !ty) { json_decref(parts); BAD("input", "%s[%zu].type: required", path, i); return NULL; }
        if (!strcmp(ty, "input_image") && images) {
            json_t *ip = image_part(p, path, i, e);
            if (!ip) { json_decref(parts); return NULL; }
            json_array_append_new(parts, ip);
            continue;
        }
        if (!strcmp(ty, "input_image")) {
            json_decref(parts);
            BAD("input", "%s[%zu]: input_image parts are served in user messages and function_call_output only", path, i);
            return NULL;
        }
        if (!strcmp(ty, "input_file") || !strcmp(ty, "input_audio")) {
            json_decref(parts);
            BAD("input", "%s[%zu]: %s parts are not supported (the model reads text and images)", path, i, ty);
            return NULL;
        }
        const json_t *t = json_object_get(p, !strcmp(ty, "refusal") ? "refusal" : "text");
        if (strcmp(ty, "input_text") && strcmp(ty, "output_text") && strcmp(ty, "text") && strcmp(ty, "refusal")) {
            json_decref(parts);
            BAD("input", "%s[%zu].type: '%.40s' is not one of input_text, output_text", path, i, ty);
            return NULL;
        }
        if (!json_is_string(t)) { json_decref(parts); BAD("input", "%s[%zu].text: required, a string", path, i); return NULL; }
        json_array_append_new(parts, json_pack("{s:s,s:O}", "type", "text", "text", t));
    }
    return parts;
}

/* The last chat message if it is an assistant one still open for tool calls, else a new one. */
static json_t *assistant_tail(json_t *out) {
    json_t *last = json_array_get(out, json_array_size(out) - 1);
    if (last && !strcmp(json_string_value(json_object_get(last, "role")), "assistant")) return last;
    json_t *m = json_pack("{s:s,s:n}", "role", "assistant", "content");
    json_array_append_new(out, m);
    return m;
}

static int convert_input(json_t *out, const json_t *in, ds41_req_error *e) {
    if (json_is_string(in)) { json_array_append_new(out, json_pack("{s:s,s:O}", "role", "user", "content", in)); return 0; }
    if (!json_is_array(in) || !json_array_size(in)) return BAD("input", "input: required, a string or a non-empty array of items");
    char path[48];
    json_t *pending = NULL;   /* a reasoning item waits for the assistant turn it belongs to */
    for (size_t i = 0; i < json_array_size(in); i++) {
        const json_t *it = json_array_get(in, i);
        snprintf(path, sizeof path, "input[%zu]", i);
        if (!json_is_object(it)) { json_decref(pending); return BAD("input", "%s: expected an object", path); }
        const char *ty = json_string_value(json_object_get(it, "type"));
        const char *role = json_string_value(json_object_get(it, "role"));
        if (!ty && role) ty = "message";
        if (!ty) { json_decref(pending); return BAD("input", "%s.type: required", path); }
        if (!strcmp(ty, "message")) {
            if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") && strcmp(role, "developer"))) {
                json_decref(pending);
                return BAD("input", "%s.role: expected user, assistant, system or developer", path);
            }
            char p2[64];
            snprintf(p2, sizeof p2, "%s.content", path);
            json_t *c = item_text(json_object_get(it, "content"), p2, !strcmp(role, "user"), e);
            if (!c) { json_decref(pending); return -1; }
            if (!strcmp(role, "assistant") && json_is_array(c)) {
                /* assistant turns as one string (the template's form for them) */
                size_t n = 0;
                for (size_t k = 0; k < json_array_size(c); k++) n += json_string_length(json_object_get(json_array_get(c, k), "text"));
                char *s = malloc(n + 1);
                if (!s) { json_decref(c); json_decref(pending); return oom(e); }
                n = 0;
                for (size_t k = 0; k < json_array_size(c); k++) {
                    const json_t *t = json_object_get(json_array_get(c, k), "text");
                    memcpy(s + n, json_string_value(t), json_string_length(t));
                    n += json_string_length(t);
                }
                json_decref(c);
                c = json_stringn(s, n);
                free(s);
            }
            json_t *m = json_pack("{s:s,s:o}", "role", role, "content", c);
            if (pending && !strcmp(role, "assistant")) { json_object_set_new(m, "reasoning_content", pending); pending = NULL; }
            json_array_append_new(out, m);
        } else if (!strcmp(ty, "function_call")) {
            const json_t *id = json_object_get(it, "call_id"), *nm = json_object_get(it, "name"), *a = json_object_get(it, "arguments");
            if (!json_is_string(id)) { json_decref(pending); return BAD("input", "%s.call_id: required, a string", path); }
            if (!json_is_string(nm)) { json_decref(pending); return BAD("input", "%s.name: required, a string", path); }
            if (!json_is_string(a)) { json_decref(pending); return BAD("input", "%s.arguments: required, a JSON string", path); }
            json_t *m = assistant_tail(out);
            if (pending) { json_object_set_new(m, "reasoning_content", pending); pending = NULL; }
            json_t *tc = json_object_get(m, "tool_calls");
            if (!tc) { tc = json_array(); json_object_set_new(m, "tool_calls", tc); }
            json_array_append_new(tc, json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", id, "type", "function", "function", "name", nm, "arguments", a));
        } else if (!strcmp(ty, "function_call_output")) {
            const json_t *id = json_object_get(it, "call_id"), *o = json_object_get(it, "output");
            if (!json_is_string(id)) { json_decref(pending); return BAD("input", "%s.call_id: required, a string", path); }
            char p2[64];
            snprintf(p2, sizeof p2, "%s.output", path);
            json_t *c = o ? item_text(o, p2, 1, e) : NULL;
            if (!o) BAD("input", "%s.output: required", path);
            if (!c) { json_decref(pending); return -1; }
            json_array_append_new(out, json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id", id, "content", c));
        } else if (!strcmp(ty, "reasoning")) {
            /* the reasoning text (content reasoning_text parts, else the summary) */
            const json_t *parts = json_object_get(it, "content");
            if (!json_is_array(parts) || !json_array_size(parts)) parts = json_object_get(it, "summary");
            if (parts && !json_is_array(parts)) { json_decref(pending); return BAD("input", "%s.summary: expected an array", path); }
            char *s = NULL;
            size_t n = 0;
            for (size_t k = 0; k < json_array_size(parts); k++) {
                const json_t *t = json_object_get(json_array_get(parts, k), "text");
                if (!json_is_string(t)) { free(s); json_decref(pending); return BAD("input", "%s: part %zu needs text", path, k); }
                char *ns = realloc(s, n + json_string_length(t) + 1);
                if (!ns) { free(s); json_decref(pending); return oom(e); }
                s = ns;
                memcpy(s + n, json_string_value(t), json_string_length(t));
                n += json_string_length(t);
            }
            json_decref(pending);
            pending = json_stringn(s ? s : "", n);
            free(s);
        } else if (!strcmp(ty, "item_reference")) {
            json_decref(pending);
            return BAD("input", "%s: item_reference needs stored responses, which this server does not keep", path);
        } else {
            json_decref(pending);
            return BAD("input", "%s.type: '%.40s' is not one of message, function_call, function_call_output, reasoning", path, ty);
        }
    }
    if (pending) json_array_append_new(out, json_pack("{s:s,s:o}", "role", "assistant", "reasoning_content", pending));
    return 0;
}

static int convert(json_t *chat, const json_t *root, ds41_resp_info *info, ds41_req_error *e) {
    const json_t *st = json_object_get(root, "store");
    if (st && !json_is_null(st) && !json_is_boolean(st)) return BAD("store", "store: expected true or false");
    if (json_is_true(st)) return BAD("store", "store: true is not supported: this server keeps no responses (send store: false)");
    const json_t *prev = json_object_get(root, "previous_response_id");
    if (prev && !json_is_null(prev))
        return BAD("previous_response_id", "previous_response_id: this server keeps no responses; send the whole conversation as input");
    const json_t *conv = json_object_get(root, "conversation");
    if (conv && !json_is_null(conv)) return BAD("conversation", "conversation: this server keeps no conversations");
    const json_t *m = json_object_get(root, "model");
    if (m && !json_is_null(m)) {
        if (!json_is_string(m)) return BAD("model", "model: expected a string");
        json_object_set(chat, "model", (json_t *)m);
    }
    json_t *out = json_array();
    json_object_set_new(chat, "messages", out);
    const json_t *ins = json_object_get(root, "instructions");
    if (ins && !json_is_null(ins)) {
        if (!json_is_string(ins)) return BAD("instructions", "instructions: expected a string");
        json_array_append_new(out, json_pack("{s:s,s:O}", "role", "system", "content", ins));
        info->instructions = strdup(json_string_value(ins));
    }
    if (convert_input(out, json_object_get(root, "input"), e)) return -1;
    const json_t *mt = json_object_get(root, "max_output_tokens");
    info->max_output_tokens = -1;
    if (mt && !json_is_null(mt)) {
        if (!json_is_integer(mt) || json_integer_value(mt) < 1) return BAD("max_output_tokens", "max_output_tokens: expected an integer >= 1");
        json_object_set(chat, "max_tokens", (json_t *)mt);
        info->max_output_tokens = json_integer_value(mt);
    }
    info->temperature = 1;
    info->top_p = 1;
    static const char *pass[] = { "temperature", "top_p", "stream", "parallel_tool_calls", "top_logprobs", "user" };
    for (size_t i = 0; i < sizeof pass / sizeof pass[0]; i++) {
        json_t *v = json_object_get(root, pass[i]);
        if (v) json_object_set(chat, pass[i], v);
    }
    if (json_is_number(json_object_get(root, "temperature"))) info->temperature = json_number_value(json_object_get(root, "temperature"));
    if (json_is_number(json_object_get(root, "top_p"))) info->top_p = json_number_value(json_object_get(root, "top_p"));
    info->stream = json_is_true(json_object_get(root, "stream"));
    info->parallel_tool_calls = !json_is_false(json_object_get(root, "parallel_tool_calls"));
    /* reasoning.effort: anything but none turns thinking on */
    const json_t *rs = json_object_get(root, "reasoning");
    json_object_set_new(chat, "chat_template_kwargs", json_pack("{s:b}", "thinking", 0));
    if (rs && !json_is_null(rs)) {
        if (!json_is_object(rs)) return BAD("reasoning", "reasoning: expected an object");
        const json_t *ef = json_object_get(rs, "effort");
        if (ef && !json_is_null(ef)) {
            if (!json_is_string(ef)) return BAD("reasoning", "reasoning.effort: expected a string");
            json_object_del(chat, "chat_template_kwargs");
            json_object_set(chat, "reasoning_effort", (json_t *)ef);
            info->thinking = strcmp(json_string_value(ef), "none") != 0;
        }
    }
    /* text.format -> response_format */
    const json_t *tx = json_object_get(root, "text");
    if (tx && !json_is_null(tx)) {
        if (!json_is_object(tx)) return BAD("text", "text: expected an object");
        const json_t *f = json_object_get(tx, "format");
        const char *ft = json_is_object(f) ? json_string_value(json_object_get(f, "type")) : NULL;
        if (f && !json_is_null(f) && !ft) return BAD("text", "text.format.type: required");
        if (ft && !strcmp(ft, "json_schema"))
            json_object_set_new(chat, "response_format", json_pack("{s:s,s:{s:O*,s:O*,s:O*}}", "type", "json_schema", "json_schema", "name",
                                json_object_get(f, "name"), "schema", json_object_get(f, "schema"), "strict", json_object_get(f, "strict")));
        else if (ft && strcmp(ft, "text")) json_object_set_new(chat, "response_format", json_pack("{s:s}", "type", ft));
    }
    /* tools: function tools; the others (web_search, file_search, computer_use, mcp, ...) run
     * at OpenAI and are skipped */
    const json_t *tools = json_object_get(root, "tools");
    json_t *ct = json_array(), *rt = json_array();
    if (tools && !json_is_null(tools) && !json_is_array(tools)) { json_decref(ct); json_decref(rt); return BAD("tools", "tools: expected an array"); }
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i);
        const char *ty = json_string_value(json_object_get(t, "type"));
        if (!json_is_object(t) || !ty) { json_decref(ct); json_decref(rt); return BAD("tools", "tools[%zu].type: required", i); }
        if (strcmp(ty, "function")) continue;
        const json_t *nm = json_object_get(t, "name"), *d = json_object_get(t, "description"), *pa = json_object_get(t, "parameters"),
                     *sr = json_object_get(t, "strict");
        if (!json_is_string(nm)) { json_decref(ct); json_decref(rt); return BAD("tools", "tools[%zu].name: required, a string", i); }
        json_t *fn = json_pack("{s:O}", "name", nm);
        if (d && !json_is_null(d)) json_object_set(fn, "description", (json_t *)d);
        if (pa && !json_is_null(pa)) json_object_set(fn, "parameters", (json_t *)pa);
        if (sr && !json_is_null(sr)) json_object_set(fn, "strict", (json_t *)sr);
        json_array_append_new(ct, json_pack("{s:s,s:o}", "type", "function", "function", fn));
        json_array_append(rt, (json_t *)t);
    }
    info->tools_json = json_dumps(rt, JSON_COMPACT);
    json_decref(rt);
    if (json_array_size(ct)) { json_object_set_new(chat, "tools", ct); info->tools = 1; }
    else json_decref(ct);
    const json_t *tc = json_object_get(root, "tool_choice");
    if (tc && !json_is_null(tc)) {
        info->tool_choice = json_dumps(tc, JSON_COMPACT | JSON_ENCODE_ANY);
        if (json_is_string(tc)) {
            json_object_set(chat, "tool_choice", (json_t *)tc);
            if (!strcmp(json_string_value(tc), "none")) info->tools = 0;
        } else if (json_is_object(tc)) {
            const char *ty = json_string_value(json_object_get(tc, "type"));
            const json_t *nm = json_object_get(tc, "name");
            if (!ty || strcmp(ty, "function") || !json_is_string(nm))
                return BAD("tool_choice", "tool_choice: expected none, auto, required or {\"type\": \"function\", \"name\": ...}");
            json_object_set_new(chat, "tool_choice", json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", nm));
        } else {
            return BAD("tool_choice", "tool_choice: expected a string or an object");
        }
    }
    if (!info->tools_json) return oom(e);
    return 0;
}

int ds41_resp_to_chat(const char *body, size_t len, char **chat, size_t *chat_len, ds41_resp_info *info, ds41_req_error *e) {
    *chat = NULL;
    *chat_len = 0;
    memset(info, 0, sizeof *info);
    json_t *root = ds41_req_load_body(body, len, e);
    if (!root) return -1;
    json_t *c = json_object();
    int rc = convert(c, root, info, e);
    if (!rc) {
        *chat = json_dumps(c, JSON_COMPACT);
        if (!*chat) rc = oom(e);
        else *chat_len = strlen(*chat);
    }
    json_decref(c);
    json_decref(root);
    if (rc) ds41_resp_info_free(info);
    return rc;
}

void ds41_resp_info_free(ds41_resp_info *info) {
    if (!info) return;
    free(info->instructions);
    free(info->tool_choice);
    free(info->tools_json);
    memset(info, 0, sizeof *info);
}

/* ---------------------------------------------------------------- replies */

static json_t *jstrn(const char *s, size_t n) {
    json_t *v = json_stringn(s ? s : "", s ? n : 0);
    return v ? v : json_string("\xef\xbf\xbd");
}

static void item_id(char *out, size_t cap, const char *kind, const char *resp_id, int index) {
    snprintf(out, cap, "%s_%.40s_%d", kind, resp_id + (strncmp(resp_id, "resp_", 5) ? 0 : 5), index);
}

static json_t *reasoning_item(const char *id, int idx, const char *t, size_t n) {
    char iid[80];
    item_id(iid, sizeof iid, "rs", id, idx);
    return json_pack("{s:s,s:s,s:[],s:[{s:s,s:o}]}", "type", "reasoning", "id", iid, "summary", "content", "type", "reasoning_text", "text",
                     jstrn(t, n));
}

static json_t *message_item(const char *id, int idx, const char *t, size_t n, const char *status) {
    char iid[80];
    item_id(iid, sizeof iid, "msg", id, idx);
    return json_pack("{s:s,s:s,s:s,s:s,s:[{s:s,s:o,s:[]}]}", "type", "message", "id", iid, "status", status, "role", "assistant", "content",
                     "type", "output_text", "text", jstrn(t, n), "annotations");
}

static json_t *call_item(const char *id, int idx, const ds41_tool_call *tc, const char *args, const char *status) {
    char iid[80], cid[80];
    item_id(iid, sizeof iid, "fc", id, idx);
    item_id(cid, sizeof cid, "call", id, idx);
    return json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "type", "function_call", "id", iid, "call_id", cid, "name", tc->name, "arguments", args,
                     "status", status);
}

static json_t *usage(const ds41_anth_seq *s) {
    return json_pack("{s:I,s:{s:I},s:I,s:{s:I},s:I}", "input_tokens", (json_int_t)s->input_tokens, "input_tokens_details", "cached_tokens",
                     (json_int_t)s->cached_tokens, "output_tokens", (json_int_t)s->output_tokens, "output_tokens_details", "reasoning_tokens",
                     (json_int_t)s->reasoning_tokens, "total_tokens", (json_int_t)(s->input_tokens + s->output_tokens));
}

/* The response object around output (status in_progress / completed / incomplete). */
static json_t *shell(const char *id, const char *model, const ds41_resp_info *info, const char *status, json_t *output, json_t *usage_or_null) {
    json_t *tools = json_loads(info->tools_json ? info->tools_json : "[]", 0, NULL);
    json_t *tc = info->tool_choice ? json_loads(info->tool_choice, JSON_DECODE_ANY, NULL) : json_string("auto");
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:s,s:o,s:n,s:n,s:o,s:o,s:o,s:b,s:f,s:f,s:o,s:n,s:b,s:o}", "id", id, "object", "response",
                          "created_at", (json_int_t)info->created_at, "status", status, "model", model, "output", output, "error",
                          "previous_response_id", "instructions", info->instructions ? json_string(info->instructions) : json_null(),
                          "tools", tools ? tools : json_array(), "tool_choice", tc ? tc : json_string("auto"), "parallel_tool_calls",
                          info->parallel_tool_calls, "temperature", info->temperature, "top_p", info->top_p, "max_output_tokens",
                          info->max_output_tokens > 0 ? json_integer(info->max_output_tokens) : json_null(), "incomplete_details", "store", 0,
                          "usage", usage_or_null ? usage_or_null : json_null());
    if (o && !strcmp(status, "incomplete")) json_object_set_new(o, "incomplete_details", json_pack("{s:s}", "reason", "max_output_tokens"));
    return o;
}

json_t *ds41_resp_object(const char *id, const char *model, const ds41_resp_info *info, const ds41_anth_seq *s) {
    ds41_text_delta d;
    ds41_tool_call *tc;
    size_t ntc = ds41_anth_split(s, info->thinking, info->tools, &d, &tc);
    json_t *out = json_array();
    int idx = 0;
    if (info->thinking && d.r1 > d.r0) json_array_append_new(out, reasoning_item(id, idx++, s->text + d.r0, d.r1 - d.r0));
    if (d.c1 > d.c0 || !ntc)
        json_array_append_new(out, message_item(id, idx++, s->text + d.c0, d.c1 - d.c0, s->finish == DS41_FIN_LENGTH ? "incomplete" : "completed"));
    for (size_t i = 0; i < ntc; i++) json_array_append_new(out, call_item(id, idx++, &tc[i], tc[i].arguments, "completed"));
    ds41_tool_calls_free(tc, ntc);
    return shell(id, model, info, s->finish == DS41_FIN_LENGTH ? "incomplete" : "completed", out, usage(s));
}

/* ---------------------------------------------------------------- stream */

typedef struct sink {
    void (*emit)(void *, const char *, size_t);
    void *ctx;
    ds41_resp_stream *st;
} sink;

static void event(const sink *k, json_t *o) {
    if (!o) return;
    json_object_set_new(o, "sequence_number", json_integer(k->st->seq++));
    char *s = json_dumps(o, JSON_COMPACT);
    const char *type = json_string_value(json_object_get(o, "type"));
    char head[96];
    int hn = snprintf(head, sizeof head, "event: %s\ndata: ", type ? type : "message");
    json_decref(o);
    if (!s) return;
    k->emit(k->ctx, head, (size_t)hn);
    k->emit(k->ctx, s, strlen(s));
    k->emit(k->ctx, "\n\n", 2);
    free(s);
}

static void close_item(ds41_resp_stream *st, const sink *k, const char *id) {
    if (!st->open) return;
    int idx = st->out_index - 1;
    char iid[80];
    json_t *full = jstrn(st->acc, st->acc_len);
    if (st->open == 1) {
        item_id(iid, sizeof iid, "rs", id, idx);
        event(k, json_pack("{s:s,s:s,s:i,s:i,s:O}", "type", "response.reasoning_text.done", "item_id", iid, "output_index", idx,
                           "content_index", 0, "text", full));
        event(k, json_pack("{s:s,s:i,s:o}", "type", "response.output_item.done", "output_index", idx, "item",
                           reasoning_item(id, idx, st->acc, st->acc_len)));
    } else {
        item_id(iid, sizeof iid, "msg", id, idx);
        event(k, json_pack("{s:s,s:s,s:i,s:i,s:O,s:[]}", "type", "response.output_text.done", "item_id", iid, "output_index", idx,
                           "content_index", 0, "text", full, "logprobs"));
        event(k, json_pack("{s:s,s:s,s:i,s:i,s:{s:s,s:O,s:[]}}", "type", "response.content_part.done", "item_id", iid, "output_index", idx,
                           "content_index", 0, "part", "type", "output_text", "text", full, "annotations"));
        event(k, json_pack("{s:s,s:i,s:o}", "type", "response.output_item.done", "output_index", idx, "item",
                           message_item(id, idx, st->acc, st->acc_len, "completed")));
    }
    json_decref(full);
    st->open = 0;
    st->acc_len = 0;
}

static void delta(ds41_resp_stream *st, const sink *k, const char *id, int kind, const char *t, size_t a, size_t b) {
    if (b <= a) return;
    char iid[80];
    if (st->open != kind) {
        close_item(st, k, id);
        int idx = st->out_index++;
        if (kind == 1) {
            json_t *it = reasoning_item(id, idx, "", 0);
            json_array_clear(json_object_get(it, "content"));
            event(k, json_pack("{s:s,s:i,s:o}", "type", "response.output_item.added", "output_index", idx, "item", it));
        } else {
            json_t *it = message_item(id, idx, "", 0, "in_progress");
            json_array_clear(json_object_get(it, "content"));
            event(k, json_pack("{s:s,s:i,s:o}", "type", "response.output_item.added", "output_index", idx, "item", it));
            item_id(iid, sizeof iid, "msg", id, idx);
            event(k, json_pack("{s:s,s:s,s:i,s:i,s:{s:s,s:s,s:[]}}", "type", "response.content_part.added", "item_id", iid, "output_index",
                               idx, "content_index", 0, "part", "type", "output_text", "text", "", "annotations"));
        }
        st->open = kind;
    }
    int idx = st->out_index - 1;
    item_id(iid, sizeof iid, kind == 1 ? "rs" : "msg", id, idx);
    if (kind == 1)
        event(k, json_pack("{s:s,s:s,s:i,s:i,s:o}", "type", "response.reasoning_text.delta", "item_id", iid, "output_index", idx,
                           "content_index", 0, "delta", jstrn(t + a, b - a)));
    else
        event(k, json_pack("{s:s,s:s,s:i,s:i,s:o,s:[]}", "type", "response.output_text.delta", "item_id", iid, "output_index", idx,
                           "content_index", 0, "delta", jstrn(t + a, b - a), "logprobs"));
    if (st->acc_len + (b - a) + 1 > st->acc_cap) {
        size_t nc = (st->acc_cap ? st->acc_cap * 2 : 256) + (b - a);
        char *na = realloc(st->acc, nc);
        if (!na) return;
        st->acc = na;
        st->acc_cap = nc;
    }
    memcpy(st->acc + st->acc_len, t + a, b - a);
    st->acc_len += b - a;
}

void ds41_resp_stream_init(ds41_resp_stream *st, const ds41_resp_info *info) {
    memset(st, 0, sizeof *st);
    ds41_text_view_init(&st->view, info->thinking, info->tools);
}

void ds41_resp_stream_free(ds41_resp_stream *st) {
    free(st->acc);
    st->acc = NULL;
}

void ds41_resp_stream_step(ds41_resp_stream *st, const char *id, const char *model, const ds41_resp_info *info,
                           const ds41_anth_seq *s, size_t avail, void (*emit)(void *ctx, const char *sse, size_t n), void *ctx) {
    sink k = { emit, ctx, st };
    if (st->ended) return;
    if (!st->started) {
        st->started = 1;
        event(&k, json_pack("{s:s,s:o}", "type", "response.created", "response", shell(id, model, info, "in_progress", json_array(), NULL)));
        event(&k, json_pack("{s:s,s:o}", "type", "response.in_progress", "response", shell(id, model, info, "in_progress", json_array(), NULL)));
    }
    const char *t = s->text ? s->text : "";
    ds41_text_delta d;
    ds41_text_view_step(&st->view, t, avail, s->finished, &d);
    if (info->thinking) delta(st, &k, id, 1, t, d.r0, d.r1);
    delta(st, &k, id, 2, t, d.c0, d.c1);
    if (!s->finished) return;
    close_item(st, &k, id);
    ds41_tool_call *tc = NULL;
    size_t ntc = st->view.phase == 2 ? ds41_dsml_parse(t + st->view.dsml_at, s->text_len - st->view.dsml_at, &tc) : 0;
    for (size_t i = 0; i < ntc; i++) {
        int idx = st->out_index++;
        char iid[80];
        item_id(iid, sizeof iid, "fc", id, idx);
        event(&k, json_pack("{s:s,s:i,s:o}", "type", "response.output_item.added", "output_index", idx, "item",
                            call_item(id, idx, &tc[i], "", "in_progress")));
        event(&k, json_pack("{s:s,s:s,s:i,s:s}", "type", "response.function_call_arguments.delta", "item_id", iid, "output_index", idx,
                            "delta", tc[i].arguments));
        event(&k, json_pack("{s:s,s:s,s:i,s:s,s:s}", "type", "response.function_call_arguments.done", "item_id", iid, "output_index", idx,
                            "name", tc[i].name, "arguments", tc[i].arguments));
        event(&k, json_pack("{s:s,s:i,s:o}", "type", "response.output_item.done", "output_index", idx, "item",
                            call_item(id, idx, &tc[i], tc[i].arguments, "completed")));
    }
    ds41_tool_calls_free(tc, ntc);
    if (s->finish == DS41_FIN_ERROR || s->finish == DS41_FIN_ABORT) {
        event(&k, json_pack("{s:s,s:s,s:s,s:n}", "type", "error", "code", s->finish == DS41_FIN_ABORT ? "server_shutting_down" : "server_error",
                            "message", "generation failed", "param"));
    } else {
        json_t *r = ds41_resp_object(id, model, info, s);
        const char *status = json_string_value(json_object_get(r, "status"));
        event(&k, json_pack("{s:s,s:o}", "type", !strcmp(status ? status : "", "incomplete") ? "response.incomplete" : "response.completed",
                            "response", r));
    }
    st->ended = 1;
}
