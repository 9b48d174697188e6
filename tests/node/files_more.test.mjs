// The rest of the file surface (api.md §9) through the official Connect
// client (@connectrpc/connect-node): Stat, MakeDir, Move, Remove and the
// WatchDir server stream, binary and JSON codecs, HTTP/1.1 and HTTP/2.
import { after, describe, test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";

import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";

import { expectError, loadSchema, mkTmp, startServer, tokenHeader, transports } from "./lib/harness.mjs";

const schema = loadSchema();
const srv = await startServer();
const root = mkTmp("conch-node-fsmore-");
const EVENT_TYPE_CREATE = 1;

after(async () => {
  fs.rmSync(root, { recursive: true, force: true });
  await srv.stop();
});

for (const t of transports(srv.url)) {
  describe(t.name, () => {
    const client = createClient(schema.FileService, t.transport);
    const headers = tokenHeader(srv.token);
    const dir = path.join(root, `${t.httpVersion === "2" ? "h2" : "h1"}-${t.useBinaryFormat ? "bin" : "json"}`);

    test("MakeDir, Stat, Move, Remove", async () => {
      const d = path.join(dir, "a", "b");
      let res = await client.makeDir({ path: d }, { headers });
      assert.equal(res.entry.path, d);
      assert.equal(res.entry.isDirectory, true);
      assert.equal(res.entry.permissions, "drwxr-xr-x");
      fs.writeFileSync(path.join(d, "f.txt"), "hello");
      res = await client.stat({ path: path.join(d, "f.txt") }, { headers });
      assert.equal(res.entry.name, "f.txt");
      assert.equal(res.entry.size, 5n);
      assert.equal(res.entry.type, "file");
      const moved = path.join(dir, "moved", "g.txt");
      res = await client.move({ source: path.join(d, "f.txt"), destination: moved }, { headers });
      assert.equal(res.entry.path, moved);
      assert.equal(fs.readFileSync(moved, "utf8"), "hello");
      await client.remove({ path: path.join(dir, "a") }, { headers });
      assert.equal(fs.existsSync(path.join(dir, "a")), false);
    });

    test("error texts", async () => {
      fs.mkdirSync(dir, { recursive: true });
      await expectError(client.stat({ path: path.join(dir, "none") }, { headers }),
        Code.NotFound, `path not found: ${dir}/none`);
      await expectError(client.makeDir({ path: dir }, { headers }),
        Code.AlreadyExists, `directory already exists: ${dir}`);
      await expectError(client.move({ source: "/", destination: "/x" }, { headers }),
        Code.InvalidArgument, "refusing to move /");
      await expectError(client.remove({ path: "/" }, { headers }),
        Code.InvalidArgument, "refusing to remove /");
      await expectError(client.remove({ path: "rel" }, { headers }),
        Code.InvalidArgument, "filepath must be a normalized absolute guest path for remove");
      await expectError(client.stat({ path: "" }, { headers }),
        Code.InvalidArgument, "filepath is required for stat");
    });

    test("WatchDir: start, then a CREATE with its entry", async () => {
      const wd = path.join(dir, "watched");
      fs.mkdirSync(wd, { recursive: true });
      const ac = new AbortController();
      const it = client.watchDir({ path: wd, recursive: true }, { headers, signal: ac.signal })[Symbol.asyncIterator]();
      const first = await it.next();
      assert.equal(first.value.event.case, "start");
      fs.writeFileSync(path.join(wd, "new.txt"), "x");
      let ev;
      for (;;) {
        const n = await it.next();
        assert.equal(n.done, false);
        if (n.value.event.case === "filesystem") { ev = n.value.event.value; break; }
      }
      assert.equal(ev.name, "new.txt");
      assert.equal(ev.type, EVENT_TYPE_CREATE);
      assert.equal(ev.entry.path, path.join(wd, "new.txt"));
      ac.abort(); // the client's own cancel: canceled, or (HTTP/1.1) just the end
      let code = "ended";
      try {
        while (!(await it.next()).done); // what was already received may still come
      } catch (e) {
        code = ConnectError.from(e).code;
      }
      assert.ok(code === "ended" || code === Code.Canceled, `after abort: ${code}`);
      await expectError((async () => { for await (const _ of client.watchDir({ path: path.join(wd, "new.txt") }, { headers })); })(),
        Code.InvalidArgument, `path is not a directory: ${wd}/new.txt`);
    });
  });
}

// The same routes through the gRPC (HTTP/2) and gRPC-Web protocols.
for (const [name, transport] of [
  ["gRPC", createGrpcTransport({ baseUrl: srv.url })],
  ["gRPC-Web HTTP/1.1", createGrpcWebTransport({ baseUrl: srv.url, httpVersion: "1.1" })],
]) {
  describe(name, () => {
    const client = createClient(schema.FileService, transport);
    const headers = tokenHeader(srv.token);
    const dir = path.join(root, name.replace(/[^a-zA-Z0-9]/g, "_"));

    test("MakeDir, Stat, Move, Remove, errors", async () => {
      const res = await client.makeDir({ path: path.join(dir, "d") }, { headers });
      assert.equal(res.entry.isDirectory, true);
      assert.equal((await client.stat({ path: path.join(dir, "d") }, { headers })).entry.name, "d");
      await client.move({ source: path.join(dir, "d"), destination: path.join(dir, "e") }, { headers });
      await client.remove({ path: path.join(dir, "e") }, { headers });
      assert.equal(fs.existsSync(path.join(dir, "e")), false);
      await expectError(client.stat({ path: path.join(dir, "e") }, { headers }),
        Code.NotFound, `path not found: ${dir}/e`);
    });

    test("WatchDir", async () => {
      const wd = path.join(dir, "w");
      fs.mkdirSync(wd, { recursive: true });
      const ac = new AbortController();
      const it = client.watchDir({ path: wd }, { headers, signal: ac.signal })[Symbol.asyncIterator]();
      assert.equal((await it.next()).value.event.case, "start");
      fs.mkdirSync(path.join(wd, "sub"));
      let ev;
      while (!ev) {
        const n = await it.next();
        if (n.value.event.case === "filesystem") ev = n.value.event.value;
      }
      assert.equal(ev.name, "sub");
      assert.equal(ev.entry.isDirectory, true);
      ac.abort();
      try { while (!(await it.next()).done); } catch (e) { /* canceled */ }
    });
  });
}
