/* For `packjit-demo run` / `dump`: an rbpf helper by its rbpf name (`sqrti`), a .rodata
 * table, a .bss counter and a string literal. r0 = sqrti(table[len & 3] * 100) + first
 * byte + strlen-like scan of a literal. */
#include "pj.h"

extern u64 sqrti(u64 x, u64 a, u64 b, u64 c, u64 d);

static const u64 table[4] = {10, 20, 30, 40};
u64 calls;

NOINLINE u64 scan(const char *s)
{
    u64 n = 0;
    while (s[n])
        n++;
    return n;
}

SEC("demo")
u64 prog_demo(u8 *mem, u64 len)
{
    calls++;
    return sqrti(table[len & 3] * 100, 0, 0, 0, 0) + (len ? mem[0] : 0) + scan("packjit");
}
