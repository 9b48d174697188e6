/* test_pbjson — the proto3 JSON codec (proto/pbjson.h) against agent.proto. */
#include "tests/unit/test.h"
#include "proto/pbjson.h"
#include "proto/agent.pb-c.h"
#include "proto/json.h"
#include "proto/pbwire.h"
#include "proto/text.h"

#include <stdlib.h>
#include <time.h>

/* ------------------------------------------------------------ helpers */

static char *enc(const void *msg) {
  size_t n = 0;
  char *s = pbjson_encode(msg, &n);
  if (s && strlen(s) != n) return NULL;
  return s;
}

/* Decode, expecting success. */
static ProtobufCMessage *dec(const ProtobufCMessageDescriptor *d, const char *json) {
  char err[256] = "";
  ProtobufCMessage *m = pbjson_decode(d, json, strlen(json), err, sizeof err);
  if (!m) fprintf(stderr, "    decode failed: %s: %s\n", json, err);
  return m;
}

/* Decode, expecting failure; returns the error text (static) or NULL if it decoded. */
static const char *dec_err(const ProtobufCMessageDescriptor *d, const char *json, size_t n) {
  static char err[256];
  err[0] = 0;
  ProtobufCMessage *m = pbjson_decode(d, json, n, err, sizeof err);
  if (m) {
    protobuf_c_message_free_unpacked(m, NULL);
    return NULL;
  }
  return err[0] ? err : "(empty error)";
}
#define REJECTS(d, s) dec_err(d, s, strlen(s))

static void must_reject(const ProtobufCMessageDescriptor *d, const char *json, const char *needle) {
  const char *e = REJECTS(d, json);
  if (!e) TEST_FAIL_("accepted: %s", json);
  if (needle && !strstr(e, needle)) TEST_FAIL_("error for %s is \"%s\", expected to contain \"%s\"", json, e, needle);
}

/* Binary form of a message (malloc'd). */
static uint8_t *pack(const ProtobufCMessage *m, size_t *n) {
  *n = protobuf_c_message_get_packed_size(m);
  uint8_t *b = malloc(*n + 1);
  protobuf_c_message_pack(m, b);
  return b;
}

/* ------------------------------------------------------------ exact encodings */

static void expect_json(const void *msg, const char *want) {
  char *s = enc(msg);
  if (!s || strcmp(s, want) != 0) {
    fprintf(stderr, "    got  %s\n    want %s\n", s ? s : "(null)", want);
    free(s);
    TEST_FAIL_("encoding mismatch");
  }
  free(s);
}

TEST(encode_examples) {
  Pb__ProcessEndEvent end = PB__PROCESS_END_EVENT__INIT;
  end.exited = 1;
  end.status = "exited";
  Pb__ProcessEvent ev = PB__PROCESS_EVENT__INIT;
  ev.event_case = PB__PROCESS_EVENT__EVENT_END;
  ev.end = &end;
  expect_json(&ev, "{\"end\":{\"exited\":true,\"status\":\"exited\"}}");
  end.exit_code = -1;
  end.error = "boom";
  expect_json(&ev, "{\"end\":{\"exitCode\":-1,\"exited\":true,\"status\":\"exited\",\"error\":\"boom\"}}");

  Pb__ProcessKeepAlive ka = PB__PROCESS_KEEP_ALIVE__INIT;
  ev.event_case = PB__PROCESS_EVENT__EVENT_KEEPALIVE;
  ev.keepalive = &ka;
  expect_json(&ev, "{\"keepalive\":{}}");
  ev.keepalive = NULL; /* set oneof member without a message: still emitted */
  expect_json(&ev, "{\"keepalive\":{}}");

  Pb__ProcessStartEvent st = PB__PROCESS_START_EVENT__INIT;
  ev.event_case = PB__PROCESS_EVENT__EVENT_START;
  ev.start = &st;
  expect_json(&ev, "{\"start\":{}}");
  st.pid = 42;
  expect_json(&ev, "{\"start\":{\"pid\":42}}");

  Pb__ProcessDataEvent de;
  pb__process_data_event__init(&de); /* the __INIT macro trips -Wmissing-braces (bytes in a oneof) */
  de.output_case = PB__PROCESS_DATA_EVENT__OUTPUT_STDOUT;
  de.stdout.data = (uint8_t *)"hello\n";
  de.stdout.len = 6;
  ev.event_case = PB__PROCESS_EVENT__EVENT_DATA;
  ev.data = &de;
  expect_json(&ev, "{\"data\":{\"stdout\":\"aGVsbG8K\"}}");
  de.output_case = PB__PROCESS_DATA_EVENT__OUTPUT_STDERR;
  de.stderr.data = NULL;
  de.stderr.len = 0;
  expect_json(&ev, "{\"data\":{\"stderr\":\"\"}}"); /* empty oneof bytes still emitted */

  Pb__ProcessEvent none = PB__PROCESS_EVENT__INIT;
  expect_json(&none, "{}");

  Pb__FileEntry fe = PB__FILE_ENTRY__INIT;
  fe.size = 6;
  expect_json(&fe, "{\"size\":\"6\"}");
  fe.size = INT64_MIN;
  expect_json(&fe, "{\"size\":\"-9223372036854775808\"}");
  fe.size = 0;
  fe.is_directory = 1;
  fe.modified_time = "2024-01-01T00:00:00Z";
  expect_json(&fe, "{\"modifiedTime\":\"2024-01-01T00:00:00Z\",\"isDirectory\":true}");

  Pb__StartProcessRequest__EnvEntry e1 = PB__START_PROCESS_REQUEST__ENV_ENTRY__INIT;
  e1.key = "A";
  e1.value = "1";
  Pb__StartProcessRequest__EnvEntry *envs[] = {&e1};
  Pb__StartProcessRequest sp = PB__START_PROCESS_REQUEST__INIT;
  sp.n_env = 1;
  sp.env = envs;
  expect_json(&sp, "{\"env\":{\"A\":\"1\"}}");
  Pb__StartProcessRequest__EnvEntry e2 = PB__START_PROCESS_REQUEST__ENV_ENTRY__INIT;
  e2.key = "B";
  Pb__StartProcessRequest__EnvEntry *envs2[] = {&e1, &e2};
  sp.n_env = 2;
  sp.env = envs2;
  char *args[] = {"-c", "echo \"hi\"\n", ""};
  sp.cmd = "/bin/sh";
  sp.n_args = 3;
  sp.args = args;
  expect_json(&sp, "{\"cmd\":\"/bin/sh\",\"args\":[\"-c\",\"echo \\\"hi\\\"\\n\",\"\"],"
                   "\"env\":{\"A\":\"1\",\"B\":\"\"}}");

  Pb__PTY pty = PB__PTY__INIT;
  sp.pty = &pty;
  sp.n_args = 0;
  sp.n_env = 0;
  sp.cmd = "";
  expect_json(&sp, "{\"pty\":{}}"); /* a set message field is emitted even when empty */
  pty.cols = 4294967295u;
  pty.rows = 24;
  expect_json(&sp, "{\"pty\":{\"cols\":4294967295,\"rows\":24}}");

  Pb__ListProcessesRequest lp = PB__LIST_PROCESSES_REQUEST__INIT;
  expect_json(&lp, "{}");
  Pb__ListFilesResponse lr = PB__LIST_FILES_RESPONSE__INIT;
  expect_json(&lr, "{}"); /* empty repeated omitted */

  Pb__PostFilesResponse pr = PB__POST_FILES_RESPONSE__INIT;
  pr.uploaded_count = 2;
  expect_json(&pr, "{\"uploadedCount\":2}");
}

