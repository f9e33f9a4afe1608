/* ds41 chat JSON: parses an OpenAI-style conversation (jansson) into a ds41_chat, and writes
 * JSON values byte for byte as the reference encoder's Python json.dumps does. */
#include "chat.h"
#include "chat_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DSML "｜DSML｜"

/* ---------------------------------------------------------------- Python-style JSON out */

/* json.dumps escapes '"', '\\' and the C0 controls (short forms for \b \f \n \r \t, \u00xx in
 * lower-case hex for the rest) and, with ensure_ascii=False, writes everything else raw. */
static void py_string(ds41_sb *b, const char *s, size_t n) {
    ds41_sb_add(b, "\"");
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        const char *esc = NULL;
        char tmp[8];
        switch (ch) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        default:
            if (ch < 0x20) {
                snprintf(tmp, sizeof tmp, "\\u%04x", ch);
                esc = tmp;
            }
        }
        if (esc) {
            ds41_sb_addn(b, s + i - run, run);
            run = 0;
            ds41_sb_add(b, esc);
        } else {
            run++;
        }
    }
    ds41_sb_addn(b, s + n - run, run);
    ds41_sb_add(b, "\"");
}

/* Python's float repr: the shortest digit string that reads back to the same double, in
 * fixed notation when the decimal exponent is in [-4, 16), else d.ddde+XX. */
static void py_float(ds41_sb *b, double v) {
    char buf[48];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, v);
        if (strtod(buf, NULL) == v) break;
    }
    /* buf is [-]d[.ddd]e(+|-)XX */
    const char *p = buf;
    char digits[24];
    int nd = 0, neg = 0;
    if (*p == '-') { neg = 1; p++; }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9' && nd < (int)sizeof digits - 1) digits[nd++] = *p;
    int exp10 = *p == 'e' ? atoi(p + 1) : 0;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int decpt = exp10 + 1;  /* value = 0.DIGITS * 10^decpt */
    if (neg) ds41_sb_add(b, "-");
    if (decpt <= -4 || decpt > 16) {
        ds41_sb_addn(b, digits, 1);
        if (nd > 1) {
            ds41_sb_add(b, ".");
            ds41_sb_addn(b, digits + 1, (size_t)nd - 1);
        }
        ds41_sb_addf(b, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    } else if (decpt <= 0) {
        ds41_sb_add(b, "0.");
        for (int i = 0; i < -decpt; i++) ds41_sb_add(b, "0");
        ds41_sb_add(b, digits);
    } else if (decpt >= nd) {
        ds41_sb_add(b, digits);
        for (int i = nd; i < decpt; i++) ds41_sb_add(b, "0");
        ds41_sb_add(b, ".0");
    } else {
        ds41_sb_addn(b, digits, (size_t)decpt);
        ds41_sb_add(b, ".");
        ds41_sb_add(b, digits + decpt);
    }
}

static void py_dump(ds41_sb *b, const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *k;
        json_t *x;
        int first = 1;
        ds41_sb_add(b, "{");
        /* jansson (>= 2.8) iterates an object in insertion order, as Python dicts do. */
        json_object_foreach((json_t *)v, k, x) {
            if (!first) ds41_sb_add(b, ", ");
            first = 0;
            py_string(b, k, strlen(k));
            ds41_sb_add(b, ": ");
            py_dump(b, x);
        }
        ds41_sb_add(b, "}");
        break;
    }
    case JSON_ARRAY:
        ds41_sb_add(b, "[");
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) ds41_sb_add(b, ", ");
            py_dump(b, json_array_get(v, i));
        }
        ds41_sb_add(b, "]");
        break;
    case JSON_STRING: py_string(b, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER: ds41_sb_addf(b, "%" JSON_INTEGER_FORMAT, json_integer_value(v)); break;
    case JSON_REAL: py_float(b, json_real_value(v)); break;
    case JSON_TRUE: ds41_sb_add(b, "true"); break;
    case JSON_FALSE: ds41_sb_add(b, "false"); break;
    case JSON_NULL: ds41_sb_add(b, "null"); break;
    }
}

static json_t *load_text(const char *json, const char *what, ds41_err *err) {
    json_error_t je;
    json_t *v = json_loads(json, JSON_DECODE_ANY, &je);
    if (!v) ds41_errf(err, "%s: invalid JSON at line %d column %d: %s", what, je.line, je.column, je.text);
    return v;
}

