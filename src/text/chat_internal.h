/* ds41 chat internals shared by chat.c (renderer) and chat_json.c (JSON in and out). */
#ifndef DS41_CHAT_INTERNAL_H
#define DS41_CHAT_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>

#include "common.h"

/* Growable NUL-terminated byte buffer; oom is sticky and checked once at the end. */
typedef struct ds41_sb {
    char *p;
    size_t len, cap;
    int oom;
} ds41_sb;

void ds41_sb_addn(ds41_sb *b, const char *s, size_t n);
void ds41_sb_add(ds41_sb *b, const char *s);
void ds41_sb_addf(ds41_sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parses the JSON text json and appends it as Python's json.dumps(v, ensure_ascii=False)
 * writes it (", " and ": " separators, keys in input order, floats in repr form), which is
 * how the reference encoder prints tool schemas. what names the value in errors. */
int ds41_chat_pyjson_text(ds41_sb *b, const char *json, const char *what, ds41_err *err);

/* Appends the DSML parameters of a tool call's arguments (a JSON object text): one
 * <｜DSML｜ parameter name="K" string="true|false">V</｜DSML｜ parameter> per member, joined by
 * "\n"; strings raw, other values as JSON. */
int ds41_chat_dsml_arguments(ds41_sb *b, const char *arguments_json, const char *tool_name,
                             ds41_err *err);

/* Replaces control characters in err->msg by spaces (messages quote the input). */
void ds41_chat_err_one_line(ds41_err *err);

#endif
