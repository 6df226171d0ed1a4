/* A BTF-defined map with a member libbpf does not define: refused naming map and member. */
#include "pj.h"

#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *) 1;

struct {
    __uint(type, 1);
    __uint(max_entries, 4);
    __type(key, u32);
    __type(value, u64);
    __uint(colour, 3);
} painted SEC(".maps");

SEC("pj/m")
u64 prog_m(u8 *mem, u64 len)
{
    u32 k = len;
    u64 *v = bpf_map_lookup_elem(&painted, &k);
    return v ? *v : 0;
}
