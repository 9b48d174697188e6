/* router — see router.h. */
#include "server/router.h"

#include <stdlib.h>
#include <string.h>

#include "server/connect.h"
#include "core/daemon.h"

#define ROUTER_MAX (sizeof conch.routes / sizeof conch.routes[0])
#define ROUTER_HTTP_MAX 8

/* plain HTTP routes (router_add_http), matched on the path alone */
static struct {
  const char *path;
  router_http_fn serve;
} http_routes[ROUTER_HTTP_MAX];
static size_t nhttp;

int router_add_http(const char *path, router_http_fn serve) {
  if (nhttp == ROUTER_HTTP_MAX) return -1;
  http_routes[nhttp].path = path;
  http_routes[nhttp].serve = serve;
  nhttp++;
  return 0;
}

int router_register(const rpc_method *methods, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (conch.nroutes == ROUTER_MAX) return -1;
    conch.routes[conch.nroutes++] = &methods[i];
  }
  return 0;
}

int rpc_service_served(const char *service) {
  size_t n = strlen(service);
  for (size_t i = 0; i < conch.nroutes; i++) {
    const char *p = conch.routes[i]->path; /* "/<service>/<method>" */
    if (strncmp(p + 1, service, n) == 0 && p[n + 1] == '/') return 1;
  }
  return 0;
}

static void router_health(hx *x) {
  if (strcmp(x->method, "GET") != 0) {
    hx_header allow = {"allow", "GET"};
    hx_simple(x, 405, "text/plain; charset=utf-8", "405 method not allowed\n", &allow, 1);
    return;
  }
  hx_simple(x, 200, "application/json", "{\"status\":\"OK\",\"message\":\"OK\"}", NULL, 0);
}

void router_dispatch(hx *x) {
  if (strcmp(x->path, "/health") == 0) {
    router_health(x);
    return;
  }
  for (size_t i = 0; i < nhttp; i++) {
    if (strcmp(http_routes[i].path, x->path) == 0) {
      http_routes[i].serve(x);
      return;
    }
  }
  for (size_t i = 0; i < conch.nroutes; i++) {
    if (strcmp(conch.routes[i]->path, x->path) == 0) {
      connect_serve(x, conch.routes[i]);
      return;
    }
  }
  hx_simple(x, 404, "text/plain; charset=utf-8", "404 page not found\n", NULL, 0);
}
