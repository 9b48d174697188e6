/* main — conch-init's entry: PID 1 (init/) or standalone `serve`.
 *
 *   conch-init                      as PID 1: the whole boot (boot.md)
 *   conch-init serve [options]      standalone: serve the API, no mounts
 *   conch-init --handover-check N   exit 0 when this program can restore
 *                                   handover state format N (Upgrade's trial)
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/daemon.h"
#include "agent/parts.h"
#include "core/handover.h"
#include "agent/metrics.h"
#include "core/log.h"
#include "proto/text.h"
#include "server/router.h"
#include "server/server.h"
#include "agent/upgrade.h"
#include "server/users.h"
#include "fs/service.h"
#include "init/initproto.h"
#include "net/service.h"
#include "init/pid1.h"
#include "proc/reaper.h"
#include "proc/cgroup.h"
#include "proc/service.h"
#include "reflect/service.h"

static const char usage[] =
    "usage: conch-init                  (as PID 1: boot the sandbox)\n"
    "       conch-init serve [options]  (standalone: serve the agent API)\n"
    "       conch-init --handover-check N  (exit 0 when it can restore state format N)\n"
    "\n"
    "options for serve:\n"
    "  --listen HOST:PORT      API address (default 127.0.0.1:4064)\n"
    "  --token-file FILE       read the agent token from FILE (preferred)\n"
    "  --token TOKEN           agent token (overwritten in the argument list at\n"
    "                          start; else --token-file, else $CONCH_INIT_TOKEN)\n"
    "  --init-listen SPEC      also accept init messages on unix:PATH or vsock:PORT\n"
    "  --init-apply-network    let init messages configure the network of this\n"
    "                          network namespace and write --resolv-conf\n"
    "  --resolv-conf FILE      where such messages write resolv.conf (/etc/resolv.conf)\n"
    "  --default-user USER     run RPCs that name no user as USER (name, uid or uid:gid)\n"
    "  --forward-ports ADDR    forward loopback-only listeners to ADDR (IPv4 or IPv6 literal)\n"
    "  --no-upgrade            refuse pb.AgentService/Upgrade (permission_denied)\n"
    "  --log-level LEVEL       debug, info (default), warn, error\n"
    "  --log-format text|json  stderr lines as text (default) or JSON objects\n"
    "  --log-stream SPEC       also send every line as JSON to vsock:CID:PORT,\n"
    "                          unix:PATH or tcp:IP:PORT (reconnects; keeps 1 MiB)\n"
    "  -h, --help              this text\n"
    "  -V, --version           print the version\n"
    "\n"
    "docs (in the source tree): README.md, docs/api.md (every route, RPC and\n"
    "error), docs/guide/pid1.md (booting as PID 1), docs/guide/*.md\n";

static int main_set_level(const char *s) {
  int i = log_level_parse(s);
  if (i < 0) return -1;
  log_set_level((log_level)i);
  return 0;
}

/* Token text: trailing whitespace (a file's newline) is not part of it. */
static int main_set_token(const char *t, size_t len, const char *from) {
  while (len && (t[len - 1] == '\n' || t[len - 1] == '\r' || t[len - 1] == ' ' || t[len - 1] == '\t'))
    len--;
  while (len && (*t == ' ' || *t == '\t')) t++, len--;
  if (len == 0) {
    fprintf(stderr, "conch-init: empty token from %s\n", from);
    return -1;
  }
  if (len > CONCH_TOKEN_MAX) {
    fprintf(stderr, "conch-init: token from %s is longer than %d bytes\n", from, CONCH_TOKEN_MAX);
    return -1;
  }
  daemon_set_token(t, len);
  return 0;
}

/* The token's bytes in an argument or the environment, overwritten in
 * place once copied: /proc/<pid>/cmdline and /proc/<pid>/environ read
 * that memory (the length stays visible, the value does not). */
static void main_scrub(char *p) {
  for (; *p; p++) *p = 'x';
}

/* The copies of the token read from argv and the environment: static, so
 * that an early return leaves nothing a leak checker counts. */
static char *main_arg_token, *main_env_token;

