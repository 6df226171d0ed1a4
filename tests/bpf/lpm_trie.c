/* IPv4 routing through an LPM trie, as libbpf users write it: BTF-defined
 * BPF_MAP_TYPE_LPM_TRIE (BPF_F_NO_PREALLOC, as the kernel requires), keys of a host-order
 * prefix length and the address in network order. The host (or pj/add) fills the table;
 * pj/match routes an address: the longest matching prefix's route id, and its hit count
 * incremented in place through the value pointer. */
#include "pj.h"

#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name

#define BPF_MAP_TYPE_LPM_TRIE 11
#define BPF_F_NO_PREALLOC 1

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_map_update_elem)(void *map, const void *key, const void *value, u64 flags) = (void *)2;
static long (*bpf_map_delete_elem)(void *map, const void *key) = (void *)3;

struct lpm_v4 {
    u32 prefixlen;
    u8 addr[4];
};

struct route {
    u32 id;
    u32 hits;
};

struct {
    __uint(type, BPF_MAP_TYPE_LPM_TRIE);
    __uint(max_entries, 64);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __type(key, struct lpm_v4);
    __type(value, struct route);
} routes SEC(".maps");

/* The context of every entry: an address, a prefix length, a route id and update flags. */
struct req {
    u8 addr[4];
    u32 prefixlen;
    u32 id;
    u32 flags;
};

/* Route req->addr (a /32 lookup): the route id, or 0xffffffff for no route. */
SEC("pj/match")
u64 match(struct req *r, u64 len)
{
    struct lpm_v4 k = { .prefixlen = 32 };
    __builtin_memcpy(k.addr, r->addr, 4);
    struct route *rt = bpf_map_lookup_elem(&routes, &k);
    if (!rt)
        return 0xffffffff;
    __sync_fetch_and_add(&rt->hits, 1);
    return rt->id;
}

/* Add or replace req->addr/req->prefixlen -> req->id with req->flags: the helper's result. */
SEC("pj/add")
u64 add(struct req *r, u64 len)
{
    struct lpm_v4 k = { .prefixlen = r->prefixlen };
    __builtin_memcpy(k.addr, r->addr, 4);
    struct route v = { .id = r->id, .hits = 0 };
    return bpf_map_update_elem(&routes, &k, &v, r->flags);
}

/* Delete exactly req->addr/req->prefixlen: the helper's result. */
SEC("pj/del")
u64 del(struct req *r, u64 len)
{
    struct lpm_v4 k = { .prefixlen = r->prefixlen };
    __builtin_memcpy(k.addr, r->addr, 4);
    return bpf_map_delete_elem(&routes, &k);
}

/* The same kind of map from the legacy `maps` section, as older loaders declare it. */
struct bpf_map_def {
    unsigned int type;
    unsigned int key_size;
    unsigned int value_size;
    unsigned int max_entries;
    unsigned int map_flags;
};

struct bpf_map_def legacy_routes SEC("maps") = {
    .type = BPF_MAP_TYPE_LPM_TRIE,
    .key_size = sizeof(struct lpm_v4),
    .value_size = sizeof(u32),
    .max_entries = 16,
    .map_flags = BPF_F_NO_PREALLOC,
};

/* With req->flags != 0: store req->addr/req->prefixlen -> req->id first (a failure is the
 * result). Then route req->addr: the id, or 0xffffffff. */
SEC("pj/legacy")
u64 legacy(struct req *r, u64 len)
{
    struct lpm_v4 k = { .prefixlen = r->prefixlen };
    __builtin_memcpy(k.addr, r->addr, 4);
    u32 id = r->id;
    if (r->flags) {
        long e = bpf_map_update_elem(&legacy_routes, &k, &id, 0);
        if (e)
            return e;
    }
    k.prefixlen = 32;
    u32 *v = bpf_map_lookup_elem(&legacy_routes, &k);
    return v ? *v : 0xffffffff;
}
