/* restore — clock step and entropy of a restored sandbox; see restore.h. */
#include "init/restore.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/random.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"

static void restore_clock(int64_t host_ms) {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  int64_t now_ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
  if (!initmsg_clock_needs_step(now_ms, host_ms)) return;
  struct timespec t = {.tv_sec = host_ms / 1000, .tv_nsec = (long)(host_ms % 1000) * 1000000};
  if (clock_settime(CLOCK_REALTIME, &t) != 0)
    LOG_WARN("clock not set to the host's time: %s", strerror(errno));
  else
    LOG_INFO("clock stepped to the host's time by %+lld ms", (long long)(host_ms - now_ms));
}

static void restore_entropy(const unsigned char *b, size_t n) {
  _Alignas(struct rand_pool_info) unsigned char raw[sizeof(struct rand_pool_info) + INITMSG_ENTROPY_MAX];
  struct rand_pool_info *info = (struct rand_pool_info *)raw;
  info->entropy_count = (int)(n * 8);
  info->buf_size = (int)n;
  memcpy(raw + sizeof *info, b, n);
  int fd = open("/dev/urandom", O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    LOG_WARN("entropy not credited: open /dev/urandom: %s", strerror(errno));
    return;
  }
  if (ioctl(fd, RNDADDENTROPY, info) != 0)
    LOG_WARN("entropy not credited: RNDADDENTROPY: %s", strerror(errno));
  else if (ioctl(fd, RNDRESEEDCRNG) != 0)
    LOG_WARN("CRNG not reseeded: RNDRESEEDCRNG: %s", strerror(errno));
  else
    LOG_INFO("entropy: %zu bytes credited, CRNG reseeded", n);
  explicit_bzero(raw, sizeof raw);
  close(fd);
}

void restore_apply(const initmsg_plan *p, int64_t age_ms) {
  if (p->timestamp_ms > 0) restore_clock(p->timestamp_ms + (age_ms > 0 ? age_ms : 0));
  if (p->entropy_len > 0) restore_entropy(p->entropy, p->entropy_len);
}