int ds41_chat_pyjson_text(ds41_sb *b, const char *json, const char *what, ds41_err *err) {
    json_t *v = load_text(json, what, err);
    if (!v) return -1;
    py_dump(b, v);
    json_decref(v);
    return 0;
}

int ds41_chat_dsml_arguments(ds41_sb *b, const char *arguments_json, const char *tool_name,
                             ds41_err *err) {
    char what[160];
    snprintf(what, sizeof what, "tool call '%.100s' arguments", tool_name);
    json_t *v = load_text(arguments_json, what, err);
    if (!v) return -1;
    if (!json_is_object(v)) {
        json_decref(v);
        return ds41_errf(err, "%s: expected a JSON object", what);
    }
    const char *k;
    json_t *x;
    int first = 1;
    json_object_foreach(v, k, x) {
        if (!first) ds41_sb_add(b, "\n");
        first = 0;
        ds41_sb_add(b, "<" DSML " parameter name=\"");
        ds41_sb_add(b, k);
        ds41_sb_add(b, json_is_string(x) ? "\" string=\"true\">" : "\" string=\"false\">");
        if (json_is_string(x)) ds41_sb_addn(b, json_string_value(x), json_string_length(x));
        else py_dump(b, x);
        ds41_sb_add(b, "</" DSML " parameter>");
    }
    json_decref(v);
    return 0;
}

/* ---------------------------------------------------------------- OpenAI-style JSON in */

typedef struct parse_ctx {
    const char *what;   /* the input's name, for messages */
    ds41_err *err;
} parse_ctx;

#define PFAIL(x, ...) ds41_errf((x)->err, __VA_ARGS__)

/* Python truthiness, which decides whether the reference renders an optional member. */
static int py_truthy(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return json_object_size(v) > 0;
    case JSON_ARRAY: return json_array_size(v) > 0;
    case JSON_STRING: return json_string_length(v) > 0;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0;
    case JSON_TRUE: return 1;
    default: return 0;
    }
}

static char *dump_compact(const json_t *v) {
    /* Compact jansson text; reals are written with 17 digits, so they read back exactly and
     * the renderer's repr form is unchanged. */
    return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
}

static int has_placeholder(const char *s) { return s && strstr(s, DS41_CHAT_IMAGE_PLACEHOLDER) != NULL; }

static int dup_into(parse_ctx *x, char **dst, const char *s) {
    *dst = ds41_chat_strdup(s);
    return *dst ? 0 : PFAIL(x, "%s: out of memory", x->what);
}

/* An optional string member: absent or null leaves *dst NULL. */
static int opt_string(parse_ctx *x, const json_t *obj, const char *key, const char *path, char **dst) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return PFAIL(x, "%s: %s.%s: expected a string", x->what, path, key);
    return dup_into(x, dst, json_string_value(v));
}

static int add_part(parse_ctx *x, ds41_chat_message *m, ds41_chat_part_kind kind, const char *text,
                    const char *id) {
    ds41_chat_part *p = realloc(m->parts, (m->n_parts + 1) * sizeof *p);
    if (!p) return PFAIL(x, "%s: out of memory", x->what);
    m->parts = p;
    ds41_chat_part *q = &p[m->n_parts];
    q->kind = kind;
    q->text = ds41_chat_strdup(text);
    q->id = ds41_chat_strdup(id);
    if (!q->text || (id && !q->id)) {
        free(q->text);
        free(q->id);
        return PFAIL(x, "%s: out of memory", x->what);
    }
    m->n_parts++;
    return 0;
}

/* A tool_result part's content: a string, or text parts joined by "\n\n". */
static int tool_result_text(parse_ctx *x, const json_t *c, const char *path, ds41_sb *out) {
    if (!c || json_is_null(c)) return 0;
    if (json_is_string(c)) {
        ds41_sb_addn(out, json_string_value(c), json_string_length(c));
        return 0;
    }
    if (!json_is_array(c)) return PFAIL(x, "%s: %s.content: expected a string or an array", x->what, path);
    for (size_t i = 0; i < json_array_size(c); i++) {
        const json_t *p = json_array_get(c, i);
        const char *type = json_string_value(json_object_get(p, "type"));
        if (!type) return PFAIL(x, "%s: %s.content[%zu]: expected an object with a string \"type\"", x->what, path, i);
        if (i) ds41_sb_add(out, "\n\n");
        if (!strcmp(type, "text")) {
            const json_t *t = json_object_get(p, "text");
            if (t && !json_is_string(t))
                return PFAIL(x, "%s: %s.content[%zu].text: expected a string", x->what, path, i);
            if (t) ds41_sb_addn(out, json_string_value(t), json_string_length(t));
        } else {
            ds41_sb_add(out, "[Unsupported ");
            ds41_sb_add(out, type);
            ds41_sb_add(out, "]");
        }
    }
    return 0;
}

