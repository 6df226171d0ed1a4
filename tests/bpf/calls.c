/* Calls across sections: the entry (selected by function name) calls a static function in
 * .text, a global one in its own section, and that one calls back into .text. A .rodata
 * lookup table and a .bss histogram are shared between them. */
#include "pj.h"

static const u8 sbox[32] = {
    0x63, 0x7c, 0x77, 0x7b, 0xf2, 0x6b, 0x6f, 0xc5, 0x30, 0x01, 0x67, 0x2b, 0xfe, 0xd7, 0xab, 0x76,
    0xca, 0x82, 0xc9, 0x7d, 0xfa, 0x59, 0x47, 0xf0, 0xad, 0xd4, 0xa2, 0xaf, 0x9c, 0xa4, 0x72, 0xc0,
};

u32 histogram[8];

static NOINLINE u64 subst(u64 x)
{
    u64 r = 0;
    for (int i = 0; i < 8; i++)
        r |= (u64)sbox[(x >> (8 * i)) & 31] << (8 * i);
    return r;
}

__attribute__((section("pj/lib"))) NOINLINE u64 round_fn(u64 x, u64 k)
{
    histogram[x & 7]++;
    return subst(x ^ k) + (x >> 3);
}

SEC("pj/calls")
u64 prog_calls(u8 *mem, u64 len)
{
    u64 acc = len;
    for (u64 i = 0; i + 8 <= len && i < 64; i += 8) {
        u64 w = 0;
        for (int b = 0; b < 8; b++)
            w |= (u64)mem[i + b] << (8 * b);
        acc = round_fn(acc, w);
    }
    return pj_mix(acc, histogram[3]);
}

#ifdef PJ_NATIVE
void pj_report(void)
{
    for (int i = 0; i < 8; i++)
        printf("global histogram[%d] %llx\n", i, (u64)histogram[i]);
}
#endif
