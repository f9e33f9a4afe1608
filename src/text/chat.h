/* ds41 chat: renders a conversation into the DeepSeek V4.1 prompt text.
 *
 * A native C rendering of the official V4.1 chat encoding (the `encoding_dsv41.py` reference
 * encoder shipped with the model, as vendored by sglang and vLLM), no template engine:
 *
 *   <｜begin▁of▁sentence｜>
 *   [<｜System｜>[Reasoning Effort: N (range 1-100, ...)\n\n]system text[\n\n## Tools ...]]
 *   <｜User｜>user text<｜Assistant｜><think>            (thinking mode, turn being generated)
 *   <｜User｜>user text<｜Assistant｜></think>           (chat mode, or an earlier turn whose
 *                                                         reasoning was dropped)
 *   [reasoning</think>]answer[\n\n<｜DSML｜ calls>...]<｜end▁of▁sentence｜>
 *
 * Rules the renderer follows (all from the reference encoder):
 * - Tool messages become <tool_result>...</tool_result> blocks of a user turn; consecutive
 *   user/tool messages merge into one user turn, parts joined by "\n\n".
 * - Thinking mode with drop_thinking (the default): assistant turns before the last user turn
 *   lose their reasoning, and developer messages before it are dropped. Any message carrying
 *   tools turns dropping off for the whole conversation.
 * - The reasoning-effort line is rendered only in thinking mode, once, at the first message.
 * - A mid-conversation system message counts as a user turn (it opens an assistant turn).
 *
 * Strings are UTF-8 and NUL-terminated (a NUL inside a message is refused by the JSON parser).
 * See tests/chat/README.md for the vectors the renderer is tested against. */
#ifndef DS41_CHAT_H
#define DS41_CHAT_H

#include <stddef.h>

#include "common.h"

typedef enum ds41_chat_role {
    DS41_ROLE_SYSTEM,
    DS41_ROLE_USER,
    DS41_ROLE_ASSISTANT,
    DS41_ROLE_TOOL,            /* a tool result; rendered inside a user turn */
    DS41_ROLE_DEVELOPER,       /* rendered like a user turn; may carry tools */
    DS41_ROLE_LATEST_REMINDER, /* <｜latest_reminder｜> context line (date, place, ...) */
} ds41_chat_role;

/* Quick-instruction tasks of the reference encoder: a message with a task ends with the task
 * token (`action`: an assistant header then <｜action｜>) instead of the assistant header. */
typedef enum ds41_chat_task {
    DS41_TASK_NONE,
    DS41_TASK_ACTION,
    DS41_TASK_QUERY,
    DS41_TASK_AUTHORITY,
    DS41_TASK_DOMAIN,
    DS41_TASK_TITLE,
    DS41_TASK_READ_URL,
} ds41_chat_task;

/* One part of an array-valued content (OpenAI content parts). */
typedef enum ds41_chat_part_kind {
    DS41_PART_TEXT,        /* text; an image part is stored as TEXT holding the image placeholder */
    DS41_PART_TOOL_RESULT, /* text = the tool output, id = tool_use_id */
    DS41_PART_OTHER,       /* an unsupported part: text = its type name ("[Unsupported TYPE]") */
} ds41_chat_part_kind;

typedef struct ds41_chat_part {
    ds41_chat_part_kind kind;
    char *text;
    char *id;   /* TOOL_RESULT only; may be NULL */
} ds41_chat_part;

/* An assistant tool call, rendered as DSML. arguments_json is a JSON object text (what the
 * OpenAI API carries in function.arguments); it is parsed at render time. */
typedef struct ds41_chat_tool_call {
    char *id;             /* may be NULL; orders tool results (see the reference encoder) */
    char *name;
    char *arguments_json;
} ds41_chat_tool_call;

typedef struct ds41_chat_message {
    ds41_chat_role role;
    char *content;             /* NULL: absent (renders as "") */
    /* Array-valued content: the parts; content then holds the text parts joined by "\n\n"
     * (what non-user roles render). has_parts distinguishes [] from a plain string. */
    ds41_chat_part *parts;
    size_t n_parts;
    int has_parts;
    char *reasoning_content;   /* NULL: absent */
    ds41_chat_tool_call *tool_calls;
    size_t n_tool_calls;
    char *tool_call_id;        /* role TOOL: the call this result answers; may be NULL */
    /* Tools offered in this message (system/developer): each a JSON text of the function
     * definition ({"name", "description", "parameters"}), i.e. the "function" member of an
     * OpenAI tool. */
    char **tools_json;
    size_t n_tools;
    char *response_format_json; /* NULL: none */
    ds41_chat_task task;
    int wo_eos;                 /* an assistant message rendered without end of sentence */
} ds41_chat_message;