static int image_has_source(const json_t *p, const char *type) {
    if (!strcmp(type, "image_url")) {
        const json_t *u = json_object_get(p, "image_url");
        if (json_is_object(u)) u = json_object_get(u, "url");
        return json_is_string(u) && json_string_length(u) > 0;
    }
    static const char *const keys[] = { "source", "url", "data" };
    for (size_t i = 0; i < 3; i++) {
        const json_t *v = json_object_get(p, keys[i]);
        if (v && py_truthy(v)) return 1;
    }
    return 0;
}

/* Array content: text parts, image parts (rendered as the image placeholder; the pixels are
 * the vision path's business), tool_result parts, and anything else as "[Unsupported T]". */
static int parse_parts(parse_ctx *x, const json_t *arr, const char *path, ds41_chat_message *m) {
    m->has_parts = 1;
    ds41_sb joined = { 0 };
    int n_text = 0, rc = -1;
    for (size_t i = 0; i < json_array_size(arr); i++) {
        const json_t *p = json_array_get(arr, i);
        const char *type = json_is_object(p) ? json_string_value(json_object_get(p, "type")) : NULL;
        if (!type) {
            PFAIL(x, "%s: %s.content[%zu]: expected an object with a string \"type\"", x->what, path, i);
            goto done;
        }
        const char *text = NULL;
        if (!strcmp(type, "text")) {
            const json_t *t = json_object_get(p, "text");
            if (t && !json_is_null(t) && !json_is_string(t)) {
                PFAIL(x, "%s: %s.content[%zu].text: expected a string", x->what, path, i);
                goto done;
            }
            text = json_is_string(t) ? json_string_value(t) : "";
            if (has_placeholder(text)) {
                PFAIL(x, "%s: %s.content[%zu].text: contains the image placeholder %s; give images as "
                      "image parts", x->what, path, i, DS41_CHAT_IMAGE_PLACEHOLDER);
                goto done;
            }
            if (add_part(x, m, DS41_PART_TEXT, text, NULL)) goto done;
        } else if (!strcmp(type, "image_url") || !strcmp(type, "image")) {
            if (!image_has_source(p, type)) {
                PFAIL(x, "%s: %s.content[%zu]: image part without a url or source", x->what, path, i);
                goto done;
            }
            text = DS41_CHAT_IMAGE_PLACEHOLDER;
            if (add_part(x, m, DS41_PART_TEXT, text, NULL)) goto done;
        } else if (!strcmp(type, "tool_result")) {
            ds41_sb tr = { 0 };
            char *id = NULL;
            int bad = tool_result_text(x, json_object_get(p, "content"), path, &tr) ||
                      opt_string(x, p, "tool_use_id", path, &id);
            if (!bad && tr.oom) bad = PFAIL(x, "%s: out of memory", x->what);
            if (!bad) bad = add_part(x, m, DS41_PART_TOOL_RESULT, tr.p ? tr.p : "", id ? id : "");
            free(tr.p);
            free(id);
            if (bad) goto done;
        } else {
            if (add_part(x, m, DS41_PART_OTHER, type, NULL)) goto done;
        }
        /* Non-user roles render the text parts (images included) joined by blank lines. */
        if (text) {
            if (n_text++) ds41_sb_add(&joined, "\n\n");
            ds41_sb_add(&joined, text);
        }
    }
    if (joined.oom) { PFAIL(x, "%s: out of memory", x->what); goto done; }
    if (m->n_parts) {
        m->content = joined.p ? joined.p : ds41_chat_strdup("");
        joined.p = NULL;
        if (!m->content) { PFAIL(x, "%s: out of memory", x->what); goto done; }
    }
    rc = 0;
done:
    free(joined.p);
    return rc;
}

