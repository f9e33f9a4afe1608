/* ds41 serve: Anthropic Messages <-> the OpenAI chat request and the V4.1 reply (serve_anth.h).
 *
 * Validation follows Anthropic's API: model, max_tokens (>= 1; not for count_tokens) and a
 * non-empty messages array are required, roles are user and assistant, temperature is 0..1.
 * Image blocks (base64 PNG or JPEG, or a data: URL) in user messages and tool results become
 * image_url parts, checked here so that errors name the block's fields. What this server cannot
 * do is refused by name rather than ignored: images by URL or file (it fetches nothing and keeps
 * no files), document blocks, and server tools (a typed tool such as web_search) that only
 * Anthropic runs. */
#include "serve_anth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_metrics.h"

#define BAD(param, ...) ds41_req_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

static int oom(ds41_req_error *e) { return ds41_req_fail(e, 500, "api_error", NULL, NULL, "out of memory"); }

/* An image block -> an image_url part with a data: URL; the image is checked in full here. */
static json_t *image_part(const json_t *b, const char *path, ds41_req_error *e) {
    const json_t *src = json_object_get(b, "source");
    char f[160];
    if (!json_is_object(src)) { BAD("messages", "%s.source: required, an object", path); return NULL; }
    const char *st = json_string_value(json_object_get(src, "type"));
    if (!st) { BAD("messages", "%s.source.type: required, \"base64\" or \"url\"", path); return NULL; }
    if (!strcmp(st, "base64")) {
        const json_t *mt = json_object_get(src, "media_type"), *d = json_object_get(src, "data");
        snprintf(f, sizeof f, "%s.source.media_type", path);
        int kind = ds41_req_image_kind(json_string_value(mt));
        if (kind < 0) {
            BAD("messages", "%s: expected image/png or image/jpeg, not '%.40s'", f, json_is_string(mt) ? json_string_value(mt) : "");
            return NULL;
        }
        snprintf(f, sizeof f, "%s.source.data", path);
        if (!json_is_string(d)) { BAD("messages", "%s: required, a base64 string", f); return NULL; }
        if (ds41_req_image_b64(kind, json_string_value(d), json_string_length(d), "messages", f, NULL, NULL, NULL, NULL, e))
            return NULL;
        size_t ml = json_string_length(mt), dl = json_string_length(d);
        char *url = malloc(ml + dl + 14);
        if (!url) { oom(e); return NULL; }
        memcpy(url, "data:", 5);
        memcpy(url + 5, json_string_value(mt), ml);
        memcpy(url + 5 + ml, ";base64,", 8);
        memcpy(url + 13 + ml, json_string_value(d), dl);
        json_t *u = json_stringn(url, ml + dl + 13);
        free(url);
        json_t *p = u ? json_pack("{s:s,s:{s:o}}", "type", "image_url", "image_url", "url", u) : NULL;
        if (!p) oom(e);
        return p;
    }
    if (!strcmp(st, "url")) {
        const json_t *u = json_object_get(src, "url");
        snprintf(f, sizeof f, "%s.source.url", path);
        if (!json_is_string(u)) { BAD("messages", "%s: required, a string", f); return NULL; }
        if (ds41_req_image_url(json_string_value(u), "messages", f, NULL, NULL, NULL, NULL, e)) return NULL;
        json_t *p = json_pack("{s:s,s:{s:O}}", "type", "image_url", "image_url", "url", u);
        if (!p) oom(e);
        return p;
    }
    if (!strcmp(st, "file"))
        BAD("messages", "%s.source: file sources need the Files API, which this server does not have: send the image "
            "as base64 (source.type \"base64\")", path);
    else
        BAD("messages", "%s.source.type: '%.40s' is not one of base64, url", path, st);
    return NULL;
}

/* Content blocks as chat content: a string stays; text blocks are joined into one string, or,
 * where images are allowed (a tool result) and some are given, text and image_url parts. */
