/* Programs for the side-by-side bench (`cargo bench -p packjit --bench peers`): ordinary C as
 * a plug-in author would write it, nothing shaped for packjit. Built with
 * `clang -O2 -g -target bpf -mcpu=v3 -c` so rbpf 0.4.1 (no cpu v4) runs the same bytecode.
 * Every entry takes the context as packjit passes it: r1 = pointer, r2 = length. */
#include "../pj.h"
#include "crc_table.h"

#define PEER(name) SEC("peers/" #name)

/* FNV-1a, 64-bit, byte at a time. */
PEER(fnv)
u64 fnv(const u8 *p, u64 len)
{
    u64 h = 0xcbf29ce484222325ULL;
    for (u64 i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* An xxhash64-shaped hash: 8-byte lanes (assembled from bytes: the context is unaligned),
 * rotate-multiply rounds, a byte tail and the avalanche. */
static inline u64 rotl(u64 x, int r)
{
    return (x << r) | (x >> (64 - r));
}

#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL

PEER(xxh)
u64 xxh(const u8 *p, u64 len)
{
    u64 h = len * P3 + 0x27D4EB2F165667C5ULL;
    u64 i = 0;
    for (; i + 8 <= len; i += 8) {
        u64 w = 0;
        for (int b = 0; b < 8; b++)
            w |= (u64)p[i + b] << (8 * b);
        w *= P2;
        w = rotl(w, 31);
        w *= P1;
        h ^= w;
        h = rotl(h, 27) * P1 + 0x85EBCA77C2B2AE63ULL;
    }
    for (; i < len; i++) {
        h ^= p[i] * 0x27D4EB2F165667C5ULL;
        h = rotl(h, 11) * P1;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

/* CRC-32 with its 1 KiB table in .rodata, indexed at run time. */
PEER(crc32)
u64 crc32(const u8 *p, u64 len)
{
    u32 c = 0xffffffff;
    for (u64 i = 0; i < len; i++)
        c = crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffff;
}

/* Insertion sort of up to 64 u32 from the context, in a stack array; returns a checksum of
 * the sorted order. */
PEER(sort)
u64 sort(const u8 *p, u64 len)
{
    u32 a[64];
    u64 n = len / 4;
    if (n > 64)
        n = 64;
    for (u64 i = 0; i < n; i++)
        a[i] = p[4 * i] | p[4 * i + 1] << 8 | p[4 * i + 2] << 16 | (u32)p[4 * i + 3] << 24;
    for (u64 i = 1; i < n; i++) {
        u32 v = a[i];
        u64 j = i;
        while (j > 0 && a[j - 1] > v) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = v;
    }
    u64 h = 0;
    for (u64 i = 0; i < n; i++)
        h = h * 31 + a[i];
    return h;
}

/* Sieve of Eratosthenes over a bitmap on the stack: primes below the bound the context
 * gives (at most 2048). */
PEER(sieve)
u64 sieve(const u8 *p, u64 len)
{
    u64 composite[32] = {0};
    u64 n = len >= 2 ? (p[0] | p[1] << 8) : 0;
    if (n > 2048)
        n = 2048;
    u64 count = 0;
    for (u64 i = 2; i < n; i++) {
        if (composite[i / 64] >> (i % 64) & 1)
            continue;
        count++;
        for (u64 j = i * i; j < n; j += i)
            composite[j / 64] |= 1ULL << (j % 64);
    }
    return count;
}

/* Ethernet / IPv4 / TCP: checks every length against the context's, as an XDP program
 * would against data_end; returns a flow hash of a TCP segment, or a verdict code. */
PEER(parse)
u64 parse(const u8 *p, u64 len)
{
    if (len < 14)
        return 1;
    u16 proto = p[12] << 8 | p[13];
    u64 off = 14;
    if (proto == 0x8100) {
        if (len < 18)
            return 1;
        proto = p[16] << 8 | p[17];
        off = 18;
    }
    if (proto != 0x0800)
        return 2;
    if (len < off + 20)
        return 1;
    const u8 *ip = p + off;
    u64 ihl = (ip[0] & 0xf) * 4;
    if ((ip[0] >> 4) != 4 || ihl < 20 || len < off + ihl)
        return 3;
    u16 frag = ip[6] << 8 | ip[7];
    if (frag & 0x3fff)
        return 4;
    u16 tot = ip[2] << 8 | ip[3];
    if (ip[9] != 6)
        return 5;
    off += ihl;
    if (len < off + 20)
        return 1;
    const u8 *tcp = p + off;
    u64 doff = (tcp[12] >> 4) * 4;
    if (doff < 20 || len < off + doff)
        return 6;
    u32 saddr = ip[12] << 24 | ip[13] << 16 | ip[14] << 8 | ip[15];
    u32 daddr = ip[16] << 24 | ip[17] << 16 | ip[18] << 8 | ip[19];
    u16 sport = tcp[0] << 8 | tcp[1];
    u16 dport = tcp[2] << 8 | tcp[3];
    u8 flags = tcp[13];
    u64 h = ((u64)saddr << 32 | daddr) ^ ((u64)sport << 16 | dport) * 0x9E3779B97F4A7C15ULL;
    h ^= (u64)flags << 56 ^ (u64)tot << 40;
    return h;
}

/* bpf-to-bpf calls passing a stack pointer and the context pointer. */
struct acc {
    u64 sum;
    u64 xor;
    u64 max;
};

static NOINLINE void absorb(struct acc *a, const u8 *p, u64 n)
{
    for (u64 i = 0; i < n; i++) {
        a->sum += p[i];
        a->xor ^= (u64)p[i] << ((i & 7) * 8);
        if (p[i] > a->max)
            a->max = p[i];
    }
}

static NOINLINE u64 fold(const struct acc *a, u64 k)
{
    return (a->sum * 0x100000001b3ULL) ^ (a->xor + k) ^ (a->max << 48);
}

PEER(calls)
u64 calls(const u8 *p, u64 len)
{
    struct acc a = {0, 0, 0};
    u64 h = 0;
    for (u64 off = 0; off < len; off += 16) {
        u64 n = len - off < 16 ? len - off : 16;
        absorb(&a, p + off, n);
        h += fold(&a, off);
    }
    return h;
}

/* A helper-heavy loop: one call of the host's `pj_mix` per 8-byte word. */
PEER(helper)
u64 helper(const u8 *p, u64 len)
{
    u64 h = len;
    for (u64 i = 0; i + 8 <= len; i += 8) {
        u64 w = 0;
        for (int b = 0; b < 8; b++)
            w |= (u64)p[i + b] << (8 * b);
        h = pj_mix(h, w);
    }
    return h;
}

/* wc: bytes, words and lines of a text context, packed into one value. */
PEER(words)
u64 words(const u8 *p, u64 len)
{
    u64 nwords = 0, nlines = 0, in_word = 0;
    for (u64 i = 0; i < len; i++) {
        u8 c = p[i];
        if (c == '\n')
            nlines++;
        if (c == ' ' || c == '\n' || c == '\t' || c == '\r') {
            in_word = 0;
        } else if (!in_word) {
            in_word = 1;
            nwords++;
        }
    }
    return len | nwords << 20 | nlines << 40;
}

/* key=value;key=value: sums the decimal values of the keys "len", "ttl" and "port", counts
 * the pairs and hashes the other keys. */
PEER(kv)
u64 kv(const u8 *p, u64 len)
{
    u64 i = 0, pairs = 0, sum = 0, other = 0;
    while (i < len) {
        u64 k0 = i;
        u64 kh = 5381;
        while (i < len && p[i] != '=' && p[i] != ';') {
            kh = kh * 33 + p[i];
            i++;
        }
        u64 klen = i - k0;
        u64 v = 0;
        if (i < len && p[i] == '=') {
            i++;
            while (i < len && p[i] >= '0' && p[i] <= '9') {
                v = v * 10 + (p[i] - '0');
                i++;
            }
        }
        while (i < len && p[i] != ';')
            i++;
        i++;
        pairs++;
        int known = 0;
        if (klen == 3 && p[k0] == 'l' && p[k0 + 1] == 'e' && p[k0 + 2] == 'n')
            known = 1;
        if (klen == 3 && p[k0] == 't' && p[k0 + 1] == 't' && p[k0 + 2] == 'l')
            known = 1;
        if (klen == 4 && p[k0] == 'p' && p[k0 + 1] == 'o' && p[k0 + 2] == 'r' && p[k0 + 3] == 't')
            known = 1;
        if (known)
            sum += v;
        else
            other ^= kh + v;
    }
    return sum | pairs << 32 | (other & 0xffff) << 48;
}
