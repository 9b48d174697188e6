/* senv — the sandbox environment; see senv.h. */
#include "agent/senv.h"

#include <stdlib.h>
#include <string.h>

#include "agent/daemon.h"

static ssize_t senv_find(char **arr, size_t n, const char *key, size_t klen) {
  for (size_t i = 0; i < n; i++)
    if (strncmp(arr[i], key, klen) == 0 && arr[i][klen] == '=') return (ssize_t)i;
  return -1;
}

int senv_set(const char *key, const char *val) {
  size_t kl = strlen(key), vl = strlen(val);
  char *kv = malloc(kl + vl + 2);
  if (!kv) return -1;
  memcpy(kv, key, kl);
  kv[kl] = '=';
  memcpy(kv + kl + 1, val, vl + 1);
  ssize_t at = senv_find(conch.senv, conch.senv_len, key, kl);
  if (at >= 0) {
    free(conch.senv[at]);
    conch.senv[at] = kv;
    return 0;
  }
  if (conch.senv_len == conch.senv_cap) {
    size_t cap = conch.senv_cap ? conch.senv_cap * 2 : 16;
    char **n = realloc(conch.senv, cap * sizeof *n);
    if (!n) {
      free(kv);
      return -1;
    }
    conch.senv = n;
    conch.senv_cap = cap;
  }
  conch.senv[conch.senv_len++] = kv;
  return 0;
}

const char *senv_get(const char *key) {
  ssize_t at = senv_find(conch.senv, conch.senv_len, key, strlen(key));
  return at < 0 ? NULL : conch.senv[at] + strlen(key) + 1;
}

const char *senv_lookup(char *const *envp, const char *key) {
  size_t kl = strlen(key);
  for (; envp && *envp; envp++)
    if (strncmp(*envp, key, kl) == 0 && (*envp)[kl] == '=') return *envp + kl + 1;
  return NULL;
}

/* Entry list built in a scratch array of (pointer,len) before packing. */
struct kvref {
  const char *k;
  size_t kl;
  const char *v; /* value only (NULL: whole "K=V" in k) */
};

char **senv_build(const char *const *keys, const char *const *vals, size_t n) {
  size_t max = conch.senv_len + n + 2;
  struct kvref *refs = calloc(max, sizeof *refs);
  if (!refs) return NULL;
  size_t cnt = 0;
  /* sandbox env first, overlay replaces in place, new overlay keys appended */
  for (size_t i = 0; i < conch.senv_len; i++) {
    const char *eq = strchr(conch.senv[i], '=');
    refs[cnt++] = (struct kvref){conch.senv[i], (size_t)(eq - conch.senv[i]), eq + 1};
  }
  const char *defk[2] = {"HOME", "PATH"}, *defv[2] = {"/root", SENV_DEFAULT_PATH};
  for (int d = 0; d < 2; d++) {
    size_t kl = strlen(defk[d]);
    size_t j;
    for (j = 0; j < cnt; j++)
      if (refs[j].kl == kl && memcmp(refs[j].k, defk[d], kl) == 0) break;
    if (j == cnt) refs[cnt++] = (struct kvref){defk[d], kl, defv[d]};
  }
  for (size_t i = 0; i < n; i++) {
    size_t kl = strlen(keys[i]);
    size_t j;
    for (j = 0; j < cnt; j++)
      if (refs[j].kl == kl && memcmp(refs[j].k, keys[i], kl) == 0) break;
    if (j == cnt) cnt++;
    refs[j] = (struct kvref){keys[i], kl, vals[i]};
  }
  size_t bytes = (cnt + 1) * sizeof(char *);
  for (size_t j = 0; j < cnt; j++) bytes += refs[j].kl + strlen(refs[j].v) + 2;
  char **out = malloc(bytes);
  if (!out) {
    free(refs);
    return NULL;
  }
  char *p = (char *)(out + cnt + 1);
  for (size_t j = 0; j < cnt; j++) {
    size_t vl = strlen(refs[j].v);
    out[j] = p;
    memcpy(p, refs[j].k, refs[j].kl);
    p[refs[j].kl] = '=';
    memcpy(p + refs[j].kl + 1, refs[j].v, vl + 1);
    p += refs[j].kl + vl + 2;
  }
  out[cnt] = NULL;
  free(refs);
  return out;
}