TEST(encode_string_escapes) {
  Pb__GetFileRequest g = PB__GET_FILE_REQUEST__INIT;
  g.filepath = "q\"b\\s/\b\f\n\r\t\x01\x1f\x7f \xe4\xb8\xad\xf0\x9f\x98\x80<>&";
  expect_json(&g, "{\"filepath\":\"q\\\"b\\\\s/\\b\\f\\n\\r\\t\\u0001\\u001f\x7f \xe4\xb8\xad\xf0\x9f\x98\x80<>&\"}");
  /* invalid UTF-8 cannot be written in JSON: each bad byte becomes \ufffd
   * (escaped, as every JSON writer here does: proto/text.h); a real U+FFFD
   * stays raw */
  g.filepath = "a\xff" "b\xc3\xef\xbf\xbd";
  expect_json(&g, "{\"filepath\":\"a\\ufffdb\\ufffd\xef\xbf\xbd\"}");
}

/* The encoder scans plain bytes 8 at a time: each byte that needs care, at
 * every position of strings around that width, against a byte-at-a-time
 * reference. */
TEST(encode_string_escapes_everywhere) {
  static const char hex[] = "0123456789abcdef";
  for (unsigned c = 1; c < 256; c++) {
    int care = c < 0x20 || c == '"' || c == '\\' || c >= 0x80;
    if (!care && c != 'x') continue;
    for (size_t len = 1; len <= 19; len++)
      for (size_t at = 0; at < len; at++) {
        char in[32], want[128];
        memset(in, 'a' + (int)(len % 26), len);
        in[len] = 0;
        in[at] = (char)c;
        size_t o = (size_t)sprintf(want, "{\"filepath\":\"");
        for (size_t i = 0; i < len; i++) {
          unsigned char b = (unsigned char)in[i];
          if (b == '"' || b == '\\') { want[o++] = '\\'; want[o++] = (char)b; }
          else if (b == '\n') { want[o++] = '\\'; want[o++] = 'n'; }
          else if (b == '\r') { want[o++] = '\\'; want[o++] = 'r'; }
          else if (b == '\t') { want[o++] = '\\'; want[o++] = 't'; }
          else if (b == '\b') { want[o++] = '\\'; want[o++] = 'b'; }
          else if (b == '\f') { want[o++] = '\\'; want[o++] = 'f'; }
          else if (b < 0x20) { o += (size_t)sprintf(want + o, "\\u00%c%c", hex[b >> 4], hex[b & 15]); }
          else if (b >= 0x80) { memcpy(want + o, "\\ufffd", 6); o += 6; } /* a lone byte: invalid */
          else want[o++] = (char)b;
        }
        strcpy(want + o, "\"}");
        Pb__GetFileRequest g = PB__GET_FILE_REQUEST__INIT;
        g.filepath = in;
        size_t n;
        char *js = pbjson_encode(&g.base, &n);
        ASSERT(js != NULL);
        if (n != strlen(want) || memcmp(js, want, n) != 0)
          TEST_FAIL_("byte 0x%02x at %zu of %zu: %.*s", c, at, len, (int)n, js);
        free(js);
      }
  }
}

/* Encoding into the caller's buffer: the same buffer when the JSON fits, a
 * new malloc'd one (the caller's never reallocated or freed: ASan) when not. */
TEST(encode_fixed_buffer) {
  char small[300], tiny[64];
  Pb__GetFileRequest g = PB__GET_FILE_REQUEST__INIT;
  g.filepath = "/tmp/x";
  size_t n = 0;
  char *r = pbjson_encode_fixed(&g.base, 5, small, sizeof small, &n);
  ASSERT(r == small);
  ASSERT_EQ(n, strlen("{\"filepath\":\"/tmp/x\"}"));
  ASSERT_MEM_EQ(r + 5, "{\"filepath\":\"/tmp/x\"}", n);
  char longp[1000];
  memset(longp, 'p', sizeof longp - 1);
  longp[sizeof longp - 1] = 0;
  g.filepath = longp;
  memset(small, 0x5a, sizeof small);
  r = pbjson_encode_fixed(&g.base, 5, small, sizeof small, &n);
  ASSERT(r != NULL && r != small);
  ASSERT_EQ(n, sizeof longp - 1 + strlen("{\"filepath\":\"\"}"));
  ASSERT_MEM_EQ(r + 5, "{\"filepath\":\"pppp", 17);
  free(r);
  r = pbjson_encode_fixed(&g.base, 5, tiny, sizeof tiny, &n); /* smaller than the first room */
  ASSERT(r != NULL && r != tiny);
  free(r);
}

/* ------------------------------------------------------------ round trips */

/* Fill a message of type d with random contents, allocated with malloc like
 * an unpacked message. */
static unsigned rt_seed;
static unsigned rnd(unsigned n) { return n ? (unsigned)rand_r(&rt_seed) % n : 0; }

static char *rnd_string(void) {
  static const char *pieces[] = {"a", "Z", "0", " ", "\"", "\\", "/", "\n", "\t", "\x01", "\x1f", "\x7f",
                                 "\xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f\x98\x80", "{", "}", "=", "_"};
  unsigned n = rnd(4) == 0 ? 0 : rnd(12);
  char *s = malloc(n * 4 + 1);
  size_t o = 0;
  for (unsigned i = 0; i < n; i++) {
    const char *p = pieces[rnd(sizeof pieces / sizeof *pieces)];
    memcpy(s + o, p, strlen(p));
    o += strlen(p);
  }
  s[o] = 0;
  return s;
}

static void fill_msg(ProtobufCMessage *m, int depth);

static ProtobufCMessage *new_msg(const ProtobufCMessageDescriptor *d, int depth) {
  ProtobufCMessage *m = malloc(d->sizeof_message);
  d->message_init(m);
  fill_msg(m, depth);
  return m;
}

