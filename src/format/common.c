#include "common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int ds41_log_level = 1;

int ds41_errf(ds41_err *err, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

void ds41_vmessage(const char *fmt, va_list ap) {
    fputs("ds41: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

void ds41_log(int level, const char *fmt, ...) {
    if (level > ds41_log_level) return;
    va_list ap;
    va_start(ap, fmt);
    ds41_vmessage(fmt, ap);
    va_end(ap);
}

int ds41_read_file(const char *path, size_t max_bytes, char **out, size_t *len, ds41_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return ds41_errf(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return ds41_errf(err, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > max_bytes) {
        fclose(f);
        return ds41_errf(err, "%s: file is %lld bytes, more than the limit of %zu", path,
                         (long long)st.st_size, max_bytes);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        return ds41_errf(err, "%s: out of memory reading %zu bytes", path, n);
    }
    if (n && fread(buf, 1, n, f) != n) {
        free(buf);
        fclose(f);
        return ds41_errf(err, "%s: short read", path);
    }
    fclose(f);
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return 0;
}

char *ds41_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    int slash = a > 0 && dir[a - 1] != '/';
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    if (slash) p[a++] = '/';
    memcpy(p + a, name, b + 1);
    return p;
}