/* CONCH_INIT_TOKEN (the first, as getenv) copied to main_env_token, then
 * gone from the agent's environment: unsetenv drops it from environ, but
 * /proc/<pid>/environ shows the block the kernel set up at exec, so the
 * value of every CONCH_INIT_TOKEN string there is overwritten too.
 * Children never had it: they get the sandbox environment (senv.h).
 * -1 when out of memory. */
static int main_take_env_token(void) {
  extern char **environ;
  static const char name[] = "CONCH_INIT_TOKEN=";
  for (char **e = environ; e && *e; e++)
    if (strncmp(*e, name, sizeof name - 1) == 0) {
      if (!main_env_token && !(main_env_token = strdup(*e + sizeof name - 1))) return -1;
      main_scrub(*e + sizeof name - 1);
    }
  unsetenv("CONCH_INIT_TOKEN");
  return 0;
}

/* A token copy is wiped before it is freed. */
static void main_forget(char **t) {
  if (!*t) return;
  explicit_bzero(*t, strlen(*t));
  free(*t);
  *t = NULL;
}

/* --token-fd N: the token read from the memfd N (from its start), copied
 * to main_arg_token; the descriptor stays open (*fd) for the handover. */
static int main_token_fd(const char *arg, int *fd) {
  char *end, buf[CONCH_TOKEN_MAX + 1];
  long n = strtol(arg, &end, 10);
  ssize_t len = *end || n < 3 || n > 1 << 20 ? -1 : pread((int)n, buf, sizeof buf - 1, 0);
  if (len < 0) {
    fprintf(stderr, "conch-init: cannot read the token from descriptor %s\n", arg);
    return -1;
  }
  buf[len] = 0;
  main_forget(&main_arg_token);
  main_arg_token = strdup(buf);
  explicit_bzero(buf, sizeof buf);
  *fd = (int)n;
  if (!main_arg_token) {
    fprintf(stderr, "conch-init: out of memory\n");
    return -1;
  }
  return 0;
}

static int main_token_file(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "conch-init: cannot read token file %s: %s\n", path, strerror(errno));
    return -1;
  }
  char buf[CONCH_TOKEN_MAX + 64];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  int r = main_set_token(buf, n, path);
  explicit_bzero(buf, sizeof buf);
  return r;
}

/* Process-wide settings every mode shares. */
static void main_common_setup(void) {
  /* libuv's thread pool (disk work) defaults to 4 threads; on a guest with
   * fewer CPUs their wake-ups cost more than they give (ListFiles rate on 2
   * cores: 80 k/s with 4 threads, 115 k/s with 2).  One thread per CPU, 2 to
   * 4, unless UV_THREADPOOL_SIZE says otherwise. */
  if (!getenv("UV_THREADPOOL_SIZE")) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    char v[8];
    snprintf(v, sizeof v, "%ld", n < 2 ? 2 : n > 4 ? 4 : n);
    setenv("UV_THREADPOOL_SIZE", v, 0);
  }
  signal(SIGPIPE, SIG_IGN);
  umask(022);
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  /* test knobs for the HTTP timers (milliseconds, 1..3600000) */
  const char *hm = getenv("CONCH_HTTP_HEADER_MS"), *im = getenv("CONCH_HTTP_IDLE_MS");
  if (hm && atol(hm) > 0 && atol(hm) <= 3600000) conch.http_header_ms = (unsigned)atol(hm);
  if (im && atol(im) > 0 && atol(im) <= 3600000) conch.http_idle_ms = (unsigned)atol(im);
  const char *rb = getenv("CONCH_RX_BUDGET");
  if (rb && atol(rb) > 0) conch.rx_budget = (size_t)atol(rb);
  const char *mb = getenv("CONCH_MEM_BUDGET");
  int budget_raised = 0;
  if (mb && atol(mb) > 0) conch.budget = (size_t)atol(mb);
  if (conch.budget < CONCH_MEM_BUDGET_MIN) { /* else a producer that asks for more room than half of it waits forever */
    conch.budget = CONCH_MEM_BUDGET_MIN;
    budget_raised = 1;
  }
  const char *mc = getenv("CONCH_MAX_CONNS");
  if (mc && atol(mc) > 0 && atol(mc) <= 1000000) conch.max_conns = (unsigned)atol(mc);
  const char *lvl = getenv("CONCH_LOG_LEVEL");
  if (lvl) main_set_level(lvl);
  if (budget_raised)
    LOG_WARN("CONCH_MEM_BUDGET=%s is below the least it can be: %u bytes (4 MiB)", mb, CONCH_MEM_BUDGET_MIN);
  conch.loop = uv_default_loop();
  log_set_json_escaper(text_json_string);
}

