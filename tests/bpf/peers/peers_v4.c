/* The signed-arithmetic program of the side-by-side bench: `sdiv`/`smod` and sign extension
 * exist only from cpu v4, so this one is built with `-mcpu=v4` (rbpf 0.4.1 cannot run it). */
#include "../pj.h"

typedef long long s64;
typedef int s32;
typedef short s16;

/* Signed 32-bit samples from the context: a running mean by signed division, the sum of
 * signed remainders against a run-time divisor, and a sign-extended delta. */
SEC("peers/signed")
u64 signed_arith(const u8 *p, u64 len)
{
    s64 sum = 0, rems = 0, mean = 0, prev = 0;
    s64 n = 0;
    for (u64 i = 0; i + 4 <= len; i += 4) {
        s32 v = (s32)(p[i] | p[i + 1] << 8 | p[i + 2] << 16 | (u32)p[i + 3] << 24);
        n++;
        sum += v;
        mean = sum / n;
        s64 d = (s64)v - prev;
        s64 div = (d & 0xff) - 128;
        if (div == 0)
            div = 7;
        rems += (s64)v % div;
        prev = (s16)v;
        mean += (s64)(s32)(v / 3);
    }
    return (u64)(sum ^ rems ^ (mean << 17));
}