static json_t *text_of(const json_t *c, const char *path, const char *param, int images, ds41_req_error *e) {
    if (json_is_string(c)) return json_incref((json_t *)c);
    if (!json_is_array(c)) { BAD(param, "%s: expected a string or an array of text blocks", path); return NULL; }
    size_t total = 0, n_img = 0;
    for (size_t i = 0; i < json_array_size(c); i++) {
        const json_t *b = json_array_get(c, i);
        const char *ty = json_string_value(json_object_get(b, "type"));
        if (!json_is_object(b) || !ty) { BAD(param, "%s[%zu].type: required", path, i); return NULL; }
        if (!strcmp(ty, "image") && images) { n_img++; continue; }
        if (!strcmp(ty, "image") || !strcmp(ty, "document")) {
            BAD(param, "%s[%zu]: %s blocks are %s", path, i, ty,
                ty[0] == 'i' ? "served in user messages and tool results only" : "not supported (the model reads text and images)");
            return NULL;
        }
        if (strcmp(ty, "text")) { BAD(param, "%s[%zu].type: expected \"text\", not '%.40s'", path, i, ty); return NULL; }
        if (!json_is_string(json_object_get(b, "text"))) { BAD(param, "%s[%zu].text: required, a string", path, i); return NULL; }
        total += json_string_length(json_object_get(b, "text"));
    }
    if (n_img) {
        json_t *parts = json_array();
        char p2[128];
        for (size_t i = 0; parts && i < json_array_size(c); i++) {
            const json_t *b = json_array_get(c, i);
            snprintf(p2, sizeof p2, "%s[%zu]", path, i);
            json_t *p = strcmp(json_string_value(json_object_get(b, "type")), "image")
                            ? json_pack("{s:s,s:O}", "type", "text", "text", json_object_get(b, "text"))
                            : image_part(b, p2, e);
            if (!p || json_array_append_new(parts, p)) { json_decref(parts); return NULL; }
        }
        if (!parts) oom(e);
        return parts;
    }
    char *s = malloc(total + 1);
    if (!s) { oom(e); return NULL; }
    size_t n = 0;
    for (size_t i = 0; i < json_array_size(c); i++) {
        const json_t *t = json_object_get(json_array_get(c, i), "text");
        memcpy(s + n, json_string_value(t), json_string_length(t));
        n += json_string_length(t);
    }
    json_t *v = json_stringn(s, n);
    free(s);
    if (!v) oom(e);
    return v;
}

/* A user message: text blocks -> one user message, each tool_result -> a tool message (before
 * it, as Anthropic puts results first). */
