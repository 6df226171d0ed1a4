/* demo_maps.c: a per-protocol packet counter, written the way a libbpf user would.
 *
 *   clang-19 -O2 -g -target bpf -mcpu=v4 -c tests/bpf/demo_maps.c -o demo_maps.o
 *   packjit-demo run demo_maps.o --section pj/count --mem 06 --mem 11 --mem 06 --maps
 *
 * The context is a packet: byte 0 is the IP protocol number (6 TCP, 17 UDP, 1 ICMP, ...).
 * For every packet the program
 *   1. counts it in `packets`, a hash map from protocol to packet count,
 *   2. sends an event (protocol, packet length, count so far) through the ring buffer
 *      `events`, which the host reads after the run,
 *   3. hands ICMP packets on to a second program, `icmp`, with a tail call through the
 *      prog array `next`; `icmp` counts them in `icmp_bytes`, an array.
 * It returns 1 (pass); the `icmp` stage returns 2.
 *
 * packjit-demo loads both programs (every program a prog array names is loaded too), fills
 * `next` as libbpf would, and with --maps prints every map after the runs. */
#include "pj.h"

/* libbpf's map definition macros (bpf_helpers.h), spelled out so no header is needed. */
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name
#define __array(name, val) typeof(val) *name[]

#define BPF_MAP_TYPE_HASH 1
#define BPF_MAP_TYPE_ARRAY 2
#define BPF_MAP_TYPE_PROG_ARRAY 3
#define BPF_MAP_TYPE_RINGBUF 27
#define BPF_NOEXIST 1

/* The kernel's helpers, by number (bpf_helper_defs.h). */
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_map_update_elem)(void *map, const void *key, const void *value, u64 flags) = (void *)2;
static long (*bpf_tail_call)(void *ctx, void *prog_array_map, u32 index) = (void *)12;
static void *(*bpf_ringbuf_reserve)(void *ringbuf, u64 size, u64 flags) = (void *)131;
static void (*bpf_ringbuf_submit)(void *data, u64 flags) = (void *)132;

#define PROTO_ICMP 1

/* protocol -> packets seen */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 256);
    __type(key, u32);
    __type(value, u64);
} packets SEC(".maps");

/* [0] = bytes of ICMP packets seen by the second stage */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, u64);
} icmp_bytes SEC(".maps");

/* One record per packet, read by the host. */
struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 4096);
} events SEC(".maps");

struct event {
    u32 proto;
    u32 len;
    u64 count; /* packets of this protocol so far, this one included */
};

/* The second stage, reached by tail call: slot PROTO_ICMP of `next` is statically set. */
int icmp(void *ctx, u64 len);

struct {
    __uint(type, BPF_MAP_TYPE_PROG_ARRAY);
    __uint(max_entries, 2);
    __type(key, u32);
    __array(values, int(void *, u64));
} next SEC(".maps") = {
    .values = { [PROTO_ICMP] = (void *)&icmp },
};

SEC("pj/count")
int count(u8 *pkt, u64 len)
{
    u32 proto = len ? pkt[0] : 0;
    u64 one = 1, seen = 1;

    /* First packet of a protocol: insert 1; later ones: add 1 in place (atomically, as
     * other CPUs may count the same protocol). */
    u64 *c = bpf_map_lookup_elem(&packets, &proto);
    if (c)
        seen = __sync_add_and_fetch(c, 1);
    else
        bpf_map_update_elem(&packets, &proto, &one, BPF_NOEXIST);

    /* A full ring buffer drops the event; the count above still happened. */
    struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
    if (e) {
        e->proto = proto;
        e->len = len;
        e->count = seen;
        bpf_ringbuf_submit(e, 0);
    }

    /* On success the tail call does not return: `icmp`'s result is the run's. */
    if (proto == PROTO_ICMP)
        bpf_tail_call(pkt, &next, PROTO_ICMP);
    return 1;
}

SEC("pj/icmp")
int icmp(void *ctx, u64 len)
{
    u32 zero = 0;
    u64 *b = bpf_map_lookup_elem(&icmp_bytes, &zero);
    if (b)
        __sync_fetch_and_add(b, len);
    return 2;
}
