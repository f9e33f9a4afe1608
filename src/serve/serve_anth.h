/* ds41 serve: the Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens).
 *
 * A Messages body is validated here and rewritten as the OpenAI chat body it means (system ->
 * a system message, tool_use / tool_result blocks -> tool_calls / tool messages, input_schema
 * -> parameters, tool_choice any -> required, stop_sequences -> stop, thinking -> the chat
 * template's thinking switch), so that the prompt, the sampling and the forced tool calls are
 * exactly those of /v1/chat/completions (serve_req.c). The reply side turns a finished
 * sequence's text into a message object, and a growing one into Anthropic's stream events.
 * No engine and no HTTP here: fuzz/fuzz_request.c drives the conversion. */
#ifndef DS41_SERVE_ANTH_H
#define DS41_SERVE_ANTH_H

#include <jansson.h>
#include <stddef.h>

#include "serve_req.h"
#include "serve_text.h"

/* What the reply side needs to know of the request. */
typedef struct ds41_anth_info {
    int stream;
    int thinking;     /* thinking {"type": "enabled"}: reasoning comes back as thinking blocks */
    int tools;        /* tools offered (tool_use blocks may come back) */
} ds41_anth_info;

/* body[len] (a Messages request) -> *chat (a malloc'd OpenAI chat body, NUL-terminated).
 * count_only: the count_tokens route (max_tokens is not required there). 0 on success, -1
 * with e set (param names the Anthropic member). */
int ds41_anth_to_chat(const char *body, size_t len, int count_only, char **chat, size_t *chat_len, ds41_anth_info *info,
                      ds41_req_error *e);

/* Anthropic's error shape {"type": "error", "error": {"type", "message"}}; the message names
 * the member (param) when the text does not start with it already. */
json_t *ds41_anth_error_json(const ds41_req_error *e);

/* The parts of one finished or growing sequence (the Responses route uses it too). */
typedef struct ds41_anth_seq {
    const char *text;
    size_t text_len;
    int finished, finish;      /* DS41_FIN_* */
    int stop_hit;              /* 1 + the stop string index, 0: none */
    const char *stop_str;      /* that string */
    long long input_tokens, cached_tokens, output_tokens;
    long long reasoning_tokens;  /* thinking mode: tokens up to the one completing </think> */
} ds41_anth_seq;

/* A finished sequence's reasoning and content ranges (*d) and its complete tool calls (the
 * count; *calls for ds41_tool_calls_free), the split both reply shapes start from. */
size_t ds41_anth_split(const ds41_anth_seq *s, int thinking, int tools, ds41_text_delta *d, ds41_tool_call **calls);

/* The whole message object of a finished sequence. */
json_t *ds41_anth_message(const char *id, const char *model, const ds41_anth_info *info, const ds41_anth_seq *s);

/* Stream state: which content block is open. */
typedef struct ds41_anth_stream {
    ds41_text_view view;
    int started;               /* message_start sent */
    int block;                 /* index of the next block */
    int open;                  /* 0 none, 1 thinking, 2 text */
    int ended;
} ds41_anth_stream;

void ds41_anth_stream_init(ds41_anth_stream *st, const ds41_anth_info *info);
/* Appends the events for what is new in s (text[0..avail) final) to *out as SSE text. */
void ds41_anth_stream_step(ds41_anth_stream *st, const char *id, const char *model, const ds41_anth_info *info,
                           const ds41_anth_seq *s, size_t avail, void (*emit)(void *ctx, const char *sse, size_t n), void *ctx);

#endif
