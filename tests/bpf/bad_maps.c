/* A BTF-defined map: packjit has no maps, so loading must fail naming `.maps`. */
#include "pj.h"

struct {
    int type;
    int max_entries;
} counters SEC(".maps");

SEC("pj/maps")
u64 prog_maps(u8 *mem, u64 len)
{
    return (u64)&counters + len;
}
