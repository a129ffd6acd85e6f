/* Swap two names forever with renameat2(RENAME_EXCHANGE): a real directory and a symlink
 * leading out of the workspace trade places atomically, as fast as the kernel allows, so a
 * walker that resolves a path string twice sees the link in the directory's place.
 * Usage: exchange A B; stopped by SIGKILL from the test. Prints "ready" after the first swap. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: exchange A B\n");
        return 2;
    }
    for (unsigned long n = 0;; n++) {
        if (syscall(SYS_renameat2, AT_FDCWD, argv[1], AT_FDCWD, argv[2], RENAME_EXCHANGE) != 0) {
            perror("renameat2");
            return 1;
        }
        if (n == 0) {
            puts("ready");
            fflush(stdout);
        }
    }
}
