/* ds41 chat: the DeepSeek V4.1 prompt format (see chat.h for the rules). This file holds the
 * conversation model and the renderer; chat_json.c parses OpenAI-style JSON into it and
 * writes JSON values the way the reference encoder's json.dumps does. */
#include "chat.h"
#include "chat_internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOK_USER "<｜User｜>"
#define TOK_ASSISTANT "<｜Assistant｜>"
#define TOK_SYSTEM "<｜System｜>"
#define TOK_LATEST_REMINDER "<｜latest_reminder｜>"
#define TOK_THINK "<think>"
#define TOK_END_THINK "</think>"
#define DSML "｜DSML｜"

/* The reference encoder's fixed texts. They are part of what the model was trained on, so
 * every byte matters. */
static const char effort_fmt[] =
    "Reasoning Effort: %d (range 1-100, the higher the value, the more thorough the reasoning)\n\n";

static const char tools_head[] =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools "
    "by writing a \"<" DSML " calls>\" block like the following:\n\n"
    "<" DSML " calls>\n"
    "<" DSML " invoke name=\"$TOOL_NAME\">\n"
    "<" DSML " parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" DSML
    " parameter>\n"
    "...\n"
    "</" DSML " invoke>\n"
    "<" DSML " invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</" DSML " invoke>\n"
    "</" DSML " calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types "
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set "
    "`string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by " TOK_THINK "), you MUST output your complete "
    "reasoning inside " TOK_THINK "..." TOK_END_THINK " BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after " TOK_END_THINK " with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";
static const char tools_tail[] =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "
    "tool calls.\n";
static const char response_format_head[] =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

static const char *const task_tokens[] = {
    [DS41_TASK_NONE] = "",
    [DS41_TASK_ACTION] = "<｜action｜>",
    [DS41_TASK_QUERY] = "<｜query｜>",
    [DS41_TASK_AUTHORITY] = "<｜authority｜>",
    [DS41_TASK_DOMAIN] = "<｜domain｜>",
    [DS41_TASK_TITLE] = "<｜title｜>",
    [DS41_TASK_READ_URL] = "<｜read_url｜>",
};

/* ---------------------------------------------------------------- string buffer */

void ds41_sb_addn(ds41_sb *b, const char *s, size_t n) {
    if (b->oom) return;
    size_t need;
    if (__builtin_add_overflow(b->len, n, &need) || __builtin_add_overflow(need, 1, &need)) {
        b->oom = 1;
        return;
    }
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < need) {
            if (cap > SIZE_MAX / 2) { cap = need; break; }
            cap *= 2;
        }
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void ds41_sb_add(ds41_sb *b, const char *s) { ds41_sb_addn(b, s, strlen(s)); }

void ds41_sb_addf(ds41_sb *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp) { b->oom = 1; return; }  /* only short formats here */
    ds41_sb_addn(b, tmp, (size_t)n);
}

/* ---------------------------------------------------------------- conversation model */

void ds41_chat_options_init(ds41_chat_options *o) {
    memset(o, 0, sizeof *o);
    o->drop_thinking = 1;
    o->add_generation_prompt = 1;
    o->add_bos = 1;
}

int ds41_chat_effort_parse(const char *s, int *effort, ds41_err *err) {
    static const struct { const char *name; int value; } names[] = {
        { "low", 25 }, { "high", 50 }, { "xhigh", 75 }, { "max", 100 },
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(s, names[i].name)) { *effort = names[i].value; return 0; }
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*s && *s != '-' && *s != '+' && *s != ' ' && !*end && !errno && v >= 1 && v <= 100) {
        *effort = (int)v;
        return 0;
    }
    return ds41_errf(err, "reasoning effort '%s': expected low, high, xhigh, max or an integer 1..100", s);
}

char *ds41_chat_strdup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

void ds41_chat_init(ds41_chat *c) { memset(c, 0, sizeof *c); }

static void message_free(ds41_chat_message *m) {
    free(m->content);
    for (size_t i = 0; i < m->n_parts; i++) {
        free(m->parts[i].text);
        free(m->parts[i].id);
    }
    free(m->parts);
    free(m->reasoning_content);
    for (size_t i = 0; i < m->n_tool_calls; i++) {
        free(m->tool_calls[i].id);
        free(m->tool_calls[i].name);
        free(m->tool_calls[i].arguments_json);
    }
    free(m->tool_calls);
    free(m->tool_call_id);
    for (size_t i = 0; i < m->n_tools; i++) free(m->tools_json[i]);
    free(m->tools_json);
    free(m->response_format_json);
}

