/* ds41 serve: the grammar table cache. Precomputed token classes (ds41_gtables) cost up to
 * about a second to build at the production vocabulary and save most of each mask's time, so
 * the server builds them once per distinct grammar and shares them across requests: entries
 * keyed by the grammar's GBNF text (what every front end translates to, so the same schema,
 * regex or grammar maps to one entry), each owning its compiled grammar and its tables,
 * reference counted by the requests using them. Bounded by entries and bytes (the tables and
 * their memo of masks, which grows as requests use them: counted again at each release): past
 * either, entries no request holds go, least recently used first. Thread-safe: the HTTP
 * handlers look up and build (a second request for a grammar being built waits for it), the
 * scheduler thread releases. */
#ifndef DS41_SERVE_GCACHE_H
#define DS41_SERVE_GCACHE_H

#include <stddef.h>

#include "grammar.h"

enum { DS41_GCACHE_ENTRIES = 64 };

typedef struct ds41_gcache ds41_gcache;
typedef struct ds41_gentry ds41_gentry;

typedef struct ds41_gcache_stats {
    long long builds;        /* tables built (one per distinct grammar while it stays cached) */
    long long hits;          /* lookups served by an entry already built or being built */
    long long entries;
    long long bytes;         /* table bytes held */
    double build_s;          /* seconds spent building */
} ds41_gcache_stats;

/* A cache over vocabulary v (it must outlive the cache) holding at most max_bytes of tables. */
ds41_gcache *ds41_gcache_new(const ds41_gvocab *v, size_t max_bytes);
/* Frees the cache; every entry must have been released. */
void ds41_gcache_free(ds41_gcache *c);
/* The entry for GBNF text[len] compiled as *g: when the text is cached, *g is freed and set to
 * NULL; otherwise the entry takes *g (set to NULL) and its tables are built here. The entry's
 * grammar (ds41_gentry_grammar) and tables stay valid until ds41_gentry_release. NULL: out of
 * memory (*g untouched). */
ds41_gentry *ds41_gcache_get(ds41_gcache *c, const char *text, size_t len, ds41_grammar **g);
const ds41_grammar *ds41_gentry_grammar(const ds41_gentry *e);
/* The tables, NULL when their build failed (masks then come from the trie walk). */
const ds41_gtables *ds41_gentry_tables(const ds41_gentry *e);
void ds41_gentry_release(ds41_gentry *e);
void ds41_gcache_get_stats(ds41_gcache *c, ds41_gcache_stats *s);

#endif
