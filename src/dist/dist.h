/* ds41 across MPI ranks (docs/distributed.md): one binary that runs as a plain process, or as
 * one rank of an `mpiexec -n N ds41 ...` job (built with MPI when mpicc was on PATH:
 * DS41_HAVE_MPI).
 *
 * The job is SPMD: every rank runs the same command over its own copy (or mapping) of the
 * checkpoint. Attention, norms, router, shared experts, embeddings and head are replicated;
 * the routed experts are owned by ranks (ds41_dist_owner) and reached through the MoE
 * dispatch (layers/moe.h): each rank runs its own experts on the rows routed to them and
 * sends their outputs to every other rank, which add all of them in the canonical expert
 * order, so that every rank holds the bit-identical result of one process. Each forward,
 * rank 0 broadcasts the step's plan (sequences, positions, row counts, token ids) and every
 * other rank checks that it is about to run exactly that plan. Only rank 0 writes output.
 *
 * Layer: above layers (the dispatch), below engine (which installs it). */
#ifndef DS41_DIST_H
#define DS41_DIST_H

#include <stdint.h>
#include <stdio.h>

#include "moe.h"

/* main(): starts MPI when the process was launched by a process manager (PMI_SIZE,
 * OMPI_COMM_WORLD_SIZE or PMIX_RANK in the environment; a plain run pays nothing), mutes the
 * output of ranks other than 0 (DS41_MPI_VERBOSE=1 keeps their stderr), and takes the job's
 * flags out of argv (--mpi-timeout SECONDS, --expert-map FILE) so that every command accepts
 * them. Returns 0, or an exit status after printing why (a bad flag, MPI without MPI built
 * in). */
int ds41_dist_start(int *argc, char **argv);

/* Under a launcher with world > 1 ranks: fork; the child execs this binary again with argv and
 * returns from here as the rank, the parent waits for it and names the rank if a signal killed
 * it (dist_watch.c). Returns at once without a launcher, with DS41_RANK_WATCH=0, or in the child. */
void ds41_rank_watch(int world, char **argv);
/* main()'s end: rc 0 on every rank -> MPI_Finalize; otherwise the job ends with MPI_Abort, so
 * that no rank waits for one that left. Returns rc. */
int ds41_dist_finish(int rc);
/* Bytes of [p, p + n) present in this process's page tables (/proc/self/pagemap bit 63): what
 * this process has touched (or the kernel mapped around a touch), whoever else shares the page
 * cache. -1 when unreadable. (MPI builds only.) */
long long ds41_dist_resident(const void *p, size_t n);
/* The weights w are about to be unmapped: under DS41_MPI_VERBOSE=1 the routed experts' residency
 * is measured now (reported by ds41_dist_finish), and the job forgets w. */
void ds41_dist_weights_closing(const struct ds41_weights *w);
/* Under the expert split (not --split layers): 1 when the tensor NAME is a routed expert
 * (backbone or DSpark) another rank owns under the job's placement (the default, or
 * --expert-map), which this rank never reads: --load copy does not copy it, --readahead does not
 * advise it; 0 otherwise, and for one process. */
int ds41_dist_not_mine(const ds41_config *c, const char *name);
int ds41_dist_rank(void);
/* --expert-map FILE of the command line, or NULL. */
const char *ds41_dist_expert_map(void);
int ds41_dist_size(void);
/* 1 when the binary was built with MPI. */
int ds41_dist_built(void);
/* --mpi-timeout in seconds, or its 30 s default (the bound of the waits on rank 0's decisions;
 * inside a replicated forward the default is derived from the forwards' times, dist_mpi.c). */
double ds41_dist_timeout(void);
/* fn(message) runs on rank 0 when the job is about to end on a fault (a lost rank, ranks that
 * drifted apart), on the thread that saw it, before MPI_Abort: serve answers the requests in
 * flight (it must return within a few seconds). NULL: none. */
void ds41_dist_set_fault_hook(void (*fn)(const char *msg));
/* On ranks other than 0: a fault this rank sees ends the job only s seconds later, so that
 * rank 0, which sees the same fault (a broken link) at about the same time, ends it after its
 * hook ran (serve's followers). 0: at once (the default). */
void ds41_dist_set_fault_delay(double s);

/* ---- placement of the routed experts (dist_place.c) ----
 * Layer l counts the backbone layers and then the DSpark stages (n_layers + s). Default:
 * expert e of every layer on rank e mod N. A map file overrides single entries. */
typedef struct ds41_placement {
    int n_ranks, n_layers, n_experts;   /* n_layers: backbone + DSpark stages */
    int16_t *owner;                     /* [n_layers][n_experts] */
} ds41_placement;
int ds41_placement_default(ds41_placement *p, int n_ranks, int n_layers, int n_experts);
/* Applies the map text (its name for messages): lines "LAYER EXPERT RANK" or "* EXPERT RANK"
 * (every layer), '#' comments, blank lines. Returns 0 or -1 with err naming the line. */
