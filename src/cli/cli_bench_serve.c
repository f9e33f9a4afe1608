/* ds41 bench-serve: placeholder */
#include <stdio.h>
#include "cli.h"
int ds41_cli_bench_serve(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "ds41 bench-serve: not yet\n"); return 2; }
