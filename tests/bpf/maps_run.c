/* A per-protocol packet counter as libbpf users write it: a hash map of counters, an array
 * of byte totals, a ring buffer of events and a tail call into a second stage through a
 * statically initialised prog array. The context is a packet: byte 0 is the protocol. */
#include "pj.h"

#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name
#define __array(name, val) typeof(val) *name[]

#define BPF_MAP_TYPE_HASH 1
#define BPF_MAP_TYPE_ARRAY 2
#define BPF_MAP_TYPE_PROG_ARRAY 3
#define BPF_MAP_TYPE_RINGBUF 27
#define BPF_NOEXIST 1

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_map_update_elem)(void *map, const void *key, const void *value, u64 flags) = (void *)2;
static long (*bpf_tail_call)(void *ctx, void *prog_array_map, u32 index) = (void *)12;
static void *(*bpf_ringbuf_reserve)(void *ringbuf, u64 size, u64 flags) = (void *)131;
static void (*bpf_ringbuf_submit)(void *data, u64 flags) = (void *)132;

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 256);
    __type(key, u32);
    __type(value, u64);
} counts SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 4);
    __type(key, u32);
    __type(value, u64);
} bytes SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 4096 * 4);
} events SEC(".maps");

struct event {
    u32 proto;
    u32 len;
    u64 seen;
};

int stage2(void *ctx);

struct {
    __uint(type, BPF_MAP_TYPE_PROG_ARRAY);
    __uint(max_entries, 2);
    __type(key, u32);
    __array(values, int(void *));
} stages SEC(".maps") = {
    .values = { [1] = (void *)&stage2 },
};

SEC("pj/count")
int count(u8 *pkt, u64 len)
{
    u32 proto = len ? pkt[0] : 0;
    u64 one = 1, seen = 1;
    u64 *c = bpf_map_lookup_elem(&counts, &proto);
    if (c)
        seen = __sync_add_and_fetch(c, 1);
    else
        bpf_map_update_elem(&counts, &proto, &one, BPF_NOEXIST);

    u32 k = proto & 3;
    u64 *b = bpf_map_lookup_elem(&bytes, &k);
    if (b)
        __sync_fetch_and_add(b, len);

    struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
    if (e) {
        e->proto = proto;
        e->len = len;
        e->seen = seen;
        bpf_ringbuf_submit(e, 0);
    }
    /* Odd protocols continue in stage 2. */
    if (proto & 1)
        bpf_tail_call(pkt, &stages, 1);
    return 1;
}

SEC("pj/stage2")
int stage2(void *ctx)
{
    u32 k = 3;
    u64 *b = bpf_map_lookup_elem(&bytes, &k);
    if (b)
        __sync_fetch_and_add(b, 1000);
    return 2;
}