static int user_msg(json_t *out, const json_t *c, const char *path, ds41_req_error *e) {
    if (json_is_string(c)) return json_array_append_new(out, json_pack("{s:s,s:O}", "role", "user", "content", c)) ? oom(e) : 0;
    json_t *parts = json_array();
    char p2[96];
    for (size_t i = 0; i < json_array_size(c); i++) {
        const json_t *b = json_array_get(c, i);
        const char *ty = json_string_value(json_object_get(b, "type"));
        snprintf(p2, sizeof p2, "%s[%zu]", path, i);
        if (!json_is_object(b) || !ty) { json_decref(parts); return BAD("messages", "%s.type: required", p2); }
        if (!strcmp(ty, "tool_result")) {
            const json_t *id = json_object_get(b, "tool_use_id");
            if (!json_is_string(id)) { json_decref(parts); return BAD("messages", "%s.tool_use_id: required, a string", p2); }
            const json_t *rc = json_object_get(b, "content");
            char p3[112];
            snprintf(p3, sizeof p3, "%s.content", p2);
            json_t *t = rc && !json_is_null(rc) ? text_of(rc, p3, "messages", 1, e) : json_string("");
            if (!t) { json_decref(parts); return -1; }
            const json_t *ie = json_object_get(b, "is_error");
            if (ie && !json_is_boolean(ie)) { json_decref(t); json_decref(parts); return BAD("messages", "%s.is_error: expected true or false", p2); }
            if (json_array_append_new(out, json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id", id, "content", t)))
                { json_decref(parts); return oom(e); }
        } else if (!strcmp(ty, "image")) {
            json_t *p = image_part(b, p2, e);
            if (!p) { json_decref(parts); return -1; }
            json_array_append_new(parts, p);
        } else if (!strcmp(ty, "document")) {
            json_decref(parts);
            return BAD("messages", "%s: document blocks are not supported (the model reads text and images)", p2);
        } else if (strcmp(ty, "text")) {
            json_decref(parts);
            return BAD("messages", "%s.type: '%.40s' is not one of text, image, tool_result in a user message", p2, ty);
        } else {
            const json_t *t = json_object_get(b, "text");
            if (!json_is_string(t)) { json_decref(parts); return BAD("messages", "%s.text: required, a string", p2); }
            json_array_append_new(parts, json_pack("{s:s,s:O}", "type", "text", "text", t));
        }
    }
    if (json_array_size(parts) && json_array_append_new(out, json_pack("{s:s,s:o}", "role", "user", "content", parts))) return oom(e);
    if (!json_array_size(parts)) json_decref(parts);
    return 0;
}

/* An assistant message: text -> content, tool_use -> tool_calls, thinking -> reasoning_content. */
static int assistant_msg(json_t *out, const json_t *c, const char *path, ds41_req_error *e) {
    if (json_is_string(c)) return json_array_append_new(out, json_pack("{s:s,s:O}", "role", "assistant", "content", c)) ? oom(e) : 0;
    json_t *m = json_pack("{s:s}", "role", "assistant"), *calls = json_array();
    size_t tn = 0, rn = 0;
    char *text = NULL, *reason = NULL;
    char p2[96];
    int rc = -1;
    for (size_t i = 0; i < json_array_size(c); i++) {
        const json_t *b = json_array_get(c, i);
        const char *ty = json_string_value(json_object_get(b, "type"));
        snprintf(p2, sizeof p2, "%s[%zu]", path, i);
        if (!json_is_object(b) || !ty) { BAD("messages", "%s.type: required", p2); goto out; }
        const char *field = !strcmp(ty, "text") ? "text" : !strcmp(ty, "thinking") ? "thinking" : NULL;
        if (field) {
            const json_t *t = json_object_get(b, field);
            if (!json_is_string(t)) { BAD("messages", "%s.%s: required, a string", p2, field); goto out; }
            char **dst = field[1] == 'e' ? &text : &reason;
            size_t *dn = field[1] == 'e' ? &tn : &rn;
            char *nb = realloc(*dst, *dn + json_string_length(t) + 1);
            if (!nb) { oom(e); goto out; }
            memcpy(nb + *dn, json_string_value(t), json_string_length(t));
            *dn += json_string_length(t);
            nb[*dn] = 0;
            *dst = nb;
        } else if (!strcmp(ty, "tool_use")) {
            const json_t *id = json_object_get(b, "id"), *nm = json_object_get(b, "name"), *in = json_object_get(b, "input");
            if (!json_is_string(id)) { BAD("messages", "%s.id: required, a string", p2); goto out; }
            if (!json_is_string(nm)) { BAD("messages", "%s.name: required, a string", p2); goto out; }
            if (!json_is_object(in)) { BAD("messages", "%s.input: required, an object", p2); goto out; }
            char *args = json_dumps(in, JSON_COMPACT);
            if (!args) { oom(e); goto out; }
            json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:s}}", "id", id, "type", "function", "function", "name", nm,
                                                   "arguments", args));
            free(args);
        } else if (!strcmp(ty, "redacted_thinking")) {
            continue;   /* encrypted by Anthropic: nothing this model can read */
        } else if (!strcmp(ty, "image") || !strcmp(ty, "document")) {
            BAD("messages", "%s: %s blocks are not served in an assistant message", p2, ty);
            goto out;
        } else {
            BAD("messages", "%s.type: '%.40s' is not one of text, thinking, tool_use in an assistant message", p2, ty);
            goto out;
        }
    }
    json_object_set_new(m, "content", text ? json_stringn(text, tn) : json_null());
    if (reason) json_object_set_new(m, "reasoning_content", json_stringn(reason, rn));
    if (json_array_size(calls)) json_object_set(m, "tool_calls", calls);
    if (!text && !reason && !json_array_size(calls)) json_object_set_new(m, "content", json_string(""));
    rc = json_array_append(out, m) ? oom(e) : 0;