static int parse_tool_calls(parse_ctx *x, const json_t *arr, const char *path, ds41_chat_message *m) {
    if (!json_is_array(arr)) return PFAIL(x, "%s: %s.tool_calls: expected an array", x->what, path);
    for (size_t i = 0; i < json_array_size(arr); i++) {
        const json_t *tc = json_array_get(arr, i);
        const json_t *fn = json_object_get(tc, "function");
        if (!json_is_object(tc) || !json_is_object(fn))
            return PFAIL(x, "%s: %s.tool_calls[%zu]: expected an object with a \"function\" object",
                         x->what, path, i);
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (!name) return PFAIL(x, "%s: %s.tool_calls[%zu].function.name: expected a string", x->what, path, i);
        const json_t *id = json_object_get(tc, "id");
        if (!json_is_string(id) || !json_string_length(id)) id = json_object_get(fn, "id");
        if (id && !json_is_null(id) && !json_is_string(id))
            return PFAIL(x, "%s: %s.tool_calls[%zu].id: expected a string", x->what, path, i);
        const json_t *args = json_object_get(fn, "arguments");
        json_t *parsed = NULL;
        if (json_is_string(args)) {
            json_error_t je;
            parsed = json_loads(json_string_value(args), JSON_DECODE_ANY, &je);
            if (!parsed)
                return PFAIL(x, "%s: %s.tool_calls[%zu].function.arguments: invalid JSON (%s)",
                             x->what, path, i, je.text);
        }
        const json_t *obj = parsed ? parsed : args;
        if (!json_is_object(obj)) {
            json_decref(parsed);
            return PFAIL(x, "%s: %s.tool_calls[%zu].function.arguments: must be a JSON object (or a "
                         "string holding one)", x->what, path, i);
        }
        char *text = json_is_string(args) ? ds41_chat_strdup(json_string_value(args)) : dump_compact(obj);
        json_decref(parsed);
        if (!text) return PFAIL(x, "%s: out of memory", x->what);
        int rc = ds41_chat_add_tool_call(m, json_string_value(id), name, text, x->err);
        free(text);
        if (rc) return -1;
    }
    return 0;
}

/* OpenAI tools: [{"type": "function", "function": {...}}, ...]; the renderer prints the
 * "function" members. Replaces any tools already on m. */
static int parse_tools(parse_ctx *x, const json_t *arr, const char *path, ds41_chat_message *m) {
    if (!json_is_array(arr)) return PFAIL(x, "%s: %s: expected an array of tools", x->what, path);
    for (size_t i = 0; i < m->n_tools; i++) free(m->tools_json[i]);
    free(m->tools_json);
    m->tools_json = NULL;
    m->n_tools = 0;
    size_t n = json_array_size(arr);
    if (!n) return 0;
    m->tools_json = calloc(n, sizeof *m->tools_json);
    if (!m->tools_json) return PFAIL(x, "%s: out of memory", x->what);
    for (size_t i = 0; i < n; i++) {
        const json_t *fn = json_object_get(json_array_get(arr, i), "function");
        if (!json_is_object(fn))
            return PFAIL(x, "%s: %s[%zu]: expected an object with a \"function\" object", x->what, path, i);
        m->tools_json[i] = dump_compact(fn);
        if (!m->tools_json[i]) return PFAIL(x, "%s: out of memory", x->what);
        m->n_tools++;
    }
    return 0;
}

static const struct { const char *name; ds41_chat_role role; } role_names[] = {
    { "system", DS41_ROLE_SYSTEM }, { "user", DS41_ROLE_USER }, { "assistant", DS41_ROLE_ASSISTANT },
    { "tool", DS41_ROLE_TOOL }, { "developer", DS41_ROLE_DEVELOPER },
    { "latest_reminder", DS41_ROLE_LATEST_REMINDER },
};
static const char *const task_names[] = {
    [DS41_TASK_ACTION] = "action", [DS41_TASK_QUERY] = "query", [DS41_TASK_AUTHORITY] = "authority",
    [DS41_TASK_DOMAIN] = "domain", [DS41_TASK_TITLE] = "title", [DS41_TASK_READ_URL] = "read_url",
};