typedef struct ds41_chat {
    ds41_chat_message *msgs;
    size_t n, cap;
} ds41_chat;

typedef struct ds41_chat_options {
    int thinking;               /* 0: chat mode (default), 1: thinking mode */
    int reasoning_effort;       /* 1..100; 0 = the default ("high" = 50). Thinking mode only. */
    int drop_thinking;          /* 1 (default): drop earlier reasoning as the reference does */
    int add_generation_prompt;  /* 1 (default): the assistant header after the last turn */
    int continue_final_message; /* 1: the last message is an assistant prefill to continue */
    int add_bos;                /* 1 (default): start with <｜begin▁of▁sentence｜> */
} ds41_chat_options;

/* Token strings of the encoding (UTF-8). */
#define DS41_CHAT_BOS "<｜begin▁of▁sentence｜>"
#define DS41_CHAT_EOS "<｜end▁of▁sentence｜>"
#define DS41_CHAT_IMAGE_PLACEHOLDER "<｜deepseek_image｜>"

void ds41_chat_options_init(ds41_chat_options *o);

/* Parses a reasoning effort: "low" (25), "high" (50), "xhigh" (75), "max" (100), or an
 * integer 1..100. */
int ds41_chat_effort_parse(const char *s, int *effort, ds41_err *err);

void ds41_chat_init(ds41_chat *c);
void ds41_chat_free(ds41_chat *c);

/* Appends a message with copies of content / reasoning (either may be NULL) and returns it
 * (further fields may then be set; they are owned by the chat and freed with it: use
 * ds41_chat_strdup for strings). Returns NULL on allocation failure. */
ds41_chat_message *ds41_chat_push(ds41_chat *c, ds41_chat_role role, const char *content,
                                  const char *reasoning_content, ds41_err *err);
int ds41_chat_add_tool_call(ds41_chat_message *m, const char *id, const char *name,
                            const char *arguments_json, ds41_err *err);
char *ds41_chat_strdup(const char *s);

/* Parses an OpenAI-style conversation (jansson) into c, and the options it carries into opts
 * (which the caller initialises; fields absent from the JSON are left as they are). Accepted:
 *   [ message, ... ]
 *   { "messages": [ message, ... ],
 *     "thinking": bool  or  "thinking_mode": "chat" | "thinking",
 *     "reasoning_effort": "low" | "high" | "xhigh" | "max" | 1..100,
 *     "drop_thinking": bool, "add_generation_prompt": bool, "continue_final_message": bool,
 *     "add_bos": bool,
 *     "tools": [ {"type": "function", "function": {...}}, ... ],   (given to the first system
 *               message; an empty one is put first when there is none, as vLLM serves)
 *     "chat_template_kwargs": { "thinking": ..., "reasoning_effort": ..., "drop_thinking": ... } }
 * message:
 *   { "role": "system" | "user" | "assistant" | "tool" | "developer" | "latest_reminder",
 *     "content": string | null | [ {"type": "text", "text": ...}
 *                                 | {"type": "image_url", "image_url": {"url": ...} | url}
 *                                 | {"type": "image", ...}
 *                                 | {"type": "tool_result", "content": string, "tool_use_id": ...} ],
 *     "reasoning_content": string,  "tool_calls": [ {"id"?, "type": "function",
 *     "function": {"name": string, "arguments": JSON-object string | object}} ],
 *     "tool_call_id": string, "tools": [...], "response_format": {...},
 *     "task": "action" | "query" | "authority" | "domain" | "title" | "read_url",
 *     "wo_eos": bool }
 * Other members are ignored (OpenAI requests carry model, temperature, name, ...). Bad input
 * (unknown role, content of the wrong type, an image placeholder typed into text, ...) fails
 * with a message naming the member, e.g. "messages[2].content: expected a string, an array or
 * null". `what` names the input in messages (a file name); may be NULL. Messages are one line.
 * Default options (ds41_chat_options_init) are the reference harness's: chat mode, effort
 * "high", earlier reasoning dropped. On failure c may hold some messages: ds41_chat_free it. */
int ds41_chat_parse_json(const char *json, size_t len, const char *what, ds41_chat *c,
                         ds41_chat_options *opts, ds41_err *err);

/* Renders the conversation to the prompt text (*out malloc'd, NUL-terminated, *len bytes). */
int ds41_chat_render(const ds41_chat *c, const ds41_chat_options *opts, char **out, size_t *len,
                     ds41_err *err);

#endif
