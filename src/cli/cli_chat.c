/* ds41 chat: a conversation with a checkpoint in the V4.1 prompt format (README, ds41 chat).
 *
 * Each turn renders the whole conversation with the chat-template renderer (src/text/chat.h,
 * the same as ds41 chat-template), tokenizes it, and feeds only what the session does not
 * hold yet: when the tokens already in the session (the earlier prompt and the generated
 * answer) are a prefix of the new rendering, just the suffix is fed; otherwise (the answer
 * re-tokenizes differently, or thinking mode dropped the earlier reasoning from the history)
 * the session is reset and the whole rendering is prefilled. The answer is sampled token by
 * token, streamed through the tokenizer's UTF-8-safe decoder, and stops at the end of sentence
 * (the end of an assistant turn), a <｜User｜> / <｜Assistant｜> marker, -n tokens or the end of
 * the context.
 *
 * On a terminal: a "> " prompt, line editing and history when built with libedit (the history
 * kept in ${XDG_STATE_HOME:-~/.local/state}/ds41/chat_history), Ctrl-C stops the answer being
 * written (or clears the line at the prompt) and Ctrl-D quits, a progress line on stderr for
 * loading and prefills that take more than two seconds. Otherwise one user message per input
 * line and each answer on stdout followed by a newline, nothing else (thinking-mode reasoning,
 * command feedback and --verbose statistics go to stderr), so it can be scripted. Commands
 * (chat_command): /help, /reset (forget the conversation, keep the system message), /system
 * [TEXT] (set or clear it), /save FILE (the conversation as a messages JSON that ds41
 * chat-template reads), /exit; "//text" sends "/text"; empty lines are skipped.
 *
 * --spec (default auto with DSpark stages, docs/speculative.md): after each token the drafter
 * proposes a block, K drafts are chosen (fixed:K, or the confidence scheduler over the
 * verify-width curve: the cache file, else measured once before the first answer) and
 * verified in one forward (ds41_spec_verify). K is cut before the first draft that is a stop
 * token and to the tokens -n leaves, so the session holds exactly what plain decoding would
 * have fed (the history reuse is unchanged; exact greedy answers are identical to --spec off). */
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef DS41_HAVE_LIBEDIT
#include <editline/readline.h>
#endif

#include "chat.h"
#include "cli.h"
#include "cli_args.h"
#include "cli_progress.h"
#include "dist.h"
#include "cli_spec.h"
#include "common.h"
#include "ds41.h"
#include "tokenizer.h"
#include "cli_vprompt.h"

static const char *CHAT_USAGE =
    "usage: ds41 chat -m DIR [--system TEXT] [--thinking] [-n N] [sampling and engine options]\n"
    "  -m, --model DIR        checkpoint directory (with tokenizer.json)\n"
    "  --system TEXT          system message at the start of the conversation\n"
    "  --thinking             thinking mode (default chat mode): the reasoning is shown (dimmed on a\n"
    "                         terminal, on stderr when scripted) and dropped from the history\n"
    "  -n, --n-predict N      at most N tokens per answer (default 256)\n"
    "  --temp T               temperature (default 0 = greedy, first maximum)\n"
    "  --top-k K, --top-p P, --min-p P, --seed S   sampling filters and seed\n"
    "  -t, --threads N        fast-mode threads (default 1)\n"
    "  -c, --ctx-size N       context size in tokens (default 4096, at most the model's)\n"
    "  --prefill MODE         ced (default), full, ced-replay\n"
    "  --chunk N|auto|off     prefill in chunks of N tokens (default auto: over 2048 tokens)\n"
    "  --index-k own|official index-K reading of spec 3.9 / 10.1 (default own)\n"
    "  --exact                exact kernels (also DS41_EXACT=1); default fast\n"
    DS41_CLI_ENGRAM_USAGE
    "  --spec off|fixed:K|auto  speculative decoding with the DSpark drafter (default auto when the\n"
    "                         model has DSpark stages; the verify-width curve as in ds41 run: cached,\n"
    "                         else measured once before the first answer)\n"
    "  --verbose              one statistics line per turn on stderr (tokens rendered, reused, prefilled,\n"
    "                         generated, tokens/s, why it stopped; with --spec drafted / accepted)\n"
    "Input: one user message per line. Commands (type /help in the chat):\n"
    "  /help  /reset  /system [TEXT]  /save FILE  /image FILE  /exit   //text sends a message that starts with '/'\n"
    "On a terminal: line editing and history, Ctrl-C stops an answer, Ctrl-D (or /exit) quits.\n"
    "Examples:\n"
    "  ds41 chat -m models/demo\n"
    "  ds41 chat -m models/demo --system \"You are terse.\" -n 64 --temp 0.7 --seed 1\n"
    "  printf 'What does telescope mean?\\n' | ds41 chat -m models/demo     # one answer line per input line\n";