void ds41_chat_free(ds41_chat *c) {
    for (size_t i = 0; i < c->n; i++) message_free(&c->msgs[i]);
    free(c->msgs);
    memset(c, 0, sizeof *c);
}

ds41_chat_message *ds41_chat_push(ds41_chat *c, ds41_chat_role role, const char *content,
                                  const char *reasoning_content, ds41_err *err) {
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 8;
        if (cap > SIZE_MAX / sizeof *c->msgs) { ds41_errf(err, "chat: too many messages"); return NULL; }
        ds41_chat_message *p = realloc(c->msgs, cap * sizeof *p);
        if (!p) { ds41_errf(err, "chat: out of memory"); return NULL; }
        c->msgs = p;
        c->cap = cap;
    }
    ds41_chat_message *m = &c->msgs[c->n];
    memset(m, 0, sizeof *m);
    m->role = role;
    m->content = ds41_chat_strdup(content);
    m->reasoning_content = ds41_chat_strdup(reasoning_content);
    if ((content && !m->content) || (reasoning_content && !m->reasoning_content)) {
        message_free(m);
        ds41_errf(err, "chat: out of memory");
        return NULL;
    }
    c->n++;
    return m;
}

int ds41_chat_add_tool_call(ds41_chat_message *m, const char *id, const char *name,
                            const char *arguments_json, ds41_err *err) {
    if (!name || !arguments_json) return ds41_errf(err, "chat: a tool call needs a name and arguments");
    ds41_chat_tool_call *p = realloc(m->tool_calls, (m->n_tool_calls + 1) * sizeof *p);
    if (!p) return ds41_errf(err, "chat: out of memory");
    m->tool_calls = p;
    ds41_chat_tool_call *tc = &p[m->n_tool_calls];
    tc->id = ds41_chat_strdup(id);
    tc->name = ds41_chat_strdup(name);
    tc->arguments_json = ds41_chat_strdup(arguments_json);
    if ((id && !tc->id) || !tc->name || !tc->arguments_json) {
        free(tc->id); free(tc->name); free(tc->arguments_json);
        return ds41_errf(err, "chat: out of memory");
    }
    m->n_tool_calls++;
    return 0;
}

/* ---------------------------------------------------------------- the working list
 * The reference encoder rewrites the message list before rendering: tool results fold into
 * user turns, consecutive user turns merge, tool results are reordered to the order of the
 * calls, and in thinking mode earlier reasoning and developer messages are dropped. Here that
 * rewritten list is a list of views (turns) over the caller's messages, which stay untouched. */

typedef struct turn_part {
    ds41_chat_part_kind kind;
    const char *text;
    const char *id;
} turn_part;

typedef struct turn {
    const ds41_chat_message *src;  /* NULL: a user turn made of tool results only */
    ds41_chat_role role;
    turn_part *parts;              /* user turns only */
    size_t n_parts, cap_parts;
    int no_reasoning;              /* its reasoning was dropped */
} turn;

typedef struct turn_list {
    turn *t;
    size_t n, cap;
} turn_list;

static void turns_free(turn_list *l) {
    for (size_t i = 0; i < l->n; i++) free(l->t[i].parts);
    free(l->t);
    memset(l, 0, sizeof *l);
}

static turn *turns_push(turn_list *l, const ds41_chat_message *src, ds41_chat_role role) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        if (cap > SIZE_MAX / sizeof *l->t) return NULL;
        turn *p = realloc(l->t, cap * sizeof *p);
        if (!p) return NULL;
        l->t = p;
        l->cap = cap;
    }
    turn *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    t->src = src;
    t->role = role;
    return t;
}

static int turn_add_part(turn *t, ds41_chat_part_kind kind, const char *text, const char *id) {
    if (t->n_parts == t->cap_parts) {
        size_t cap = t->cap_parts ? t->cap_parts * 2 : 4;
        if (cap > SIZE_MAX / sizeof *t->parts) return -1;
        turn_part *p = realloc(t->parts, cap * sizeof *p);
        if (!p) return -1;
        t->parts = p;
        t->cap_parts = cap;
    }
    t->parts[t->n_parts++] = (turn_part){ kind, text, id };
    return 0;
}

static ds41_chat_task turn_task(const turn *t) { return t->src ? t->src->task : DS41_TASK_NONE; }

/* A user turn's parts from one user message: its content parts, or its text as one part. */
static int add_user_parts(turn *t, const ds41_chat_message *m) {
    if (m->has_parts) {
        for (size_t i = 0; i < m->n_parts; i++)
            if (turn_add_part(t, m->parts[i].kind, m->parts[i].text ? m->parts[i].text : "",
                              m->parts[i].id))
                return -1;
        return 0;
    }
    return turn_add_part(t, DS41_PART_TEXT, m->content ? m->content : "", NULL);
}

