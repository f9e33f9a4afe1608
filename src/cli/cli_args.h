/* Strict parsing of numeric command-line values for the ds41 CLI commands: a value that is
 * not entirely a number in range is refused with one line on stderr naming the command,
 * the flag and the value, never silently read as 0 or wrapped (atoi / strtoull would). */
#ifndef DS41_CLI_ARGS_H
#define DS41_CLI_ARGS_H

/* Decimal integer in lo..hi. Returns 0, or -1 after printing "ds41 CMD: FLAG: ...". */
int ds41_cli_int(const char *cmd, const char *flag, const char *v, long long lo, long long hi, long long *out);
/* Finite number in lo..hi (no nan / inf). */
int ds41_cli_double(const char *cmd, const char *flag, const char *v, double lo, double hi, double *out);
/* Unsigned 64-bit integer (no sign; a seed). */
int ds41_cli_u64(const char *cmd, const char *flag, const char *v, unsigned long long *out);

#endif
