/* Programs the sandbox must stop: a store into .rodata (read-only for the program) and a
 * load past the end of the context. */
#include "pj.h"

static const u64 table[4] = {1, 2, 3, 4};

SEC("pj/rodata_write")
u64 prog_rodata_write(u8 *mem, u64 len)
{
    /* Cast away const: the store reaches .rodata at run time. */
    volatile u64 *p = (volatile u64 *)&table[len & 3];
    *p = 42;
    return *p;
}

SEC("pj/oob_read")
u64 prog_oob_read(u8 *mem, u64 len)
{
    return *(volatile u64 *)(mem + len + 4096);
}

SEC("pj/spin")
u64 prog_spin(u8 *mem, u64 len)
{
    volatile u64 n = 0;
    for (;;)
        n++;
    return n;
}
