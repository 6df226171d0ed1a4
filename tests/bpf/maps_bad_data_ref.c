/* A pointer to a map stored in .data: maps are only referenced by code. */
#include "pj.h"

#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *) 1;

struct {
    __uint(type, 2);
    __uint(max_entries, 4);
    __type(key, u32);
    __type(value, u64);
} table SEC(".maps");

void *table_ptr = &table;

SEC("pj/m")
u64 prog_m(u8 *mem, u64 len)
{
    u32 k = len;
    u64 *v = bpf_map_lookup_elem(table_ptr, &k);
    return v ? *v : 0;
}
