/* ds41 Engram placement (P4): the mode choice, the start-up lines, the forward hook.
 *
 * An operator who runs V4.1 on a machine smaller than the checkpoint wants to know at start-up
 * where each part lives and whether a step will page. The Engram tables (196.6 GB in V4.1)
 * are the one part that can leave memory without costing a step its weights: a step needs
 * 2 x 24 rows per token, known from the token ids alone. */
#include "engram_place.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "ds41.h"

int ds41_parse_engram_mode(const char *s, int *mode) {
    static const char *names[] = { "auto", "ram", "mmap", "prefetch" };
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, names[i])) { *mode = i; return 0; }
    return -1;
}

const char *ds41_engram_mode_name(int mode) {
    static const char *names[] = { "auto", "ram", "mmap", "prefetch" };
    return mode >= 0 && mode < 4 ? names[mode] : "?";
}

/* ---------------------------------------------------------------- memory available */

static long long read_ll(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char buf[64];
    long long v = -1;
    if (fgets(buf, sizeof buf, f)) {
        char *end;
        v = strtoll(buf, &end, 10);
        if (end == buf) v = !strncmp(buf, "max", 3) ? -2 : -1;   /* v2 "max": no limit */
    }
    fclose(f);
    return v;
}

static long long stat_field(const char *path, const char *field) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[256];
    long long v = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ' ') { v = strtoll(line + n + 1, NULL, 10); break; }
    fclose(f);
    return v;
}

/* The room left in this process's memory cgroup, or -1 without a limit. */
static long long cgroup_room(char *why, size_t cap) {
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return -1;
    char line[1024], v1[900] = "", v2[900] = "";
    int have1 = 0, have2 = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *a = strchr(line, ':'), *b = a ? strchr(a + 1, ':') : NULL;
        if (!b) continue;
        *b = 0;
        const char *ctrl = a + 1, *path = b + 1;
        if (strlen(path) >= sizeof v1) continue;
        if (!strcmp(ctrl, "memory") || strstr(ctrl, "memory")) { snprintf(v1, sizeof v1, "%s", path); have1 = 1; }
        else if (!*ctrl && line[0] == '0') { snprintf(v2, sizeof v2, "%s", path); have2 = 1; }
    }
    fclose(f);
    char p[1100];
    if (have1) {
        snprintf(p, sizeof p, "/sys/fs/cgroup/memory%s/memory.limit_in_bytes", v1);
        long long lim = read_ll(p);
        snprintf(p, sizeof p, "/sys/fs/cgroup/memory%s/memory.usage_in_bytes", v1);
        long long use = read_ll(p);
        snprintf(p, sizeof p, "/sys/fs/cgroup/memory%s/memory.stat", v1);
        long long cache = stat_field(p, "cache");
        /* v1 reports "no limit" as a huge number */
        if (lim > 0 && lim < (1LL << 60) && use >= 0) {
            long long room = lim - use + (cache > 0 ? cache : 0);
            if (why) snprintf(why, cap, "memory cgroup %s: limit %lld bytes", v1, lim);
            return room < 0 ? 0 : room;
        }
    }
    if (have2) {
        snprintf(p, sizeof p, "/sys/fs/cgroup%s/memory.max", v2);
        long long lim = read_ll(p);
        snprintf(p, sizeof p, "/sys/fs/cgroup%s/memory.current", v2);
        long long use = read_ll(p);
        snprintf(p, sizeof p, "/sys/fs/cgroup%s/memory.stat", v2);
        long long cache = stat_field(p, "file");
        if (lim > 0 && use >= 0) {
            long long room = lim - use + (cache > 0 ? cache : 0);
            if (why) snprintf(why, cap, "memory cgroup %s: limit %lld bytes", v2, lim);
            return room < 0 ? 0 : room;
        }
    }
    return -1;
}

long long ds41_memory_available(char *why, size_t why_cap) {
    long long avail = stat_field("/proc/meminfo", "MemAvailable:");
    if (avail >= 0) avail *= 1024;   /* kB */
    if (why && why_cap) snprintf(why, why_cap, "MemAvailable");
    char cwhy[1024] = "";
    long long room = cgroup_room(cwhy, sizeof cwhy);
    if (room >= 0 && (avail < 0 || room < avail)) {
        if (why && why_cap) snprintf(why, why_cap, "%s", cwhy);
        return room;
    }
    return avail;
}

