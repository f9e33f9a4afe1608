/* Progress on stderr for work that takes a while (issue 26): nothing unless stderr is a
 * terminal and the work has run for DS41_PROGRESS_AFTER seconds; then one line, rewritten in
 * place a few times a second ("label: 3.1 s", or "label: 40 % (400 / 1000), 3.1 s" once a
 * total is known), erased when the work ends so that what follows starts on a clean line.
 * A helper thread draws the line, so the work itself needs no callbacks; ds41_progress_set
 * may be called from the working thread to report how far it got. DS41_PROGRESS=0 turns it
 * off, DS41_PROGRESS=1 draws it even when stderr is not a terminal (the pty test uses both). */
#ifndef DS41_CLI_PROGRESS_H
#define DS41_CLI_PROGRESS_H

#define DS41_PROGRESS_AFTER 2.0

typedef struct ds41_progress ds41_progress;

/* Starts timing the work named `label` (copied); NULL when progress is off (every function
 * accepts NULL). */
ds41_progress *ds41_progress_start(const char *label);
void ds41_progress_set(ds41_progress *p, long long done, long long total);
/* Stops the thread and erases the line if one was drawn. */
void ds41_progress_end(ds41_progress *p);
/* 1 when progress lines would be drawn (stderr a terminal, or DS41_PROGRESS=1). */
int ds41_progress_enabled(void);

#endif