static const char *CHAT_HELP =
    "  /help           this list\n"
    "  /reset          forget the conversation (the system message stays)\n"
    "  /system TEXT    set the system message (/system alone clears it); the conversation is kept\n"
    "  /save FILE      write the conversation as a messages JSON (ds41 chat-template -m DIR FILE renders it)\n"
    "  /image FILE     attach a PNG or JPEG to the next message (a model with a vision tower); the\n"
    "                  message then starts with the image, as a user message whose image part comes first\n"
    "  /exit           quit (also Ctrl-D)\n"
    "  //text          send a message that starts with '/'\n"
    "  Ctrl-C          stop the answer being written\n";

/* Ctrl-C on a terminal: stops the answer (checked between tokens), not the program. */
static volatile sig_atomic_t chat_interrupted;
static void on_sigint(int sig) { (void)sig; chat_interrupted = 1; }

/* ---------------------------------------------------------------- growable buffers */

typedef struct ids_buf { int32_t *v; size_t n, cap; } ids_buf;
typedef struct str_buf { char *v; size_t n, cap; } str_buf;

static int ids_push(ids_buf *b, int32_t x) {
    if (b->n == b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        int32_t *nv = realloc(b->v, nc * sizeof *nv);
        if (!nv) return -1;
        b->v = nv;
        b->cap = nc;
    }
    b->v[b->n++] = x;
    return 0;
}

static int str_add(str_buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *nv = realloc(b->v, nc);
        if (!nv) return -1;
        b->v = nv;
        b->cap = nc;
    }
    memcpy(b->v + b->n, s, n);
    b->n += n;
    b->v[b->n] = 0;
    return 0;
}

/* ---------------------------------------------------------------- the conversation */

typedef struct turn { char *user, *answer, *reasoning; } turn;

typedef struct chat_state {
    char *system;   /* owned; NULL: none */
    ds41_chat_options opts;
    turn *t;
    size_t n, cap;
} chat_state;

static void history_clear(chat_state *c) {
    for (size_t i = 0; i < c->n; i++) { free(c->t[i].user); free(c->t[i].answer); free(c->t[i].reasoning); }
    c->n = 0;
}

/* s without the image placeholder (a copy): an answer that generated the placeholder token
 * has no image there, and every placeholder of a rendering with images is an image slot. */
static char *no_placeholder(const char *s) {
    if (!s) return NULL;
    char *o = strdup(s), *q;
    size_t phl = strlen(DS41_CHAT_IMAGE_PLACEHOLDER);
    while (o && (q = strstr(o, DS41_CHAT_IMAGE_PLACEHOLDER))) memmove(q, q + phl, strlen(q + phl) + 1);
    return o;
}

/* Renders the history plus the new user message (with the assistant header). images: the
 * conversation has images, so placeholders the model generated are left out of its answers. */
static int render(const chat_state *c, const char *user, int images, char **text, size_t *len, ds41_err *err) {
    ds41_chat chat;
    ds41_chat_init(&chat);
    int rc = -1;
    if (c->system && !ds41_chat_push(&chat, DS41_ROLE_SYSTEM, c->system, NULL, err)) goto out;
    for (size_t i = 0; i < c->n; i++) {
        if (!ds41_chat_push(&chat, DS41_ROLE_USER, c->t[i].user, NULL, err)) goto out;
        char *a = images ? no_placeholder(c->t[i].answer) : NULL, *r = images ? no_placeholder(c->t[i].reasoning) : NULL;
        ds41_chat_message *m = ds41_chat_push(&chat, DS41_ROLE_ASSISTANT, images ? a : c->t[i].answer,
                                              images ? r : c->t[i].reasoning, err);
        free(a);
        free(r);
        if (!m) goto out;
    }
    if (!ds41_chat_push(&chat, DS41_ROLE_USER, user, NULL, err)) goto out;
    rc = ds41_chat_render(&chat, &c->opts, text, len, err);
out:
    ds41_chat_free(&chat);
    return rc;
}

