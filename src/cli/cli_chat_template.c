/* ds41 chat-template: renders an OpenAI-style messages JSON in the DeepSeek V4.1 prompt format
 * and prints the exact prompt text and its token ids (from DIR/tokenizer.json). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "cli.h"
#include "tokenizer.h"

#define MAX_INPUT_BYTES ((size_t)256 << 20)

static void usage(FILE *f) {
    fprintf(f,
        "usage: ds41 chat-template [-m DIR] FILE.json|- [options]\n"
        "\n"
        "Renders a conversation in the DeepSeek V4.1 prompt format. FILE.json is an array of\n"
        "messages ({\"role\", \"content\", \"reasoning_content\"?, \"tool_calls\"?, ...}) or an object\n"
        "{\"messages\": [...], \"thinking\": bool, \"reasoning_effort\": ..., \"tools\": [...]}\n"
        "(see src/text/chat.h). '-' reads standard input.\n"
        "\n"
        "Output: the prompt text, a newline, then a line 'ids: N N ...' (token ids from\n"
        "DIR/tokenizer.json, special tokens matched, nothing added: the text carries its BOS).\n"
        "\n"
        "options:\n"
        "  -m, --model DIR          checkpoint directory with tokenizer.json (needed for ids)\n"
        "  --json                   print {\"text\": ..., \"ids\": [...]} instead\n"
        "  --text                   print only the prompt text, byte for byte (no -m needed)\n"
        "  --thinking               thinking mode (the reply opens with <think>)\n"
        "  --no-thinking            chat mode (the default unless the file says otherwise)\n"
        "  --reasoning-effort X     low, high (default), xhigh, max, or 1..100 (thinking mode)\n"
        "  --keep-thinking          keep the reasoning of earlier turns (default: dropped)\n"
        "  --no-generation-prompt   do not open an assistant turn after the last message\n"
        "  --continue               continue the final assistant message (a prefill)\n"
        "  --no-bos                 do not start with <｜begin▁of▁sentence｜>\n"
        "Flags override what the file sets.\n");
}

static int read_input(const char *path, char **buf, size_t *len, ds41_err *err) {
    if (strcmp(path, "-")) return ds41_read_file(path, MAX_INPUT_BYTES, buf, len, err);
    size_t cap = 1 << 16, n = 0;
    char *p = malloc(cap + 1);
    if (!p) return ds41_errf(err, "stdin: out of memory");
    size_t got;
    while ((got = fread(p + n, 1, cap - n, stdin)) > 0) {
        n += got;
        if (n == cap) {
            if (cap >= MAX_INPUT_BYTES) {
                free(p);
                return ds41_errf(err, "stdin: input larger than %zu bytes", MAX_INPUT_BYTES);
            }
            char *q = realloc(p, cap * 2 + 1);
            if (!q) { free(p); return ds41_errf(err, "stdin: out of memory"); }
            p = q;
            cap *= 2;
        }
    }
    if (ferror(stdin)) { free(p); return ds41_errf(err, "stdin: read error"); }
    p[n] = 0;
    *buf = p;
    *len = n;
    return 0;
}

static int print_json(const char *text, size_t len, const int32_t *ids, size_t n_ids) {
    json_t *o = json_object();
    json_t *arr = json_array();
    int bad = !o || !arr || json_object_set_new(o, "text", json_stringn(text, len));
    for (size_t i = 0; !bad && i < n_ids; i++) bad = json_array_append_new(arr, json_integer(ids[i]));
    if (!bad) bad = json_object_set(o, "ids", arr);
    char *s = bad ? NULL : json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(arr);
    json_decref(o);
    if (!s) {
        fprintf(stderr, "ds41 chat-template: cannot write the JSON output\n");
        return 1;
    }
    puts(s);
    free(s);
    return 0;
}

int ds41_cli_chat_template(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *effort = NULL;
    int as_json = 0, text_only = 0, thinking = -1, keep = 0, no_gen = 0, cont = 0, no_bos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (++i >= argc) { fprintf(stderr, "ds41 chat-template: %s needs a directory\n", a); return 2; }
            model = argv[i];
        } else if (!strcmp(a, "--reasoning-effort")) {
            if (++i >= argc) { fprintf(stderr, "ds41 chat-template: %s needs a value\n", a); return 2; }
            effort = argv[i];
        }
        else if (!strcmp(a, "--json")) as_json = 1;
        else if (!strcmp(a, "--text")) text_only = 1;
        else if (!strcmp(a, "--thinking")) thinking = 1;
        else if (!strcmp(a, "--no-thinking")) thinking = 0;
        else if (!strcmp(a, "--keep-thinking")) keep = 1;
        else if (!strcmp(a, "--no-generation-prompt")) no_gen = 1;
        else if (!strcmp(a, "--continue")) cont = 1;
        else if (!strcmp(a, "--no-bos")) no_bos = 1;
        else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "ds41 chat-template: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (!file) file = a;
        else { fprintf(stderr, "ds41 chat-template: more than one input file ('%s', '%s')\n", file, a); return 2; }
    }
    if (!file) { fprintf(stderr, "ds41 chat-template: FILE.json (or - for stdin) is required\n"); usage(stderr); return 2; }
    if (as_json && text_only) { fprintf(stderr, "ds41 chat-template: --json and --text exclude each other\n"); return 2; }
    if (!text_only && !model) {
        fprintf(stderr, "ds41 chat-template: -m DIR is needed for token ids (or use --text)\n");
        return 2;
    }

    ds41_err err = { { 0 } };
    ds41_chat chat;
    ds41_chat_init(&chat);
    ds41_chat_options o;
    ds41_chat_options_init(&o);
    ds41_tokenizer *tok = NULL;
    char *json = NULL, *text = NULL;
    int32_t *ids = NULL;
    size_t jlen = 0, tlen = 0, n_ids = 0;
    int rc = 1;

    if (read_input(file, &json, &jlen, &err) ||
        ds41_chat_parse_json(json, jlen, strcmp(file, "-") ? file : "stdin", &chat, &o, &err))
        goto fail;
    if (thinking >= 0) o.thinking = thinking;
    if (effort && ds41_chat_effort_parse(effort, &o.reasoning_effort, &err)) goto fail;
    if (keep) o.drop_thinking = 0;
    if (no_gen) o.add_generation_prompt = 0;
    if (cont) o.continue_final_message = 1;
    if (no_bos) o.add_bos = 0;
    if (ds41_chat_render(&chat, &o, &text, &tlen, &err)) goto fail;

    if (text_only) {
        rc = fwrite(text, 1, tlen, stdout) == tlen ? 0 : 1;
        goto done;
    }
    /* Special-token strings in the rendered text are the format's own markers; the text
     * already starts with the BOS, so the post-processor adds nothing. */
    if (ds41_tokenizer_load(model, &tok, &err) ||
        ds41_tokenize(tok, text, tlen, 1, 0, &ids, &n_ids, &err))
        goto fail;
    if (as_json) {
        rc = print_json(text, tlen, ids, n_ids);
    } else {
        fwrite(text, 1, tlen, stdout);
        fputs("\nids:", stdout);
        for (size_t i = 0; i < n_ids; i++) printf(" %d", (int)ids[i]);
        putchar('\n');
        rc = 0;
    }
    goto done;
fail:
    fprintf(stderr, "ds41 chat-template: %s\n", err.msg);
done:
    if (fflush(stdout)) rc = 1;
    free(ids);
    if (tok) ds41_tokenizer_free(tok);
    free(text);
    free(json);
    ds41_chat_free(&chat);
    return rc;
}