int ds41_placement_parse(ds41_placement *p, const char *text, size_t len, const char *name, char *err, size_t errcap);
int ds41_placement_load(ds41_placement *p, const char *path, char *err, size_t errcap);
void ds41_placement_free(ds41_placement *p);
static inline int ds41_dist_owner(const ds41_placement *p, int layer, int expert) {
    return p->owner[(size_t)layer * p->n_experts + expert];
}
/* Routing counts (`ds41 bench --routing-counts FILE` writes them): lines "LAYER EXPERT COUNT",
 * '#' comments, blank lines, the layers and experts of p. Adds each line's COUNT into
 * counts [p->n_layers][p->n_experts]. 0, or -1 with err naming the file and line. */
int ds41_route_counts_load(const ds41_placement *p, const char *path, unsigned long long *counts, char *err,
                           size_t errcap);
/* A placement balanced on the counts: per layer with any count, its experts (experts[l] of
 * them) in descending count (ties: ascending id) each go to the rank with the least count so
 * far among those holding fewer than ceil(experts[l] / N) of the layer's experts (ties: the
 * fewest experts, then the lowest rank), so every rank keeps an equal share of the layer's
 * bytes and the hot experts spread; a layer without counts keeps the default. */
void ds41_placement_balance(ds41_placement *p, const unsigned long long *counts, const int *experts);
/* Writes p as a map file for --expert-map: "LAYER EXPERT RANK" for every expert of the layers
 * with counts (experts[l] each; the other layers keep the default and get no line); header
 * names the source in a comment. 0, or -1 (a write error). */
int ds41_placement_write(const ds41_placement *p, const unsigned long long *counts, const int *experts,
                         const char *header, FILE *f);

/* ---- the job, once the model is loaded (dist_mpi.c) ----
 * What every rank must agree on, hashed: the config, the shard list (names and sizes), the
 * flags that change results (the command line without the model path), the kernel mode. */
typedef struct ds41_dist_ident {
    uint64_t config, shards, flags, kernels;
} ds41_dist_ident;
/* FNV-1a over n bytes, continuing from h (start with DS41_FNV0). */
#define DS41_FNV0 1469598103934665603ULL
uint64_t ds41_fnv(uint64_t h, const void *p, size_t n);
/* The flags hash of argv: every argument but the values of -m / --model and the command's
 * first positional path. */
uint64_t ds41_dist_flags_hash(void);
/* The identity of the checkpoint in dir (st: its tensors, NULL when it failed to load) under
 * this command line and kernel mode. 0, or -1 when out of memory. */
struct ds41_st;
int ds41_dist_ident_of(const char *dir, const struct ds41_st *st, int exact, ds41_dist_ident *id);

/* Collective start-up check, called by every rank after its load, successful (fail = NULL)
 * or not (fail = its error): rank 0 names each rank that failed or differs from rank 0 in
 * one of the four hashes. Then builds the placement (--expert-map or the default) for the
 * model's layers and returns the MoE dispatch the engine installs. 0, or -1 with err (the
 * same verdict on every rank). */
int ds41_dist_join(const ds41_config *cfg, const struct ds41_weights *w, const ds41_dist_ident *id, const char *fail,
                   const ds41_moe_dispatch **moe, char *err, size_t errcap);
/* Per forward (every rank): rank 0's plan (count sequences, each at pos[i] with T[i] rows of
 * tokens[i]) is broadcast and compared with this rank's. 0, or -1 with err. */
int ds41_dist_step(int count, const long long *pos, const int *T, const int32_t *const *tokens, char *err, size_t errcap);
/* Rank 0's n bytes at buf on every rank (a decision only rank 0 may take: a measured curve,
 * whether a cache file exists). 0, or -1 when n is too large. */
int ds41_dist_bcast(void *buf, size_t n);
/* The same, waiting at most limit seconds instead of --mpi-timeout (<= 0: no limit: the
 * other ranks wait for a person typing on rank 0's terminal; a dead rank 0 still ends the
 * job through the launcher). */
int ds41_dist_bcast_wait(void *buf, size_t n, double limit);
/* The least of every rank's v, on every rank (rank 0 gathers and broadcasts it; a silent
 * rank is named, what: the exchange, in the message). One process: v. */
long long ds41_dist_min(long long v, const char *what);
/* The sum of every rank's v, on every rank (the same exchange). One process: v. */
long long ds41_dist_sum(long long v, const char *what);
/* This rank's routed-expert bytes and the replicated ones, and the bytes each token sent and
 * received in expert exchanges so far (for bench and inspect). */
typedef struct ds41_dist_stats {
    long long exchanges;        /* MoE sublayers exchanged */
    long long rows;             /* rows over them */
    long long bytes_sent, bytes_recv;
    double wait_s;              /* time spent waiting for peers' outputs */
} ds41_dist_stats;
void ds41_dist_get_stats(ds41_dist_stats *s);

