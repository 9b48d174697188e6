/* cmdline — conch.* kernel command-line keys; see cmdline.h. */
#include "init/cmdline.h"

#include <string.h>

#include "core/log.h"

void init_cmdline_reset(init_cmdline *c) { memset(c, 0, sizeof *c); }

static int has_prefix(const char *w, size_t n, const char *p, size_t *plen) {
  size_t l = strlen(p);
  if (n < l || memcmp(w, p, l) != 0) return 0;
  *plen = l;
  return 1;
}

static int dev_path_ok(const char *v, size_t n) {
  if (n == 0 || n >= INIT_CMDLINE_DEV_MAX || v[0] != '/') return 0;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)v[i] <= ' ' || v[i] == ',' || v[i] == 0x7f) return 0;
  return 1;
}

static int set_layers(init_cmdline *c, const char *v, size_t n) {
  size_t cnt = 0;
  size_t start = 0;
  char tmp[INIT_CMDLINE_MAX_LAYERS][INIT_CMDLINE_DEV_MAX];
  for (size_t i = 0; i <= n; i++) {
    if (i < n && v[i] != ',') continue;
    size_t len = i - start;
    if (cnt == INIT_CMDLINE_MAX_LAYERS) {
      LOG_WARN("ignoring conch.layers: more than %d layers", INIT_CMDLINE_MAX_LAYERS);
      return 0;
    }
    if (!dev_path_ok(v + start, len)) {
      LOG_WARN("ignoring conch.layers: invalid device path in \"%.*s\"", (int)(n > 200 ? 200 : n), v);
      return 0;
    }
    memcpy(tmp[cnt], v + start, len);
    tmp[cnt][len] = 0;
    cnt++;
    start = i + 1;
  }
  memcpy(c->layers, tmp, sizeof tmp);
  c->nlayers = cnt;
  c->have_layers = 1;
  return 1;
}

static int listen_spec_ok(const char *v, size_t n) {
  if (n >= INIT_CMDLINE_LISTEN_MAX) return 0;
  if (n > 6 && memcmp(v, "vsock:", 6) == 0) {
    if (n - 6 > 10) return 0;
    for (size_t i = 6; i < n; i++)
      if (v[i] < '0' || v[i] > '9') return 0;
    return 1;
  }
  if (n > 6 && memcmp(v, "unix:/", 6) == 0) {
    for (size_t i = 5; i < n; i++)
      if ((unsigned char)v[i] <= ' ' || v[i] == 0x7f) return 0;
    return 1;
  }
  return 0;
}

static int set_listen(init_cmdline *c, const char *v, size_t n) {
  size_t cnt = 0, start = 0;
  char tmp[INIT_CMDLINE_MAX_LISTEN][INIT_CMDLINE_LISTEN_MAX];
  for (size_t i = 0; i <= n; i++) {
    if (i < n && v[i] != ',') continue;
    size_t len = i - start;
    if (cnt == INIT_CMDLINE_MAX_LISTEN || !listen_spec_ok(v + start, len)) {
      LOG_WARN("ignoring conch.init_listen: invalid or too many listeners");
      return 0;
    }
    memcpy(tmp[cnt], v + start, len);
    tmp[cnt][len] = 0;
    cnt++;
    start = i + 1;
  }
  memcpy(c->listen, tmp, sizeof tmp);
  c->nlisten = cnt;
  c->have_listen = 1;
  return 1;
}

