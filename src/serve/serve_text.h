/* ds41 serve: generated text -> the OpenAI reply's parts.
 *
 * In thinking mode the model writes `reasoning</think>answer`; with tools it may end its
 * answer with a V4.1 DSML block (the form src/text/chat.c renders for assistant tool calls):
 *
 *   \n\n<｜DSML｜ calls>
 *   <｜DSML｜ invoke name="NAME">
 *   <｜DSML｜ parameter name="P" string="true|false">VALUE</｜DSML｜ parameter>
 *   </｜DSML｜ invoke>
 *   </｜DSML｜ calls>
 *
 * A view walks the text as it grows (streaming) or once (done): it hands out the reasoning
 * and content ranges that can no longer change (holding back what could be the start of a
 * marker), and keeps the DSML block for ds41_dsml_parse at the end. */
#ifndef DS41_SERVE_TEXT_H
#define DS41_SERVE_TEXT_H

#include <stddef.h>

#define DS41_THINK_END "</think>"
#define DS41_DSML_CALLS "<\xef\xbd\x9c" "DSML\xef\xbd\x9c calls>"

/* Largest k <= n such that s[0..k) does not end inside a UTF-8 sequence. */
size_t ds41_utf8_floor(const char *s, size_t n);

typedef struct ds41_tool_call {
    char *name;
    char *arguments;   /* JSON object text */
} ds41_tool_call;

/* Parses the DSML block text[len] (from "<｜DSML｜ calls>"). Invokes that are complete are
 * returned (a block cut off by max_tokens keeps its finished calls); string="true" values stay
 * strings, others are read as JSON (kept as strings when they do not parse). Returns the call
 * count (0: nothing usable), *calls malloc'd; ds41_tool_calls_free. */
size_t ds41_dsml_parse(const char *text, size_t len, ds41_tool_call **calls);
void ds41_tool_calls_free(ds41_tool_call *calls, size_t n);

typedef struct ds41_text_view {
    int phase;          /* 0 reasoning, 1 content, 2 inside the DSML block */
    int tools;          /* look for a DSML block */
    size_t cur;         /* text consumed */
    size_t dsml_at;     /* phase 2: where the block starts */
} ds41_text_view;

typedef struct ds41_text_delta {
    size_t r0, r1;      /* reasoning text[r0..r1) */
    size_t c0, c1;      /* content text[c0..c1) */
} ds41_text_delta;

void ds41_text_view_init(ds41_text_view *v, int thinking, int tools);
/* text[0..avail) is what exists (final when done); fills d with the new ranges. */
void ds41_text_view_step(ds41_text_view *v, const char *text, size_t avail, int done, ds41_text_delta *d);

#endif
