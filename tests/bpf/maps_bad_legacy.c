/* A legacy map whose struct is shorter than struct bpf_map_def (no map_flags). */
#include "pj.h"

#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *) 1;

struct short_def {
    unsigned int type, key_size, value_size, max_entries;
};

struct short_def stubby SEC("maps") = { 1, 4, 8, 16 };

SEC("pj/m")
u64 prog_m(u8 *mem, u64 len)
{
    u32 k = len;
    u64 *v = bpf_map_lookup_elem(&stubby, &k);
    return v ? *v : 0;
}