/* ---------------------------------------------------------------- placement */

static void human(long long b, char *buf, size_t cap) {
    if (b >= (1LL << 30)) snprintf(buf, cap, "%.2f GiB", (double)b / (double)(1LL << 30));
    else if (b >= (1LL << 20)) snprintf(buf, cap, "%.1f MiB", (double)b / (double)(1LL << 20));
    else snprintf(buf, cap, "%lld KiB", (b + 1023) / 1024);
}

static long long total_weight_bytes(const ds41_st *st) {
    long long b = 0;
    for (int i = 0; i < ds41_st_shard_count(st); i++) b += (long long)ds41_st_shard_bytes(st, i);
    return b;
}

int ds41_engine_engram_place(ds41_engine *e, int mode, long long cache_bytes, int load_copy, int verbose,
                             ds41_err *err) {
    const ds41_config *cfg = e->cfg;
    if (!e->has_engram || cfg->n_engram_layers == 0) return 0;
    if (mode < DS41_EG_AUTO || mode > DS41_EG_PREFETCH) return ds41_errf(err, "engram: mode %d unknown", mode);
    ds41_weights *w = &e->model->w;
    long long tables = ds41_engram_table_bytes(cfg, w);
    long long all = total_weight_bytes(e->model->st);
    /* under MPI each rank holds 1/N of every table's rows (src/dist/dist_engram.c), and the
     * mode is chosen for that share; the RAM copy of ram mode is then made by the job */
    int ranks = ds41_dist_engram_shards();
    long long share = tables / (ranks > 1 ? ranks : 1);
    char why[1100];
    long long avail = ds41_memory_available(why, sizeof why);
    char ht[80], ha[32], ho[32];
    human(tables, ht, sizeof ht);
    if (ranks > 1) {
        char hs[32];
        human(share, hs, sizeof hs);
        size_t n = strlen(ht);
        snprintf(ht + n, sizeof ht - n, " (sharded by rows over %d ranks: %s here)", ranks, hs);
    }
    human(avail, ha, sizeof ha);
    human(all - tables, ho, sizeof ho);
    int chosen = mode;
    if (load_copy) {
        /* --load copy already read every weight, the tables included, into anonymous memory */
        if (mode == DS41_EG_PREFETCH || mode == DS41_EG_MMAP)
            ds41_log(1, "engram: --engram-mode %s ignored: --load copy holds the tables in RAM", ds41_engram_mode_name(mode));
        chosen = DS41_EG_RAM;
    } else if (mode == DS41_EG_AUTO) {
        chosen = avail >= 0 && share > avail / 2 ? DS41_EG_PREFETCH : DS41_EG_MMAP;
    }
    if (chosen == DS41_EG_RAM && !load_copy) {
        if (avail >= 0 && share > avail)
            ds41_log(1, "engram: warning: --engram-mode ram reads %s of Engram tables into memory with %s available "
                     "(%s): the process will swap or be killed", ht, ha, why);
        if (ranks < 2 && ds41_engram_tables_to_ram(cfg, w, &e->eg_ram, &e->eg_ram_len, err)) return -1;
    }
    if (chosen == DS41_EG_PREFETCH) {
        long long cb = cache_bytes;
        if (cb == 0) {
            cb = avail > 0 ? avail / 16 : (64LL << 20);
            if (cb > (1LL << 30)) cb = 1LL << 30;
        }
        if (cb < 0) cb = 0;
        if (cb > share) cb = share;
        /* the scales (1/33 of the tables) stay in RAM when they take at most 1/8 of the memory
         * available: a missing row then costs one read, not two; DS41_ENGRAM_SCALES=disk reads
         * them per row anyway (tests, comparisons) */
        const char *sc = getenv("DS41_ENGRAM_SCALES");
        long long scale_bytes = tables / (cfg->engram_head_dim + cfg->engram_head_dim / 32) * (cfg->engram_head_dim / 32);
        int scales_ram = !(sc && !strcmp(sc, "disk")) && avail > 0 && scale_bytes <= avail / 8 && ranks < 2;
        if (ds41_engram_io_open(&e->eio, cfg, w, e->model->st, cb, scales_ram, err)) return -1;
    }
    if (chosen == DS41_EG_MMAP) ds41_engram_tables_advise_random(cfg, w);
    e->eg_mode = chosen;
    int pages = chosen == DS41_EG_MMAP && avail >= 0 && all - tables + share > avail;
    /* said when asked (verbose, or a mode named explicitly) and whenever the tables are not
     * simply mapped into memory that holds them */
    if (verbose || mode != DS41_EG_AUTO || chosen != DS41_EG_MMAP || pages) {
        const char *where = chosen == DS41_EG_RAM ? "in RAM (anonymous memory)"
                            : chosen == DS41_EG_MMAP ? "mmap'd (page cache)" : "on disk, rows prefetched per step";
        ds41_log(1, "engram: %d tables, %s: %s%s; other weights %s %s; memory available %s (%s)",
                 cfg->n_engram_layers, ht, where, mode == DS41_EG_AUTO && !load_copy ? " (auto)" : "", ho,
                 load_copy ? "in RAM" : "mmap'd", ha, why);
        if (e->eio) {
            ds41_engram_io_stats s;
            ds41_engram_io_get_stats(e->eio, &s);
            char hc[32];
            human(s.cache_rows * s.row_bytes, hc, sizeof hc);
            char hs[32];
            human(s.scale_ram_bytes, hs, sizeof hs);
            ds41_log(1, "engram: prefetch through %s%s, row cache %s (%lld rows of %lld bytes), scales %s%s",
                     s.uring ? "io_uring" : "pread", s.direct ? " (O_DIRECT)" : "", hc, s.cache_rows, s.row_bytes,
                     s.scale_ram_bytes ? "in RAM, " : "read per row", s.scale_ram_bytes ? hs : "");
        }
    }
    if (pages)
        ds41_log(1, "engram: warning: the weights (%s + %s of Engram tables) exceed the memory available (%s): "
                 "mmap will page inside the layer loop; --engram-mode prefetch reads the Engram rows ahead",
                 ho, ht, ha);
    return 0;
}