static void main_register_services(void) {
  size_t n;
  router_add_http("/metrics", metrics_serve);
  const rpc_method *m = fs_service_methods(conch.loop, &n);
  router_register(m, n);
  router_add_http("/files", fs_http_serve);
  m = net_service_methods(conch.loop, &n);
  router_register(m, n);
  m = upgrade_service_methods(&n);
  router_register(m, n);
  m = reflect_service_methods(&n);
  if (m) router_register(m, n);
  else LOG_ERROR("the embedded descriptor set does not load: no gRPC reflection");
  int failed = 0;
#ifndef CONCH_STATIC /* CONCH_FAULT=proc_init: the test seam for "PID 1 never exits" (tests/ns);
                        not in the release binary, whose environment the kernel command line sets */
  const char *fault = getenv("CONCH_FAULT");
  failed = fault && strcmp(fault, "proc_init") == 0;
#endif
  failed = failed || reaper_init(conch.loop) != 0 || proc_init(conch.loop) != 0;
  if (failed && getpid() == 1) { /* exiting would panic the kernel */
    LOG_ERROR("cannot start the process service: ProcessService unavailable, PID 1 goes on");
    return;
  }
  if (failed) {
    LOG_ERROR("cannot start the process service");
    exit(1);
  }
  m = proc_service_methods(&n);
  router_register(m, n);
  net_set_owner_lookup(proc_owner_lookup); /* net/ sees proc/ only through this hook */
}

/* `conch-init --handover-check N` (the Upgrade trial, api.md §9): 0 when
 * this program can restore handover state format N, else 1 with a line on
 * stderr; 2 for a usage error. */
static int main_handover_check(int argc, char **argv) {
  char *end = NULL;
  errno = 0;
  unsigned long n = argc == 3 && argv[2][0] >= '0' && argv[2][0] <= '9' ? strtoul(argv[2], &end, 10) : 0;
  if (!end || *end || errno || n > 0xffffffffUL) {
    fprintf(stderr, "usage: conch-init --handover-check N\n");
    return 2;
  }
  if (handover_can_read((unsigned)n)) return 0;
  fprintf(stderr, "conch-init %s cannot read handover state format %lu (it reads %d to %d)\n", CONCH_VERSION, n,
          HANDOVER_FORMAT_MIN, HANDOVER_FORMAT);
  return 1;
}

static void main_stopped(void) { uv_stop(conch.loop); }

/* The first SIGTERM/SIGINT ends the commands first (proc_stop), a second
 * one stops at once. */
static void main_on_stop(uv_signal_t *s, int signum) {
  (void)s;
  LOG_INFO("stopping signal=%d", signum);
  if (proc_stop(main_stopped) != 0) uv_stop(conch.loop);
}

