/* One program per map kind beyond maps_run.c, as libbpf users write them: per-CPU array
 * and hash, LRU hash, queue and stack, and the callback helpers bpf_loop and
 * bpf_for_each_map_elem. The context is `struct in`; each returns what the test's model
 * expects. */
#include "pj.h"

#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name

#define BPF_MAP_TYPE_ARRAY 2
#define BPF_MAP_TYPE_PERCPU_HASH 5
#define BPF_MAP_TYPE_PERCPU_ARRAY 6
#define BPF_MAP_TYPE_LRU_HASH 9
#define BPF_MAP_TYPE_QUEUE 22
#define BPF_MAP_TYPE_STACK 23
#define BPF_ANY 0

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_map_update_elem)(void *map, const void *key, const void *value, u64 flags) = (void *)2;
static long (*bpf_map_push_elem)(void *map, const void *value, u64 flags) = (void *)87;
static long (*bpf_map_pop_elem)(void *map, void *value) = (void *)88;
static long (*bpf_for_each_map_elem)(void *map, void *callback, void *ctx, u64 flags) = (void *)164;
static long (*bpf_loop)(u32 nr_loops, void *callback, void *ctx, u64 flags) = (void *)181;

struct { __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); __uint(max_entries, 4); __type(key, u32); __type(value, u64); } pcpu SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_PERCPU_HASH); __uint(max_entries, 16); __type(key, u32); __type(value, u64); } pcpu_hash SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_LRU_HASH); __uint(max_entries, 4); __type(key, u32); __type(value, u64); } lru SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_QUEUE); __uint(max_entries, 8); __type(value, u32); } fifo SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_STACK); __uint(max_entries, 8); __type(value, u32); } lifo SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 8); __type(key, u32); __type(value, u64); } table SEC(".maps");

struct in {
    u32 key;
    u32 n;
};

/* Per-CPU counters: this CPU's slot of key `key & 3`, incremented; returns the new value. */
SEC("pj/percpu")
u64 percpu(struct in *in, u64 len)
{
    u32 k = in->key & 3;
    u64 *v = bpf_map_lookup_elem(&pcpu, &k);
    if (!v)
        return -1;
    *v += in->n;
    u64 *h = bpf_map_lookup_elem(&pcpu_hash, &k);
    if (h)
        *h += 1;
    else {
        u64 one = 1;
        bpf_map_update_elem(&pcpu_hash, &k, &one, BPF_ANY);
    }
    return *v;
}

/* LRU: insert key (value = n); returns how many of keys 0..7 are present. */
SEC("pj/lru")
u64 lru_insert(struct in *in, u64 len)
{
    u64 v = in->n;
    bpf_map_update_elem(&lru, &in->key, &v, BPF_ANY);
    u64 present = 0;
    for (u32 k = 0; k < 8; k++)
        if (bpf_map_lookup_elem(&lru, &k))
            present++;
    return present;
}

/* Queue and stack: push 1..n to both, pop both dry; returns fifo order * 1000 + lifo order
 * as digits (n <= 3). */
SEC("pj/queues")
u64 queues(struct in *in, u64 len)
{
    u32 n = in->n > 3 ? 3 : in->n;
    for (u32 i = 1; i <= n; i++) {
        bpf_map_push_elem(&fifo, &i, 0);
        bpf_map_push_elem(&lifo, &i, 0);
    }
    u64 f = 0, s = 0;
    u32 v;
    while (bpf_map_pop_elem(&fifo, &v) == 0)
        f = f * 10 + v;
    while (bpf_map_pop_elem(&lifo, &v) == 0)
        s = s * 10 + v;
    return f * 1000 + s;
}

struct sum {
    u64 total;
    u32 stop;
};

static long add_index(u64 i, struct sum *s)
{
    s->total += i * i;
    return i == s->stop;
}

static long add_value(void *map, u32 *key, u64 *value, struct sum *s)
{
    s->total += *value * 100 + *key;
    return *key == s->stop;
}

/* bpf_loop: sum of i*i for i < n, stopping at `key`; returns total * 1000 + iterations. */
SEC("pj/loop")
u64 loop(struct in *in, u64 len)
{
    struct sum s = { 0, in->key };
    long r = bpf_loop(in->n, add_index, &s, 0);
    return s.total * 1000 + r;
}

/* bpf_for_each_map_elem over `table` (the host fills it); returns total * 100 + visited. */
SEC("pj/each")
u64 each(struct in *in, u64 len)
{
    struct sum s = { 0, in->key };
    long r = bpf_for_each_map_elem(&table, add_value, &s, 0);
    return s.total * 100 + r;
}

/* bpf_for_each_map_elem over the per-CPU hash pj/percpu fills (this CPU's values) and over
 * the LRU hash pj/lru fills, with the same callback; returns the per-CPU walk's
 * total * 100 + visited in the low 32 bits, the LRU walk's visited count above. */
SEC("pj/each_hash")
u64 each_hash(struct in *in, u64 len)
{
    struct sum s = { 0, in->key };
    long r = bpf_for_each_map_elem(&pcpu_hash, add_value, &s, 0);
    struct sum l = { 0, 0xffffffff };
    long n = bpf_for_each_map_elem(&lru, add_value, &l, 0);
    return ((u64)n << 32) | (s.total * 100 + r);
}

/* An array lookup with a key the caller chooses (the inlined lookup: in range, past the end,
 * the top of u32): adds n to the element and returns its new value, or 0xdead for NULL. In a
 * loop, so the optimizing tier keeps the key and the element in registers across lookups. */
SEC("pj/array")
u64 array(struct in *in, u64 len)
{
    u64 last = 0xdead;
    for (u32 i = 0; i < 3; i++) {
        u32 k = in->key + i;
        u64 *v = bpf_map_lookup_elem(&table, &k);
        if (!v)
            return i == 0 ? 0xdead : last;
        *v += in->n;
        last = *v;
    }
    return last;
}
