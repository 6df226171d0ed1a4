/* Global data of every kind: a .rodata table, string literals (.rodata.str*), a pointer
 * table (data relocations), an initialised .data counter, .bss counters (one static, reached
 * through the section symbol), calls between non-inlined functions and an extern helper. */
#include "pj.h"

static const u32 primes[16] = {
    2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53,
};

static const char *const names[] = {"alpha", "beta", "gamma", "delta"};

u64 runs = 7;           /* .data */
u64 bytes_seen;         /* .bss */
static u32 last_len;    /* .bss, static: referenced through the section symbol */

NOINLINE u64 mix_byte(u64 h, u8 b)
{
    return (h ^ primes[b & 15]) * 0x100000001b3ull + (b >> 4);
}

NOINLINE u64 hash_str(const char *s)
{
    u64 h = 1469598103934665603ull;
    while (*s)
        h = mix_byte(h, (u8)*s++);
    return h;
}

SEC("pj/globals")
u64 prog_globals(u8 *mem, u64 len)
{
    runs++;
    bytes_seen += len;
    last_len = (u32)len;
    u64 h = hash_str("packjit elf");
    for (u64 i = 0; i < len && i < 64; i++)
        h = mix_byte(h, mem[i]);
    if (len > 0) {
        h ^= hash_str(names[mem[0] & 3]);
        mem[0] = (u8)h;
    }
    return pj_mix(h, runs) ^ last_len;
}

#ifdef PJ_NATIVE
void pj_report(void)
{
    PJ_REPORT(runs);
    PJ_REPORT(bytes_seen);
    PJ_REPORT(last_len);
}
#endif