static void fill_value(const ProtobufCFieldDescriptor *f, void *p, int depth, unsigned idx) {
  static const int64_t i64[] = {0, 1, -1, INT64_MAX, INT64_MIN, 6, 1234567890123LL};
  static const int32_t i32[] = {0, 1, -1, INT32_MAX, INT32_MIN, 4096};
  switch (f->type) {
  case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
    *(int32_t *)p = i32[rnd(6)];
    break;
  case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32:
    *(uint32_t *)p = rnd(2) ? UINT32_MAX : rnd(100);
    break;
  case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
    *(int64_t *)p = i64[rnd(7)];
    break;
  case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
    *(uint64_t *)p = rnd(2) ? UINT64_MAX : rnd(100);
    break;
  case PROTOBUF_C_TYPE_BOOL:
    *(protobuf_c_boolean *)p = (protobuf_c_boolean)rnd(2);
    break;
  case PROTOBUF_C_TYPE_STRING:
    if (strcmp(f->name, "key") == 0) {
      /* map keys: unique within the map */
      char *s = rnd_string();
      char *k = malloc(strlen(s) + 16);
      snprintf(k, strlen(s) + 16, "%u%s", idx, s);
      free(s);
      *(char **)p = k;
    } else {
      *(char **)p = rnd_string();
    }
    break;
  case PROTOBUF_C_TYPE_BYTES: {
    ProtobufCBinaryData *b = p;
    b->len = rnd(3) == 0 ? 0 : rnd(200);
    b->data = b->len ? malloc(b->len) : NULL;
    for (size_t i = 0; i < b->len; i++) b->data[i] = (uint8_t)rnd(256);
    break;
  }
  case PROTOBUF_C_TYPE_MESSAGE:
    *(ProtobufCMessage **)p = new_msg(f->descriptor, depth + 1);
    break;
  default:
    break; /* no float/double/enum in agent.proto */
  }
}

static void fill_msg(ProtobufCMessage *m, int depth) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    void *p = (char *)m + f->offset;
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
      /* at most one member per oneof: decide at the first member */
      if (i > 0 && (d->fields[i - 1].flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
          d->fields[i - 1].quantifier_offset == f->quantifier_offset)
        continue;
      unsigned k = 0;
      while (i + k < d->n_fields && (d->fields[i + k].flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
             d->fields[i + k].quantifier_offset == f->quantifier_offset)
        k++;
      unsigned pick = rnd(k + 1);
      if (pick == k) continue; /* none */
      const ProtobufCFieldDescriptor *g = &d->fields[i + pick];
      fill_value(g, (char *)m + g->offset, depth, 0);
      *(uint32_t *)((char *)m + g->quantifier_offset) = g->id;
      continue;
    }
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = depth > 3 ? 0 : rnd(4);
      size_t sz = f->type == PROTOBUF_C_TYPE_STRING ? sizeof(char *) : sizeof(ProtobufCMessage *);
      char *arr = n ? malloc(n * sz) : NULL;
      for (size_t j = 0; j < n; j++) {
        if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
          const ProtobufCMessageDescriptor *ed = f->descriptor;
          ProtobufCMessage *e;
          if (strcmp(ed->fields[0].name, "key") == 0) {
            /* a map entry: key and value always set, keys unique */
            e = malloc(ed->sizeof_message);
            ed->message_init(e);
            for (unsigned q = 0; q < ed->n_fields; q++)
              fill_value(&ed->fields[q], (char *)e + ed->fields[q].offset, depth + 1, (unsigned)j);
          } else {
            e = new_msg(ed, depth + 1);
          }
          ((ProtobufCMessage **)arr)[j] = e;
        } else {
          fill_value(f, arr + j * sz, depth, (unsigned)j);
        }
      }
      *(size_t *)((char *)m + f->quantifier_offset) = n;
      *(char **)p = arr;
      continue;
    }
    if (f->type == PROTOBUF_C_TYPE_MESSAGE && (depth > 3 || rnd(3) == 0)) continue;
    if (rnd(4) == 0) continue; /* leave at default */
    fill_value(f, p, depth, 0);
  }
}

static const ProtobufCMessageDescriptor *all_types[] = {
    &pb__pty__descriptor, &pb__start_process_request__descriptor,
    &pb__start_process_request__env_entry__descriptor, &pb__process_config__descriptor,
    &pb__process_config__env_entry__descriptor, &pb__process_info__descriptor,
    &pb__process_selector__descriptor, &pb__process_event__descriptor,
    &pb__process_start_event__descriptor, &pb__process_data_event__descriptor,
    &pb__process_end_event__descriptor, &pb__process_keep_alive__descriptor,
    &pb__connect_process_request__descriptor, &pb__list_processes_request__descriptor,
    &pb__list_processes_response__descriptor, &pb__send_signal_request__descriptor,
    &pb__send_signal_response__descriptor, &pb__file_chunk__descriptor,
    &pb__post_files_response__descriptor, &pb__write_info__descriptor,
    &pb__get_file_request__descriptor, &pb__file_entry__descriptor,
    &pb__file_entry__metadata_entry__descriptor, &pb__list_files_request__descriptor,
    &pb__list_files_response__descriptor, &pb__search_files_request__descriptor,
    &pb__search_files_response__descriptor,
};

/* encode → decode → pack must equal pack of the original; and encoding the
 * binary-unpacked original gives the same JSON. */
static void round_trip(const ProtobufCMessage *m) {
  size_t n1, n2;
  uint8_t *b1 = pack(m, &n1);
  char *js = enc(m);
  ASSERT(js);
  char err[256] = "";
  ProtobufCMessage *d = pbjson_decode(m->descriptor, js, strlen(js), err, sizeof err);
  if (!d) TEST_FAIL_("decode of own output failed: %s\n    %s", err, js);
  uint8_t *b2 = pack(d, &n2);
  if (n1 != n2 || memcmp(b1, b2, n1) != 0) TEST_FAIL_("binary mismatch after round trip of %s", js);
  ProtobufCMessage *u = protobuf_c_message_unpack(m->descriptor, NULL, n1, b1);
  ASSERT(u);
  char *js2 = enc(u);
  ASSERT(js2);
  if (strcmp(js, js2) != 0) TEST_FAIL_("JSON differs:\n    %s\n    %s", js, js2);
  char *js3 = enc(d);
  ASSERT_STR_EQ(js3, js);
  ASSERT_EQ(pbjson_check_decoded(d, NULL, 0), 0);
  free(js3);
  free(js2);
  protobuf_c_message_free_unpacked(u, NULL);
  protobuf_c_message_free_unpacked(d, NULL);
  free(b1);
  free(b2);
  free(js);
}

TEST(round_trip_every_type) {
  rt_seed = 99;
  for (size_t t = 0; t < sizeof all_types / sizeof *all_types; t++) {
    for (int it = 0; it < 60; it++) {
      ProtobufCMessage *m = new_msg(all_types[t], 0);
      round_trip(m);
      protobuf_c_message_free_unpacked(m, NULL);
    }
  }
}

