/* libFuzzer harness for the decoder of rank 0's messages to its 503 guard under mpiexec
 * (src/serve/serve_mpi_wire.c, ds41_sguard_decode): the first input byte is the number of
 * descriptors the message came with (0-3), the rest the message. It must decode with every
 * field inside the message (the two answers exactly fill it) or be refused with one line
 * starting "serve guard: "; never crash or read past it. Build and run with `make fuzz`. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve_mpi.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int nfd = data[0] & 3;
    size_t n = size - 1;
    uint8_t *b = malloc(n ? n : 1);   /* exactly n bytes: ASan sees any overread */
    if (!b) return 0;
    memcpy(b, data + 1, n);
    ds41_sguard_msg m;
    char err[256];
    err[0] = 0;
    int r = ds41_sguard_decode(b, n, nfd, &m, err, sizeof err);
    if (r == 0) {
        if (m.op < DS41_SGUARD_OPEN || m.op > DS41_SGUARD_BYE) abort();
        if (m.op == DS41_SGUARD_OPEN) {
            if (nfd != 1 || m.id == 0 || m.n_full == 0 || m.written < 0) abort();
            if (m.full != b + DS41_SGUARD_HDR || m.tail != m.full + m.n_full || DS41_SGUARD_HDR + m.n_full + m.n_tail != n) abort();
            if ((m.flags & DS41_SGUARD_STREAM) && m.n_tail == 0) abort();
        } else if (n != DS41_SGUARD_HDR || nfd != 0 || m.full || m.tail) {
            abort();
        }
    } else if (r != -1 || !memchr(err, 0, sizeof err) || strchr(err, '\n') || strncmp(err, "serve guard: ", 13)) {
        abort();
    }
    free(b);
    return 0;
}
