/* Chat renderer tests: every vector under tests/chat/{published,sglang,generated,constructed}
 * (NAME.json rendered must equal NAME.txt byte for byte; see tests/chat/README.md for where
 * each set comes from), then bad-input cases, the C API, and the JSON writer. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "chat_internal.h"
#include "check.h"

static const char *root(void) {
    const char *r = getenv("DS41_ROOT");
    return r && *r ? r : ".";
}

static int render_json(const char *json, ds41_chat_options *o, char **out, ds41_err *err) {
    ds41_chat c;
    ds41_chat_init(&c);
    int rc = ds41_chat_parse_json(json, strlen(json), "test", &c, o, err);
    if (!rc) rc = ds41_chat_render(&c, o, out, NULL, err);
    ds41_chat_free(&c);
    return rc;
}

/* Prints where got and want first differ, with a little context either side. */
static void show_diff(const char *got, size_t glen, const char *want, size_t wlen) {
    size_t i = 0;
    while (i < glen && i < wlen && got[i] == want[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    int gn = (int)((glen - from) < 80 ? glen - from : 80), wn = (int)((wlen - from) < 80 ? wlen - from : 80);
    printf("  first difference at byte %zu (got %zu bytes, want %zu)\n  got:  ...%.*s\n  want: ...%.*s\n",
           i, glen, wlen, gn, got + from, wn, want + from);
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Runs the vectors of one directory; returns how many it ran. */
static int run_vector_dir(const char *sub) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/chat/%s", root(), sub);
    DIR *d = opendir(dir);
    if (!d) {
        printf("FAIL chat/%s: cannot open %s\n", sub, dir);
        check_total_failed++;
        return 0;
    }
    char *names[512];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 512) {
        size_t l = strlen(e->d_name);
        if (l > 5 && !strcmp(e->d_name + l - 5, ".json")) names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_names);
    for (int i = 0; i < n; i++) {
        char in[1400], want_path[1400], name[512];
        size_t l = strlen(names[i]) - 5;
        snprintf(name, sizeof name, "chat/%s/%.*s", sub, (int)l, names[i]);
        snprintf(in, sizeof in, "%s/%s", dir, names[i]);
        snprintf(want_path, sizeof want_path, "%s/%.*s.txt", dir, (int)l, names[i]);
        CASE_BEGIN();
        char *json = NULL, *want = NULL, *got = NULL;
        size_t jlen = 0, wlen = 0, glen = 0;
        ds41_err err = { { 0 } };
        ds41_chat c;
        ds41_chat_init(&c);
        ds41_chat_options o;
        ds41_chat_options_init(&o);
        if (ds41_read_file(in, 1 << 24, &json, &jlen, &err) || ds41_read_file(want_path, 1 << 24, &want, &wlen, &err) ||
            ds41_chat_parse_json(json, jlen, in, &c, &o, &err) || ds41_chat_render(&c, &o, &got, &glen, &err)) {
            CHECK(0, "%s", err.msg);
        } else {
            CHECK(glen == wlen && !memcmp(got, want, wlen), "rendered text differs from %s", want_path);
            if (glen != wlen || memcmp(got, want, wlen)) show_diff(got, glen, want, wlen);
            CHECK(strlen(got) == glen, "length %zu but strlen %zu", glen, strlen(got));
        }
        ds41_chat_free(&c);
        free(json);
        free(want);
        free(got);
        case_end(name);
        free(names[i]);
    }
    return n;
}

static void vector_counts(void) {
    /* The published reference goldens are 5; the suite as a whole must have at least 20. */
    int n = run_vector_dir("published");
    int m = run_vector_dir("sglang") + run_vector_dir("generated") + run_vector_dir("constructed");
    CASE_BEGIN();
    CHECK(n == 5, "published vectors: %d, want 5", n);
    CHECK(n + m >= 20, "only %d vectors", n + m);
    case_end("chat_vector_count");
}

/* ---------------------------------------------------------------- bad input */

static void expect_error(const char *json, const char *needle) {
    ds41_chat_options o;
    ds41_chat_options_init(&o);
    char *out = NULL;
    ds41_err err = { { 0 } };
    int rc = render_json(json, &o, &out, &err);
    CHECK(rc == -1, "accepted %s", json);
    CHECK(rc == -1 && strstr(err.msg, needle), "error for %s is '%s', want it to mention '%s'", json, err.msg, needle);
    CHECK(!out, "output set on failure");
    free(out);
}

static void chat_bad_input(void) {
    expect_error("", "invalid JSON");
    expect_error("[{\"role\": \"user\", \"content\": \"x\"}", "invalid JSON");
    expect_error("42", "expected an array of messages");
    expect_error("{\"msgs\": []}", "messages: expected an array");
    expect_error("[{\"role\": \"robot\", \"content\": \"x\"}]", "messages[0].role: unknown role 'robot'");
    expect_error("[{\"content\": \"x\"}]", "messages[0].role: expected a string");
    expect_error("[\"user\"]", "messages[0]: expected an object");
    expect_error("[{\"role\": \"user\", \"content\": 5}]", "messages[0].content: expected a string, an array");
    expect_error("[{\"role\": \"user\", \"content\": {\"text\": \"x\"}}]", "messages[0].content: expected");
    expect_error("[{\"role\": \"user\", \"content\": [{\"text\": \"x\"}]}]", "messages[0].content[0]: expected an object with a string \"type\"");
    expect_error("[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": 3}]}]", "content[0].text: expected a string");
    expect_error("[{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]", "image part without a url");
    expect_error("[{\"role\": \"user\", \"content\": \"a\\u0000b\"}]", "invalid JSON");
    expect_error("[{\"role\": \"user\", \"content\": \"see <｜deepseek_image｜>\"}]", "image placeholder");
    expect_error("[{\"role\": \"assistant\", \"content\": \"a\", \"reasoning_content\": 1}]", "messages[0].reasoning_content: expected a string");
    expect_error("[{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": \"[1]\"}}]}]",
                 "messages[1].tool_calls[0].function.arguments: must be a JSON object");
    expect_error("[{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": \"{bad\"}}]}]", "arguments: invalid JSON");
    expect_error("[{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"arguments\": \"{}\"}}]}]", "function.name: expected a string");
    expect_error("[{\"role\": \"assistant\", \"tool_calls\": {}}]", "tool_calls: expected an array");
    expect_error("[{\"role\": \"system\", \"content\": \"s\", \"tools\": [{\"name\": \"f\"}]}]", "messages[0].tools[0]: expected an object with a \"function\"");
    expect_error("[{\"role\": \"user\", \"content\": \"q\", \"task\": \"dance\"}]", "messages[0].task: expected one of");
    expect_error("[{\"role\": \"assistant\", \"content\": \"a\", \"wo_eos\": 1}]", "wo_eos: expected true or false");
    expect_error("[{\"role\": \"developer\", \"content\": \"\"}]", "developer message needs non-empty content");
    expect_error("{\"messages\": [], \"reasoning_effort\": \"medium\"}", "reasoning effort 'medium'");
    expect_error("{\"messages\": [], \"reasoning_effort\": 0}", "reasoning_effort: 0 is outside 1..100");
    expect_error("{\"messages\": [], \"reasoning_effort\": 101}", "outside 1..100");
    expect_error("{\"messages\": [], \"reasoning_effort\": 1.5}", "reasoning_effort: expected");
    expect_error("{\"messages\": [], \"reasoning_effort\": true}", "reasoning_effort: expected");
    expect_error("{\"messages\": [], \"thinking\": \"yes\"}", "thinking: expected true or false");
    expect_error("{\"messages\": [], \"thinking_mode\": \"deep\"}", "thinking_mode: expected");
    expect_error("{\"messages\": [], \"context\": []}", "context: not supported");
    expect_error("{\"messages\": [], \"chat_template_kwargs\": {\"reasoning_effort\": \"none\"}}", "chat_template_kwargs.reasoning effort 'none'");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"continue_final_message\": true}",
                 "continue_final_message needs a final assistant message");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"tools\": {}}", "tools: expected an array");
}

