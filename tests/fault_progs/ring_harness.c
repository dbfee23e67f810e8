/*
 * The shim's ring producer (native/ring.c, compiled in whole) driven step by step, so that
 * tests/test_faults.py can stop or kill a producer between reserving a slot and publishing it.
 *
 *   ring_harness RING write N [US] write N records (LAUNCH, a = 1..N), pausing US microseconds
 *                                  after each; prints written=
 *   ring_harness RING stall N      reserve one slot, print "reserved=POS", wait for a line on
 *                                  stdin, publish it (a = 0xdead), then write N records
 *   ring_harness RING die          reserve one slot and SIGKILL itself
 */
#include "../../native/ring.c"

#include <signal.h>
#include <stdlib.h>

struct shim_state g_shim;

static void write_n(int n, int pause_us)
{
    int written = 0;
    for (int i = 1; i <= n; i++) {
        written += ring_write(&(struct pyobmem_record){.type = PYOBMEM_EV_LAUNCH,
                                                       .launch = {.op = (uint64_t)i, .function = 0xF00D}}, 1);
        if (pause_us)
            usleep((useconds_t)pause_us);
    }
    printf("written=%d\n", written);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    if (argc < 3 || !ring_open(argv[1]))
        return 2;
    g_shim.pid = (uint32_t)getpid();
    const char *mode = argv[2];
    if (!strcmp(mode, "write")) {
        write_n(atoi(argv[3]), argc > 4 ? atoi(argv[4]) : 0);
    } else if (!strcmp(mode, "stall")) {
        uint64_t pos;
        if (!reserve(1, &pos))
            return 3;
        printf("reserved=%llu\n", (unsigned long long)pos);
        fflush(stdout);
        char line[16];
        if (!fgets(line, sizeof line, stdin))
            return 4;
        struct pyobmem_record r = {.type = PYOBMEM_EV_LAUNCH, .launch = {.op = 0xdead}};
        publish(pos, &r, 1, shim_now_ns());
        write_n(atoi(argv[3]), 0);
    } else if (!strcmp(mode, "die")) {
        uint64_t pos;
        if (!reserve(1, &pos))
            return 3;
        raise(SIGKILL);
    }
    return 0;
}
