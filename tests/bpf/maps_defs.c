/* libbpf-style maps written out without libbpf's headers: BTF-defined maps in `.maps`
 * (one of each type the tests check) and a legacy `maps`-section map. */
#include "pj.h"

#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name
#define __array(name, val) typeof(val) *name[]

/* Map types (enum bpf_map_type). */
#define BPF_MAP_TYPE_HASH 1
#define BPF_MAP_TYPE_ARRAY 2
#define BPF_MAP_TYPE_PROG_ARRAY 3
#define BPF_MAP_TYPE_PERCPU_HASH 5
#define BPF_MAP_TYPE_PERCPU_ARRAY 6
#define BPF_MAP_TYPE_LRU_HASH 9
#define BPF_MAP_TYPE_QUEUE 22
#define BPF_MAP_TYPE_RINGBUF 27

#define BPF_F_NO_PREALLOC 1

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *) 1;
static long (*bpf_map_push_elem)(void *map, const void *value, u64 flags) = (void *) 87;

struct pair {
    u64 a;
    u32 b;
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 128);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __type(key, u32);
    __type(value, u64);
} hash SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 16);
    __type(key, u32);
    __type(value, struct pair);
} array SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 4);
    __uint(key_size, 4);
    __uint(value_size, 32);
} percpu_array SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
    __uint(max_entries, 64);
    __type(key, u64);
    __type(value, u32);
    __uint(pinning, 0);
} percpu_hash SEC(".maps");

typedef struct pair pair_t;

struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 1000);
    __type(key, const struct pair);
    __type(value, pair_t);
} lru SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 4096 * 4);
} ringbuf SEC(".maps");

SEC("pj/b")
int prog_b(void *ctx)
{
    return 2;
}

struct {
    __uint(type, BPF_MAP_TYPE_PROG_ARRAY);
    __uint(max_entries, 4);
    __uint(key_size, sizeof(u32));
    __uint(value_size, sizeof(u32));
    __array(values, int (void *));
} jmp_table SEC(".maps") = {
    .values = { [1] = &prog_b },
};

struct {
    __uint(type, BPF_MAP_TYPE_QUEUE);
    __uint(max_entries, 8);
    __type(value, u32);
} queue SEC(".maps");

/* A static map: clang refers to it through the `.maps` section symbol plus an addend. */
static struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 2);
    __type(key, u32);
    __type(value, u32);
} hidden SEC(".maps");

struct bpf_map_def {
    unsigned int type;
    unsigned int key_size;
    unsigned int value_size;
    unsigned int max_entries;
    unsigned int map_flags;
};

struct bpf_map_def legacy SEC("maps") = {
    .type = BPF_MAP_TYPE_HASH,
    .key_size = 8,
    .value_size = 16,
    .max_entries = 32,
    .map_flags = 0,
};

/* Uses hash, array, queue, the static map and the legacy map (not the others). */
SEC("pj/a")
u64 prog_a(u8 *mem, u64 len)
{
    u32 k = len;
    u64 sum = 0;
    u64 *v = bpf_map_lookup_elem(&hash, &k);
    if (v)
        sum += *v;
    struct pair *p = bpf_map_lookup_elem(&array, &k);
    if (p)
        sum += p->a;
    u32 *h = bpf_map_lookup_elem(&hidden, &k);
    if (h)
        sum += *h;
    u64 lk = len;
    u64 *l = bpf_map_lookup_elem(&legacy, &lk);
    if (l)
        sum += *l;
    bpf_map_push_elem(&queue, &k, 0);
    return sum;
}

/* No maps at all. */
SEC("pj/plain")
u64 prog_plain(u8 *mem, u64 len)
{
    return len * 3 + 1;
}
