/* LD_PRELOAD fault shim for tests/store_faults.test.sh: makes the Nth call of one operation on
 * matching paths fail with a chosen errno, without touching the file system.
 *   DS41_FAULT_OP     write | fsync | rename   (fsync counts fdatasync too)
 *   DS41_FAULT_N      the first failing call, counting from 1 (only matching calls count)
 *   DS41_FAULT_COUNT  how many consecutive matching calls fail (default 1)
 *   DS41_FAULT_ERRNO  EIO (default) or ENOSPC
 *   DS41_FAULT_MATCH  a substring of the path (of the descriptor's file, or rename's source);
 *                     calls on other paths pass through uncounted (default: every path)
 * Only calls that go through the dynamic symbol table are seen (glibc's own stdio is not). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long seen;   /* matching calls of the chosen operation so far */

static int op_is(const char *op) {
    const char *e = getenv("DS41_FAULT_OP");
    return e && !strcmp(e, op);
}

static int matches(const char *path) {
    const char *m = getenv("DS41_FAULT_MATCH");
    return !m || !*m || (path && strstr(path, m));
}

static int fd_matches(int fd) {
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n < 0) return 0;
    path[n] = 0;
    return matches(path);
}

/* 1 when this (matching) call is to fail; sets errno */
static int should_fail(void) {
    const char *n = getenv("DS41_FAULT_N"), *c = getenv("DS41_FAULT_COUNT"), *e = getenv("DS41_FAULT_ERRNO");
    long first = n ? atol(n) : 1, count = c ? atol(c) : 1;
    long k = __atomic_add_fetch(&seen, 1, __ATOMIC_SEQ_CST);
    if (k < first || k >= first + count) return 0;
    errno = e && !strcmp(e, "ENOSPC") ? ENOSPC : EIO;
    return 1;
}

ssize_t write(int fd, const void *buf, size_t n) {
    static ssize_t (*real)(int, const void *, size_t);
    if (!real) real = (ssize_t(*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    if (op_is("write") && fd > 2 && fd_matches(fd) && should_fail()) return -1;
    return real(fd, buf, n);
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    if (op_is("fsync") && fd_matches(fd) && should_fail()) return -1;
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    if (op_is("fsync") && fd_matches(fd) && should_fail()) return -1;
    return real(fd);
}

int rename(const char *from, const char *to) {
    static int (*real)(const char *, const char *);
    if (!real) real = (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename");
    if (op_is("rename") && matches(from) && should_fail()) return -1;
    return real(from, to);
}
