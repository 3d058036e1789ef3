// The header's calls are inline; this file holds those that are not.
#define _GNU_SOURCE
#include <pthread.h>

#include "CLinuxSupport.h"

#include <stdint.h>
#include <string.h>

// CRC-32C (Castagnoli), for the store's intent log: the SSE 4.2 instruction where the CPU has
// it (about 8 bytes a cycle's worth of throughput), a table otherwise.

static uint32_t crc32c_table[256];

static void crc32c_fill_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        crc32c_table[i] = c;
    }
}

static uint32_t crc32c_software(uint32_t crc, const uint8_t *p, size_t n) {
    static int filled = 0;
    if (!__atomic_load_n(&filled, __ATOMIC_ACQUIRE)) {
        crc32c_fill_table();  // idempotent: racing fillers write the same values
        __atomic_store_n(&filled, 1, __ATOMIC_RELEASE);
    }
    while (n--) crc = crc32c_table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2")))
static uint32_t crc32c_hardware(uint32_t crc, const uint8_t *p, size_t n) {
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = __builtin_ia32_crc32di(c, word);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32;
}
#endif

uint32_t docfs_crc32c(uint32_t crc, const void *bytes, size_t count) {
    const uint8_t *p = bytes;
    crc = ~crc;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.2")) return ~crc32c_hardware(crc, p, count);
#endif
    return ~crc32c_software(crc, p, count);
}

int docfs_set_thread_name(const char *name) {
    char shortened[16];
    strncpy(shortened, name, sizeof shortened - 1);
    shortened[sizeof shortened - 1] = 0;
    return pthread_setname_np(pthread_self(), shortened);
}
