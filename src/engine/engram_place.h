/* ds41 Engram placement (P4): where the Engram tables live (RAM, mmap, prefetched from disk),
 * chosen at load from the tables' size and the memory available, and the two hooks the
 * forward pass calls in prefetch mode. */
#ifndef DS41_ENGRAM_PLACE_H
#define DS41_ENGRAM_PLACE_H

#include "engram_io.h"
#include "forward.h"

/* DS41_ENGRAM_AUTO / RAM / MMAP / PREFETCH as in ds41.h. */
enum { DS41_EG_AUTO = 0, DS41_EG_RAM = 1, DS41_EG_MMAP = 2, DS41_EG_PREFETCH = 3 };

/* Bytes this process can still use: MemAvailable, or less when its memory cgroup (v1 or v2)
 * has a limit (limit - usage + the cgroup's page cache). -1 when unknown. */
long long ds41_memory_available(char *why, size_t why_cap);

/* Places the engine's Engram tables: mode DS41_EG_* (AUTO: prefetch when the tables exceed
 * half of the memory available, else mmap), row cache cache_bytes (0: min(1 GiB, 1/16 of the
 * memory available), prefetch only). Writes the start-up lines when the tables are not simply
 * mapped in memory that holds them (or always with verbose). No Engram layer: nothing. */
int ds41_engine_engram_place(ds41_engine *e, int mode, long long cache_bytes, int load_copy, int verbose,
                             ds41_err *err);
void ds41_engine_engram_free(ds41_engine *e);

/* Forward hooks. Step start: issue the reads (or under MPI the exchange) of the rows ids
 * [n_slots][N][cols] needs (a no-op when the tables are mapped or in RAM in one process). */
int ds41_engram_prefetch_issue(ds41_seq *s, const int64_t *ids, size_t N, ds41_err *err);
/* Before an Engram layer: the module for slot on X [T, hc, dim] with the ids of its rows, the
 * rows from the step's source (the engine's eg_src under MPI, else the sequence's prefetch
 * step, else the tables the weights point at); is_image: NULL, or 1 at image rows (dead tokens). */
int ds41_engram_layer(ds41_seq *s, const ds41_layer_weights *lw, int slot, const int64_t *ids, int T,
                      const uint8_t *is_image, float *X, ds41_err *err);
#endif
