/* initmsg — decoding and validating the init message; see initmsg.h. */
#include "init/initmsg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/daemon.h"
#include "core/log.h"
#include "server/users.h"
#include "init/initstr.h"
#include "proto/json.h"
#include "proto/pbjson.h"
#include "proto/text.h"

typedef struct sv {
  const char *s;
  size_t n;
} sv;

typedef struct decoded {
  long long version;
  sv sid, tok;
  const json_value *env; /* object or NULL */
  sv gip, gw;
  long long prefix;
  const json_value *ns, *search, *opts; /* arrays or NULL */
  sv domain;
  const json_value *ts, *entropy; /* boot.md §10, raw: their errors are terminal texts */
  const json_value *wl_mem, *wl_pids; /* boot.md §12, raw likewise */
  const json_value *duser;            /* boot.md §13, raw likewise */
  const json_value *fwdlp;            /* boot.md §13 forwardLocalPorts: true, false or absent */
  const json_value *allow_up;         /* api.md §9 allowUpgrade, raw: a bad type is a terminal text */
  const json_value *log_port, *con_lvl; /* api.md §9 "Operators", raw likewise */
} decoded;

#define FAIL(...)                                   \
  do {                                              \
    if (errlen) snprintf(err, errlen, __VA_ARGS__); \
    return -1;                                      \
  } while (0)

/* Unknown or duplicate keys → error. */
static int check_keys(const json_value *o, const char *what, const char *const *allowed,
                      size_t na, char *err, size_t errlen) {
  for (size_t i = 0; i < o->n; i++) {
    size_t a;
    for (a = 0; a < na; a++)
      if (o->key_lens[i] == strlen(allowed[a]) && memcmp(o->keys[i], allowed[a], o->key_lens[i]) == 0)
        break;
    if (a == na) FAIL("unknown field in %s", what);
    for (size_t j = 0; j < i; j++)
      if (o->key_lens[j] == o->key_lens[i] && memcmp(o->keys[j], o->keys[i], o->key_lens[i]) == 0)
        FAIL("duplicate field \"%s\" in %s", allowed[a], what);
  }
  return 0;
}

static int get_str(const json_value *o, const char *key, sv *out, char *err, size_t errlen) {
  const json_value *v = json_get(o, key);
  out->s = "";
  out->n = 0;
  if (!v || v->type == JSON_NULL) return 0;
  if (v->type != JSON_STRING) FAIL("field %s: expected a string, got %s", key, json_type_name(v->type));
  out->s = v->str;
  out->n = v->len;
  return 0;
}

static int get_int(const json_value *o, const char *key, long long *out, char *err, size_t errlen) {
  const json_value *v = json_get(o, key);
  *out = 0;
  if (!v || v->type == JSON_NULL) return 0;
  if (v->type != JSON_NUMBER) FAIL("field %s: expected a number, got %s", key, json_type_name(v->type));
  const char *p = v->str;
  int neg = 0;
  if (*p == '-') {
    neg = 1;
    p++;
  }
  if (!*p) FAIL("field %s: bad number", key);
  unsigned long long acc = 0, lim = neg ? 9223372036854775808ull : 9223372036854775807ull;
  for (; *p; p++) {
    if (*p < '0' || *p > '9') FAIL("field %s: not an integer", key);
    unsigned d = (unsigned)(*p - '0');
    if (acc > (lim - d) / 10) FAIL("field %s: integer out of range", key);
    acc = acc * 10 + d;
  }
  *out = neg ? (long long)(0 - acc) : (long long)acc;
  return 0;
}

static int get_obj(const json_value *o, const char *key, const json_value **out, char *err,
                   size_t errlen) {
  const json_value *v = json_get(o, key);
  *out = NULL;
  if (!v || v->type == JSON_NULL) return 0;
  if (v->type != JSON_OBJECT) FAIL("field %s: expected an object, got %s", key, json_type_name(v->type));
  *out = v;
  return 0;
}

