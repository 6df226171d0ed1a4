/* A tail call inside a `static __noinline` function, through a BTF prog array initialised
 * statically, as libbpf programs write it: clang emits the call in a bpf-to-bpf function,
 * and the kernel runs it (x86-64 since 5.10, arm64 since 6.0). The context is a packet:
 * byte 0 the slot `dispatch` tail calls, byte 1 a value, byte 2 the entry's factor, byte 3
 * counted by the stage. */
#include "pj.h"

#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name
#define __array(name, val) typeof(val) *name[]

#define BPF_MAP_TYPE_PROG_ARRAY 3

static long (*bpf_tail_call)(void *ctx, void *prog_array_map, u32 index) = (void *)12;

int stage(u8 *pkt);

struct {
    __uint(type, BPF_MAP_TYPE_PROG_ARRAY);
    __uint(max_entries, 4);
    __type(key, u32);
    __array(values, int(void *));
} stages SEC(".maps") = {
    .values = { [1] = (void *)&stage },
};

/* The stage's result when slot pkt[0] holds one (the tail call does not come back here),
 * else 100 + pkt[1]. */
static __attribute__((noinline)) int dispatch(u8 *pkt)
{
    volatile u32 keep = pkt[1]; /* a frame of its own */
    bpf_tail_call(pkt, &stages, pkt[0]);
    return 100 + keep;
}

SEC("pj/entry")
int entry(u8 *pkt, u64 len)
{
    volatile u64 frame = 7; /* the caller's stack, read after the call */
    u64 mine = pkt[2] * 3;   /* live across the call */
    int r = dispatch(pkt);
    return r + mine + frame;
}

/* `return dispatch(pkt)`: clang emits `call dispatch; exit`, a call in tail position, so
 * dispatch's tail call leaves both frames and jumps to the stage (its result is the run's). */
SEC("pj/entry_return")
int entry_return(u8 *pkt, u64 len)
{
    return dispatch(pkt);
}

SEC("pj/stage")
int stage(u8 *pkt)
{
    pkt[3] += 1;
    return 1000 + pkt[1];
}