static void chat_effort_parse(void) {
    static const struct { const char *s; int want; } ok[] = {
        { "low", 25 }, { "high", 50 }, { "xhigh", 75 }, { "max", 100 }, { "1", 1 }, { "64", 64 }, { "100", 100 },
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        int v = -1;
        ds41_err err;
        CHECK(ds41_chat_effort_parse(ok[i].s, &v, &err) == 0 && v == ok[i].want, "%s -> %d", ok[i].s, v);
    }
    static const char *const bad[] = { "", "0", "101", "-5", "+5", " 5", "5x", "medium", "none", "HIGH", "1e1" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int v = -1;
        ds41_err err = { { 0 } };
        CHECK(ds41_chat_effort_parse(bad[i], &v, &err) == -1 && strstr(err.msg, "expected low, high"),
              "'%s' accepted (%d)", bad[i], v);
    }
}

/* A conversation built through the C API renders like the same conversation given as JSON. */
static void chat_api_matches_json(void) {
    ds41_chat c;
    ds41_chat_init(&c);
    ds41_err err = { { 0 } };
    CHECK(ds41_chat_push(&c, DS41_ROLE_SYSTEM, "sys", NULL, &err) != NULL, "%s", err.msg);
    CHECK(ds41_chat_push(&c, DS41_ROLE_USER, "q1", NULL, &err) != NULL, "%s", err.msg);
    ds41_chat_message *a = ds41_chat_push(&c, DS41_ROLE_ASSISTANT, "", "plan", &err);
    CHECK(a && ds41_chat_add_tool_call(a, "c1", "lookup", "{\"query\": \"x\", \"limit\": 2}", &err) == 0, "%s", err.msg);
    ds41_chat_message *t = ds41_chat_push(&c, DS41_ROLE_TOOL, "found", NULL, &err);
    CHECK(t != NULL, "%s", err.msg);
    if (t) t->tool_call_id = ds41_chat_strdup("c1");
    CHECK(ds41_chat_push(&c, DS41_ROLE_ASSISTANT, "answer", "done", &err) != NULL, "%s", err.msg);
    CHECK(ds41_chat_push(&c, DS41_ROLE_USER, "q2", NULL, &err) != NULL, "%s", err.msg);
    static const char json[] =
        "{\"thinking\": true, \"reasoning_effort\": \"xhigh\", \"messages\": ["
        "{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"q1\"},"
        "{\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"plan\", \"tool_calls\": [{\"id\": \"c1\","
        " \"type\": \"function\", \"function\": {\"name\": \"lookup\", \"arguments\": {\"query\": \"x\", \"limit\": 2}}}]},"
        "{\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"found\"},"
        "{\"role\": \"assistant\", \"content\": \"answer\", \"reasoning\": \"done\"}, {\"role\": \"user\", \"content\": \"q2\"}]}";
    ds41_chat_options o, oj;
    ds41_chat_options_init(&o);
    o.thinking = 1;
    o.reasoning_effort = 75;
    ds41_chat_options_init(&oj);
    char *a_out = NULL, *j_out = NULL;
    size_t alen = 0;
    CHECK(ds41_chat_render(&c, &o, &a_out, &alen, &err) == 0, "%s", err.msg);
    CHECK(render_json(json, &oj, &j_out, &err) == 0, "%s", err.msg);
    CHECK(a_out && j_out && !strcmp(a_out, j_out), "API and JSON renderings differ:\n%s\n%s", a_out, j_out);
    CHECK(oj.thinking == 1 && oj.reasoning_effort == 75, "options from JSON: thinking %d effort %d", oj.thinking, oj.reasoning_effort);
    /* Written out from the rules: reasoning dropped before q2 (no tools defined), the DSML
     * call with its arguments, the tool result folded into a user turn. */
    static const char want[] =
        DS41_CHAT_BOS "<｜System｜>Reasoning Effort: 75 (range 1-100, the higher the value, the more thorough the reasoning)\n\n"
        "sys<｜User｜>q1<｜Assistant｜></think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"lookup\">\n"
        "<｜DSML｜ parameter name=\"query\" string=\"true\">x</｜DSML｜ parameter>\n"
        "<｜DSML｜ parameter name=\"limit\" string=\"false\">2</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>"
        DS41_CHAT_EOS "<｜User｜><tool_result>found</tool_result><｜Assistant｜></think>answer" DS41_CHAT_EOS
        "<｜User｜>q2<｜Assistant｜><think>";
    CHECK(a_out && !strcmp(a_out, want), "got:\n%s", a_out);
    CHECK(alen == sizeof want - 1, "len %zu", alen);
    /* The caller's messages are not changed by rendering: a second render is identical. */
    char *again = NULL;
    CHECK(ds41_chat_render(&c, &o, &again, NULL, &err) == 0 && again && !strcmp(again, want), "second render differs");
    free(again);
    free(a_out);
    free(j_out);
    ds41_chat_free(&c);

    /* No messages: the prompt is the BOS alone (or nothing without it). */
    ds41_chat e;
    ds41_chat_init(&e);
    char *out = NULL;
    size_t len = 99;
    CHECK(ds41_chat_render(&e, &o, &out, &len, &err) == 0 && out && !strcmp(out, DS41_CHAT_BOS), "empty: '%s'", out);
    free(out);
    o.add_bos = 0;
    CHECK(ds41_chat_render(&e, &o, &out, &len, &err) == 0 && out && len == 0 && !*out, "empty without BOS: len %zu", len);
    free(out);
    o.reasoning_effort = 101;
    out = NULL;
    CHECK(ds41_chat_render(&e, &o, &out, &len, &err) == -1 && !out && strstr(err.msg, "reasoning effort 101"), "%s", err.msg);
}