static int get_str_list(const json_value *o, const char *key, const json_value **out, char *err,
                        size_t errlen) {
  const json_value *v = json_get(o, key);
  *out = NULL;
  if (!v || v->type == JSON_NULL) return 0;
  if (v->type != JSON_ARRAY) FAIL("field %s: expected an array, got %s", key, json_type_name(v->type));
  for (size_t i = 0; i < v->n; i++)
    if (v->items[i].type != JSON_STRING && v->items[i].type != JSON_NULL)
      FAIL("field %s: expected strings, got %s", key, json_type_name(v->items[i].type));
  *out = v;
  return 0;
}

static sv item_sv(const json_value *v) {
  sv s = {"", 0};
  if (v->type == JSON_STRING) {
    s.s = v->str;
    s.n = v->len;
  }
  return s;
}

static int decode(const json_value *root, decoded *d, char *err, size_t errlen) {
  static const char *const top_keys[] = {"version", "sandboxID", "agentToken", "env",
                                         "network", "timestampMs", "entropy",
                                         "workloadMemoryMaxBytes", "workloadPidsMax",
                                         "defaultUser", "forwardLocalPorts", "allowUpgrade",
                                         "logPort", "consoleLogLevel"};
  static const char *const net_keys[] = {"guestIP", "prefixLength", "gateway", "dns"};
  static const char *const dns_keys[] = {"nameservers", "domain", "search", "options"};
  memset(d, 0, sizeof *d);
  d->sid = d->tok = d->gip = d->gw = d->domain = (sv){"", 0};
  if (root->type == JSON_NULL) return 0;
  if (root->type != JSON_OBJECT) FAIL("message is a JSON %s, not an object", json_type_name(root->type));
  if (check_keys(root, "message", top_keys, sizeof top_keys / sizeof top_keys[0], err, errlen) ||
      get_int(root, "version", &d->version, err, errlen) ||
      get_str(root, "sandboxID", &d->sid, err, errlen) ||
      get_str(root, "agentToken", &d->tok, err, errlen) ||
      get_obj(root, "env", &d->env, err, errlen))
    return -1;
  d->ts = json_get(root, "timestampMs");
  d->entropy = json_get(root, "entropy");
  if (d->ts && d->ts->type == JSON_NULL) d->ts = NULL;
  if (d->entropy && d->entropy->type == JSON_NULL) d->entropy = NULL;
  d->wl_mem = json_get(root, "workloadMemoryMaxBytes");
  d->wl_pids = json_get(root, "workloadPidsMax");
  d->duser = json_get(root, "defaultUser");
  d->fwdlp = json_get(root, "forwardLocalPorts");
  if (d->fwdlp && d->fwdlp->type == JSON_NULL) d->fwdlp = NULL;
  d->allow_up = json_get(root, "allowUpgrade");
  if (d->allow_up && d->allow_up->type == JSON_NULL) d->allow_up = NULL;
  d->log_port = json_get(root, "logPort");
  if (d->log_port && d->log_port->type == JSON_NULL) d->log_port = NULL;
  d->con_lvl = json_get(root, "consoleLogLevel");
  if (d->con_lvl && d->con_lvl->type == JSON_NULL) d->con_lvl = NULL;
  if (d->fwdlp && d->fwdlp->type != JSON_TRUE && d->fwdlp->type != JSON_FALSE)
    FAIL("forwardLocalPorts: expected bool, got %s", json_type_name(d->fwdlp->type));
  if (d->wl_mem && d->wl_mem->type == JSON_NULL) d->wl_mem = NULL;
  if (d->wl_pids && d->wl_pids->type == JSON_NULL) d->wl_pids = NULL;
  if (d->env)
    for (size_t i = 0; i < d->env->n; i++) {
      json_type t = d->env->items[i].type;
      if (t != JSON_STRING && t != JSON_NULL) FAIL("env: expected string values, got %s", json_type_name(t));
      for (size_t j = 0; j < i; j++)
        if (d->env->key_lens[j] == d->env->key_lens[i] &&
            memcmp(d->env->keys[j], d->env->keys[i], d->env->key_lens[i]) == 0)
          FAIL("duplicate key in env");
    }
  const json_value *net, *dns = NULL;
  if (get_obj(root, "network", &net, err, errlen)) return -1;
  if (net) {
    if (check_keys(net, "network", net_keys, 4, err, errlen) ||
        get_str(net, "guestIP", &d->gip, err, errlen) ||
        get_int(net, "prefixLength", &d->prefix, err, errlen) ||
        get_str(net, "gateway", &d->gw, err, errlen) || get_obj(net, "dns", &dns, err, errlen))
      return -1;
  }
  if (dns) {
    if (check_keys(dns, "network.dns", dns_keys, 4, err, errlen) ||
        get_str_list(dns, "nameservers", &d->ns, err, errlen) ||
        get_str(dns, "domain", &d->domain, err, errlen) ||
        get_str_list(dns, "search", &d->search, err, errlen) ||
        get_str_list(dns, "options", &d->opts, err, errlen))
      return -1;
  }
  return 0;
}

