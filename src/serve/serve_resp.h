/* ds41 serve: the OpenAI Responses API (POST /v1/responses), stateless.
 *
 * As for Anthropic Messages (serve_anth.h), a Responses body is validated and rewritten as the
 * chat body it means: instructions -> a system message, input items (messages, function_call,
 * function_call_output, reasoning) -> chat messages, function tools -> chat tools (other tool
 * types, which only OpenAI runs, are skipped), max_output_tokens -> max_tokens, reasoning.effort
 * -> thinking, text.format -> response_format. Nothing is stored: store true and
 * previous_response_id are refused. The reply side builds the response object and its
 * stream events from a sequence's text. */
#ifndef DS41_SERVE_RESP_H
#define DS41_SERVE_RESP_H

#include <jansson.h>
#include <stddef.h>

#include "serve_anth.h"

typedef struct ds41_resp_info {
    int stream;
    int thinking;
    int tools;
    long long max_output_tokens;   /* -1: none */
    double temperature, top_p;
    char *instructions;            /* echoed in the response (NULL: none) */
    char *tool_choice;             /* the request's tool_choice as JSON text (NULL: "auto") */
    char *tools_json;              /* the function tools as Responses lists them (JSON text) */
    int parallel_tool_calls;
    long long created_at;
} ds41_resp_info;

/* body[len] -> *chat (malloc'd OpenAI chat body). 0 on success (ds41_resp_info_free info
 * later), -1 with e set. */
int ds41_resp_to_chat(const char *body, size_t len, char **chat, size_t *chat_len, ds41_resp_info *info, ds41_req_error *e);
void ds41_resp_info_free(ds41_resp_info *info);

/* The response object of a finished sequence (status completed, or incomplete at
 * max_output_tokens). */
json_t *ds41_resp_object(const char *id, const char *model, const ds41_resp_info *info, const ds41_anth_seq *s);

typedef struct ds41_resp_stream {
    ds41_text_view view;
    int started, ended;
    int out_index;           /* the next output item's index */
    int open;                /* 0 none, 1 reasoning item, 2 message item */
    long long seq;           /* sequence_number */
    char *acc;               /* the open item's text so far (for the .done events) */
    size_t acc_len, acc_cap;
} ds41_resp_stream;

void ds41_resp_stream_init(ds41_resp_stream *st, const ds41_resp_info *info);
void ds41_resp_stream_free(ds41_resp_stream *st);
void ds41_resp_stream_step(ds41_resp_stream *st, const char *id, const char *model, const ds41_resp_info *info,
                           const ds41_anth_seq *s, size_t avail, void (*emit)(void *ctx, const char *sse, size_t n), void *ctx);

#endif