out:
    free(text);
    free(reason);
    json_decref(calls);
    json_decref(m);
    return rc;
}

static int convert_tools(json_t *chat, const json_t *root, ds41_anth_info *info, ds41_req_error *e) {
    const json_t *tools = json_object_get(root, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) return BAD("tools", "tools: expected an array of tools");
        json_t *ot = json_array();
        json_object_set_new(chat, "tools", ot);
        for (size_t i = 0; i < json_array_size(tools); i++) {
            const json_t *t = json_array_get(tools, i);
            if (!json_is_object(t)) return BAD("tools", "tools[%zu]: expected an object", i);
            const char *ty = json_string_value(json_object_get(t, "type"));
            if (ty && strcmp(ty, "custom"))
                return BAD("tools", "tools[%zu].type: '%.60s' is a server tool that only Anthropic runs; give custom tools "
                           "(name, input_schema)", i, ty);
            const json_t *nm = json_object_get(t, "name"), *sc = json_object_get(t, "input_schema"), *d = json_object_get(t, "description");
            if (!json_is_string(nm)) return BAD("tools", "tools[%zu].name: required, a string", i);
            if (!json_is_object(sc)) return BAD("tools", "tools[%zu].input_schema: required, a JSON Schema object", i);
            if (d && !json_is_null(d) && !json_is_string(d)) return BAD("tools", "tools[%zu].description: expected a string", i);
            /* the OpenAI member order (name, description, parameters): the template renders
             * the function as given, and count_tokens must equal the chat route's count */
            json_t *fn = json_pack("{s:O}", "name", nm);
            if (json_is_string(d)) json_object_set(fn, "description", (json_t *)d);
            json_object_set(fn, "parameters", (json_t *)sc);
            json_array_append_new(ot, json_pack("{s:s,s:o}", "type", "function", "function", fn));
        }
        info->tools = json_array_size(tools) > 0;
    }
    const json_t *tc = json_object_get(root, "tool_choice");
    if (!tc || json_is_null(tc)) return 0;
    const char *ty = json_is_object(tc) ? json_string_value(json_object_get(tc, "type")) : NULL;
    if (!ty) return BAD("tool_choice", "tool_choice: expected {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
    const json_t *dp = json_object_get(tc, "disable_parallel_tool_use");
    if (dp && !json_is_null(dp)) {
        if (!json_is_boolean(dp)) return BAD("tool_choice", "tool_choice.disable_parallel_tool_use: expected true or false");
        json_object_set_new(chat, "parallel_tool_calls", json_boolean(!json_is_true(dp)));
    }
    if (!strcmp(ty, "auto")) json_object_set_new(chat, "tool_choice", json_string("auto"));
    else if (!strcmp(ty, "none")) { json_object_set_new(chat, "tool_choice", json_string("none")); info->tools = 0; }
    else if (!strcmp(ty, "any")) {
        if (!info->tools) return BAD("tool_choice", "tool_choice: \"any\" needs tools");
        json_object_set_new(chat, "tool_choice", json_string("required"));
    } else if (!strcmp(ty, "tool")) {
        const json_t *nm = json_object_get(tc, "name");
        if (!json_is_string(nm)) return BAD("tool_choice", "tool_choice.name: required with type \"tool\"");
        if (!info->tools) return BAD("tool_choice", "tool_choice names a tool but no tools are given");
        json_object_set_new(chat, "tool_choice", json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", nm));
    } else {
        return BAD("tool_choice", "tool_choice.type: '%.40s' is not one of auto, any, tool, none", ty);
    }
    return 0;
}

static int convert(json_t *chat, const json_t *root, int count_only, ds41_anth_info *info, ds41_req_error *e) {
    const json_t *m = json_object_get(root, "model");
    if (!json_is_string(m)) return BAD("model", "model: required, a string");
    json_object_set(chat, "model", (json_t *)m);
    const json_t *mt = json_object_get(root, "max_tokens");
    if (!count_only) {
        if (!mt || json_is_null(mt)) return BAD("max_tokens", "max_tokens: required (an integer >= 1)");
        if (!json_is_integer(mt) || json_integer_value(mt) < 1) return BAD("max_tokens", "max_tokens: expected an integer >= 1");
        json_object_set(chat, "max_tokens", (json_t *)mt);
    }
    const json_t *msgs = json_object_get(root, "messages");
    if (!json_is_array(msgs) || !json_array_size(msgs)) return BAD("messages", "messages: required, a non-empty array of messages");
    json_t *out = json_array();
    json_object_set_new(chat, "messages", out);
    const json_t *sys = json_object_get(root, "system");
    if (sys && !json_is_null(sys)) {
        json_t *t = text_of(sys, "system", "system", 0, e);
        if (!t) return -1;
        json_array_append_new(out, json_pack("{s:s,s:o}", "role", "system", "content", t));
    }
    char path[48];
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *x = json_array_get(msgs, i);
        snprintf(path, sizeof path, "messages[%zu]", i);
        if (!json_is_object(x)) return BAD("messages", "%s: expected an object", path);
        const char *role = json_string_value(json_object_get(x, "role"));
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant")))
            return BAD("messages", "%s.role: expected \"user\" or \"assistant\"", path);
        const json_t *c = json_object_get(x, "content");
        snprintf(path, sizeof path, "messages[%zu].content", i);
        if (!json_is_string(c) && !json_is_array(c)) return BAD("messages", "%s: required, a string or an array of content blocks", path);
        if (json_is_array(c) && !json_array_size(c)) return BAD("messages", "%s: empty array, expected at least one block", path);
        if (role[0] == 'u' ? user_msg(out, c, path, e) : assistant_msg(out, c, path, e)) return -1;
    }
    const json_t *th = json_object_get(root, "thinking");
    if (th && !json_is_null(th)) {
        const char *ty = json_is_object(th) ? json_string_value(json_object_get(th, "type")) : NULL;
        if (!ty || (strcmp(ty, "enabled") && strcmp(ty, "disabled")))
            return BAD("thinking", "thinking: expected {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}");
        const json_t *bt = json_object_get(th, "budget_tokens");
        if (!strcmp(ty, "enabled") && (!json_is_integer(bt) || json_integer_value(bt) < 1))
            return BAD("thinking", "thinking.budget_tokens: required with type \"enabled\", an integer >= 1");
        if (!strcmp(ty, "enabled") && mt && json_integer_value(bt) >= json_integer_value(mt) && !count_only)
            return BAD("thinking", "thinking.budget_tokens: must be less than max_tokens");
        info->thinking = !strcmp(ty, "enabled");
        /* the budget holds: after budget_tokens of reasoning, </think> is forced (lproc.h) */
        if (info->thinking) json_object_set_new(chat, "thinking_token_budget", json_integer(json_integer_value(bt)));
    }
    json_object_set_new(chat, "chat_template_kwargs", json_pack("{s:b}", "thinking", info->thinking));
    const json_t *t = json_object_get(root, "temperature");
    if (t && !json_is_null(t)) {
        if (!json_is_number(t) || json_number_value(t) < 0 || json_number_value(t) > 1)
            return BAD("temperature", "temperature: expected a number in 0..1");
        json_object_set(chat, "temperature", (json_t *)t);
    }
    static const char *pass[] = { "top_p", "top_k", "stream" };
    for (size_t i = 0; i < sizeof pass / sizeof pass[0]; i++) {
        json_t *v = json_object_get(root, pass[i]);
        if (v) json_object_set(chat, pass[i], v);
    }
    const json_t *ss = json_object_get(root, "stop_sequences");
    if (ss && !json_is_null(ss)) {
        if (!json_is_array(ss)) return BAD("stop_sequences", "stop_sequences: expected an array of strings");
        for (size_t i = 0; i < json_array_size(ss); i++)
            if (!json_is_string(json_array_get(ss, i)) || !json_string_length(json_array_get(ss, i)))
                return BAD("stop_sequences", "stop_sequences[%zu]: expected a non-empty string", i);
        if (json_array_size(ss)) json_object_set(chat, "stop", (json_t *)ss);
    }
    const json_t *st = json_object_get(root, "stream");
    if (st && !json_is_null(st) && !json_is_boolean(st)) return BAD("stream", "stream: expected true or false");
    info->stream = json_is_true(st);
    const json_t *md = json_object_get(root, "metadata");
    if (md && !json_is_null(md) && !json_is_object(md)) return BAD("metadata", "metadata: expected an object");
    return convert_tools(chat, root, info, e);
}