TEST(round_trip_oneof_variants) {
  /* every ProcessEvent / ProcessDataEvent member, empty and not */
  Pb__ProcessDataEvent de;
  pb__process_data_event__init(&de); /* the __INIT macro trips -Wmissing-braces (bytes in a oneof) */
  Pb__ProcessEvent ev = PB__PROCESS_EVENT__INIT;
  ev.event_case = PB__PROCESS_EVENT__EVENT_DATA;
  ev.data = &de;
  for (int c = 1; c <= 3; c++) {
    de.output_case = (Pb__ProcessDataEvent__OutputCase)c;
    ProtobufCBinaryData *b = c == 1 ? &de.stdout : c == 2 ? &de.stderr : &de.pty;
    b->data = NULL;
    b->len = 0;
    round_trip(&ev.base);
    b->data = (uint8_t *)"\x00\xff\x10";
    b->len = 3;
    round_trip(&ev.base);
  }
  Pb__ProcessKeepAlive ka = PB__PROCESS_KEEP_ALIVE__INIT;
  ev.event_case = PB__PROCESS_EVENT__EVENT_KEEPALIVE;
  ev.keepalive = &ka;
  round_trip(&ev.base);
  /* decoding {"keepalive":{}} yields a set member with a message */
  Pb__ProcessEvent *d = (Pb__ProcessEvent *)dec(&pb__process_event__descriptor, "{\"keepalive\":{}}");
  ASSERT(d);
  ASSERT_EQ(d->event_case, PB__PROCESS_EVENT__EVENT_KEEPALIVE);
  ASSERT(d->keepalive != NULL);
  protobuf_c_message_free_unpacked(&d->base, NULL);
  Pb__ProcessDataEvent *dd = (Pb__ProcessDataEvent *)dec(&pb__process_data_event__descriptor, "{\"pty\":\"\"}");
  ASSERT(dd);
  ASSERT_EQ(dd->output_case, PB__PROCESS_DATA_EVENT__OUTPUT_PTY);
  ASSERT_EQ(dd->pty.len, 0);
  protobuf_c_message_free_unpacked(&dd->base, NULL);
}