/* ------------------------------------------------------------ validation */

static char *dup_sv(sv s) {
  char *p = malloc(s.n + 1);
  if (p) {
    memcpy(p, s.s, s.n);
    p[s.n] = 0;
  }
  return p;
}

static char *text_quoted(const char *pre, sv s, const char *post) {
  istr b = {0};
  istr_adds(&b, pre);
  istr_quote(&b, s.s, s.n);
  istr_adds(&b, post);
  return istr_take(&b, NULL);
}

static int ipv4_sv(sv s, uint32_t *a) { return initstr_ipv4(s.s, s.n, a); }

/* 1 and the reason in *why (malloc'd; NULL on OOM) when the DNS config is
 * invalid, else 0. */
static int check_dns(const decoded *d, char **why) {
  *why = NULL;
  if (d->ns)
    for (size_t i = 0; i < d->ns->n; i++) {
      sv s = item_sv(&d->ns->items[i]);
      uint32_t a;
      if (!ipv4_sv(s, &a) || a == 0 || (a >> 24) == 127) {
        *why = text_quoted("nameserver ", s, " must be a reachable IPv4 address");
        return 1;
      }
    }
  if (d->domain.n && initstr_has_space_or_control(d->domain.s, d->domain.n)) {
    *why = text_quoted("invalid domain ", d->domain, "");
    return 1;
  }
  if (d->search)
    for (size_t i = 0; i < d->search->n; i++) {
      sv s = item_sv(&d->search->items[i]);
      if (s.n == 0 || initstr_has_space_or_control(s.s, s.n)) {
        *why = text_quoted("invalid search domain ", s, "");
        return 1;
      }
    }
  if (d->opts)
    for (size_t i = 0; i < d->opts->n; i++) {
      sv s = item_sv(&d->opts->items[i]);
      if (s.n == 0 || initstr_has_space_or_control(s.s, s.n)) {
        *why = text_quoted("invalid resolver option ", s, "");
        return 1;
      }
    }
  return 0;
}

/* timestampMs: a positive integer (plain digits), else -1. */
static int restore_timestamp(const json_value *v, int64_t *out) {
  if (v->type != JSON_NUMBER || v->len == 0 || v->len > 18) return -1;
  int64_t acc = 0;
  for (size_t i = 0; i < v->len; i++) {
    if (v->str[i] < '0' || v->str[i] > '9') return -1;
    acc = acc * 10 + (v->str[i] - '0');
  }
  if (acc <= 0) return -1;
  *out = acc;
  return 0;
}

/* A uint of plain digits within [lo, hi] (hi 0: no upper bound), else -1. */
static int workload_uint(const json_value *v, uint64_t lo, uint64_t hi, uint64_t *out) {
  if (v->type != JSON_NUMBER || v->len == 0 || v->len > 19) return -1;
  uint64_t acc = 0;
  for (size_t i = 0; i < v->len; i++) {
    if (v->str[i] < '0' || v->str[i] > '9') return -1;
    acc = acc * 10 + (uint64_t)(v->str[i] - '0');
  }
  if (acc < lo || (hi && acc > hi)) return -1;
  *out = acc;
  return 0;
}

/* consoleLogLevel's level, -1 when it names none. */
static int console_level(const json_value *v) {
  char s[8];
  if (v->type != JSON_STRING || v->len >= sizeof s) return -1;
  memcpy(s, v->str, v->len);
  s[v->len] = 0;
  return log_level_parse(s);
}

