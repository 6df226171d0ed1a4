/* A `.maps` entry not in libbpf's encoding (plain `int` members instead of
 * `int (*type)[N]`): loading must fail naming the map and `.maps`. */
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