int ds41_anth_to_chat(const char *body, size_t len, int count_only, char **chat, size_t *chat_len, ds41_anth_info *info,
                      ds41_req_error *e) {
    *chat = NULL;
    *chat_len = 0;
    memset(info, 0, sizeof *info);
    json_t *root = ds41_req_load_body(body, len, e);
    if (!root) return -1;
    json_t *c = json_object();
    int rc = convert(c, root, count_only, info, e);
    if (!rc) {
        *chat = json_dumps(c, JSON_COMPACT);
        if (!*chat) rc = oom(e);
        else *chat_len = strlen(*chat);
    }
    json_decref(c);
    json_decref(root);
    return rc;
}

json_t *ds41_anth_error_json(const ds41_req_error *e) {
    static const struct { int status; const char *type; } map[] = {
        { 400, "invalid_request_error" }, { 401, "authentication_error" }, { 404, "not_found_error" },
        { 413, "request_too_large" }, { 429, "rate_limit_error" }, { 503, "overloaded_error" },
    };
    const char *type = "api_error";
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (map[i].status == e->status) type = map[i].type;
    char msg[700];
    size_t pl = strlen(e->param);
    if (pl && strncmp(e->message, e->param, pl)) snprintf(msg, sizeof msg, "%s: %s", e->param, e->message);
    else snprintf(msg, sizeof msg, "%s", e->message);
    json_t *m = json_string(msg);
    if (!m) m = json_string("invalid request");
    return json_pack("{s:s,s:{s:s,s:o}}", "type", "error", "error", "type", type, "message", m);
}

