/* ds41 bench --settle: measure a checkpoint's steady state, not the minutes after it was written.
 *
 * Right after bench/run.sh writes the production-width checkpoint, mmap'd decode ran 2.4-2.6x
 * slower until the page cache had been re-read (issue 27): the pages the writer left behind
 * (dirty, then under write-back, cached in the writer's order) are not the pages a later run
 * maps. Settling makes the later state now: each *.safetensors file of the directory is
 * written back (fdatasync), dropped from the page cache (POSIX_FADV_DONTNEED) and read again
 * sequentially, as a run after a reboot or an eviction would find it. auto settles when a file
 * was modified in the last DS41_SETTLE_FRESH_S seconds; the line printed says which state was
 * measured and how much of the checkpoint was in the page cache (mincore). */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli_bench_settle.h"

#define DS41_SETTLE_FRESH_S 600

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int is_shard(const char *name) {
    size_t n = strlen(name);
    return n > 12 && !strcmp(name + n - 12, ".safetensors");
}

/* write back, evict, re-read one file; returns bytes read or -1 */
static long long settle_file(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    long long got = 0;
    char *buf = malloc((size_t)4 << 20);
    if (buf && fdatasync(fd) == 0 && posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0) {
        ssize_t r;
        while ((r = read(fd, buf, (size_t)4 << 20)) > 0) got += r;
        if (r < 0) got = -1;
    } else {
        got = -1;
    }
    free(buf);
    close(fd);
    return got;
}

/* pages of the file in the page cache (mincore), and its page count */
static void resident(const char *path, long long *in_cache, long long *pages) {
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size == 0) {
        if (fd >= 0) close(fd);
        return;
    }
    long pg = sysconf(_SC_PAGESIZE);
    size_t np = (size_t)((st.st_size + pg - 1) / pg);
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    unsigned char *v = malloc(np);
    if (m != MAP_FAILED && v && mincore(m, (size_t)st.st_size, v) == 0) {
        for (size_t i = 0; i < np; i++) *in_cache += v[i] & 1;
        *pages += (long long)np;
    }
    free(v);
    if (m != MAP_FAILED) munmap(m, (size_t)st.st_size);
    close(fd);
}

int ds41_cli_parse_settle(const char *s, int *mode) {
    if (!strcmp(s, "auto")) *mode = DS41_SETTLE_AUTO;
    else if (!strcmp(s, "always")) *mode = DS41_SETTLE_ALWAYS;
    else if (!strcmp(s, "never")) *mode = DS41_SETTLE_NEVER;
    else return -1;
    return 0;
}

int ds41_cli_bench_settle(const char *dir, int mode, FILE *out) {
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "ds41 bench: --settle: cannot open %s\n", dir);
        return -1;
    }
    char path[4096];
    time_t newest = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        struct stat st;
        if (!is_shard(de->d_name)) continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (stat(path, &st) == 0 && st.st_mtime > newest) newest = st.st_mtime;
    }
    long long age = (long long)(time(NULL) - newest);
    int settle = mode == DS41_SETTLE_ALWAYS || (mode == DS41_SETTLE_AUTO && newest > 0 && age < DS41_SETTLE_FRESH_S);
    long long bytes = 0, in_cache = 0, pages = 0;
    int failed = 0;
    double t0 = now_s();
    rewinddir(d);
    while ((de = readdir(d)) != NULL) {
        if (!is_shard(de->d_name)) continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (settle) {
            long long b = settle_file(path);
            if (b < 0) failed = 1;
            else bytes += b;
        }
        resident(path, &in_cache, &pages);
    }
    closedir(d);
    double pct = pages ? 100.0 * (double)in_cache / (double)pages : 0.0;
    if (settle && failed) {
        fprintf(stderr, "ds41 bench: --settle: could not write back, evict or re-read a shard of %s\n", dir);
        return -1;
    }
    if (settle)
        fprintf(out, "checkpoint state: settled (newest shard written %llds ago: written back, evicted, re-read %.2f GB in"
                     " %.1f s); %.0f%% in the page cache\n", age, (double)bytes / 1e9, now_s() - t0, pct);
    else
        fprintf(out, "checkpoint state: as found (newest shard written %llds ago%s); %.0f%% in the page cache\n", age,
                mode == DS41_SETTLE_NEVER ? ", --settle never" : "", pct);
    return 0;
}
