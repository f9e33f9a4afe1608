/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of the persistent prefix
 * store's records. ds41_crc32c uses the SSE4.2 crc32 instruction when the CPU has it (chosen
 * once at run time) and a slicing-by-8 table otherwise; both give the same values. */
#ifndef DS41_CRC32C_H
#define DS41_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* crc: 0 to start, or the value returned for the bytes before p (so that
 * ds41_crc32c(ds41_crc32c(0, a, na), b, nb) == ds41_crc32c(0, a||b, na + nb)).
 * ds41_crc32c(0, "123456789", 9) == 0xE3069283. */
uint32_t ds41_crc32c(uint32_t crc, const void *p, size_t n);
/* The table-driven implementation, whatever the CPU (for tests). */
uint32_t ds41_crc32c_sw(uint32_t crc, const void *p, size_t n);
/* 1 when ds41_crc32c uses the SSE4.2 instruction. */
int ds41_crc32c_hw(void);

#endif