static int main_serve(int argc, char **argv) {
  const char *listen = "127.0.0.1:4064", *token = NULL, *token_file = NULL, *init_listen = NULL;
  const char *resolv = NULL, *forward = NULL;
  int apply_network = 0, token_fd = -1;
  static const struct option opts[] = {
      {"listen", required_argument, NULL, 'l'},  {"token", required_argument, NULL, 't'},
      {"token-file", required_argument, NULL, 'f'}, {"init-listen", required_argument, NULL, 'i'},
      {"init-apply-network", no_argument, NULL, 'N'}, {"resolv-conf", required_argument, NULL, 'R'},
      {"log-level", required_argument, NULL, 'L'}, {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, 'V'},        {"default-user", required_argument, NULL, 'U'},
      {"forward-ports", required_argument, NULL, 'F'}, {"handover", required_argument, NULL, 'H'},
      {"handover-rollback", required_argument, NULL, 'B'}, {"no-upgrade", no_argument, NULL, 'u'},
      {"log-format", required_argument, NULL, 'J'}, {"log-stream", required_argument, NULL, 'S'},
      {"token-fd", required_argument, NULL, 'T'},
      {NULL, 0, NULL, 0}};
  int ch;
  optind = 1;
  while ((ch = getopt_long(argc, argv, "hV", opts, NULL)) != -1) {
    switch (ch) {
      case 'l': listen = optarg; break;
      case 't': /* copied, then overwritten in argv (also --token=VALUE) */
        free(main_arg_token);
        main_arg_token = strdup(optarg);
        main_scrub(optarg);
        if (!main_arg_token) {
          fprintf(stderr, "conch-init: out of memory\n");
          return 2;
        }
        token = main_arg_token;
        break;
      case 'f': token_file = optarg; break;
      case 'T': /* an upgrade's: the token for a start without the state (core/handover.c closes it) */
        if (main_token_fd(optarg, &token_fd) != 0) return 2;
        token = main_arg_token;
        break;
      case 'i': init_listen = optarg; break;
      case 'N': apply_network = 1; break;
      case 'R': resolv = optarg; break;
      case 'F': forward = optarg; break;
      case 'H': case 'B': break; /* handover_arg() read it */
      case 'u': conch.no_upgrade = 1; break;
      case 'U': {
        users_spec sp;
        if (users_spec_parse(optarg, &sp) != 0) {
          fprintf(stderr, "conch-init: invalid user: %s\n", optarg);
          return 2;
        }
        snprintf(conch.default_user, sizeof conch.default_user, "%s", optarg);
        break;
      }
      case 'L':
        if (main_set_level(optarg)) {
          fprintf(stderr, "conch-init: unknown log level %s\n", optarg);
          return 2;
        }
        break;
      case 'J':
        if (strcmp(optarg, "text") != 0 && strcmp(optarg, "json") != 0) {
          fprintf(stderr, "conch-init: unknown log format %s\n", optarg);
          return 2;
        }
        log_set_console_json(strcmp(optarg, "json") == 0);
        break;
      case 'S':
        if (log_stream_set(optarg) != 0) {
          fprintf(stderr, "conch-init: --log-stream needs vsock:CID:PORT, unix:PATH or tcp:IP:PORT: %s\n", optarg);
          return 2;
        }
        break;
      case 'h': fputs(usage, stdout); return 0;
      case 'V': printf("conch-init %s\n", CONCH_VERSION); return 0;
      default: fputs(usage, stderr); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "conch-init: unexpected argument %s\n", argv[optind]);
    return 2;
  }
  int rollback = 0, hfd = handover_arg(argc, argv, &rollback);
  char herr[512];
  if (hfd < 0 && token_fd >= 0) close(token_fd); /* (not a handover's: nothing else holds it) */
  if (hfd >= 0 && handover_load(hfd, rollback, herr, sizeof herr) != 0) hfd = -1; /* a fresh start */
  if (hfd >= 0) { /* the token, and the rest, come from the state */
    main_take_env_token();
    main_forget(&main_arg_token);
    main_forget(&main_env_token);
    token = token_file = NULL;
    reaper_hold(1);
  }
  if (hfd < 0 && main_take_env_token() != 0) {
    fprintf(stderr, "conch-init: out of memory\n");
    return 2;
  }
  if (token && main_set_token(token, strlen(token), "--token")) return 2;
  if (!token && token_file && main_token_file(token_file)) return 2;
  if (!token && !token_file && main_env_token &&
      main_set_token(main_env_token, strlen(main_env_token), "CONCH_INIT_TOKEN"))
    return 2;
  main_forget(&main_arg_token);
  main_forget(&main_env_token);
  if (hfd < 0 && !conch.token_set && !init_listen)
    LOG_WARN("no token configured: every RPC answers \"agent token is not initialized\"");
  main_register_services();
  if (forward && net_forward_set(forward) != 0) {
    fprintf(stderr, "conch-init: --forward-ports needs an IPv4 or IPv6 address: %s\n", forward);
    return 2;
  }
  uv_signal_t main_sigterm, main_sigint; /* live as long as uv_run below */
  if (hfd >= 0) {
    handover_finish(herr, sizeof herr);
    reaper_hold(0);
  }
  if (!conch.server && server_listen(listen) != 0) return 1;
  if (init_listen && !initproto_listening()) {
    initproto_configure(&(initproto_opts){.apply_network = apply_network, .resolv_path = resolv});
    int r = initproto_listen(init_listen);
    if (r != 0) {
      fprintf(stderr, "conch-init: cannot listen for init messages on %s: %s\n", init_listen,
              strerror(-r));
      return 1;
    }
  }
  uv_signal_init(conch.loop, &main_sigterm);
  uv_signal_init(conch.loop, &main_sigint);
  uv_signal_start(&main_sigterm, main_on_stop, SIGTERM);
  uv_signal_start(&main_sigint, main_on_stop, SIGINT);
  LOG_INFO("conch-init %s standalone pid=%d", CONCH_VERSION, (int)getpid());
  uv_run(conch.loop, UV_RUN_DEFAULT);
  if (init_listen) initproto_close(); /* removes a unix: socket file */
  proc_cg_shutdown();
  return 0;
}

