/* Shared by the eBPF test programs and their native (gcc) builds.
 *
 * The same source is compiled twice: `clang -O2 -target bpf -mcpu=v4 -c` (run by packjit from
 * the .o) and `gcc -O2 -DPJ_NATIVE` with shim.c (the oracle). Entry points take the context
 * the way packjit passes it: r1 = pointer, r2 = length. */
#ifndef PJ_H
#define PJ_H

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

#ifdef PJ_NATIVE
#define SEC(name)
#include <stdio.h>
#define PJ_REPORT(sym) printf("global %s %llx\n", #sym, (u64)(sym))
#else
#define SEC(name) __attribute__((section(name), used))
#endif

#define NOINLINE __attribute__((noinline))

/* The extern helper: resolved by name to the helper the test registers as "pj_mix"
 * (shim.c defines the same function for the native build). */
extern u64 pj_mix(u64 a, u64 b);

#endif
