/* What a budget charge costs on x86-64, counted in memory or in a register, in short loops
 * that mispredict their exits (kv's key scan: h = h * 33 + c until '=' or ';') and in one
 * long loop. Not part of the build; see docs/BENCHMARKS.md, "The budget's charge on an
 * Intel host".
 *
 *   gcc -O2 -o short_loops benches/budget-charge/short_loops.c && ./short_loops
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* One scan from i to the next '=' or ';' (or n); CHARGE is the back-edge, LOAD what runs
 * on the way into the loop. */
#define SCANS(LOAD, CHARGE)                                                          \
    uint64_t h = 5381, i = 0, c, tot = 0;                                            \
    while (i < n) {                                                                  \
        __asm__ volatile(LOAD ".p2align 5\n1:\n\t"                                             \
                              "movzbl (%[p],%[i]), %k[c]\n\t"                        \
                              "cmp $0x3b, %k[c]\n\t je 2f\n\t"                       \
                              "cmp $0x3d, %k[c]\n\t je 2f\n\t"                       \
                              "imul $33, %[h], %[h]\n\t add %[c], %[h]\n\t"          \
                              "add $1, %[i]\n\t cmp %[n], %[i]\n\t" CHARGE "2:\n\t"  \
                         : [h] "+r"(h), [i] "+r"(i), [c] "=&r"(c), [b] "+r"(b)      \
                         : [p] "r"(p), [n] "r"(n), [bm] "r"(bm)                      \
                         : "cc", "memory");                                          \
        i++;                                                                         \
        tot += h;                                                                    \
    }                                                                                \
    return tot;

typedef uint64_t (*scan_fn)(const uint8_t *, uint64_t, uint64_t *);

/* No budget: the loop's own test is the jump back. */
__attribute__((noinline)) static uint64_t none(const uint8_t *p, uint64_t n, uint64_t *bm)
{
    uint64_t b = 0;
    SCANS("", "jb 1b\n\t")
}
/* packjit's memory counter: sub [budget], c; jae top (the stop's jmp never taken). */
__attribute__((noinline)) static uint64_t memory(const uint8_t *p, uint64_t n, uint64_t *bm)
{
    uint64_t b = 0;
    SCANS("", "jae 2f\n\t subq $11, (%[bm])\n\t jae 1b\n\t")
}
/* A register loaded once per call. */
__attribute__((noinline)) static uint64_t reg(const uint8_t *p, uint64_t n, uint64_t *bm)
{
    uint64_t b = *bm;
    SCANS("", "jae 2f\n\t sub $11, %[b]\n\t jae 1b\n\t")
}
/* packjit's budget loops: loaded at each loop's head on the way in, each charge a sub of
 * the register and a store of it back. */
__attribute__((noinline)) static uint64_t loop_reg(const uint8_t *p, uint64_t n, uint64_t *bm)
{
    uint64_t b = 0;
    SCANS("mov (%[bm]), %[b]\n\t", "jae 2f\n\t sub $11, %[b]\n\t mov %[b], (%[bm])\n\t jae 1b\n\t")
}

int main(void)
{
    static uint8_t keys[4096], text[4096];
    srand(1);
    for (int i = 0; i < 4096; i++) {
        keys[i] = (rand() % 5 == 0) ? ((rand() & 1) ? '=' : ';') : 'a' + rand() % 26;
        text[i] = 'a';
    }
    scan_fn f[] = {none, memory, reg, loop_reg};
    const char *name[] = {"no budget", "memory", "register", "register per loop"};
    const uint8_t *input[] = {keys, text};
    const char *shape[] = {"short loops", "one long loop"};
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < 4; k++) {
            double best = 1e9;
            uint64_t sink = 0;
            for (int t = 0; t < 20; t++) {
                uint64_t b = ~0ull >> 1;
                double t0 = now();
                for (int j = 0; j < 2000; j++)
                    sink += f[k](input[s], 4096, &b);
                double dt = (now() - t0) / (2000.0 * 4096);
                if (dt < best)
                    best = dt;
            }
            printf("%-13s %-17s %.3f ns/byte (%d)\n", shape[s], name[k], best * 1e9, (int)(sink & 1));
        }
    return 0;
}
