/* ds41 serve: OpenAI request bodies -> a validated request struct (no engine, no tokenizer:
 * the libFuzzer harness fuzz/fuzz_request.c drives exactly this).
 *
 * Chat bodies are rendered to the V4.1 prompt text here (src/text/chat.c); completion bodies
 * keep their prompts as text or token ids. Tokenizing and range checks against the model's
 * vocabulary and context happen in the HTTP layer, which has the tokenizer and the engine. */
#ifndef DS41_SERVE_REQ_H
#define DS41_SERVE_REQ_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "grammar.h"

typedef enum ds41_req_kind { DS41_REQ_CHAT, DS41_REQ_COMPLETION } ds41_req_kind;

enum { DS41_REQ_MAX_BIAS = 1024, DS41_REQ_MAX_STOP = 16, DS41_REQ_MAX_TOP_LOGPROBS = 20, DS41_REQ_MAX_N = 16, DS41_REQ_MAX_CHOICES = 64,
       DS41_REQ_MAX_DEPTH = 64 };

/* One prompt: text (NUL-terminated, text_len bytes) or token ids (ids != NULL). */
typedef struct ds41_req_prompt {
    char *text;
    size_t text_len;
    int32_t *ids;
    size_t n_ids;
} ds41_req_prompt;

typedef struct ds41_req {
    ds41_req_kind kind;
    char *model;                  /* NULL when absent */
    ds41_req_prompt *prompts;     /* chat: one (the rendered conversation) */
    uint8_t **images;             /* chat: the image_url parts' bytes (PNG or JPEG), in order */
    size_t *image_len;
    int *image_w, *image_h;       /* their sizes in pixels (the span length follows from them) */
    int n_images;
    size_t n_prompts;
    int n;                        /* choices per prompt */
    long long max_tokens;         /* -1: until the context ends */
    double temperature, top_p, min_p;
    int top_k;                    /* 0: off (-1 in the request means off too) */
    int has_seed;
    uint64_t seed;
    char *stop[DS41_REQ_MAX_STOP];
    int n_stop;
    int32_t *stop_token_ids;      /* vLLM extension */
    size_t n_stop_token_ids;
    int stream, include_usage;
    int logprobs;                 /* 1: report the sampled token's logprob */
    int top_logprobs;             /* alternatives per position, 0..20 */
    int echo;                     /* completions: prepend the prompt */
    int ignore_eos;               /* vLLM extension */
    /* logits processing (src/engine/lproc.h) */
    double frequency_penalty, presence_penalty;   /* -2..2, 0 off */
    double repetition_penalty;    /* vLLM: (0, 2], 1 off */
    long long min_tokens;         /* vLLM: EOS and stop_token_ids banned before this many */
    int32_t *bias_id;             /* logit_bias: token ids (the vocabulary check comes later) */
    float *bias_val;              /* -100..100 */
    int n_bias;
    /* constrained output: response_format json_object / json_schema, structured_outputs,
     * guided_json / guided_regex / guided_choice, grammar (GBNF); NULL: none. grammar_src
     * names the member it came from; grammar_text its GBNF text. */
    ds41_grammar *grammar;
    char *grammar_text;
    const char *grammar_src;
    int skip_special_tokens;      /* vLLM extension, default 1 */
    int tokens_as_ids;            /* vLLM return_tokens_as_token_ids: logprob tokens as "token_id:N" */
    /* chat */
    int thinking;                 /* the prompt ends in <think>: output starts as reasoning */
    long long think_budget;       /* vLLM thinking_token_budget (Anthropic thinking.budget_tokens): at most
                                   * this many tokens of reasoning, then </think> is forced; -1: none */
    int tools;                    /* tools offered and tool_choice != "none": parse DSML calls */
    char *tool_choice_name;       /* a named function: the call is forced */
    int tool_required;            /* tool_choice "required": some call is forced */
    int parallel_tool_calls;      /* 0: generation stops after the first call */
    char *user;
} ds41_req;

/* An OpenAI error object {"error": {"message", "type", "param", "code"}} and its status. */
typedef struct ds41_req_error {
    int status;                   /* 400, 401, 404, 405, 413, 429, 500, 503 */
    char type[40];                /* invalid_request_error, authentication_error, ... */
    char param[64];               /* "" = null */
    char code[48];                /* "" = null */
    char message[600];
} ds41_req_error;

/* Fills e (status 400 unless given) and returns -1. */
int ds41_req_fail(ds41_req_error *e, int status, const char *type, const char *param, const char *code,
                  const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* Nesting depth of the JSON text outside strings (a pre-check before the recursive parser). */
int ds41_req_json_depth(const char *body, size_t len);

/* body[len] as a JSON object (depth-checked first); NULL with e set. json_decref it. */
json_t *ds41_req_load_body(const char *body, size_t len, ds41_req_error *e);

/* An image a request gives: a PNG (kind 0) or JPEG (kind 1) as base64. Checked in full when the
 * request is parsed: strict base64 (padding optional, nothing after it), the signature of the
 * declared type, and a decodable image within the limits of src/image/image.h. 0 on success,
 * with the bytes in *data (malloc'd; data may be NULL: checked, then dropped) and the size in
 * *w, *h (may be NULL); -1 with a 400 whose message starts with field and whose param is param. */
int ds41_req_image_b64(int kind, const char *b64, size_t n, const char *param, const char *field, uint8_t **data,
                       size_t *len, int *w, int *h, ds41_req_error *e);
/* The kind of a MIME type: 0 image/png, 1 image/jpeg, -1 anything else. */
int ds41_req_image_kind(const char *mime);
/* The same for a URL: only data:image/png;base64,... and data:image/jpeg;base64,... are served;
 * an http(s) URL is refused as a fetch this server never makes. */
int ds41_req_image_url(const char *url, const char *param, const char *field, uint8_t **data, size_t *len, int *w,
                       int *h, ds41_req_error *e);

/* Parses and validates body[len]. 0 on success (r filled; ds41_req_free it), -1 with e set
 * (r is then already freed). Never reads past len; the body needs no NUL. */
int ds41_req_parse(ds41_req_kind kind, const char *body, size_t len, ds41_req *r, ds41_req_error *e);
void ds41_req_free(ds41_req *r);

/* /tokenize body: {"prompt": text, "add_special_tokens"?} or {"messages": [...], chat options}.
 * On success *text is the text to encode (malloc'd) and *add_special whether to apply the
 * post-processor (chat prompts carry their BOS already). */
int ds41_req_parse_tokenize(const char *body, size_t len, char **text, size_t *text_len, int *add_special,
                            ds41_req_error *e);
/* /detokenize body: {"tokens": [ids]} */
int ds41_req_parse_detokenize(const char *body, size_t len, int32_t **ids, size_t *n, ds41_req_error *e);

#endif