static uint64_t initmsg_mem_total;
void initmsg_set_mem_total(uint64_t bytes) { initmsg_mem_total = bytes; }

/* entropy: base64 of INITMSG_ENTROPY_MIN..MAX bytes, else -1. */
static int restore_entropy(const json_value *v, unsigned char *out, size_t *outlen) {
  if (v->type != JSON_STRING || v->len > (INITMSG_ENTROPY_MAX + 2) / 3 * 4) return -1;
  unsigned char buf[INITMSG_ENTROPY_MAX + 4];
  long n = text_b64_decode(v->str, v->len, buf);
  if (n < INITMSG_ENTROPY_MIN || n > INITMSG_ENTROPY_MAX) return -1;
  memcpy(out, buf, (size_t)n);
  *outlen = (size_t)n;
  return 0;
}

int initmsg_clock_needs_step(int64_t now_ms, int64_t host_ms) {
  return now_ms < host_ms - INITMSG_CLOCK_BEHIND_MS || now_ms > host_ms + INITMSG_CLOCK_AHEAD_MS;
}

/* Returns NULL when valid, else the terminal text (malloc'd); *invalid is
 * set to 1 for any failure, so an allocation failure (NULL text) is never
 * mistaken for a valid message. */
static char *validate_text(const decoded *d, sv *sid, sv *tok, uint32_t *ip, uint32_t *gw,
                           int64_t *ts_ms, unsigned char *entropy, size_t *entropy_len,
                           uint64_t *wl_mem, uint64_t *wl_pids, int *invalid) {
  istr b = {0};
  *invalid = 1;
  if (d->version != 1) {
    istr_addf(&b, "unsupported protocol version %lld", d->version);
    return istr_take(&b, NULL);
  }
  *sid = d->sid;
  initstr_trim(&sid->s, &sid->n);
  if (sid->n == 0) return strdup("sandboxID is required");
  *tok = d->tok;
  initstr_trim(&tok->s, &tok->n);
  if (tok->n == 0) return strdup("agentToken is required");
  if (tok->n > CONCH_TOKEN_MAX) return strdup("agentToken is too large");
  if (d->env)
    for (size_t i = 0; i < d->env->n; i++) {
      sv k = {d->env->keys[i], d->env->key_lens[i]};
      if (k.n == 0 || memchr(k.s, '=', k.n) || memchr(k.s, 0, k.n))
        return text_quoted("invalid sandbox environment: invalid environment key ", k, "");
      sv v = item_sv(&d->env->items[i]);
      if (memchr(v.s, 0, v.n))
        return text_quoted("invalid sandbox environment: value for ", k, " contains NUL");
    }
  if (!ipv4_sv(d->gip, ip)) return text_quoted("guestIP ", d->gip, " must be a valid IPv4 address");
  if (!ipv4_sv(d->gw, gw)) return text_quoted("gateway ", d->gw, " must be a valid IPv4 address");
  if (d->prefix < 1 || d->prefix > 32) {
    istr_addf(&b, "prefixLength %lld must be within [1, 32]", d->prefix);
    return istr_take(&b, NULL);
  }
  uint32_t mask = d->prefix == 32 ? 0xffffffffu : ~(0xffffffffu >> d->prefix);
  if ((*ip & mask) != (*gw & mask)) {
    istr_addf(&b, "guestIP %.*s/%lld and gateway %.*s are not in the same subnet", (int)d->gip.n,
              d->gip.s, d->prefix, (int)d->gw.n, d->gw.s);
    return istr_take(&b, NULL);
  }
  if (*ip == *gw) return strdup("guestIP and gateway must be different");
  char *why;
  if (check_dns(d, &why)) {
    if (!why) return NULL;
    istr_adds(&b, "invalid DNS config: ");
    istr_adds(&b, why);
    free(why);
    return istr_take(&b, NULL);
  }
  if (d->ts && restore_timestamp(d->ts, ts_ms) != 0) return strdup("invalid timestampMs");
  if (d->entropy && restore_entropy(d->entropy, entropy, entropy_len) != 0)
    return strdup("invalid entropy");
  if (d->wl_mem && workload_uint(d->wl_mem, INITMSG_WORKLOAD_MEM_MIN, initmsg_mem_total, wl_mem) != 0)
    return strdup("invalid workloadMemoryMaxBytes");
  if (d->wl_pids && workload_uint(d->wl_pids, INITMSG_WORKLOAD_PIDS_MIN, 0, wl_pids) != 0)
    return strdup("invalid workloadPidsMax");
  if (d->duser) { /* a name, uid or uid:gid; resolved when the message is applied */
    users_spec sp;
    sv u = d->duser->type == JSON_STRING ? item_sv(d->duser) : (sv){"", 0};
    char buf[USERS_MAX_SPEC + 1];
    if (u.n == 0 || u.n > USERS_MAX_SPEC || memchr(u.s, 0, u.n)) return strdup("invalid defaultUser");
    memcpy(buf, u.s, u.n);
    buf[u.n] = 0;
    if (users_spec_parse(buf, &sp) != 0) return strdup("invalid defaultUser");
  }
  if (d->allow_up && d->allow_up->type != JSON_TRUE && d->allow_up->type != JSON_FALSE)
    return strdup("invalid allowUpgrade");
  uint64_t port;
  if (d->log_port && workload_uint(d->log_port, 0, 0xffffffffULL, &port) != 0) return strdup("invalid logPort");
  if (d->con_lvl && console_level(d->con_lvl) < 0) return strdup("invalid consoleLogLevel");
  *invalid = 0;
  return NULL;
}