/* ---------------------------------------------------------------- replies */

static json_t *jstrn(const char *s, size_t n) {
    json_t *v = json_stringn(s ? s : "", s ? n : 0);
    return v ? v : json_string("\xef\xbf\xbd");
}

static json_t *usage(const ds41_anth_seq *s, int with_input) {
    json_t *u = json_pack("{s:I}", "output_tokens", (json_int_t)s->output_tokens);
    if (with_input) {
        /* Anthropic counts cache reads apart: input_tokens + cache_read_input_tokens = the prompt */
        json_object_set_new(u, "input_tokens", json_integer(s->input_tokens - s->cached_tokens));
        json_object_set_new(u, "cache_read_input_tokens", json_integer(s->cached_tokens));
        json_object_set_new(u, "cache_creation_input_tokens", json_integer(0));
    }
    return u;
}

static const char *stop_reason(const ds41_anth_seq *s, size_t ncalls) {
    if (s->finish == DS41_FIN_LENGTH) return "max_tokens";
    if (ncalls) return "tool_use";
    if (s->stop_hit) return "stop_sequence";
    return "end_turn";
}

static json_t *tool_block(const char *msg_id, size_t i, const ds41_tool_call *tc, int with_input) {
    char id[96];
    snprintf(id, sizeof id, "toolu_%.60s_%zu", msg_id + (strncmp(msg_id, "msg_", 4) ? 0 : 4), i);
    json_t *in = NULL;
    if (with_input) {
        in = json_loads(tc->arguments, 0, NULL);
        if (!json_is_object(in)) { json_decref(in); in = json_object(); }
    }
    return json_pack("{s:s,s:s,s:s,s:o}", "type", "tool_use", "id", id, "name", tc->name, "input", in ? in : json_object());
}