/* ---------------------------------------------------------------- output */

typedef struct out_ctx {
    int interactive;    /* stdin is a terminal */
    int color;          /* stdout is a terminal: reasoning dimmed on stdout */
} out_ctx;

static void show_reasoning(const out_ctx *o, const char *s, size_t n, int *started) {
    if (!n) return;
    FILE *f = o->color ? stdout : stderr;
    if (!*started) {
        fputs(o->color ? "\033[2m" : "thinking: ", f);
        *started = 1;
    }
    fwrite(s, 1, n, f);
    fflush(f);
}

static void end_reasoning(const out_ctx *o, int *started) {
    if (!*started) return;
    if (o->color) fputs("\033[0m\n", stdout);
    else fputc('\n', stderr);
    fflush(o->color ? stdout : stderr);
    *started = 2;
}

static char *read_line_here(const out_ctx *o);

/* One line of input (without its newline) or NULL at the end of input; malloc'd. Under
 * mpiexec rank 0 reads it (the launcher gives stdin to rank 0 only) and every rank gets that
 * line, so that all of them run the same turn (docs/distributed.md). */
static char *read_line(const out_ctx *o) {
    if (ds41_dist_size() < 2) return read_line_here(o);
    char *line = ds41_dist_rank() == 0 ? read_line_here(o) : NULL;
    long long n = line ? (long long)strlen(line) : -1;
    ds41_dist_bcast_wait(&n, sizeof n, 0);   /* no limit: a person may take a while to type */
    if (n < 0) { free(line); return NULL; }
    if (!line && !(line = malloc((size_t)n + 1))) {
        fprintf(stderr, "ds41 chat: out of memory\n");
        return NULL;   /* ends this rank's loop: the job's end agreement then stops the others */
    }
    ds41_dist_bcast(line, (size_t)n);
    line[n] = 0;
    return line;
}

/* One line read here; Ctrl-C at the prompt gives an empty line (skipped), not the end. */
static char *read_line_here(const out_ctx *o) {
    chat_interrupted = 0;
#ifdef DS41_HAVE_LIBEDIT
    if (o->interactive) {
        char *l = readline("> ");
        if (!l && chat_interrupted) { chat_interrupted = 0; putchar('\n'); return strdup(""); }
        if (l && *l) add_history(l);
        return l;
    }
#endif
    if (o->interactive) { fputs("> ", stdout); fflush(stdout); }
    char *line = NULL;
    size_t cap = 0;
    errno = 0;
    ssize_t n = getline(&line, &cap, stdin);
    if (n < 0 && errno == EINTR && chat_interrupted) {
        clearerr(stdin);
        chat_interrupted = 0;
        putchar('\n');
        free(line);
        return strdup("");
    }
    if (n < 0) { free(line); return NULL; }
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    return line;
}

/* ---------------------------------------------------------------- history file, /save */

#ifdef DS41_HAVE_LIBEDIT
/* ${XDG_STATE_HOME:-$HOME/.local/state}/ds41/chat_history (directories made); NULL without HOME */
static char *history_path(void) {
    const char *xs = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    char base[4096];
    if (xs && xs[0]) snprintf(base, sizeof base, "%s/ds41", xs);
    else if (home && home[0]) snprintf(base, sizeof base, "%s/.local/state/ds41", home);
    else return NULL;
    for (char *p = base + 1; *p; p++)
        if (*p == '/') { *p = 0; mkdir(base, 0700); *p = '/'; }
    mkdir(base, 0700);
    size_t n = strlen(base) + sizeof "/chat_history";
    char *path = malloc(n);
    if (path) snprintf(path, n, "%s/chat_history", base);
    return path;
}
#endif

