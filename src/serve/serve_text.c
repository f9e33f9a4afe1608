/* ds41 serve: reasoning / content / DSML tool-call split of generated text (serve_text.h). */
#define _GNU_SOURCE
#include "serve_text.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define DSML "\xef\xbd\x9c" "DSML\xef\xbd\x9c"

size_t ds41_utf8_floor(const char *s, size_t n) {
    /* walk back over continuation bytes to the lead byte; keep it only if complete */
    size_t k = n, back = 0;
    while (k > 0 && back < 4 && ((unsigned char)s[k - 1] & 0xC0) == 0x80) { k--; back++; }
    if (k == 0) return n;   /* no lead byte in reach: nothing to protect */
    unsigned char c = (unsigned char)s[k - 1];
    size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (need == 1) return n;
    return back + 1 >= need ? n : k - 1;
}

static const char *find(const char *h, size_t hl, const char *n) {
    return memmem(h, hl, n, strlen(n));
}

static char *dupn(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) { memcpy(p, s, n); p[n] = 0; }
    return p;
}

/* value of attr="..." inside the tag text[0..len) */
static char *attr(const char *tag, size_t len, const char *name) {
    size_t nl = strlen(name);
    for (size_t i = 0; i + nl + 2 <= len; i++) {
        if (memcmp(tag + i, name, nl) || tag[i + nl] != '=' || tag[i + nl + 1] != '"') continue;
        if (i > 0 && tag[i - 1] != ' ') continue;
        const char *v = tag + i + nl + 2;
        const char *q = memchr(v, '"', (size_t)(tag + len - v));
        if (!q) return NULL;
        return dupn(v, (size_t)(q - v));
    }
    return NULL;
}

/* One <｜DSML｜ invoke ...>...</｜DSML｜ invoke>: parameters -> a JSON object text. */
static int parse_invoke(const char *s, size_t len, ds41_tool_call *out) {
    const char *gt = memchr(s, '>', len);
    if (!gt) return -1;
    char *name = attr(s, (size_t)(gt - s), "name");
    if (!name || !*name) { free(name); return -1; }
    json_t *args = json_object();
    const char *p = gt + 1, *end = s + len;
    static const char popen[] = "<" DSML " parameter ", pclose[] = "</" DSML " parameter>";
    for (;;) {
        const char *a = find(p, (size_t)(end - p), popen);
        if (!a) break;
        const char *tg = memchr(a, '>', (size_t)(end - a));
        if (!tg) break;
        const char *c = find(tg + 1, (size_t)(end - tg - 1), pclose);
        if (!c) break;
        char *pn = attr(a, (size_t)(tg - a), "name");
        char *ps = attr(a, (size_t)(tg - a), "string");
        if (pn) {
            const char *v = tg + 1;
            size_t vl = (size_t)(c - v);
            json_t *jv = NULL;
            if (!ps || strcmp(ps, "true")) jv = json_loadb(v, vl, JSON_DECODE_ANY, NULL);
            if (!jv) jv = json_stringn(v, vl);
            if (jv) json_object_set_new(args, pn, jv);
        }
        free(pn);
        free(ps);
        p = c + strlen(pclose);
    }
    out->name = name;
    out->arguments = json_dumps(args, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(args);
    if (!out->arguments) { free(name); return -1; }
    return 0;
}

size_t ds41_dsml_parse(const char *text, size_t len, ds41_tool_call **calls) {
    *calls = NULL;
    static const char iopen[] = "<" DSML " invoke ", iclose[] = "</" DSML " invoke>";
    size_t n = 0, cap = 0;
    const char *p = text, *end = text + len;
    for (;;) {
        const char *a = find(p, (size_t)(end - p), iopen);
        if (!a) break;
        const char *c = find(a, (size_t)(end - a), iclose);
        if (!c) break;
        ds41_tool_call tc;
        if (parse_invoke(a + strlen(iopen) - 1, (size_t)(c - a - strlen(iopen) + 1), &tc) == 0) {
            if (n == cap) {
                size_t nc = cap ? cap * 2 : 4;
                ds41_tool_call *nv = realloc(*calls, nc * sizeof *nv);
                if (!nv) { free(tc.name); free(tc.arguments); break; }
                *calls = nv;
                cap = nc;
            }
            (*calls)[n++] = tc;
        }
        p = c + strlen(iclose);
    }
    return n;
}

void ds41_tool_calls_free(ds41_tool_call *calls, size_t n) {
    for (size_t i = 0; i < n; i++) { free(calls[i].name); free(calls[i].arguments); }
    free(calls);
}

void ds41_text_view_init(ds41_text_view *v, int thinking, int tools) {
    memset(v, 0, sizeof *v);
    v->phase = thinking ? 0 : 1;
    v->tools = tools;
}

/* Bytes at the end of text[cur..avail) that could begin marker m: held back. */
static size_t hold(const char *t, size_t cur, size_t avail, const char *m) {
    size_t ml = strlen(m);
    for (size_t k = ml - 1; k > 0; k--)
        if (avail - cur >= k && !memcmp(t + avail - k, m, k)) return k;
    return 0;
}

void ds41_text_view_step(ds41_text_view *v, const char *t, size_t avail, int done, ds41_text_delta *d) {
    memset(d, 0, sizeof *d);
    d->r0 = d->r1 = d->c0 = d->c1 = v->cur;
    if (v->phase == 0) {
        const char *m = find(t + v->cur, avail - v->cur, DS41_THINK_END);
        if (m) {
            d->r0 = v->cur;
            d->r1 = (size_t)(m - t);
            v->cur = d->r1 + strlen(DS41_THINK_END);
            v->phase = 1;
        } else {
            size_t e = done ? avail : ds41_utf8_floor(t, avail - hold(t, v->cur, avail, DS41_THINK_END));
            if (e < v->cur) e = v->cur;
            d->r0 = v->cur;
            d->r1 = e;
            v->cur = e;
            return;
        }
    }
    if (v->phase == 1) {
        d->c0 = d->c1 = v->cur;
        const char *m = v->tools ? find(t + v->cur, avail - v->cur, DS41_DSML_CALLS) : NULL;
        if (m) {
            size_t e = (size_t)(m - t);
            v->dsml_at = e;
            while (e > v->cur && t[e - 1] == '\n') e--;
            d->c1 = e;
            v->cur = avail;
            v->phase = 2;
            return;
        }
        size_t e = avail;
        if (!done) {
            size_t h = v->tools ? hold(t, v->cur, avail, "\n\n" DS41_DSML_CALLS) : 0;
            /* trailing newlines may be the separator before a block */
            if (v->tools && !h) while (h < avail - v->cur && h < 2 && t[avail - 1 - h] == '\n') h++;
            e = ds41_utf8_floor(t, avail - h);
            if (e < v->cur) e = v->cur;
        }
        d->c1 = e;
        v->cur = e;
        return;
    }
    v->cur = avail;
}
