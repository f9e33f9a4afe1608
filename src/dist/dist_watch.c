/* ds41 -- the rank watcher: a rank that dies is named by ds41, not only by the launcher.
 *
 * MPICH's launcher (hydra) ends the whole job the moment one rank's process dies: it kills
 * every rank's process group with SIGKILL, rank 0 included, so no rank can report the death of
 * another (docs/distributed.md, "Faults"). A process that dies cannot speak for itself either.
 * So under a launcher with more than one rank, each rank's process forks once at start-up,
 * before MPI_Init: the child execs this binary again and is the rank (MPI, the model, the
 * work); the parent, the watcher, stays in the launcher's process group, does nothing but wait
 * for the child, and when the child was killed by a signal it did not receive itself (SIGKILL
 * from a user or the kernel's out-of-memory killer, a crash) it writes one line naming the rank,
 * its pid, its host and the signal, then exits with the child's status. The launcher forwards
 * the line and ends the job as before. A child that exits passes its status on unchanged; a
 * stopped child (SIGSTOP, a hang) is left to --mpi-timeout, which rank 0 reports.
 *
 * The watcher's command name is "ds41-watch" (ps, top); the rank keeps "ds41". Signals sent to
 * the process group (Ctrl-C forwarded by mpiexec, hydra's SIGUSR1 under -disable-auto-cleanup)
 * reach both: the watcher records them and lets the rank decide, and a rank that dies of a
 * signal the watcher also received ends quietly. DS41_RANK_WATCH=0 turns the watcher off. */
#define _GNU_SOURCE
#include "dist.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define WATCHED_ENV "DS41_RANK_WATCHED"

static volatile sig_atomic_t got[NSIG];

static void note_signal(int s) {
    if (s > 0 && s < NSIG) got[s] = 1;
}

/* What a death by signal s most likely means, for the line. */
static const char *signal_hint(int s) {
    switch (s) {
    case SIGKILL: return "SIGKILL: sent by a user or by the kernel's out-of-memory killer; dmesg tells which";
    case SIGSEGV: return "SIGSEGV: a crash; please report it with the command line";
    case SIGBUS: return "SIGBUS: a mapped file shrank or a disk failed under it (is the checkpoint being rewritten?)";
    case SIGABRT: return "SIGABRT: an internal check failed";
    case SIGILL: return "SIGILL: an instruction this CPU lacks (DS41_ISA=avx2 selects the AVX2 kernels)";
    case SIGFPE: return "SIGFPE: an arithmetic trap";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU: the CPU-time limit (ulimit -t) ran out";
    default: return NULL;
    }
}

/* The rank's number as the launcher gives it, -1 when none is set. */
static int launcher_rank(void) {
    const char *v = getenv("PMI_RANK");
    if (!v) v = getenv("OMPI_COMM_WORLD_RANK");
    if (!v) v = getenv("PMIX_RANK");
    if (!v || !*v) return -1;
    char *end;
    long r = strtol(v, &end, 10);
    return (*end || r < 0 || r > 1 << 30) ? -1 : (int)r;
}

void ds41_rank_watch(int world, char **argv) {
    const char *off = getenv("DS41_RANK_WATCH");
    if (world < 2 || getenv(WATCHED_ENV) || (off && !strcmp(off, "0"))) return;
    char exe[4096];
    ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (l <= 0) return;   /* no /proc: run unwatched rather than not at all */
    exe[l] = 0;
    fflush(NULL);
    pid_t parent = getpid(), child = fork();
    if (child < 0) return;
    if (child == 0) {
        /* the rank never outlives its watcher (a launcher that kills the watcher's pid alone) */
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
        if (getppid() != parent) _exit(1);
        setenv(WATCHED_ENV, "1", 1);
        execv(exe, argv);
        fprintf(stderr, "ds41: cannot start the rank (%s: %s)\n", exe, strerror(errno));
        _exit(127);
    }
    /* the watcher: signals that reach the group are the rank's to act on; note them only */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = note_signal;
    sigemptyset(&sa.sa_mask);
    const int group_sigs[] = { SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE, SIGALRM };
    for (size_t i = 0; i < sizeof group_sigs / sizeof group_sigs[0]; i++) sigaction(group_sigs[i], &sa, NULL);
    prctl(PR_SET_NAME, "ds41-watch", 0, 0, 0);
    int st = 0;
    while (waitpid(child, &st, 0) < 0)
        if (errno != EINTR) _exit(1);
    if (WIFEXITED(st)) _exit(WEXITSTATUS(st));
    int s = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
    if (s > 0 && s < NSIG && !got[s]) {
        char host[256] = "?";
        gethostname(host, sizeof host - 1);
        host[sizeof host - 1] = 0;
        const char *hint = signal_hint(s);
        char line[768];
        int n = snprintf(line, sizeof line, "ds41: rank %d (pid %ld on %s) was killed by signal %d (%s); the job ends\n",
                         launcher_rank(), (long)child, host, s, hint ? hint : strsignal(s));
        if (n > 0) {
            ssize_t w = write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
            (void)w;
        }
    }
    _exit(128 + s);
}