TEST(big_bytes_round_trip) {
  size_t n = 1 << 20;
  Pb__FileChunk c = PB__FILE_CHUNK__INIT;
  c.filepath = "/tmp/big";
  c.content.len = n;
  c.content.data = malloc(n);
  for (size_t i = 0; i < n; i++) c.content.data[i] = (uint8_t)(i * 7 + (i >> 11));
  struct timespec a, b, e;
  clock_gettime(CLOCK_MONOTONIC, &a);
  size_t jl;
  char *js = pbjson_encode(&c.base, &jl);
  clock_gettime(CLOCK_MONOTONIC, &b);
  ASSERT(js);
  ASSERT_EQ(jl, strlen("{\"filepath\":\"/tmp/big\",\"content\":\"\"}") + text_b64_encoded_len(n));
  char err[256];
  Pb__FileChunk *d = (Pb__FileChunk *)pbjson_decode(&pb__file_chunk__descriptor, js, jl, err, sizeof err);
  clock_gettime(CLOCK_MONOTONIC, &e);
  ASSERT(d);
  ASSERT_EQ(d->content.len, n);
  ASSERT(memcmp(d->content.data, c.content.data, n) == 0);
  printf("  1 MiB FileChunk: encode %.2f ms, decode %.2f ms (this build)\n",
         (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6,
         (double)(e.tv_sec - b.tv_sec) * 1e3 + (double)(e.tv_nsec - b.tv_nsec) / 1e6);
  protobuf_c_message_free_unpacked(&d->base, NULL);
  free(js);
  free(c.content.data);
}

/* ------------------------------------------------------------ decode features */

TEST(decode_names) {
  Pb__SearchFilesRequest *s = (Pb__SearchFilesRequest *)dec(
      &pb__search_files_request__descriptor,
      "{\"path\":\"/w\",\"exclude_patterns\":[\"*.o\",\"x\"]}");
  ASSERT(s);
  ASSERT_STR_EQ(s->path, "/w");
  ASSERT_EQ(s->n_exclude_patterns, 2);
  ASSERT_STR_EQ(s->exclude_patterns[1], "x");
  protobuf_c_message_free_unpacked(&s->base, NULL);
  s = (Pb__SearchFilesRequest *)dec(&pb__search_files_request__descriptor,
                                    "{\"excludePatterns\":[\"a\"],\"pattern\":\"*.c\"}");
  ASSERT(s);
  ASSERT_EQ(s->n_exclude_patterns, 1);
  ASSERT_STR_EQ(s->pattern, "*.c");
  protobuf_c_message_free_unpacked(&s->base, NULL);

  Pb__FileEntry *f = (Pb__FileEntry *)dec(&pb__file_entry__descriptor,
                                          "{\"is_directory\":true,\"modified_time\":\"t\",\"size\":\"6\"}");
  ASSERT(f);
  ASSERT_EQ(f->is_directory, 1);
  ASSERT_STR_EQ(f->modified_time, "t");
  ASSERT_EQ(f->size, 6);
  protobuf_c_message_free_unpacked(&f->base, NULL);
  f = (Pb__FileEntry *)dec(&pb__file_entry__descriptor, "{\"isDirectory\":false,\"metadata\":{\"k\":\"v\",\"\":\"e\"}}");
  ASSERT(f);
  ASSERT_EQ(f->is_directory, 0);
  ASSERT_EQ(f->n_metadata, 2);
  ASSERT_STR_EQ(f->metadata[0]->key, "k");
  ASSERT_STR_EQ(f->metadata[0]->value, "v");
  ASSERT_STR_EQ(f->metadata[1]->key, "");
  protobuf_c_message_free_unpacked(&f->base, NULL);
  /* near-miss names are unknown fields, not matches */
  f = (Pb__FileEntry *)dec(&pb__file_entry__descriptor, "{\"IsDirectory\":true,\"isdirectory\":true,\"is_Directory\":true}");
  ASSERT(f);
  ASSERT_EQ(f->is_directory, 0);
  protobuf_c_message_free_unpacked(&f->base, NULL);
}

TEST(decode_unknown_and_null) {
  Pb__ListFilesRequest *l = (Pb__ListFilesRequest *)dec(
      &pb__list_files_request__descriptor,
      "{\"x\":{\"y\":[1,{\"z\":null},[[]]],\"w\":\"\\u0000\"},\"path\":\"/a\",\"q\":[true,false],"
      "\"r\":-1.5e300,\"s\":null}");
  ASSERT(l);
  ASSERT_STR_EQ(l->path, "/a");
  ASSERT_EQ(l->depth, 0);
  protobuf_c_message_free_unpacked(&l->base, NULL);
  /* null means default for every kind of field */
  Pb__StartProcessRequest *sp = (Pb__StartProcessRequest *)dec(
      &pb__start_process_request__descriptor,
      "{\"cmd\":null,\"args\":null,\"env\":null,\"background\":null,\"pty\":null,\"stdin\":null}");
  ASSERT(sp);
  ASSERT_STR_EQ(sp->cmd, "");
  ASSERT_EQ(sp->n_args, 0);
  ASSERT_EQ(sp->n_env, 0);
  ASSERT(sp->pty == NULL);
  ASSERT_EQ(sp->stdin.len, 0);
  protobuf_c_message_free_unpacked(&sp->base, NULL);
  /* a null oneof member does not count as set */
  Pb__ProcessEvent *ev = (Pb__ProcessEvent *)dec(&pb__process_event__descriptor, "{\"start\":null,\"end\":{}}");
  ASSERT(ev);
  ASSERT_EQ(ev->event_case, PB__PROCESS_EVENT__EVENT_END);
  protobuf_c_message_free_unpacked(&ev->base, NULL);
  /* whitespace is fine */
  l = (Pb__ListFilesRequest *)dec(&pb__list_files_request__descriptor, " \n{ \"depth\" : 3 }\r\n");
  ASSERT(l);
  ASSERT_EQ(l->depth, 3);
  protobuf_c_message_free_unpacked(&l->base, NULL);
}

TEST(decode_numbers) {
  struct { const char *json; int64_t want; } i64[] = {
      {"{\"size\":6}", 6}, {"{\"size\":\"6\"}", 6},
      {"{\"size\":\"9223372036854775807\"}", INT64_MAX}, {"{\"size\":-9223372036854775808}", INT64_MIN},
      {"{\"size\":\"-9223372036854775808\"}", INT64_MIN}, {"{\"size\":1e3}", 1000},
      {"{\"size\":\"1.5e1\"}", 15}, {"{\"size\":100.000}", 100}, {"{\"size\":-0}", 0},
      {"{\"size\":0.0e5}", 0}, {"{\"size\":12300e-2}", 123}, {"{\"size\":0e99999999999}", 0},
  };
  for (size_t i = 0; i < sizeof i64 / sizeof *i64; i++) {
    Pb__FileEntry *f = (Pb__FileEntry *)dec(&pb__file_entry__descriptor, i64[i].json);
    ASSERT(f);
    if (f->size != i64[i].want) TEST_FAIL_("%s → %" PRId64, i64[i].json, f->size);
    protobuf_c_message_free_unpacked(&f->base, NULL);
  }
  struct { const char *json; int32_t want; } i32[] = {
      {"{\"depth\":2147483647}", INT32_MAX}, {"{\"depth\":-2147483648}", INT32_MIN},
      {"{\"depth\":\"5\"}", 5}, {"{\"depth\":2.0}", 2}, {"{\"depth\":-1}", -1},
  };
  for (size_t i = 0; i < sizeof i32 / sizeof *i32; i++) {
    Pb__ListFilesRequest *l = (Pb__ListFilesRequest *)dec(&pb__list_files_request__descriptor, i32[i].json);
    ASSERT(l);
    ASSERT_EQ(l->depth, i32[i].want);
    protobuf_c_message_free_unpacked(&l->base, NULL);
  }
  Pb__PTY *p = (Pb__PTY *)dec(&pb__pty__descriptor, "{\"cols\":4294967295,\"rows\":\"0\"}");
  ASSERT(p);
  ASSERT_EQ(p->cols, 4294967295u);
  protobuf_c_message_free_unpacked(&p->base, NULL);
}

TEST(decode_base64_forms) {
  const char *forms[] = {"{\"content\":\"-_-_\"}", "{\"content\":\"+/+/\"}"};
  for (int i = 0; i < 2; i++) {
    Pb__FileChunk *c = (Pb__FileChunk *)dec(&pb__file_chunk__descriptor, forms[i]);
    ASSERT(c);
    ASSERT_EQ(c->content.len, 3);
    ASSERT_MEM_EQ(c->content.data, "\xfb\xff\xbf", 3);
    protobuf_c_message_free_unpacked(&c->base, NULL);
  }
  const char *hi[] = {"{\"content\":\"aGk=\"}", "{\"content\":\"aGk\"}"};
  for (int i = 0; i < 2; i++) {
    Pb__FileChunk *c = (Pb__FileChunk *)dec(&pb__file_chunk__descriptor, hi[i]);
    ASSERT(c);
    ASSERT_EQ(c->content.len, 2);
    ASSERT_MEM_EQ(c->content.data, "hi", 2);
    protobuf_c_message_free_unpacked(&c->base, NULL);
  }
  Pb__FileChunk *c = (Pb__FileChunk *)dec(&pb__file_chunk__descriptor, "{\"content\":\"\"}");
  ASSERT(c);
  ASSERT_EQ(c->content.len, 0);
  protobuf_c_message_free_unpacked(&c->base, NULL);
  /* the escaped form of base64 characters is still base64 */
  c = (Pb__FileChunk *)dec(&pb__file_chunk__descriptor, "{\"content\":\"aG\\u006b\\/\"}");
  ASSERT(c);
  ASSERT_EQ(c->content.len, 3);
  protobuf_c_message_free_unpacked(&c->base, NULL);
}

TEST(decode_nul) {
  int nul = -1;
  char err[200];
  const char *js = "{\"filepath\":\"/tmp/a\\u0000b\"}";
  Pb__GetFileRequest *g =
      (Pb__GetFileRequest *)pbjson_decode_ex(&pb__get_file_request__descriptor, js, strlen(js), &nul, err, sizeof err);
  ASSERT(g);
  ASSERT_EQ(nul, 1);
  ASSERT_STR_EQ(g->filepath, "/tmp/a");
  protobuf_c_message_free_unpacked(&g->base, NULL);
  js = "{\"filepath\":\"/tmp/ab\"}";
  g = (Pb__GetFileRequest *)pbjson_decode_ex(&pb__get_file_request__descriptor, js, strlen(js), &nul, err, sizeof err);
  ASSERT(g);
  ASSERT_EQ(nul, 0);
  protobuf_c_message_free_unpacked(&g->base, NULL);
  /* in repeated strings, map keys and map values too */
  const char *more[] = {"{\"args\":[\"a\",\"\\u0000\"]}", "{\"env\":{\"A\\u0000\":\"1\"}}",
                        "{\"env\":{\"A\":\"x\\u0000\"}}", "{\"pty\":{},\"tag\":\"\\u0000\"}"};
  for (size_t i = 0; i < 4; i++) {
    nul = 0;
    ProtobufCMessage *m = pbjson_decode_ex(&pb__start_process_request__descriptor, more[i], strlen(more[i]),
                                           &nul, err, sizeof err);
    ASSERT(m);
    if (nul != 1) TEST_FAIL_("no NUL reported for %s", more[i]);
    protobuf_c_message_free_unpacked(m, NULL);
  }
  /* NUL inside an unknown field does not count */
  nul = 0;
  js = "{\"zzz\":\"\\u0000\"}";
  ProtobufCMessage *m = pbjson_decode_ex(&pb__start_process_request__descriptor, js, strlen(js), &nul, err, sizeof err);
  ASSERT(m);
  ASSERT_EQ(nul, 0);
  protobuf_c_message_free_unpacked(m, NULL);
}

TEST(decode_rejects) {
  const ProtobufCMessageDescriptor *fc = &pb__file_chunk__descriptor, *lf = &pb__list_files_request__descriptor,
                                   *sp = &pb__start_process_request__descriptor,
                                   *fe = &pb__file_entry__descriptor, *ev = &pb__process_event__descriptor;
  must_reject(fc, "{\"content\":\"aGk*\"}", "invalid value for field \"content\": invalid base64");
  must_reject(fc, "{\"content\":\"aGVs\\nbG8K\"}", "invalid base64");
  must_reject(fc, "{\"content\":\"aGVsbG8K\\n\"}", "invalid base64");
  must_reject(fc, "{\"content\":\"aGk= \"}", "invalid base64");
  must_reject(fc, "{\"content\":\"a\"}", "invalid base64");
  must_reject(fc, "{\"content\":\"aGk==\"}", "invalid base64");
  must_reject(fc, "{\"content\":\"+_\"}", "invalid base64");
  must_reject(fc, "{\"content\":5}", "\"content\"");
  must_reject(fc, "{\"content\":[]}", "\"content\"");
  must_reject(lf, "{\"depth\":1.5}", "\"depth\"");
  must_reject(lf, "{\"depth\":\"x\"}", "\"depth\"");
  must_reject(lf, "{\"depth\":\"\"}", "\"depth\"");
  must_reject(lf, "{\"depth\":\" 1\"}", "\"depth\"");
  must_reject(lf, "{\"depth\":2147483648}", "out of range");
  must_reject(lf, "{\"depth\":-2147483649}", "out of range");
  must_reject(lf, "{\"depth\":\"1e10\"}", "out of range");
  must_reject(lf, "{\"depth\":1e-1}", "not an integer");
  must_reject(lf, "{\"depth\":1e999999999999}", "out of range");
  must_reject(lf, "{\"depth\":true}", "\"depth\"");
  must_reject(lf, "{\"depth\":{}}", "\"depth\"");
  must_reject(lf, "{\"path\":1}", "\"path\"");
  must_reject(lf, "{\"path\":[\"a\"]}", "\"path\"");
  must_reject(lf, "{\"path\":true}", "\"path\"");
  must_reject(&pb__pty__descriptor, "{\"cols\":-1}", "out of range");
  must_reject(&pb__pty__descriptor, "{\"cols\":4294967296}", "out of range");
  must_reject(fe, "{\"size\":\"9223372036854775808\"}", "out of range");
  must_reject(fe, "{\"size\":-9223372036854775809}", "out of range");
  must_reject(fe, "{\"size\":\"0x10\"}", "\"size\"");
  must_reject(fe, "{\"size\":\"+1\"}", "\"size\"");
  must_reject(fe, "{\"isDirectory\":1}", "\"is_directory\"");
  must_reject(fe, "{\"isDirectory\":\"true\"}", "is_directory");
  must_reject(fe, "{\"metadata\":[]}", "metadata");
  must_reject(fe, "{\"metadata\":{\"a\":1}}", "metadata[a]");
  must_reject(fe, "{\"metadata\":{\"a\":null}}", "null");
  must_reject(fe, "{\"metadata\":{\"a\":\"1\",\"a\":\"2\"}}", "duplicate map key");
  must_reject(sp, "{\"args\":[\"a\",null]}", "args[1]");
  must_reject(sp, "{\"args\":[\"a\",1]}", "args[1]");
  must_reject(sp, "{\"args\":\"a\"}", "args");
  must_reject(sp, "{\"pty\":[]}", "pty");
  must_reject(sp, "{\"pty\":{\"cols\":\"x\"}}", "\"pty.cols\"");
  must_reject(sp, "{\"cmd\":\"a\",\"cmd\":\"b\"}", "duplicate field \"cmd\"");
  must_reject(sp, "{\"cmd\":\"a\",\"cmd\":null}", "duplicate field");
  must_reject(fe, "{\"isDirectory\":true,\"is_directory\":true}", "duplicate field");
  must_reject(ev, "{\"start\":{},\"end\":{}}", "oneof");
  must_reject(ev, "{\"keepalive\":{},\"data\":{\"stdout\":\"\"}}", "oneof");
  must_reject(ev, "{\"data\":{\"stdout\":\"\",\"stderr\":\"\"}}", "oneof");
  must_reject(ev, "{\"data\":{\"stdout\":\"!!\"}}", "\"data.stdout\"");
  must_reject(&pb__list_files_response__descriptor, "{\"entries\":[{},{\"size\":true}]}",
              "\"entries[1].size\"");
  /* document level */
  must_reject(fc, "", "empty");
  must_reject(fc, "   ", NULL);
  must_reject(fc, "[]", "object");
  must_reject(fc, "null", "object");
  must_reject(fc, "\"x\"", "object");
  must_reject(fc, "1", "object");
  must_reject(fc, "{} x", "invalid JSON");
  must_reject(fc, "{}{}", "invalid JSON");
  must_reject(fc, "{\"filepath\":\"a\"", "invalid JSON");
  must_reject(fc, "{\"filepath\":\"\xff\"}", "UTF-8");
  must_reject(fc, "{\"filepath\":\"\xed\xa0\x80\"}", "UTF-8");
  must_reject(fc, "{\"filepath\":\"\\udc00\"}", "surrogate");
  must_reject(fc, "{\"x\xc3\":1}", "UTF-8");
  ASSERT(dec_err(fc, "{}\0", 3) != NULL);
  ASSERT(dec_err(fc, NULL, 0) != NULL);
}

TEST(check_utf8) {
  char err[200] = "";
  Pb__StartProcessRequest sp = PB__START_PROCESS_REQUEST__INIT;
  sp.cmd = "ok \xe4\xb8\xad";
  ASSERT_EQ(pbjson_check_decoded(&sp.base, err, sizeof err), 0);
  sp.cwd = "bad\xff";
  ASSERT_EQ(pbjson_check_decoded(&sp.base, err, sizeof err), -1);
  ASSERT(strstr(err, "\"cwd\""));
  sp.cwd = "";
  char *args[] = {"a", "\xc0\xaf"};
  sp.args = args;
  sp.n_args = 2;
  ASSERT_EQ(pbjson_check_decoded(&sp.base, err, sizeof err), -1);
  ASSERT(strstr(err, "args[1]"));
  sp.n_args = 1;
  Pb__StartProcessRequest__EnvEntry e = PB__START_PROCESS_REQUEST__ENV_ENTRY__INIT;
  e.key = "K";
  e.value = "\xed\xa0\x80";
  Pb__StartProcessRequest__EnvEntry *env[] = {&e};
  sp.env = env;
  sp.n_env = 1;
  ASSERT_EQ(pbjson_check_decoded(&sp.base, err, sizeof err), -1);
  ASSERT(strstr(err, "env[K].value"));
  e.value = "v";
  e.key = "\xf5";
  ASSERT_EQ(pbjson_check_decoded(&sp.base, err, sizeof err), -1);
  ASSERT(strstr(err, "env[0].key"));
  e.key = "K";
  ASSERT_EQ(pbjson_check_decoded(&sp.base, err, sizeof err), 0);
  /* a map key twice (legal on the wire, rejected as in JSON; found by fuzz_pbwire) */
  Pb__StartProcessRequest__EnvEntry e2 = PB__START_PROCESS_REQUEST__ENV_ENTRY__INIT;
  e2.key = "K";
  e2.value = "w";
  Pb__StartProcessRequest__EnvEntry *env2[] = {&e, &e2};
  sp.env = env2;
  sp.n_env = 2;
  ASSERT_EQ(pbjson_check_decoded(&sp.base, err, sizeof err), -1);
  ASSERT_STR_EQ(err, "duplicate map key in field \"env\"");
  e2.key = "L";
  ASSERT_EQ(pbjson_check_decoded(&sp.base, err, sizeof err), 0);
  sp.env = env;
  sp.n_env = 1;
  /* bytes are not strings */
  sp.stdin.data = (uint8_t *)"\xff";
  sp.stdin.len = 1;
  ASSERT_EQ(pbjson_check_decoded(&sp.base, err, sizeof err), 0);
  /* nested messages */
  Pb__ProcessConfig cfg = PB__PROCESS_CONFIG__INIT;
  cfg.cmd = "\x80";
  Pb__ProcessInfo pi = PB__PROCESS_INFO__INIT;
  pi.config = &cfg;
  Pb__ProcessInfo *pis[] = {&pi};
  Pb__ListProcessesResponse lr = PB__LIST_PROCESSES_RESPONSE__INIT;
  lr.processes = pis;
  lr.n_processes = 1;
  ASSERT_EQ(pbjson_check_decoded(&lr.base, err, sizeof err), -1);
  ASSERT(strstr(err, "processes[0].config.cmd"));
  /* a binary message with invalid UTF-8 unpacks (protobuf-c 1.4.1 does not check) and is caught */
  size_t n;
  uint8_t *b = pack(&lr.base, &n);
  ProtobufCMessage *u = protobuf_c_message_unpack(&pb__list_processes_response__descriptor, NULL, n, b);
  ASSERT(u);
  ASSERT_EQ(pbjson_check_decoded(u, err, sizeof err), -1);
  protobuf_c_message_free_unpacked(u, NULL);
  free(b);
  /* oneof: unselected members are not looked at (none of ProcessEvent's are strings) */
  Pb__ProcessEndEvent end = PB__PROCESS_END_EVENT__INIT;
  end.error = "\xfe";
  Pb__ProcessEvent ev = PB__PROCESS_EVENT__INIT;
  ev.event_case = PB__PROCESS_EVENT__EVENT_END;
  ev.end = &end;
  ASSERT_EQ(pbjson_check_decoded(&ev.base, err, sizeof err), -1);
  ASSERT(strstr(err, "end.error"));
  ASSERT_EQ(text_utf8_valid("\xe4\xb8\xad", 3), 1);
  ASSERT_EQ(text_utf8_valid("\xe4\xb8", 2), 0);
}

/* ------------------------------------------------------------ fuzz-ish */

TEST(mutations_never_crash) {
  static const char *docs[] = {
      "{\"cmd\":\"/bin/sh\",\"args\":[\"-c\",\"echo hi\"],\"env\":{\"A\":\"1\",\"B\":\"x\"},\"cwd\":\"/\","
      "\"background\":true,\"tag\":\"t\",\"pty\":{\"cols\":80,\"rows\":24},\"stdin\":\"aGVsbG8K\"}",
      "{\"end\":{\"exitCode\":1,\"exited\":true,\"status\":\"exited\",\"error\":\"e\"}}",
      "{\"data\":{\"stdout\":\"aGVsbG8K\"}}",
      "{\"entries\":[{\"name\":\"a\",\"size\":\"6\",\"metadata\":{\"k\":\"v\"},\"isDirectory\":true}]}",
      "{\"processes\":[{\"pid\":1,\"config\":{\"cmd\":\"x\",\"env\":{\"a\":\"b\"},\"pty\":{}},\"running\":true}]}",
      "{\"path\":\"/\",\"pattern\":\"*\",\"exclude_patterns\":[\"a\",\"b\"]}",
      "{\"process\":{\"pid\":3,\"tag\":\"x\"},\"signal\":9}",
  };
  static const ProtobufCMessageDescriptor *types[] = {
      &pb__start_process_request__descriptor, &pb__process_event__descriptor,
      &pb__process_event__descriptor, &pb__list_files_response__descriptor,
      &pb__list_processes_response__descriptor, &pb__search_files_request__descriptor,
      &pb__send_signal_request__descriptor,
  };
  static const char junk[] = "{}[]\":,\\0-1e.5tnfu\xff\xc3 \n=aZ+/_";
  unsigned seed = 4242;
  char buf[512];
  size_t ok = 0;
  for (int it = 0; it < 60000; it++) {
    size_t di = (size_t)rand_r(&seed) % (sizeof docs / sizeof *docs);
    size_t n = strlen(docs[di]);
    memcpy(buf, docs[di], n);
    int muts = 1 + rand_r(&seed) % 4;
    for (int k = 0; k < muts; k++) {
      size_t pos = n ? (size_t)rand_r(&seed) % n : 0;
      switch (rand_r(&seed) % 4) {
      case 0: /* replace */
        if (n) buf[pos] = junk[rand_r(&seed) % (sizeof junk - 1)];
        break;
      case 1: /* delete */
        if (n) {
          memmove(buf + pos, buf + pos + 1, n - pos - 1);
          n--;
        }
        break;
      case 2: /* insert */
        if (n < sizeof buf - 1) {
          memmove(buf + pos + 1, buf + pos, n - pos);
          buf[pos] = junk[rand_r(&seed) % (sizeof junk - 1)];
          n++;
        }
        break;
      default: /* truncate */
        n = pos;
      }
    }
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
      char err[128];
      int nul;
      ProtobufCMessage *m = pbjson_decode_ex(types[t], buf, n, &nul, err, sizeof err);
      if (m) {
        ok++;
        char *js = pbjson_encode(m, NULL);
        ASSERT(js);
        /* anything we accepted re-encodes into something we accept again */
        ProtobufCMessage *m2 = pbjson_decode(types[t], js, strlen(js), err, sizeof err);
        if (!m2) TEST_FAIL_("re-decode failed: %s: %s", js, err);
        protobuf_c_message_free_unpacked(m2, NULL);
        free(js);
        protobuf_c_message_free_unpacked(m, NULL);
      } else {
        ASSERT(err[0] != 0);
      }
    }
  }
  printf("  mutations: %zu of %d decodes accepted\n", ok, 60000 * 7);
  ASSERT(ok > 0);
}

