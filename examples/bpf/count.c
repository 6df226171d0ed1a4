/* The program of packjit's first-run examples (runtime/examples/sandboxed_elf.rs and
 * examples/standalone), built by clang as any eBPF object is:
 *
 *     clang-19 -O2 -g -target bpf -mcpu=v4 -c examples/bpf/count.c -o count.o
 *
 * packjit calls an entry with r1 = the memory it is given (here a packet) and r2 = its
 * length; what the entry returns is r0. */
typedef unsigned long long u64;
typedef unsigned char u8;

/* One ELF section per program: the host picks an entry by section name. */
#define SEC(name) __attribute__((section(name), used))

/* How many bytes after the first one equal it. */
SEC("pj/count")
u64 count_bytes(const u8 *pkt, u64 len)
{
    u64 n = 0;
    for (u64 i = 1; i < len; i++)
        n += pkt[i] == pkt[0];
    return n;
}

/* Reads the byte just past the packet: a sandboxed load stops it before the read. */
SEC("pj/past_end")
u64 past_end(const u8 *pkt, u64 len)
{
    return pkt[len];
}