static int parse_message(parse_ctx *x, const json_t *jm, size_t index, ds41_chat *c) {
    char path[48];
    snprintf(path, sizeof path, "messages[%zu]", index);
    if (!json_is_object(jm)) return PFAIL(x, "%s: %s: expected an object", x->what, path);
    const json_t *jr = json_object_get(jm, "role");
    if (!json_is_string(jr)) return PFAIL(x, "%s: %s.role: expected a string", x->what, path);
    const char *rs = json_string_value(jr);
    int role = -1;
    for (size_t i = 0; i < sizeof role_names / sizeof role_names[0]; i++)
        if (!strcmp(rs, role_names[i].name)) role = (int)role_names[i].role;
    if (role < 0)
        return PFAIL(x, "%s: %s.role: unknown role '%.60s' (expected system, user, assistant, tool, "
                     "developer or latest_reminder)", x->what, path, rs);
    ds41_chat_message *m = ds41_chat_push(c, (ds41_chat_role)role, NULL, NULL, x->err);
    if (!m) return -1;

    const json_t *jc = json_object_get(jm, "content");
    if (json_is_string(jc)) {
        if (has_placeholder(json_string_value(jc)))
            return PFAIL(x, "%s: %s.content: contains the image placeholder %s; give images as image "
                         "parts", x->what, path, DS41_CHAT_IMAGE_PLACEHOLDER);
        if (dup_into(x, &m->content, json_string_value(jc))) return -1;
    } else if (json_is_array(jc)) {
        if (parse_parts(x, jc, path, m)) return -1;
    } else if (jc && !json_is_null(jc)) {
        return PFAIL(x, "%s: %s.content: expected a string, an array of content parts or null", x->what, path);
    }

    /* Clients echo reasoning back as reasoning_content (DeepSeek API) or reasoning (newer
     * OpenAI-compatible servers); both mean the same. */
    const char *rkey = json_object_get(jm, "reasoning_content") ? "reasoning_content" : "reasoning";
    if (opt_string(x, jm, rkey, path, &m->reasoning_content)) return -1;
    if (has_placeholder(m->reasoning_content))
        return PFAIL(x, "%s: %s.%s: contains the image placeholder %s", x->what, path, rkey,
                     DS41_CHAT_IMAGE_PLACEHOLDER);

    const json_t *jtc = json_object_get(jm, "tool_calls");
    if (jtc && !json_is_null(jtc) && parse_tool_calls(x, jtc, path, m)) return -1;
    if (opt_string(x, jm, "tool_call_id", path, &m->tool_call_id)) return -1;

    const json_t *jt = json_object_get(jm, "tools");
    if (jt && !json_is_null(jt)) {
        char tpath[64];
        snprintf(tpath, sizeof tpath, "%s.tools", path);
        if (parse_tools(x, jt, tpath, m)) return -1;
    }
    const json_t *jf = json_object_get(jm, "response_format");
    if (jf && py_truthy(jf)) {
        m->response_format_json = dump_compact(jf);
        if (!m->response_format_json) return PFAIL(x, "%s: out of memory", x->what);
    }

    const json_t *jk = json_object_get(jm, "task");
    if (jk && !json_is_null(jk)) {
        const char *ts = json_string_value(jk);
        for (int i = DS41_TASK_ACTION; ts && i <= DS41_TASK_READ_URL; i++)
            if (!strcmp(ts, task_names[i])) m->task = (ds41_chat_task)i;
        if (m->task == DS41_TASK_NONE)
            return PFAIL(x, "%s: %s.task: expected one of action, query, authority, domain, title, "
                         "read_url", x->what, path);
    }
    const json_t *jw = json_object_get(jm, "wo_eos");
    if (jw && !json_is_null(jw)) {
        if (!json_is_boolean(jw)) return PFAIL(x, "%s: %s.wo_eos: expected true or false", x->what, path);
        m->wo_eos = json_is_true(jw);
    }
    return 0;
}

static int opt_bool(parse_ctx *x, const json_t *obj, const char *key, const char *where, int *dst) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return PFAIL(x, "%s: %s%s: expected true or false", x->what, where, key);
    *dst = json_is_true(v);
    return 0;
}

static int opt_effort(parse_ctx *x, const json_t *obj, const char *where, int *dst) {
    const json_t *v = json_object_get(obj, "reasoning_effort");
    if (!v || json_is_null(v)) return 0;
    if (json_is_integer(v)) {
        json_int_t e = json_integer_value(v);
        if (e < 1 || e > 100)
            return PFAIL(x, "%s: %sreasoning_effort: %" JSON_INTEGER_FORMAT " is outside 1..100", x->what, where, e);
        *dst = (int)e;
        return 0;
    }
    if (!json_is_string(v))
        return PFAIL(x, "%s: %sreasoning_effort: expected low, high, xhigh, max or an integer 1..100",
                     x->what, where);
    ds41_err e2;
    if (ds41_chat_effort_parse(json_string_value(v), dst, &e2)) return PFAIL(x, "%s: %s%s", x->what, where, e2.msg);
    return 0;
}