int init_cmdline_word(init_cmdline *c, const char *w, size_t n) {
  size_t pl;
  if (has_prefix(w, n, "conch.sandbox_id=", &pl)) {
    if (c->have_sandbox_id) return 0;
    size_t vl = n - pl;
    if (vl >= sizeof c->sandbox_id) vl = sizeof c->sandbox_id - 1;
    memcpy(c->sandbox_id, w + pl, vl);
    c->sandbox_id[vl] = 0;
    if (strlen(c->sandbox_id) != vl) return 0; /* embedded NUL: impossible from text */
    c->have_sandbox_id = 1;
    return 1;
  }
  if (has_prefix(w, n, "conch.sharefs=", &pl)) {
    if (c->have_sharefs) return 0;
    c->have_sharefs = 1;
    c->sharefs_virtiofs = (n - pl == 8 && memcmp(w + pl, "virtiofs", 8) == 0);
    return 1;
  }
  if (has_prefix(w, n, "conch.layers=", &pl)) {
    if (c->have_layers) return 0;
    return set_layers(c, w + pl, n - pl);
  }
  if (has_prefix(w, n, "conch.init_listen=", &pl)) {
    if (c->have_listen) return 0;
    return set_listen(c, w + pl, n - pl);
  }
  if (has_prefix(w, n, "conch.modules=", &pl)) {
    if (c->have_modules) return 0;
    size_t vl = n - pl;
    int bad = vl >= sizeof c->modules;
    for (size_t i = 0; i < vl && !bad; i++) {
      char ch = w[pl + i];
      bad = !((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '-' || ch == ',');
    }
    if (bad) {
      LOG_WARN("ignoring conch.modules: invalid module list");
      return 0;
    }
    memcpy(c->modules, w + pl, vl);
    c->modules[vl] = 0;
    c->have_modules = 1;
    return 1;
  }
  if (has_prefix(w, n, "conch.console_level=", &pl)) {
    if (c->have_console_level) return 0;
    char v[8] = "";
    if (n - pl < sizeof v) memcpy(v, w + pl, n - pl), v[n - pl] = 0;
    int l = log_level_parse(v);
    if (l < 0) {
      LOG_WARN("ignoring conch.console_level: not debug, info, warn or error");
      return 0;
    }
    c->console_level = l;
    c->have_console_level = 1;
    return 1;
  }
  int is_port = has_prefix(w, n, "conch.log_port=", &pl), is_cid = !is_port && has_prefix(w, n, "conch.log_cid=", &pl);
  if (is_port || is_cid) {
    if (is_port ? c->have_log_port : c->have_log_cid) return 0;
    unsigned long long v = 0;
    size_t vl = n - pl;
    int bad = vl == 0 || vl > 10;
    for (size_t i = 0; i < vl && !bad; i++) {
      bad = w[pl + i] < '0' || w[pl + i] > '9';
      v = v * 10 + (unsigned)(w[pl + i] - '0');
    }
    if (bad || v > 0xffffffffULL) {
      LOG_WARN("ignoring conch.%s: not a number of 0 to 4294967295", is_port ? "log_port" : "log_cid");
      return 0;
    }
    if (is_port) c->log_port = (unsigned)v, c->have_log_port = 1;
    else c->log_cid = (unsigned)v, c->have_log_cid = 1;
    return 1;
  }
  if (has_prefix(w, n, "conch.disk=", &pl)) {
    if (c->have_disk) return 0;
    const char *v = w + pl;
    size_t vl = n - pl;
    if (!(vl == 4 && memcmp(v, "none", 4) == 0) && !dev_path_ok(v, vl)) {
      LOG_WARN("ignoring conch.disk: invalid device path");
      return 0;
    }
    memcpy(c->disk, v, vl);
    c->disk[vl] = 0;
    c->have_disk = 1;
    return 1;
  }
  return 0;
}

static int is_space(char ch) {
  return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f' ||
         ch == 0;
}

void init_cmdline_parse(init_cmdline *c, const char *text, size_t n) {
  char word[4096];
  size_t i = 0;
  while (i < n) {
    while (i < n && is_space(text[i])) i++;
    if (i >= n) break;
    size_t wl = 0;
    int quoted = 0, overflow = 0;
    while (i < n && (quoted || !is_space(text[i]))) {
      if (text[i] == '"') {
        quoted = !quoted;
      } else if (wl < sizeof word) {
        word[wl++] = text[i];
      } else {
        overflow = 1;
      }
      i++;
    }
    if (overflow) {
      LOG_WARN("ignoring an over-long kernel command line word");
      continue;
    }
    init_cmdline_word(c, word, wl);
  }
}