/* Tool messages become tool_result parts of a user turn; a user message following a user turn
 * (that has no task) merges into it. The merged message's own fields (task, tools) are lost,
 * as in the reference. */
static int merge_turns(const ds41_chat *c, turn_list *l) {
    for (size_t i = 0; i < c->n; i++) {
        const ds41_chat_message *m = &c->msgs[i];
        turn *last = l->n ? &l->t[l->n - 1] : NULL;
        if (m->role == DS41_ROLE_TOOL) {
            turn *t = (last && last->role == DS41_ROLE_USER) ? last : turns_push(l, NULL, DS41_ROLE_USER);
            if (!t || turn_add_part(t, DS41_PART_TOOL_RESULT, m->content ? m->content : "",
                                    m->tool_call_id ? m->tool_call_id : ""))
                return -1;
        } else if (m->role == DS41_ROLE_USER) {
            turn *t = (last && last->role == DS41_ROLE_USER && turn_task(last) == DS41_TASK_NONE)
                          ? last : turns_push(l, m, DS41_ROLE_USER);
            if (!t || add_user_parts(t, m)) return -1;
        } else if (!turns_push(l, m, m->role)) {
            return -1;
        }
    }
    return 0;
}

/* Position of a tool call id in the calls of the assistant message (the last one with that id,
 * as a Python dict keeps the last); 0 when absent, as in the reference. */
static size_t call_order(const ds41_chat_message *calls, const char *id) {
    if (!calls || !id || !*id) return 0;
    for (size_t k = calls->n_tool_calls; k-- > 0;)
        if (calls->tool_calls[k].id && !strcmp(calls->tool_calls[k].id, id)) return k;
    return 0;
}

static int has_call_ids(const ds41_chat_message *m) {
    for (size_t k = 0; k < m->n_tool_calls; k++)
        if (m->tool_calls[k].id && *m->tool_calls[k].id) return 1;
    return 0;
}

/* Reorders the tool results of each user turn to the order of the calls of the last
 * assistant message with tool calls: a stable sort of the tool-result slots only. */
static int sort_tool_results(turn_list *l) {
    const ds41_chat_message *calls = NULL;
    for (size_t i = 0; i < l->n; i++) {
        turn *t = &l->t[i];
        if (t->role == DS41_ROLE_ASSISTANT && t->src && t->src->n_tool_calls) {
            calls = has_call_ids(t->src) ? t->src : NULL;
            continue;
        }
        if (t->role != DS41_ROLE_USER || !calls) continue;
        size_t n = 0;
        for (size_t k = 0; k < t->n_parts; k++) n += t->parts[k].kind == DS41_PART_TOOL_RESULT;
        if (n < 2) continue;
        turn_part *tmp = malloc(n * sizeof *tmp);
        size_t *key = malloc(n * sizeof *key);
        if (!tmp || !key) {
            free(tmp);
            free(key);
            return -1;
        }
        size_t j = 0;
        for (size_t k = 0; k < t->n_parts; k++)
            if (t->parts[k].kind == DS41_PART_TOOL_RESULT) {
                tmp[j] = t->parts[k];
                key[j++] = call_order(calls, t->parts[k].id);
            }
        for (size_t a = 1; a < n; a++) {  /* insertion sort: stable, and n is small */
            turn_part x = tmp[a];
            size_t kx = key[a], b = a;
            while (b > 0 && key[b - 1] > kx) {
                tmp[b] = tmp[b - 1];
                key[b] = key[b - 1];
                b--;
            }
            tmp[b] = x;
            key[b] = kx;
        }
        j = 0;
        for (size_t k = 0; k < t->n_parts; k++)
            if (t->parts[k].kind == DS41_PART_TOOL_RESULT) t->parts[k] = tmp[j++];
        free(tmp);
        free(key);
    }
    return 0;
}

/* The last turn that opens an assistant reply: user, developer, or a system message after the
 * first position. -1 if none. */
static long last_user_index(const turn_list *l) {
    for (size_t i = l->n; i-- > 0;) {
        ds41_chat_role r = l->t[i].role;
        if (r == DS41_ROLE_USER || r == DS41_ROLE_DEVELOPER || (r == DS41_ROLE_SYSTEM && i > 0))
            return (long)i;
    }
    return -1;
}

/* Thinking mode: before the last user turn, assistant turns lose their reasoning and developer
 * messages are dropped (user, system, tool and latest_reminder turns stay). */