/* Options shared by the request body and chat_template_kwargs. */
static int parse_common_options(parse_ctx *x, const json_t *obj, const char *where, ds41_chat_options *o) {
    if (opt_bool(x, obj, "thinking", where, &o->thinking)) return -1;
    if (opt_effort(x, obj, where, &o->reasoning_effort)) return -1;
    return opt_bool(x, obj, "drop_thinking", where, &o->drop_thinking);
}

/* Messages quote pieces of the input (a role name, jansson's "near" text), which may hold
 * newlines or other controls; an error message stays one line. */
void ds41_chat_err_one_line(ds41_err *err) {
    if (!err) return;
    for (char *p = err->msg; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = ' ';
}

int ds41_chat_parse_json(const char *json, size_t len, const char *what, ds41_chat *c,
                         ds41_chat_options *opts, ds41_err *err) {
    parse_ctx x = { what ? what : "chat JSON", err };
    json_error_t je;
    /* No JSON_ALLOW_NUL: a NUL inside a string is refused (prompts are C strings). */
    json_t *root = json_loadb(json, len, JSON_DECODE_ANY, &je);
    if (!root) {
        PFAIL(&x, "%s: invalid JSON at line %d column %d: %s", x.what, je.line, je.column, je.text);
        ds41_chat_err_one_line(err);
        return -1;
    }
    int rc = -1;
    const json_t *msgs = root;
    if (json_is_object(root)) {
        msgs = json_object_get(root, "messages");
        if (!json_is_array(msgs)) {
            PFAIL(&x, "%s: messages: expected an array of messages", x.what);
            goto done;
        }
        if (json_object_get(root, "context")) {
            PFAIL(&x, "%s: context: not supported (give the whole conversation in messages)", x.what);
            goto done;
        }
        const json_t *mode = json_object_get(root, "thinking_mode");
        if (mode && !json_is_null(mode)) {
            const char *ms = json_string_value(mode);
            if (!ms || (strcmp(ms, "chat") && strcmp(ms, "thinking"))) {
                PFAIL(&x, "%s: thinking_mode: expected \"chat\" or \"thinking\"", x.what);
                goto done;
            }
            opts->thinking = !strcmp(ms, "thinking");
        }
        if (parse_common_options(&x, root, "", opts) ||
            opt_bool(&x, root, "add_generation_prompt", "", &opts->add_generation_prompt) ||
            opt_bool(&x, root, "continue_final_message", "", &opts->continue_final_message) ||
            opt_bool(&x, root, "add_bos", "", &opts->add_bos))
            goto done;
        const json_t *kw = json_object_get(root, "chat_template_kwargs");
        if (kw && !json_is_null(kw)) {
            if (!json_is_object(kw)) {
                PFAIL(&x, "%s: chat_template_kwargs: expected an object", x.what);
                goto done;
            }
            if (parse_common_options(&x, kw, "chat_template_kwargs.", opts)) goto done;
        }
    } else if (!json_is_array(root)) {
        PFAIL(&x, "%s: expected an array of messages or an object with \"messages\"", x.what);
        goto done;
    }
    for (size_t i = 0; i < json_array_size(msgs); i++)
        if (parse_message(&x, json_array_get(msgs, i), i, c)) goto done;
    /* Request-level tools go to the first system message; without one, an empty system
     * message is put first (vLLM's serving rule; in the reference goldens the first message
     * is that system message). Only system and developer messages render tools. */
    const json_t *tools = json_is_object(root) ? json_object_get(root, "tools") : NULL;
    if (tools && !json_is_null(tools) && json_array_size(tools) > 0) {
        size_t k = 0;
        while (k < c->n && c->msgs[k].role != DS41_ROLE_SYSTEM) k++;
        if (k == c->n) {
            if (!ds41_chat_push(c, DS41_ROLE_SYSTEM, "", NULL, err)) goto done;
            ds41_chat_message sys = c->msgs[c->n - 1];
            memmove(c->msgs + 1, c->msgs, (c->n - 1) * sizeof *c->msgs);
            c->msgs[0] = sys;
            k = 0;
        }
        if (parse_tools(&x, tools, "tools", &c->msgs[k])) goto done;
    } else if (tools && !json_is_null(tools) && !json_is_array(tools)) {
        PFAIL(&x, "%s: tools: expected an array of tools", x.what);
        goto done;
    }
    rc = 0;
done:
    if (rc) ds41_chat_err_one_line(err);
    json_decref(root);
    return rc;
}
