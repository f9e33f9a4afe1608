/* ds41 image: the vision tower part (cli_vision.c), called by cli_image.c. */
#ifndef DS41_CLI_VISION_H
#define DS41_CLI_VISION_H

typedef struct ds41_cli_tower_args {
    const char *dir, *dump;
    const char *raw;   /* --pixels: read when pixels is NULL, after the grid is checked */
    int width, height;
    int tokens_only, exact, threads;
    int to_stderr;   /* the summary lines on stderr (ds41 image --json keeps stdout one object) */
    int bench;   /* > 0: encode this many times, print the median time and the GFLOP */
} ds41_cli_tower_args;

/* FILE of raw little-endian BF16 [3, H, W] -> floats; NULL with a message (wrong size named). */
float *ds41_cli_read_pixels(const char *path, int H, int W);
/* Runs the tower and aligner of a->dir on pixels [3, height, width] (NULL: read from a->raw);
 * 0, or 1 with a message. */
int ds41_cli_image_tower(const ds41_cli_tower_args *a, const float *pixels);

#endif