/* The conversation as a messages JSON array (the input of ds41 chat-template). */
static int save_conversation(const chat_state *c, const char *path, char *msg, size_t cap) {
    json_t *a = json_array();
    int bad = !a;
    if (!bad && c->system) bad |= json_array_append_new(a, json_pack("{s:s, s:s}", "role", "system", "content", c->system));
    for (size_t i = 0; i < c->n && !bad; i++) {
        bad |= json_array_append_new(a, json_pack("{s:s, s:s}", "role", "user", "content", c->t[i].user));
        json_t *m = json_pack("{s:s, s:s}", "role", "assistant", "content", c->t[i].answer);
        if (m && c->t[i].reasoning && c->t[i].reasoning[0])
            json_object_set_new(m, "reasoning_content", json_string(c->t[i].reasoning));
        bad |= json_array_append_new(a, m);
    }
    if (bad) { json_decref(a); snprintf(msg, cap, "out of memory"); return -1; }
    int rc = json_dump_file(a, path, JSON_INDENT(2) | JSON_ENSURE_ASCII);
    size_t nm = json_array_size(a);
    json_decref(a);
    if (rc) { snprintf(msg, cap, "cannot write %s: %s", path, errno ? strerror(errno) : "write failed"); return -1; }
    snprintf(msg, cap, "saved %zu messages to %s", nm, path);
    return 0;
}

/* ---------------------------------------------------------------- the command */

int ds41_cli_chat(int argc, char **argv) {
    const char *dir = NULL, *system = NULL, *spec_arg = NULL;
    char *hist_file = NULL;
    int thinking = 0, verbose = 0;
    ds41_cli_gen g;
    ds41_cli_gen_default(&g);
    g.n_predict = 256;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int ga = ds41_cli_gen_arg("chat", argc, argv, &i, DS41_CLI_SAMPLING | DS41_CLI_NPREDICT | DS41_CLI_ENGINE |
                                  DS41_CLI_CTX | DS41_CLI_PREFILL, &g);
        if (ga < 0) return 2;
        if (ga > 0) continue;
        int has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { fputs(CHAT_USAGE, stdout); return 0; }
        else if (!strcmp(a, "--thinking")) thinking = 1;
        else if (!strcmp(a, "--verbose")) verbose = 1;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "--system") || !strcmp(a, "--spec")) {
            if (!has) { fprintf(stderr, "ds41 chat: %s needs a value\n", a); return 2; }
            if (!strcmp(a, "--system")) system = argv[++i];
            else if (!strcmp(a, "--spec")) spec_arg = argv[++i];
            else dir = argv[++i];
        } else { fprintf(stderr, "ds41 chat: unknown option '%s'\n%s", a, CHAT_USAGE); return 2; }
    }
    if (!dir) {
        fprintf(stderr, "ds41 chat: -m DIR is required: the checkpoint directory, e.g. ds41 chat -m models/demo "
                "(ds41 chat --help for the options)\n");
        return 2;
    }

    int rc = 1;
    ds41_err err;
    char ebuf[1024];
    ds41_tokenizer *tok = NULL;
    ds41_engine *e = NULL;
    ds41_session *s = NULL;
    ids_buf held = { 0 }, gen = { 0 };
    str_buf answer = { 0 }, reasoning = { 0 };
    chat_state c = { 0 };
    char *line = NULL, *piece = NULL;
    int turn_failed = 0;
    int32_t *spec_out = NULL;
    /* images of the conversation in order: [0, img_held) are in the history, the rest are
     * attached to the next message */
    ds41_cli_vimage *imgs = NULL;
    int n_imgs = 0, img_held = 0;
    ds41_cli_vprompt vp = { 0 };

    struct stat dsb;
    if (stat(dir, &dsb) != 0) {
        fprintf(stderr, "ds41 chat: %s: cannot open: %s%s\n", dir, strerror(errno),
                errno == ENOENT ? " (the bundled model is models/demo, run from the repository root)" : "");
        goto out;
    }
    if (!ds41_cli_file_exists(dir, "tokenizer.json")) {
        fprintf(stderr, "ds41 chat: %s has no tokenizer.json: chat needs the model's tokenizer\n", dir);
        goto out;
    }
    if (ds41_tokenizer_load(dir, &tok, &err)) { fprintf(stderr, "ds41 chat: %s\n", err.msg); goto out; }
    ds41_load_params lp;
    ds41_load_params_default(&lp);
    lp.exact = g.exact;
    lp.load = g.load;
    lp.readahead = g.readahead;
    lp.engram_mode = g.engram_mode;
    lp.engram_cache = g.engram_cache;
    lp.n_threads = g.threads;
    lp.ctx_size = g.ctx;
    char plabel[128];
    snprintf(plabel, sizeof plabel, "loading %s", dir);
    ds41_progress *pg = ds41_progress_start(plabel);
    e = ds41_load(dir, &lp, ebuf, sizeof ebuf);
    ds41_progress_end(pg);
    if (!e) { fprintf(stderr, "ds41 chat: %s\n", ebuf); goto out; }
    int V = ds41_vocab_size(e);
    long long C = ds41_ctx_size(e);
    if (ds41_tokenizer_vocab_size(tok) > V) {
        fprintf(stderr, "ds41 chat: %s/tokenizer.json has ids up to %d but the model's vocabulary is 0..%d: "
                "the tokenizer does not belong to this checkpoint\n", dir, ds41_tokenizer_vocab_size(tok) - 1, V - 1);
        goto out;
    }
    ds41_session_params sp;
    ds41_session_params_default(&sp);
    sp.prefill = g.prefill;
    sp.chunk = g.chunk;
    sp.index_k = g.index_k;
    int B = ds41_draft_block_size(e);
    ds41_cli_spec spc;
    if (ds41_cli_spec_parse("chat", spec_arg, B, 0, &spc)) { rc = 2; goto out; }
    sp.draft = spc.mode != DS41_SPEC_OFF;
    ds41_spec_curve curve;
    memset(&curve, 0, sizeof curve);
    int have_curve = 0;
    spec_out = malloc((size_t)(B + 2) * sizeof *spec_out);
    if (!spec_out) goto oom;
    s = ds41_session_open(e, &sp, ebuf, sizeof ebuf);
    if (!s) { fprintf(stderr, "ds41 chat: %s\n", ebuf); goto out; }
    ds41_session_set_sampling(s, g.temp, g.top_k, g.top_p, g.min_p, g.seed);

    /* the end of an assistant turn: the end of sentence, or the model opening a new turn */
    int32_t stops[3] = { ds41_tokenizer_eos(tok), ds41_token_id(tok, "<｜User｜>"), ds41_token_id(tok, "<｜Assistant｜>") };
    int32_t end_think = ds41_token_id(tok, "</think>");
    if (system && !(c.system = strdup(system))) goto oom;
    ds41_chat_options_init(&c.opts);
    c.opts.thinking = thinking;
    out_ctx oc = { isatty(0), isatty(1) };
    size_t dcap = ds41_detok_stream_cap(tok);
    piece = malloc(dcap + 1);
    if (!piece) { fprintf(stderr, "ds41 chat: out of memory\n"); goto out; }
    int n_turn = 0;
    /* command feedback: on the terminal where the user typed, else on stderr */
    FILE *say = oc.interactive ? stdout : stderr;
    if (oc.interactive) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_sigint;   /* no SA_RESTART: a read at the prompt returns */
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
#ifdef DS41_HAVE_LIBEDIT
        if ((hist_file = history_path())) read_history(hist_file);