static void drop_thinking(turn_list *l) {
    long lu = last_user_index(l);
    size_t out = 0;
    for (size_t i = 0; i < l->n; i++) {
        turn t = l->t[i];
        int before = (long)i < lu;
        if (before && t.role == DS41_ROLE_ASSISTANT) t.no_reasoning = 1;
        else if (before && t.role == DS41_ROLE_DEVELOPER) { free(t.parts); continue; }
        l->t[out++] = t;
    }
    l->n = out;
}

/* ---------------------------------------------------------------- rendering */

static int render_tools(ds41_sb *b, const ds41_chat_message *m, ds41_err *err) {
    if (m->n_tools) {
        ds41_sb_add(b, "\n\n");
        ds41_sb_add(b, tools_head);
        for (size_t i = 0; i < m->n_tools; i++) {
            if (i) ds41_sb_add(b, "\n");
            if (ds41_chat_pyjson_text(b, m->tools_json[i], "tool definition", err)) return -1;
        }
        ds41_sb_add(b, tools_tail);
    }
    if (m->response_format_json) {
        ds41_sb_add(b, "\n\n");
        ds41_sb_add(b, response_format_head);
        if (ds41_chat_pyjson_text(b, m->response_format_json, "response_format", err)) return -1;
    }
    return 0;
}

static int render_tool_calls(ds41_sb *b, const ds41_chat_message *m, ds41_err *err) {
    if (!m->n_tool_calls) return 0;
    ds41_sb_add(b, "\n\n<" DSML " calls>\n");
    for (size_t i = 0; i < m->n_tool_calls; i++) {
        const ds41_chat_tool_call *tc = &m->tool_calls[i];
        if (i) ds41_sb_add(b, "\n");
        ds41_sb_add(b, "<" DSML " invoke name=\"");
        ds41_sb_add(b, tc->name);
        ds41_sb_add(b, "\">\n");
        if (ds41_chat_dsml_arguments(b, tc->arguments_json, tc->name, err)) return -1;
        ds41_sb_add(b, "\n</" DSML " invoke>");
    }
    ds41_sb_add(b, "\n</" DSML " calls>");
    return 0;
}

static void render_user_parts(ds41_sb *b, const turn *t) {
    if (!t->n_parts) {
        if (t->src && t->src->content) ds41_sb_add(b, t->src->content);
        return;
    }
    for (size_t k = 0; k < t->n_parts; k++) {
        const turn_part *p = &t->parts[k];
        if (k) ds41_sb_add(b, "\n\n");
        if (p->kind == DS41_PART_TEXT) {
            ds41_sb_add(b, p->text);
        } else if (p->kind == DS41_PART_TOOL_RESULT) {
            ds41_sb_add(b, "<tool_result>");
            ds41_sb_add(b, p->text);
            ds41_sb_add(b, "</tool_result>");
        } else {
            ds41_sb_add(b, "[Unsupported ");
            ds41_sb_add(b, p->text);
            ds41_sb_add(b, "]");
        }
    }
}

typedef struct render_ctx {
    const turn_list *l;
    const ds41_chat_options *o;
    int drop;          /* effective drop_thinking */
    long last_user;
} render_ctx;

