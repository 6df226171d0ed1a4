/* A legacy map whose struct has a field past map_flags (libbpf's inner_map_idx) set. */
#include "pj.h"

struct long_def {
    unsigned int type, key_size, value_size, max_entries, map_flags, inner_map_idx;
};

struct long_def longer SEC("maps") = { 1, 4, 8, 16, 0, 5 };
struct long_def zero_tail SEC("maps") = { 2, 4, 4, 1, 0, 0 };