/* ------------------------------------------------------------ resolv.conf */

static int seen_before(const char *const *v, size_t i) {
  for (size_t j = 0; j < i; j++)
    if (strcmp(v[j], v[i]) == 0) return 1;
  return 0;
}

char *initmsg_resolv(const char *const *ns, size_t nns, const char *domain,
                     const char *const *search, size_t nsearch, const char *const *opts,
                     size_t nopts, size_t *len) {
  istr b = {0};
  istr_adds(&b, "# Generated by Conch\n");
  size_t written = 0;
  for (size_t i = 0; i < nns && written < INITMSG_MAX_NAMESERVERS; i++) {
    if (seen_before(ns, i)) continue;
    istr_addf(&b, "nameserver %s\n", ns[i]);
    written++;
  }
  if (nsearch) {
    istr_adds(&b, "search");
    for (size_t i = 0; i < nsearch; i++)
      if (!seen_before(search, i)) {
        istr_adds(&b, " ");
        istr_adds(&b, search[i]);
      }
    istr_adds(&b, "\n");
  } else if (domain && *domain) {
    istr_addf(&b, "domain %s\n", domain);
  }
  if (nopts) {
    istr_adds(&b, "options");
    for (size_t i = 0; i < nopts; i++)
      if (!seen_before(opts, i)) {
        istr_adds(&b, " ");
        istr_adds(&b, opts[i]);
      }
    istr_adds(&b, "\n");
  }
  return istr_take(&b, len);
}

/* Strings of a validated list (no NULs, since they passed validation). */
static const char **list_strs(const json_value *a, size_t *n) {
  *n = a ? a->n : 0;
  const char **v = calloc(*n + 1, sizeof *v);
  if (!v) return NULL;
  for (size_t i = 0; i < *n; i++) v[i] = item_sv(&a->items[i]).s;
  return v;
}

