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
int ds41_cli_bench_prefix(int argc, char **argv);
int ds41_cli_perplexity(int argc, char **argv);
int ds41_cli_chat(int argc, char **argv);
int ds41_cli_serve(int argc, char **argv);
int ds41_cli_bench_serve(int argc, char **argv);
int ds41_cli_cache(int argc, char **argv);
int ds41_cli_image(int argc, char **argv);

#endif
