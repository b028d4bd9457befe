/* The pod's network namespace, as far as loopback goes: preloaded into a pod's processes
 * (LD_PRELOAD) by the emulated kubelet, with the pod's IP in K8S_EMULATOR_POD_IP.
 *
 * connect():    an unbound IPv4 socket connecting to 127.0.0.0/8 is first bound to the pod
 *               IP, so the pod's traffic (and a UDP route probe) leaves from its own address,
 *               as it would from a pod's eth0.
 * getifaddrs(): the loopback interface shows the pod IP instead of 127.0.0.1, so whatever
 *               asks which interface holds the address it leaves from (gloo with
 *               GLOO_SOCKET_IFNAME=lo, psutil.net_if_addrs) finds the pod IP on "lo".
 *
 * Everything else is untouched: listening on 127.0.0.1 or 0.0.0.0 still works, and nothing
 * isolates one pod from another. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static in_addr_t pod_ip(void) {
    const char *text = getenv("K8S_EMULATOR_POD_IP");
    struct in_addr addr;
    if (text == NULL || inet_pton(AF_INET, text, &addr) != 1) return 0;
    return addr.s_addr;
}

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    static int (*real_connect)(int, const struct sockaddr *, socklen_t);
    if (real_connect == NULL) real_connect = dlsym(RTLD_NEXT, "connect");
    in_addr_t ip = pod_ip();
    if (ip != 0 && addr != NULL && addr->sa_family == AF_INET) {
        const struct sockaddr_in *to = (const struct sockaddr_in *)addr;
        if ((ntohl(to->sin_addr.s_addr) >> 24) == 127) {
            struct sockaddr_in mine;
            socklen_t mine_len = sizeof mine;
            memset(&mine, 0, sizeof mine);
            if (getsockname(fd, (struct sockaddr *)&mine, &mine_len) == 0 &&
                mine.sin_family == AF_INET && mine.sin_port == 0 && mine.sin_addr.s_addr == 0) {
                int saved = errno;
                struct sockaddr_in from;
                memset(&from, 0, sizeof from);
                from.sin_family = AF_INET;
                from.sin_addr.s_addr = ip;
                (void)bind(fd, (struct sockaddr *)&from, sizeof from); /* best effort */
                errno = saved;
            }
        }
    }
    return real_connect(fd, addr, len);
}

int getifaddrs(struct ifaddrs **out) {
    static int (*real_getifaddrs)(struct ifaddrs **);
    if (real_getifaddrs == NULL) real_getifaddrs = dlsym(RTLD_NEXT, "getifaddrs");
    int rc = real_getifaddrs(out);
    in_addr_t ip = pod_ip();
    if (rc != 0 || ip == 0) return rc;
    for (struct ifaddrs *i = *out; i != NULL; i = i->ifa_next) {
        if (i->ifa_addr != NULL && i->ifa_addr->sa_family == AF_INET && i->ifa_name != NULL &&
            strcmp(i->ifa_name, "lo") == 0) {
            struct sockaddr_in *in = (struct sockaddr_in *)i->ifa_addr;
            if (in->sin_addr.s_addr == htonl(INADDR_LOOPBACK)) in->sin_addr.s_addr = ip;
        }
    }
    return rc;
}