static int render_turn(ds41_sb *b, const render_ctx *x, size_t i, ds41_err *err) {
    const turn *t = &x->l->t[i];
    const ds41_chat_message *m = t->src;
    const char *content = m && m->content ? m->content : "";
    int thinking = x->o->thinking;
    int is_last = i + 1 == x->l->n;

    /* The system token opens the conversation when there is a system message or an effort
     * line to host. */
    if (i == 0 && (thinking || t->role == DS41_ROLE_SYSTEM)) ds41_sb_add(b, TOK_SYSTEM);
    if (i == 0 && thinking)
        ds41_sb_addf(b, effort_fmt, x->o->reasoning_effort ? x->o->reasoning_effort : 50);

    switch (t->role) {
    case DS41_ROLE_SYSTEM:
        if (i > 0) ds41_sb_add(b, TOK_SYSTEM);
        ds41_sb_add(b, content);
        if (render_tools(b, m, err)) return -1;
        break;
    case DS41_ROLE_DEVELOPER:
        if (!*content)
            return ds41_errf(err, "chat: a developer message needs non-empty content");
        ds41_sb_add(b, TOK_USER);
        ds41_sb_add(b, content);
        if (render_tools(b, m, err)) return -1;
        break;
    case DS41_ROLE_USER:
        ds41_sb_add(b, TOK_USER);
        render_user_parts(b, t);
        break;
    case DS41_ROLE_LATEST_REMINDER:
        ds41_sb_add(b, TOK_LATEST_REMINDER);
        ds41_sb_add(b, content);
        break;
    case DS41_ROLE_ASSISTANT: {
        const char *rc = m->reasoning_content && !t->no_reasoning ? m->reasoning_content : "";
        int prev_task = i > 0 && turn_task(&x->l->t[i - 1]) != DS41_TASK_NONE;
        int cont = is_last && x->o->continue_final_message;
        /* A task's output carries no reasoning. The reasoning of a turn before the last user
         * turn is shown only when not dropping. */
        if (thinking && !prev_task && (!x->drop || (long)i > x->last_user)) {
            ds41_sb_add(b, rc);
            /* Continuing a prefill that has reasoning only: leave the think block open. */
            if (!(cont && *rc && !*content && !m->n_tool_calls)) ds41_sb_add(b, TOK_END_THINK);
        }
        ds41_sb_add(b, content);
        if (render_tool_calls(b, m, err)) return -1;
        if (!m->wo_eos && !cont) ds41_sb_add(b, DS41_CHAT_EOS);
        break;
    }
    case DS41_ROLE_TOOL:  /* merged into user turns before rendering */
    default:
        return ds41_errf(err, "chat: message %zu: unexpected role %d", i, (int)t->role);
    }

    /* What follows the message: nothing when the next turn is not an assistant reply (or a
     * latest_reminder); otherwise the task token or the assistant header. */
    if (is_last && !x->o->add_generation_prompt) return 0;
    if (!is_last) {
        ds41_chat_role next = x->l->t[i + 1].role;
        if (next != DS41_ROLE_ASSISTANT && next != DS41_ROLE_LATEST_REMINDER) return 0;
    }
    ds41_chat_task task = turn_task(t);
    if (task == DS41_TASK_ACTION) {
        ds41_sb_add(b, TOK_ASSISTANT);
        ds41_sb_add(b, thinking ? TOK_THINK : TOK_END_THINK);
        ds41_sb_add(b, task_tokens[task]);
    } else if (task != DS41_TASK_NONE) {
        ds41_sb_add(b, task_tokens[task]);
    } else if (t->role == DS41_ROLE_USER || t->role == DS41_ROLE_DEVELOPER ||
               (t->role == DS41_ROLE_SYSTEM && i > 0)) {
        ds41_sb_add(b, TOK_ASSISTANT);
        /* Open a think block for the reply being generated (or for every reply when
         * reasoning is kept); close it at once for replies whose reasoning is dropped. */
        int open = thinking && (!x->drop || (long)i >= x->last_user);
        ds41_sb_add(b, open ? TOK_THINK : TOK_END_THINK);
    }
    return 0;
}

int ds41_chat_render(const ds41_chat *c, const ds41_chat_options *opts, char **out, size_t *len,
                     ds41_err *err) {
    *out = NULL;
    if (len) *len = 0;
    ds41_chat_options o = *opts;
    if (o.reasoning_effort < 0 || o.reasoning_effort > 100)
        return ds41_errf(err, "chat: reasoning effort %d: expected 1..100 (0 for the default)",
                         o.reasoning_effort);
    if (o.continue_final_message) {
        if (!c->n || c->msgs[c->n - 1].role != DS41_ROLE_ASSISTANT)
            return ds41_errf(err, "chat: continue_final_message needs a final assistant message");
        o.add_generation_prompt = 0;
    }

    turn_list l = { 0 };
    ds41_sb b = { 0 };
    int rc = -1;
    if (merge_turns(c, &l) || sort_tool_results(&l)) {
        ds41_errf(err, "chat: out of memory");
        goto done;
    }
    /* Tools anywhere keep every reasoning (the model needs its earlier tool-use reasoning). */
    int drop = o.drop_thinking;
    for (size_t i = 0; i < l.n; i++)
        if (l.t[i].src && l.t[i].src->n_tools) drop = 0;
    if (o.thinking && drop) drop_thinking(&l);

    render_ctx x = { &l, &o, drop, last_user_index(&l) };
    if (o.add_bos) ds41_sb_add(&b, DS41_CHAT_BOS);
    for (size_t i = 0; i < l.n; i++)
        if (render_turn(&b, &x, i, err)) goto done;
    if (!b.p) ds41_sb_addn(&b, "", 0);
    if (b.oom) {
        ds41_errf(err, "chat: out of memory rendering the prompt");
        goto done;
    }
    *out = b.p;
    if (len) *len = b.len;
    b.p = NULL;
    rc = 0;
done:
    if (rc) ds41_chat_err_one_line(err);
    free(b.p);
    turns_free(&l);
    return rc;
}