static int build_plan(const decoded *d, sv sid, sv tok, uint32_t ip, uint32_t gw,
                      initmsg_plan *p) {
  memset(p, 0, sizeof *p);
  p->sandbox_id = dup_sv(sid);
  p->token = dup_sv(tok);
  p->token_len = tok.n;
  p->guest_ip = ip;
  p->gateway = gw;
  p->prefix_len = (unsigned)d->prefix;
  if (!p->sandbox_id || !p->token) return -1;
  if (d->duser && !(p->default_user = dup_sv(item_sv(d->duser)))) return -1;
  p->forward_local_ports = d->fwdlp ? d->fwdlp->type == JSON_TRUE : -1;
  p->allow_upgrade = d->allow_up ? d->allow_up->type == JSON_TRUE : -1;
  uint64_t port = 0;
  p->log_port = d->log_port && workload_uint(d->log_port, 0, 0xffffffffULL, &port) == 0 ? (long long)port : -1;
  p->console_level = d->con_lvl ? console_level(d->con_lvl) : -1;
  size_t ne = d->env ? d->env->n : 0;
  if (ne) {
    p->env_k = calloc(ne, sizeof *p->env_k);
    p->env_v = calloc(ne, sizeof *p->env_v);
    if (!p->env_k || !p->env_v) return -1;
    for (size_t i = 0; i < ne; i++) {
      p->env_k[i] = dup_sv((sv){d->env->keys[i], d->env->key_lens[i]});
      p->env_v[i] = dup_sv(item_sv(&d->env->items[i]));
      p->nenv = i + 1;
      if (!p->env_k[i] || !p->env_v[i]) return -1;
    }
  }
  size_t nns, nsearch, nopts;
  const char **ns = list_strs(d->ns, &nns), **search = list_strs(d->search, &nsearch),
             **opts = list_strs(d->opts, &nopts);
  if (ns && search && opts)
    p->resolv = initmsg_resolv(ns, nns, d->domain.s, search, nsearch, opts, nopts, &p->resolv_len);
  free(ns);
  free(search);
  free(opts);
  return p->resolv ? 0 : -1;
}

void initmsg_plan_free(initmsg_plan *p) {
  free(p->sandbox_id);
  free(p->token);
  for (size_t i = 0; i < p->nenv; i++) {
    free(p->env_k[i]);
    free(p->env_v[i]);
  }
  free(p->env_k);
  free(p->env_v);
  free(p->resolv);
  free(p->default_user);
  explicit_bzero(p, sizeof *p);
}

int initmsg_process(const char *buf, size_t n, initmsg_plan *plan, char **msg, char *err,
                    size_t errlen) {
  *msg = NULL;
  memset(plan, 0, sizeof *plan);
  char jerr[128] = "";
  json_value *root = json_parse(buf, n, jerr, sizeof jerr);
  if (!root) {
    if (errlen) snprintf(err, errlen, "invalid JSON: %s", jerr);
    return -1;
  }
  decoded d;
  if (decode(root, &d, err, errlen) != 0) {
    json_free(root);
    return -1;
  }
  sv sid, tok;
  uint32_t ip = 0, gw = 0;
  int invalid;
  int64_t ts_ms = 0;
  unsigned char entropy[INITMSG_ENTROPY_MAX];
  size_t entropy_len = 0;
  uint64_t wl_mem = 0, wl_pids = 0;
  char *bad = validate_text(&d, &sid, &tok, &ip, &gw, &ts_ms, entropy, &entropy_len, &wl_mem, &wl_pids,
                            &invalid);
  int rc = 0;
  if (invalid) {
    *msg = bad;
    rc = 1;
  } else if (build_plan(&d, sid, tok, ip, gw, plan) != 0) {
    initmsg_plan_free(plan);
    if (errlen) snprintf(err, errlen, "out of memory");
    rc = -2;
  } else {
    plan->timestamp_ms = ts_ms;
    memcpy(plan->entropy, entropy, entropy_len);
    plan->entropy_len = entropy_len;
    plan->workload_memory_max = wl_mem;
    plan->workload_pids_max = wl_pids;
  }
  explicit_bzero(entropy, sizeof entropy);
  json_free(root);
  if (rc == 1 && !*msg) {
    if (errlen) snprintf(err, errlen, "out of memory");
    return -2;
  }
  return rc;
}

char *initmsg_response(int ready, int retryable, const char *message, size_t *len) {
  istr b = {0};
  istr_adds(&b, "{\"version\":1,\"status\":");
  istr_adds(&b, ready ? "\"ready\"" : "\"not_ready\"");
  istr_adds(&b, retryable ? ",\"retryable\":true" : ",\"retryable\":false");
  if (message && *message) {
    istr_adds(&b, ",\"message\":");
    istr_json(&b, message, strlen(message));
  }
  istr_adds(&b, "}");
  return istr_take(&b, len);
}