/* The JSON writer against Python's json.dumps output (values taken from CPython 3.11). */
static void chat_python_json(void) {
    static const struct { const char *in, *want; } v[] = {
        { "[0.1, 1e-05, 0.0001, 1e16, 1e15, 100.0, -0.0, 1.5e-07, 123456789.123]",
          "[0.1, 1e-05, 0.0001, 1e+16, 1000000000000000.0, 100.0, -0.0, 1.5e-07, 123456789.123]" },
        { "[1.2345678901234567e+300, 5e-324, 1.7976931348623157e308, 0.3, 2.5e-5, 9999999999999998.0]",
          "[1.2345678901234567e+300, 5e-324, 1.7976931348623157e+308, 0.3, 2.5e-05, 9999999999999998.0]" },
        { "{\"b\": 1, \"a\": [true, false, null], \"c\": {}}", "{\"b\": 1, \"a\": [true, false, null], \"c\": {}}" },
        { "\"q\\\"b\\\\s/\\u0001\\u001f\\b\\f\\n\\r\\t\\u007f\\u2028é😀\"", "\"q\\\"b\\\\s/\\u0001\\u001f\\b\\f\\n\\r\\t\x7f\xe2\x80\xa8é😀\"" },
        { "[-9223372036854775808, 9223372036854775807, []]", "[-9223372036854775808, 9223372036854775807, []]" },
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        ds41_sb b = { 0 };
        ds41_err err = { { 0 } };
        CHECK(ds41_chat_pyjson_text(&b, v[i].in, "t", &err) == 0, "%s", err.msg);
        CHECK(b.p && !strcmp(b.p, v[i].want), "%s -> %s (want %s)", v[i].in, b.p, v[i].want);
        free(b.p);
    }
}

int main(void) {
    vector_counts();
    RUN_CASE(chat_bad_input);
    RUN_CASE(chat_effort_parse);
    RUN_CASE(chat_api_matches_json);
    RUN_CASE(chat_python_json);
    return check_exit();
}