size_t ds41_anth_split(const ds41_anth_seq *s, int thinking, int tools, ds41_text_delta *d, ds41_tool_call **calls) {
    ds41_text_view v;
    ds41_text_view_init(&v, thinking, tools);
    ds41_text_view_step(&v, s->text ? s->text : "", s->text_len, 1, d);
    *calls = NULL;
    return v.phase == 2 ? ds41_dsml_parse(s->text + v.dsml_at, s->text_len - v.dsml_at, calls) : 0;
}

json_t *ds41_anth_message(const char *id, const char *model, const ds41_anth_info *info, const ds41_anth_seq *s) {
    ds41_text_delta d;
    ds41_tool_call *tc;
    size_t ntc = ds41_anth_split(s, info->thinking, info->tools, &d, &tc);
    json_t *content = json_array();
    if (info->thinking && d.r1 > d.r0)
        json_array_append_new(content, json_pack("{s:s,s:o,s:s}", "type", "thinking", "thinking", jstrn(s->text + d.r0, d.r1 - d.r0),
                                                 "signature", ""));
    /* a text block when there is text, or when nothing else came (the stream sends the same) */
    if (d.c1 > d.c0 || (!ntc && !json_array_size(content)))
        json_array_append_new(content, json_pack("{s:s,s:o}", "type", "text", "text", jstrn(s->text + d.c0, d.c1 - d.c0)));
    for (size_t i = 0; i < ntc; i++) json_array_append_new(content, tool_block(id, i, &tc[i], 1));
    const char *sr = stop_reason(s, ntc);
    ds41_tool_calls_free(tc, ntc);
    return json_pack("{s:s,s:s,s:s,s:s,s:o,s:s,s:o,s:o}", "id", id, "type", "message", "role", "assistant", "model", model,
                     "content", content, "stop_reason", sr, "stop_sequence",
                     s->stop_hit && s->stop_str && !strcmp(sr, "stop_sequence") ? json_string(s->stop_str) : json_null(), "usage",
                     usage(s, 1));
}

/* ---------------------------------------------------------------- stream */

typedef struct sink {
    void (*emit)(void *, const char *, size_t);
    void *ctx;
} sink;

static void event(const sink *k, const char *name, json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) return;
    char head[64];
    int hn = snprintf(head, sizeof head, "event: %s\ndata: ", name);
    k->emit(k->ctx, head, (size_t)hn);
    k->emit(k->ctx, s, strlen(s));
    k->emit(k->ctx, "\n\n", 2);
    free(s);
}

static void close_block(ds41_anth_stream *st, const sink *k) {
    if (!st->open) return;
    event(k, "content_block_stop", json_pack("{s:s,s:i}", "type", "content_block_stop", "index", st->block - 1));
    st->open = 0;
}

/* Text (kind 2) or thinking (kind 1) text[a..b): opens its block when another one is open. */
static void delta(ds41_anth_stream *st, const sink *k, int kind, const char *t, size_t a, size_t b) {
    if (b <= a) return;
    if (st->open != kind) {
        close_block(st, k);
        json_t *blk = kind == 1 ? json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "", "signature", "")
                                : json_pack("{s:s,s:s}", "type", "text", "text", "");
        event(k, "content_block_start", json_pack("{s:s,s:i,s:o}", "type", "content_block_start", "index", st->block, "content_block", blk));
        st->block++;
        st->open = kind;
    }
    json_t *dl = kind == 1 ? json_pack("{s:s,s:o}", "type", "thinking_delta", "thinking", jstrn(t + a, b - a))
                           : json_pack("{s:s,s:o}", "type", "text_delta", "text", jstrn(t + a, b - a));
    event(k, "content_block_delta", json_pack("{s:s,s:i,s:o}", "type", "content_block_delta", "index", st->block - 1, "delta", dl));
}