#endif
        fprintf(stdout, "ds41 chat with %s: /help for the commands, Ctrl-D to quit\n", dir);
    }

    for (;;) {
        if (!(line = read_line(&oc))) {
            if (oc.interactive) putchar('\n');   /* end of input at the prompt */
            break;
        }
        if (line[0] == '/' && line[1] != '/') {
            /* a command: the word after '/', then its argument */
            char *arg = line + 1 + strcspn(line + 1, " \t");
            if (*arg) *arg++ = 0;
            arg += strspn(arg, " \t");
            const char *cmd = line + 1;
            if (!strcmp(cmd, "exit") || !strcmp(cmd, "quit")) break;
            if (!strcmp(cmd, "help")) fputs(CHAT_HELP, say);
            else if (!strcmp(cmd, "reset")) {
                history_clear(&c);
                while (n_imgs > 0) ds41_cli_image_free(&imgs[--n_imgs]);
                img_held = 0;
                ds41_session_reset(s);
                held.n = 0;
                if (verbose || oc.interactive) fprintf(say, "chat: conversation reset\n");
            } else if (!strcmp(cmd, "system")) {
                /* the next turn renders with it; the session's tokens no longer prefix the
                 * rendering, so that turn prefills the conversation again */
                free(c.system);
                c.system = NULL;
                if (*arg && !(c.system = strdup(arg))) goto oom;
                if (verbose || oc.interactive)
                    fprintf(say, "chat: system message %s\n", c.system ? "set" : "cleared");
            } else if (!strcmp(cmd, "save")) {
                char msg[512];
                if (!*arg) fprintf(stderr, "ds41 chat: /save needs a file name: /save conversation.json\n");
                else if (save_conversation(&c, arg, msg, sizeof msg)) fprintf(stderr, "ds41 chat: %s\n", msg);
                else if (verbose || oc.interactive) fprintf(say, "chat: %s\n", msg);
            } else if (!strcmp(cmd, "image")) {
                ds41_cli_vimage *ni = *arg ? realloc(imgs, (size_t)(n_imgs + 1) * sizeof *imgs) : NULL;
                if (*arg && !ni) goto oom;
                if (ni) imgs = ni;
                if (!*arg) fprintf(stderr, "ds41 chat: /image needs a file name: /image photo.png\n");
                else if (ds41_cli_image_load(e, arg, &imgs[n_imgs], &err)) fprintf(stderr, "ds41 chat: /image %s\n", err.msg);
                else if (n_imgs++, verbose || oc.interactive)
                    fprintf(say, "chat: %s attached to the next message (%d positions)\n", arg, imgs[n_imgs - 1].rows);
            } else {
                fprintf(stderr, "ds41 chat: unknown command '/%s': /help lists the commands (//%s sends it as a message)\n",
                        cmd, cmd);
            }
            free(line);
            line = NULL;
            continue;
        }
        if (line[0] == '/') memmove(line, line + 1, strlen(line));   /* "//text": the message "/text" */
        if (!line[0]) { free(line); line = NULL; continue; }
        if (strstr(line, DS41_CHAT_IMAGE_PLACEHOLDER)) {
            fprintf(stderr, "ds41 chat: the message contains the image placeholder %s: attach images with /image FILE\n",
                    DS41_CHAT_IMAGE_PLACEHOLDER);
            if (!oc.interactive) putchar('\n');   /* keep one answer line per message */
            turn_failed = 1;
            free(line);
            line = NULL;
            continue;
        }
        if (n_imgs > img_held) {
            /* the attached images first, each followed by a blank line (the rendering of a user
             * message whose image parts precede the text part) */
            size_t phl = strlen(DS41_CHAT_IMAGE_PLACEHOLDER), ll = strlen(line);
            char *m = malloc((size_t)(n_imgs - img_held) * (phl + 2) + ll + 1), *q = m;
            if (!m) goto oom;
            for (int k = img_held; k < n_imgs; k++, q += phl + 2) memcpy(q, DS41_CHAT_IMAGE_PLACEHOLDER "\n\n", phl + 2);
            memcpy(q, line, ll + 1);
            free(line);
            line = m;
        }
        n_turn++;

        /* ---- render, tokenize, find what the session already holds ---- */
        char *text = NULL;
        size_t tlen = 0, n_ids = 0;
        int32_t *ids = NULL;
        ds41_cli_vprompt_free(&vp);
        if (render(&c, line, n_imgs > 0, &text, &tlen, &err) ||
            (n_imgs ? ds41_cli_vprompt_text(&vp, tok, text, tlen, 0, imgs, n_imgs, ds41_model_dim(e),
                                            ds41_image_token_id(e), &err)
                    : ds41_tokenize(tok, text, tlen, 1, 0, &ids, &n_ids, &err))) {
            fprintf(stderr, "ds41 chat: %s\n", err.msg);
            free(text);
            free(ids);
            goto out;
        }
        free(text);
        if (n_imgs) {
            /* the expansion's ids, copied: the code below owns ids */
            if (!(ids = malloc((vp.n ? vp.n : 1) * sizeof *ids))) goto oom;
            memcpy(ids, vp.ids, vp.n * sizeof *ids);
            n_ids = vp.n;
        }
        if ((long long)n_ids + 1 > C) {
            fprintf(stderr, "ds41 chat: the conversation is %zu tokens with this message, the context holds %lld "
                    "(-c): /reset to start over\n", n_ids, C);
            free(ids);
            if (!oc.interactive) putchar('\n');   /* keep one answer line per message */
            fflush(stdout);
            turn_failed = 1;
            free(line);
            line = NULL;
            while (n_imgs > img_held) ds41_cli_image_free(&imgs[--n_imgs]);   /* they went with the message */
            continue;
        }
        size_t n_rendered = n_ids;
        size_t reuse = held.n > 0 && held.n < n_ids && !memcmp(held.v, ids, held.n * sizeof *ids) ? held.n : 0;
        if (reuse == 0 && held.n > 0) ds41_session_reset(s);
        double t0 = ds41_cli_now();
        snprintf(plabel, sizeof plabel, "prefill %zu tokens", n_ids - reuse);
        pg = ds41_progress_start(plabel);
        /* images only ever append to the conversation, so equal ids up to `reuse` are the
         * same images as well */
        int frc = n_imgs ? ds41_cli_vprompt_feed(s, &vp, reuse) : ds41_feed(s, ids + reuse, n_ids - reuse);
        ds41_progress_end(pg);
        double t_prefill = ds41_cli_now() - t0;
        held.n = 0;
        int bad = frc != 0;
        for (size_t i = 0; i < n_ids && !bad; i++) bad = ids_push(&held, ids[i]) != 0;
        free(ids);
        if (bad) {
            fprintf(stderr, "ds41 chat: %s\n", frc ? ds41_session_error(s) : "out of memory");
            goto out;
        }

        /* ---- generate ---- */
        ds41_detok_stream ds;
        ds41_detok_stream_init(&ds, tok);
        ds.skip_special = 1;
        gen.n = answer.n = reasoning.n = 0;
        int in_reasoning = thinking, shown = 0, n_gen = 0;
        const char *why = "length";
        if (spc.mode == DS41_SPEC_AUTO && !have_curve) {
            pg = ds41_progress_start("measuring the speculative verify costs");
            int crc = ds41_cli_spec_curve(e, dir, g.threads, g.exact, !verbose, &curve);
            ds41_progress_end(pg);
            if (crc) goto out;
            have_curve = 1;
        }
        /* speculative: the tokens of the last verify still to show (spec_out[qi..nq)), the
         * first qa of them already fed */
        int qi = 0, nq = 0, qa = 0;
        long long drafted = 0, accepted = 0;
        double t1 = ds41_cli_now();
        for (int k = 0; k < g.n_predict; k++) {
            /* Ctrl-C: stop here, once the tokens already in the session are shown (the
             * accepted drafts of the last verify), so the history and the session agree */
            if (chat_interrupted && qi >= qa) { why = "interrupted"; break; }
            int fed = qi < qa;
            int32_t t = qi < nq ? spec_out[qi++] : ds41_session_sample(s);
            n_gen++;
            int stop = 0;
            for (int j = 0; j < 3; j++) stop |= stops[j] >= 0 && t == stops[j];
            if (stop) { why = t == stops[0] ? "eos" : "end-of-turn"; break; }
            if (in_reasoning && t == end_think) {
                size_t fl = ds41_detok_stream_flush(&ds, piece, dcap);
                if (str_add(&reasoning, piece, fl)) goto oom;
                show_reasoning(&oc, piece, fl, &shown);
                end_reasoning(&oc, &shown);
                ds41_detok_stream_init(&ds, tok);
                ds.skip_special = 1;
                in_reasoning = 0;
            } else {
                size_t pl = ds41_detok_stream_push(&ds, t, piece, dcap);
                if (in_reasoning) {
                    if (str_add(&reasoning, piece, pl)) goto oom;
                    show_reasoning(&oc, piece, pl, &shown);
                } else {
                    if (pl) { fwrite(piece, 1, pl, stdout); fflush(stdout); }
                    if (ids_push(&gen, t)) goto oom;
                }
            }
            if (fed) {   /* an accepted draft: in the session already */
                if (ids_push(&held, t)) goto oom;
                continue;
            }
            if (ds41_session_pos(s) >= C) { why = "context"; break; }
            /* drafts after t: at most the tokens -n leaves, none from the first stop token on */
            int K = 0, km = spc.mode == DS41_SPEC_OFF ? 0 : ds41_spec_max_drafts(s);
            if (km > g.n_predict - n_gen) km = g.n_predict - n_gen;
            int32_t d[DS41_SPEC_MAX_DRAFTS];
            float cf[DS41_SPEC_MAX_DRAFTS];
            /* auto: no proposal when the gate says drafting cannot pay (a plain step) */
            if (km > 0 && spc.mode == DS41_SPEC_AUTO && have_curve && !ds41_spec_want_draft(s, &curve)) km = 0;
            if (km > 0) {
                if (ds41_session_draft(s, t, d, cf)) { fprintf(stderr, "\nds41 chat: %s\n", ds41_session_error(s)); goto out; }
                for (int i = 0; i < km; i++) {
                    int st = 0;
                    for (int j = 0; j < 3; j++) st |= stops[j] >= 0 && d[i] == stops[j];
                    if (st) { km = i; break; }
                }
                if (spc.mode == DS41_SPEC_FIXED) K = spc.k < km ? spc.k : km;
                else if (km > 0) ds41_spec_schedule(have_curve ? &curve : NULL, 1, B, cf, &km, &K);
            }
            if (K == 0) {
                if (ds41_feed(s, &t, 1)) {
                    fprintf(stderr, "\nds41 chat: %s\n", ds41_session_error(s));
                    goto out;
                }
            } else {
                int A = 0;
                int m = ds41_spec_verify(s, t, d, K, spec_out, NULL, &A);
                if (m < 0) { fprintf(stderr, "\nds41 chat: %s\n", ds41_session_error(s)); goto out; }
                qi = 0;
                nq = m;
                qa = A;
                drafted += K;
                accepted += A;
            }
            if (ids_push(&held, t)) goto oom;
        }
        double t_gen = ds41_cli_now() - t1;
        size_t fl = ds41_detok_stream_flush(&ds, piece, dcap);
        if (in_reasoning) {
            if (str_add(&reasoning, piece, fl)) goto oom;
            show_reasoning(&oc, piece, fl, &shown);
            end_reasoning(&oc, &shown);
        } else if (fl) {
            fwrite(piece, 1, fl, stdout);
        }
        putchar('\n');
        fflush(stdout);
        if (!strcmp(why, "interrupted")) {
            chat_interrupted = 0;
            fprintf(stderr, "%s(stopped: the answer so far stays in the conversation)%s\n", oc.color ? "\033[2m" : "",
                    oc.color ? "\033[0m" : "");
        }
        if (!strcmp(why, "context"))
            fprintf(stderr, "ds41 chat: the context of %lld tokens is full: /reset to start over\n", C);

        /* ---- history: the answer as generated (special tokens kept, so that it re-renders
         * to the same tokens); the reasoning is kept for the renderer to drop ---- */
        char *atext = NULL;
        size_t alen = 0;
        if (gen.n == 0) atext = strdup("");
        else if (ds41_detokenize(tok, gen.v, gen.n, 0, &atext, &alen, &err)) {
            fprintf(stderr, "ds41 chat: %s\n", err.msg);
            goto out;
        }
        if (!atext) goto oom;
        if (c.n == c.cap) {
            size_t nc = c.cap ? c.cap * 2 : 8;
            turn *nt = realloc(c.t, nc * sizeof *nt);
            if (!nt) { free(atext); goto oom; }
            c.t = nt;
            c.cap = nc;
        }
        c.t[c.n].user = line;
        img_held = n_imgs;
        c.t[c.n].answer = atext;
        c.t[c.n].reasoning = thinking ? strdup(reasoning.v ? reasoning.v : "") : NULL;
        c.n++;
        line = NULL;
        if (verbose) {
            char sx[96] = "";
            if (spc.mode != DS41_SPEC_OFF)
                snprintf(sx, sizeof sx, "; spec %s: drafted %lld, accepted %lld", spc.mode == DS41_SPEC_AUTO ? "auto" : "fixed",
                         drafted, accepted);
            fprintf(stderr, "chat: turn %d: rendered %zu tokens, reused %zu, prefilled %zu in %.3f s; generated %d in "
                    "%.3f s (%.1f tok/s), stop %s; context %lld/%lld%s\n", n_turn, n_rendered, reuse, n_rendered - reuse,
                    t_prefill, n_gen, t_gen, t_gen > 0 ? n_gen / t_gen : 0.0, why, ds41_session_pos(s), C, sx);
        }
    }
    rc = turn_failed ? 1 : 0;
    goto out;
oom:
    fprintf(stderr, "ds41 chat: out of memory\n");
out:
#ifdef DS41_HAVE_LIBEDIT
    if (hist_file) { write_history(hist_file); free(hist_file); }
#endif
    free(c.system);
    free(line);
    free(piece);
    free(spec_out);
    history_clear(&c);
    free(c.t);
    for (int k = 0; k < n_imgs; k++) ds41_cli_image_free(&imgs[k]);
    free(imgs);
    ds41_cli_vprompt_free(&vp);
    free(held.v);
    free(gen.v);
    free(answer.v);
    free(reasoning.v);
    ds41_session_close(s);
    ds41_unload(e);
    if (tok) ds41_tokenizer_free(tok);
    return rc;
}