int main(int argc, char **argv) {
  daemon_stdio_fill(); /* before anything opens a descriptor */
  /* Two malloc arenas, not one per pool thread: a thread's arena keeps its
   * peak (a 100 000-entry env decoded in the pool left 14 MiB that
   * malloc_trim could not return; with two arenas RSS went back to idle). */
  mallopt(M_ARENA_MAX, 2);
  /* Fixed thresholds instead of glibc's sliding ones: with the 128 KiB
   * default trim threshold the heap top shrank and regrew around every
   * 32 KiB output event and 1 MiB upload chunk (100–220 page faults per
   * MiB, the zeroing of those pages a third of the loop's time).  A 4 MiB
   * top is kept between requests; conn_trim_soon's malloc_trim(0) still
   * hands it back a second after big answers.  docs/internals/profile.md,
   * tests/bench/README.md: stdout and upload figures. */
  mallopt(M_MMAP_THRESHOLD, 4 << 20);
  mallopt(M_TRIM_THRESHOLD, 4 << 20);
  mallopt(M_TOP_PAD, 1 << 20);
  if (argc >= 2 && (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0)) {
    printf("conch-init %s\n", CONCH_VERSION);
    return 0;
  }
  agent_handover_setup(argc, argv);
  if (argc >= 2 && strcmp(argv[1], "--handover-check") == 0) return main_handover_check(argc, argv);
  if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    fputs(usage, stdout);
    return 0;
  }
  main_common_setup();
  if (argc >= 2 && strcmp(argv[1], "serve") == 0) return main_serve(argc - 1, argv + 1);
  if (getpid() == 1) {
    int rollback = 0, hfd = handover_arg(argc, argv, &rollback);
    char herr[512];
    if (hfd >= 0) { /* an upgrade in place (boot.md §13): no boot, the state instead */
      init_pid1_prepare();
      if (handover_load(hfd, rollback, herr, sizeof herr) == 0) {
        reaper_hold(1);
        main_register_services();
        handover_finish(herr, sizeof herr);
        reaper_hold(0);
        return init_pid1_serve(argc, argv);
      }
      LOG_ERROR("PID 1 boots again: %s", herr); /* no rollback was possible */
    }
    main_register_services();
    return init_pid1_main(argc, argv);
  }
  if (argc >= 2)
    fprintf(stderr, "conch-init: unknown command \"%s\" (not PID 1: the command is serve)\n\n", argv[1]);
  else
    fprintf(stderr, "conch-init: not PID 1: serve the API standalone with `conch-init serve`\n\n");
  fputs(usage, stderr);
  return 2;
}