/* ---- serve --dp-attention (dist_dp.c) ----
 * Each rank runs the forwards of its own sequences only and brings their rows to the expert
 * exchange: per MoE sublayer every rank sends each expert owner the rows routed to its
 * experts, the owner runs them in one call with its own rows and sends the outputs back, and
 * each rank adds its rows' k outputs in ascending expert id (the order of one process). The
 * ranks stay in lock step: every forward starts with a round in which each rank says whether
 * it runs one; a rank that has none (or has finished its part of the step) joins with zero
 * rows. Set on every rank before ds41_load (it installs this dispatch; the Engram rows a
 * forward needs are asked of their owners in its start round, dist_engram.c). */
void ds41_dist_set_dp(int on);
int ds41_dist_dp(void);
/* The ranks an Engram table is sharded over: the job's size. */
int ds41_dist_engram_shards(void);
/* --dp-attention: rows of rank q's forward in the round under way (0: it runs none). */
int ds41_dist_dp_rows(int q);
/* --dp-attention, a rank outside a forward in a forward round: answers the other ranks' Engram
 * row requests (dist_engram.c). */
void ds41_dist_engram_dp_serve(void);
/* --dp-attention, prefetch mode: the rows other ranks asked of this rank, read while its own
 * forward runs, are sent once their reads are in; called in front of each MoE round of layer
 * `layer` (-1: a round that starts a forward), it sends them if they are in, and always from
 * the first Engram layer on (a peer's forward may be waiting there for them). */
void ds41_dist_engram_dp_progress(int layer);
/* This rank's part of a step is done (it ran its sequences' forwards, perhaps none): joins
 * the other ranks' remaining forwards with zero rows until every rank's part is done. ctx:
 * the engine's (its kernels run the rows other ranks route to this rank's experts). */
void ds41_dist_dp_done(const ds41_ctx *ctx);
/* A step's answers to rank 0 (bounded by --mpi-timeout): a rank > 0 sends its n bytes at buf
 * (n > 0); rank 0 receives n[q] bytes into buf[q] from every rank q > 0 with n[q] > 0. */
void ds41_dist_dp_send0(const void *buf, size_t n);
void ds41_dist_dp_recv0(void *const *buf, const size_t *n);

/* ---- Engram tables sharded by rows (dist_engram.c) ----
 * Rank r of n holds rows [lo, hi) of a table of `rows` rows: contiguous runs of rows / n, the
 * first rows % n ranks one row more. */
void ds41_dist_engram_range(int64_t rows, int r, int n, int64_t *lo, int64_t *hi);
/* Every rank, after its load and before the start-up check: this rank's rows of every Engram
 * table, read from where the engine placed them (ram: copies only its rows into RAM; io: the
 * prefetch reader, which then reads only its rows; otherwise the mapping, its first and last
 * rows probed), and the row source the engine installs (ds41_engine.eg_src), which exchanges
 * each step's rows between the ranks. *src = NULL in one process or without Engram. 0, or -1
 * with why (a shard this rank cannot read, out of memory). */
struct ds41_engram_io;
struct ds41_engram_src;
int ds41_dist_engram_open(const ds41_config *cfg, const struct ds41_weights *w, const struct ds41_st *st, int ram,
                          struct ds41_engram_io *io, const struct ds41_engram_src **src, char *why, size_t cap);
void ds41_dist_engram_close(void);
typedef struct ds41_dist_engram_stats {
    long long steps;            /* steps exchanged */
    long long rows;             /* distinct rows over them (every rank's) */
    long long bytes_sent, bytes_recv;
    double wait_s;              /* time spent waiting for peers' rows */
} ds41_dist_engram_stats;
void ds41_dist_engram_get_stats(ds41_dist_engram_stats *s);
/* One line for DS41_MPI_VERBOSE (this rank's rows, the table bytes resident in this process
 * inside and outside them, the exchange counters) into line; 0 when nothing is sharded. */
int ds41_dist_engram_report(char *line, size_t cap);

/* Ends the job (under MPI: one message, MPI_Abort after rank 0's fault hook; one process
 * built without MPI: the message and exit(code)). */
void ds41_dist_fatal(int code, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));

#ifdef DS41_HAVE_MPI
#include <mpi.h>
/* Waits for r[0..n) (peer[i]: the rank request i talks to) at most --mpi-timeout; past it the
 * job ends with one message naming the ranks that did not answer (what: the exchange). */
void ds41_dist_wait(MPI_Request *r, int n, const int *peer, const char *what);
/* dist_dp.c's reach into the job (dist_mpi.c): the experts' placement, the end of the job on
 * a fault (one message, MPI_Abort), the exchange counters of ds41_dist_get_stats. */
const ds41_placement *ds41_dist_placement(void);
void ds41_dist_count(long long rows, long long sent, long long recv);
/* acc[t] += the k outputs slots[t * k + i] of row t of r, in ascending expert id (the additions
 * of one process, in its order), row by row. */
void ds41_dist_combine(const ds41_moe_rows *r, const float *slots, float *acc);
/* Under --dp-attention: the dispatch ds41_dist_join installs, and the start of a forward of
 * rows rows (ds41_dist_step: the round in which every rank says whether it runs one). */
const ds41_moe_dispatch *ds41_dist_dp_dispatch(const ds41_config *cfg, const ds41_weights *w);
void ds41_dist_dp_forward(int rows);
#endif

#endif
