/* ds41 CLI commands: each is `int ds41_cli_NAME(int argc, char **argv)` with argv[0] the
 * command name; returns the process exit status. Each has --help. */
#ifndef DS41_CLI_H
#define DS41_CLI_H

int ds41_cli_inspect(int argc, char **argv);
int ds41_cli_tokenize(int argc, char **argv);
int ds41_cli_chat_template(int argc, char **argv);
int ds41_cli_run(int argc, char **argv);
int ds41_cli_bench(int argc, char **argv);
int ds41_cli_bench_long(int argc, char **argv);   /* bench --synthetic-context / --ablate */
int ds41_cli_bench_engram(int argc, char **argv); /* bench --engram */
int ds41_cli_bench_configs(int argc, char **argv);/* bench --configs */
/* bench --routing-counts FILE (cli_bench_routes.c): check the flag (2: refused, after a
 * message), start counting after the load, write the counts at the end (rank 0); path NULL:
 * nothing. 0 or 1 after a message. */
struct ds41_engine;
int ds41_cli_bench_routes_check(const char *path, int spec_curve);
int ds41_cli_bench_routes_start(struct ds41_engine *e, const char *path);
int ds41_cli_bench_routes_write(const struct ds41_engine *e, const char *path, const char *dir);
int ds41_cli_bench_prefix(int argc, char **argv);
int ds41_cli_perplexity(int argc, char **argv);
int ds41_cli_chat(int argc, char **argv);
int ds41_cli_serve(int argc, char **argv);
int ds41_cli_bench_serve(int argc, char **argv);
int ds41_cli_cache(int argc, char **argv);
int ds41_cli_image(int argc, char **argv);

#endif
