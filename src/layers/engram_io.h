/* ds41 Engram rows off RAM (deployment point P4): the tables' rows read from the checkpoint
 * files by the engine's own I/O instead of page faults in the layer loop.
 *
 * A step (one forward) knows every Engram row it needs from its token ids alone (spec 3.2), so
 * ds41_engram_step_issue deduplicates the step's (slot, id) pairs, copies the ones the shared
 * row cache holds and starts asynchronous reads (io_uring through liburing when built with it,
 * else plain pread at wait time) of the others into the step's own row buffer; the forward
 * waits for a slot's rows only in front of that slot's Engram layer (ds41_engram_step_wait).
 * Rows come out byte for byte as the mapping holds them, so every mode computes the same
 * values; a read that fails or comes back short is retried and then reported as an error,
 * never used as a zero row.
 *
 * ds41_engram_io (shared by an engine's sequences; thread-safe): the tables' file offsets and
 * the row cache, a CLOCK over a fixed number of rows. ds41_engram_step (one per sequence, used
 * by one thread at a time): the step's distinct rows, its buffer and its ring. */
#ifndef DS41_ENGRAM_IO_H
#define DS41_ENGRAM_IO_H

#include "engram.h"
#include "model.h"
#include "safetensors.h"

typedef struct ds41_engram_io ds41_engram_io;
typedef struct ds41_engram_step ds41_engram_step;

typedef struct ds41_engram_io_stats {
    int uring;                       /* 1: reads go through io_uring; 0: pread */
    long long cache_rows, cache_used;/* row cache capacity and rows held */
    long long row_bytes;             /* one row's bytes (E4M3 row + its scales) */
    long long steps;                 /* steps that issued rows */
    long long refs;                  /* (slot, id) lookups of those steps, duplicates included */
    long long lookups, hits;         /* distinct rows per step, and those the cache held */
    long long rows_read, bytes_read; /* rows and bytes read from the files */
    long long retries, errors;       /* reads retried (failed or short), rows given up on */
    double stall_s, stall_max_s;     /* time waited for rows: total, and the worst step */
    double issue_s;                  /* time in the steps' issue (dedup, cache copies, submission) */
    double lead_s;                   /* time from each issue's end to its first wait: the layers the
                                      * first Engram layer's reads overlap */
    long long scale_ram_bytes;       /* scales held in RAM (scales_in_ram) */
    int direct;                      /* 1: rows read O_DIRECT (DS41_ENGRAM_DIRECT=0: buffered) */
} ds41_engram_io_stats;

/* The tables of every Engram layer of w, located in the files of st (each table must lie in a
 * shard mapped from its file), with a row cache of cache_bytes (0: none); scales_in_ram: the
 * scale tensors (1/33 of the tables) are read into RAM here, so a row costs one read. Reads the fault
 * injection setting DS41_ENGRAM_FAULT (tests): "eio:K" / "short:K" make the K-th read (1-based;
 * for short, the first from the K-th on that is longer than a byte) fail with EIO / come back
 * half done once, "eio-all" / "eof-all" every read. DS41_ENGRAM_PREAD=1 (read at step start by
 * ds41_engram_step_new) takes the pread path where io_uring works. */
int ds41_engram_io_open(ds41_engram_io **out, const ds41_config *cfg, const ds41_weights *w, const ds41_st *st,
                        long long cache_bytes, int scales_in_ram, ds41_err *err);
void ds41_engram_io_close(ds41_engram_io *io);
void ds41_engram_io_get_stats(ds41_engram_io *io, ds41_engram_io_stats *out);

/* A step object for one sequence (NULL when out of memory); free drains its reads first. */
ds41_engram_step *ds41_engram_step_new(ds41_engram_io *io);
void ds41_engram_step_free(ds41_engram_step *st);
/* Starts the step over ids [n_slots][N][cols] (the forward's hash ids): finishes the previous
 * step's reads, then deduplicates, takes cached rows and issues the reads of the others.
 * Ids outside a table are skipped (the module reads them as zero rows, as before). */
int ds41_engram_step_issue(ds41_engram_step *st, const int64_t *ids, size_t N, int cols, ds41_err *err);
/* Waits until every row of slot is in the step's buffer (retrying failed or short reads);
 * -1 with the file, offset and reason when a read keeps failing. */
int ds41_engram_step_wait(ds41_engram_step *st, int slot, ds41_err *err);
/* Moves the step's reads on without blocking: submits the ones not yet submitted (issue holds
 * back all but the first slot's) and takes the completions that are in. 1 when every slot's
 * rows are in (ds41_engram_step_wait then returns at once and reports any failure), 0 while
 * reads are in flight. On the pread path the reads are done here, so it returns 1. */
int ds41_engram_step_poll(ds41_engram_step *st);
/* The step's copy of row id of slot: head_dim E4M3 bytes, then head_dim / 32 scale bytes; NULL
 * when the step did not issue it. Valid until the next issue. */
const uint8_t *ds41_engram_step_row(const ds41_engram_step *st, int slot, int64_t id);

/* Another source of a step's rows, behind the same three calls (ds41_engine.eg_src): under
 * MPI the tables are sharded by rows across the ranks and each step's rows are exchanged
 * (src/dist/dist_engram.c). issue at the step's start over ids [n_slots][N][cols]; wait before
 * slot's Engram layer; row as ds41_engram_step_row (NULL: not issued). Every process of a job
 * calls issue for every forward and wait before every Engram layer it runs. */
typedef struct ds41_engram_src {
    void *self;
    int (*issue)(void *self, const int64_t *ids, size_t N, int cols, ds41_err *err);
    int (*wait)(void *self, int slot, ds41_err *err);
    const uint8_t *(*row)(const void *self, int slot, int64_t id);
} ds41_engram_src;

/* The Engram module (ds41_engram_apply) with the rows taken from a step: waits for slot's rows
 * first. st NULL: the rows the weights point at (mapped or in RAM). */
int ds41_engram_apply_step(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                           ds41_engram_step *st, int slot, const int64_t *ids, int T, const uint8_t *is_image,
                           float *X, ds41_err *err);
/* The same with the rows from src (waits for slot's rows first). */
int ds41_engram_apply_from(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                           const ds41_engram_src *src, int slot, const int64_t *ids, int T, const uint8_t *is_image,
                           float *X, ds41_err *err);

/* Reads every Engram table of w into anonymous memory and points the weights at the copies
 * (--engram-mode ram); *mem receives the block to free with ds41_engram_ram_free. */
int ds41_engram_tables_to_ram(const ds41_config *cfg, ds41_weights *w, void **mem, size_t *len, ds41_err *err);
void ds41_engram_ram_free(void *mem, size_t len);
/* madvise(MADV_RANDOM) on the mapped tables (--engram-mode mmap): a fault reads its page only. */
void ds41_engram_tables_advise_random(const ds41_config *cfg, const ds41_weights *w);
/* Bytes of the Engram tables (rows and scales, every layer). */
long long ds41_engram_table_bytes(const ds41_config *cfg, const ds41_weights *w);
#endif