void ds41_engine_engram_free(ds41_engine *e) {
    if (e->eg_src) ds41_dist_engram_close();
    e->eg_src = NULL;
    ds41_engram_io_close(e->eio);
    e->eio = NULL;
    ds41_engram_ram_free(e->eg_ram, e->eg_ram_len);
    e->eg_ram = NULL;
}

void ds41_engram_get_stats(ds41_engine *e, ds41_engram_stats *out) {
    memset(out, 0, sizeof *out);
    out->mode = e->eg_mode;
    if (e->has_engram) out->table_bytes = ds41_engram_table_bytes(e->cfg, e->w);
    if (!e->eio) return;
    ds41_engram_io_stats s;
    ds41_engram_io_get_stats(e->eio, &s);
    out->uring = s.uring;
    out->cache_rows = s.cache_rows;
    out->cache_used = s.cache_used;
    out->cache_bytes = s.cache_rows * s.row_bytes;
    out->steps = s.steps;
    out->refs = s.refs;
    out->lookups = s.lookups;
    out->hits = s.hits;
    out->rows_read = s.rows_read;
    out->bytes_read = s.bytes_read;
    out->retries = s.retries;
    out->errors = s.errors;
    out->stall_s = s.stall_s;
    out->stall_max_s = s.stall_max_s;
    out->issue_s = s.issue_s;
    out->lead_s = s.lead_s;
}

int ds41_engram_prefetch_issue(ds41_seq *s, const int64_t *ids, size_t N, ds41_err *err) {
    ds41_engine *e = s->e;
    int cols = (e->cfg->engram_max_ngram - 1) * e->cfg->engram_n_heads;
    if (e->eg_src) return e->eg_src->issue(e->eg_src->self, ids, N, cols, err);
    if (!e->eio) return 0;
    if (!s->eg_step && !(s->eg_step = ds41_engram_step_new(e->eio))) return ds41_errf(err, "out of memory");
    return ds41_engram_step_issue(s->eg_step, ids, N, cols, err);
}

int ds41_engram_layer(ds41_seq *s, const ds41_layer_weights *lw, int slot, const int64_t *ids, int T,
                      const uint8_t *is_image, float *X, ds41_err *err) {
    const ds41_engine *e = s->e;
    if (e->eg_src) return ds41_engram_apply_from(&e->ctx, e->cfg, lw, e->eg_src, slot, ids, T, is_image, X, err);
    return ds41_engram_apply_step(&e->ctx, e->cfg, lw, s->eg_step, slot, ids, T, is_image, X, err);
}