/* Memory bounds of decoding: a document or a wire message of many tiny
 * values is refused (PBJSON_TOO_BIG / pbwire_unpack_mem's over) instead of
 * growing ~20-40 times its size past JSON_MEM_BUDGET's 64 MiB cap; a large
 * ordinary one still decodes. */
/* pbwire_unpack_mem without a buffer, within `budget`; *over as m.over. */
static ProtobufCMessage *unpack_budget(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n,
                                       size_t budget, int *over) {
  pbmem m;
  pbmem_init(&m, NULL, 0, budget);
  ProtobufCMessage *r = pbwire_unpack_mem(d, p, n, &m);
  *over = m.over;
  return r;
}

TEST(decode_memory_budget) {
  char err[300];
  int flags = -1;
  /* {"cmd":"x","args":["","",...]}: 3 MB of JSON */
  size_t n = 1000000, len = 0;
  char *js = malloc(3 * n + 64);
  ASSERT(js);
  len += (size_t)sprintf(js, "{\"cmd\":\"x\",\"args\":[");
  for (size_t i = 0; i < n; i++) {
    memcpy(js + len, "\"\",", 3);
    len += 3;
  }
  js[len - 1] = ']';
  js[len++] = '}';
  ProtobufCMessage *m = pbjson_decode_ex(&pb__start_process_request__descriptor, js, len, &flags, err, sizeof err);
  ASSERT(m == NULL);
  ASSERT_EQ(flags, PBJSON_TOO_BIG);
  ASSERT(strstr(err, "bytes of memory to decode") != NULL);
  free(js);
  /* 10000 one-character arguments decode (16 times the input refused them) */
  n = 10000;
  js = malloc(n * 4 + 64);
  ASSERT(js);
  len = (size_t)sprintf(js, "{\"cmd\":\"x\",\"args\":[");
  for (size_t i = 0; i < n; i++) len += (size_t)sprintf(js + len, "\"%zu\",", i % 10);
  js[len - 1] = ']';
  js[len++] = '}';
  m = pbjson_decode_ex(&pb__start_process_request__descriptor, js, len, &flags, err, sizeof err);
  if (!m) TEST_FAIL_("%s", err);
  ASSERT_EQ(((Pb__StartProcessRequest *)m)->n_args, n);
  protobuf_c_message_free_unpacked(m, NULL);
  free(js);
  /* 20000 ordinary arguments decode */
  n = 20000;
  js = malloc(n * 16 + 64);
  ASSERT(js);
  len = (size_t)sprintf(js, "{\"cmd\":\"x\",\"args\":[");
  for (size_t i = 0; i < n; i++) len += (size_t)sprintf(js + len, "\"arg-%06zu\",", i);
  js[len - 1] = ']';
  js[len++] = '}';
  Pb__StartProcessRequest *r =
      (Pb__StartProcessRequest *)pbjson_decode_ex(&pb__start_process_request__descriptor, js, len, &flags, err, sizeof err);
  ASSERT(r != NULL);
  ASSERT_EQ(flags, 0);
  ASSERT_EQ(r->n_args, n);
  ASSERT_STR_EQ(r->args[n - 1], "arg-019999");
  protobuf_c_message_free_unpacked(&r->base, NULL);
  free(js);

  /* wire: 2.5 M empty args, 2 bytes each */
  n = 2500000;
  uint8_t *w = malloc(2 * n);
  ASSERT(w);
  for (size_t i = 0; i < n; i++) {
    w[2 * i] = 2 << 3 | 2; /* field 2 (args), length-delimited */
    w[2 * i + 1] = 0;
  }
  int over = -1;
  m = unpack_budget(&pb__start_process_request__descriptor, w, 2 * n, JSON_MEM_BUDGET(2 * n), &over);
  ASSERT(m == NULL);
  ASSERT_EQ(over, 1);
  /* with the room it takes, the same bytes unpack */
  m = unpack_budget(&pb__start_process_request__descriptor, w, 2 * n, (size_t)256 << 20, &over);
  ASSERT(m != NULL);
  ASSERT_EQ(over, 0);
  ASSERT_EQ(((Pb__StartProcessRequest *)m)->n_args, n);
  protobuf_c_message_free_unpacked(m, NULL);
  /* a 1 MiB chunk unpacks within its budget; invalid bytes are not "over" */
  size_t cl = 1u << 20;
  uint8_t *c = malloc(cl + 8);
  ASSERT(c);
  c[0] = 2 << 3 | 2;
  c[1] = 0x80; c[2] = 0x80; c[3] = 0x40; /* varint 1 MiB */
  memset(c + 4, 'z', cl);
  m = unpack_budget(&pb__file_chunk__descriptor, c, cl + 4, JSON_MEM_BUDGET(cl + 4), &over);
  ASSERT(m != NULL);
  ASSERT_EQ(over, 0);
  ASSERT_EQ(((Pb__FileChunk *)m)->content.len, cl);
  protobuf_c_message_free_unpacked(m, NULL);
  m = unpack_budget(&pb__file_chunk__descriptor, c, 100, JSON_MEM_BUDGET(100), &over);
  ASSERT(m == NULL);
  ASSERT_EQ(over, 0);
  free(c);
  free(w);
}

int main(void) {
  RUN(encode_examples);
  RUN(encode_string_escapes);
  RUN(encode_string_escapes_everywhere);
  RUN(encode_fixed_buffer);
  RUN(round_trip_every_type);
  RUN(round_trip_oneof_variants);
  RUN(big_bytes_round_trip);
  RUN(decode_names);
  RUN(decode_unknown_and_null);
  RUN(decode_numbers);
  RUN(decode_base64_forms);
  RUN(decode_nul);
  RUN(decode_memory_budget);
  RUN(decode_rejects);
  RUN(check_utf8);
  RUN(mutations_never_crash);
  return test_summary();
}