void ds41_anth_stream_init(ds41_anth_stream *st, const ds41_anth_info *info) {
    memset(st, 0, sizeof *st);
    ds41_text_view_init(&st->view, info->thinking, info->tools);
}

void ds41_anth_stream_step(ds41_anth_stream *st, const char *id, const char *model, const ds41_anth_info *info,
                           const ds41_anth_seq *s, size_t avail, void (*emit)(void *ctx, const char *sse, size_t n), void *ctx) {
    sink k = { emit, ctx };
    if (st->ended) return;
    /* message_start waits for the first token: by then admission has counted the cached prompt
     * tokens, so its usage is the final input split */
    if (!st->started) {
        if (!s->output_tokens && !s->finished) return;
        st->started = 1;
        json_t *msg = json_pack("{s:s,s:s,s:s,s:s,s:[],s:n,s:n,s:o}", "id", id, "type", "message", "role", "assistant", "model", model,
                                "content", "stop_reason", "stop_sequence", "usage", usage(&(ds41_anth_seq){ .input_tokens = s->input_tokens,
                                .cached_tokens = s->cached_tokens, .output_tokens = 0 }, 1));
        event(&k, "message_start", json_pack("{s:s,s:o}", "type", "message_start", "message", msg));
    }
    const char *t = s->text ? s->text : "";
    ds41_text_delta d;
    ds41_text_view_step(&st->view, t, avail, s->finished, &d);
    if (info->thinking) delta(st, &k, 1, t, d.r0, d.r1);
    delta(st, &k, 2, t, d.c0, d.c1);
    if (!s->finished) return;
    ds41_tool_call *tc = NULL;
    size_t ntc = st->view.phase == 2 ? ds41_dsml_parse(t + st->view.dsml_at, s->text_len - st->view.dsml_at, &tc) : 0;
    if (!st->block && !ntc) {
        /* nothing was shown: one empty text block, as the whole message has */
        event(&k, "content_block_start", json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_start", "index", 0, "content_block",
                                                   "type", "text", "text", ""));
        st->block = 1;
        st->open = 2;
    }
    close_block(st, &k);
    for (size_t i = 0; i < ntc; i++) {
        event(&k, "content_block_start", json_pack("{s:s,s:i,s:o}", "type", "content_block_start", "index", st->block, "content_block",
                                                   tool_block(id, i, &tc[i], 0)));
        event(&k, "content_block_delta", json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_delta", "index", st->block, "delta",
                                                   "type", "input_json_delta", "partial_json", tc[i].arguments));
        event(&k, "content_block_stop", json_pack("{s:s,s:i}", "type", "content_block_stop", "index", st->block));
        st->block++;
    }
    if (s->finish == DS41_FIN_ERROR || s->finish == DS41_FIN_ABORT) {
        event(&k, "error", json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type",
                                     s->finish == DS41_FIN_ABORT ? "overloaded_error" : "api_error", "message", "generation failed"));
    } else {
        const char *sr = stop_reason(s, ntc);
        event(&k, "message_delta", json_pack("{s:s,s:{s:s,s:o},s:o}", "type", "message_delta", "delta", "stop_reason", sr, "stop_sequence",
                                             s->stop_hit && s->stop_str && !strcmp(sr, "stop_sequence") ? json_string(s->stop_str) : json_null(),
                                             "usage", usage(s, 1)));
        event(&k, "message_stop", json_pack("{s:s}", "type", "message_stop"));
    }
    ds41_tool_calls_free(tc, ntc);
    st->ended = 1;
}
