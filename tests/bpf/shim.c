/* Native oracle: runs ENTRY (a -D define) over each argv hex buffer in turn, the way the
 * test runs the eBPF program over the same buffers, and prints r0 and the buffer after each
 * run, then the program's globals (pj_report). */
#include <stdlib.h>
#include <string.h>
#include "pj.h"

u64 ENTRY(u8 *mem, u64 len);
void pj_report(void);

/* Must match the Rust helper in runtime/tests/elf.rs. */
u64 pj_mix(u64 a, u64 b)
{
    return ((a << 13) | (a >> 51)) ^ (b * 0x9E3779B97F4A7C15ull);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        size_t n = strlen(argv[i]) / 2;
        u8 *buf = malloc(n + 1);
        for (size_t k = 0; k < n; k++) {
            char h[3] = {argv[i][2 * k], argv[i][2 * k + 1], 0};
            buf[k] = (u8)strtoul(h, NULL, 16);
        }
        u64 r0 = ENTRY(buf, n);
        printf("r0 %llx mem ", r0);
        for (size_t k = 0; k < n; k++)
            printf("%02x", buf[k]);
        printf("\n");
        free(buf);
    }
    pj_report();
    return 0;
}
