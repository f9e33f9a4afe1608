/* CRC32C: slicing-by-8 tables (built once) and the SSE4.2 crc32 instruction, chosen at run
 * time with __builtin_cpu_supports. */
#include "crc32c.h"

#include <pthread.h>
#include <string.h>
#include <nmmintrin.h>

#define POLY 0x82F63B78u

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void build_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (POLY & (0u - (c & 1)));
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xFF];
}

uint32_t ds41_crc32c_sw(uint32_t crc, const void *p, size_t n) {
    pthread_once(&table_once, build_table);
    const uint8_t *s = p;
    uint32_t c = ~crc;
    while (n && ((uintptr_t)s & 7)) { c = (c >> 8) ^ table[0][(c ^ *s++) & 0xFF]; n--; }
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, s, 4);
        memcpy(&hi, s + 4, 4);
        /* the tables assume little-endian words (x86-64, the only target of this build) */
        lo ^= c;
        c = table[7][lo & 0xFF] ^ table[6][(lo >> 8) & 0xFF] ^ table[5][(lo >> 16) & 0xFF] ^ table[4][lo >> 24] ^
            table[3][hi & 0xFF] ^ table[2][(hi >> 8) & 0xFF] ^ table[1][(hi >> 16) & 0xFF] ^ table[0][hi >> 24];
        s += 8;
        n -= 8;
    }
    while (n--) c = (c >> 8) ^ table[0][(c ^ *s++) & 0xFF];
    return ~c;
}

__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t c = ~crc;
    while (n && ((uintptr_t)s & 7)) { c = _mm_crc32_u8((uint32_t)c, *s++); n--; }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        c = _mm_crc32_u64(c, w);
        s += 8;
        n -= 8;
    }
    while (n--) c = _mm_crc32_u8((uint32_t)c, *s++);
    return ~(uint32_t)c;
}

int ds41_crc32c_hw(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") ? 1 : 0;
}

uint32_t ds41_crc32c(uint32_t crc, const void *p, size_t n) {
    static int mode = -1;   /* -1 unknown, 0 table, 1 SSE4.2; a benign race: every thread stores the same value */
    int m = __atomic_load_n(&mode, __ATOMIC_RELAXED);
    if (m < 0) {
        m = ds41_crc32c_hw();
        __atomic_store_n(&mode, m, __ATOMIC_RELAXED);
    }
    return m ? crc32c_hw(crc, p, n) : ds41_crc32c_sw(crc, p, n);
}
