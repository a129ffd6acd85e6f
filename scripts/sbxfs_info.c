/* Ask an sbxfs mount about a path through its INFO ioctl (the ABI in README.md).
 *   cc -o sbxfs_info scripts/sbxfs_info.c && ./sbxfs_info ~/mnt/sbx/src
 * Prints the JSON answer: mountpoint, control socket, remote, the path in the workspace, and the
 * cached version. Exits 1 when the path is not in an sbxfs mount. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define SBXFS_IOC_INFO_SIZE 4096
#define SBXFS_IOC_INFO _IOR('S', 1, char[SBXFS_IOC_INFO_SIZE])

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : ".";
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) { perror(path); return 2; }
    char buf[SBXFS_IOC_INFO_SIZE];
    memset(buf, 0, sizeof buf);
    if (ioctl(fd, SBXFS_IOC_INFO, buf) != 0) { perror("SBXFS_IOC_INFO"); close(fd); return 1; }
    close(fd);
    buf[sizeof buf - 1] = '\0';
    puts(buf);
    return 0;
}
