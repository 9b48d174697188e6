// FileService through the official Connect client (@connectrpc/connect-node):
// all four RPCs, binary and JSON codecs, over HTTP/1.1 and HTTP/2 (h2c).
import { after, describe, test } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import * as fs from "node:fs";
import * as path from "node:path";

import { Code, createClient } from "@connectrpc/connect";

import { expectError, loadSchema, mkTmp, startServer, tokenHeader, transports } from "./lib/harness.mjs";

const schema = loadSchema();
const srv = await startServer();
const root = mkTmp("conch-node-fs-");
const MiB = 1024 * 1024;
const RFC3339 = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/;

after(async () => {
  fs.rmSync(root, { recursive: true, force: true });
  await srv.stop();
});

const sha = (b) => createHash("sha256").update(b).digest("hex");


async function collect(stream) {
  const out = [];
  for await (const m of stream) out.push(m);
  return out;
}

async function* chunksOf(filepath, data, size) {
  if (data.length === 0) {
    yield { filepath, content: new Uint8Array(0) };
    return;
  }
  for (let off = 0; off < data.length; off += size) {
    // every chunk repeats the path (api.md §7: later chunks may repeat it)
    yield { filepath, content: data.subarray(off, off + size) };
  }
}

for (const t of transports(srv.url)) {
  describe(t.name, () => {
    const client = createClient(schema.FileService, t.transport);
    const headers = tokenHeader(srv.token);
    const dir = path.join(root, `${t.httpVersion === "2" ? "h2" : "h1"}-${t.useBinaryFormat ? "bin" : "json"}`);

    test("PostFileStream uploads a multi-chunk file atomically", async () => {
      const target = path.join(dir, "up", "data.bin"); // parent created by the server
      const data = randomBytes(2 * MiB + 12345);
      const res = await client.postFileStream(chunksOf(target, data, MiB), { headers });
      assert.equal(res.uploadedCount, 1);
      assert.equal(res.entries.length, 1);
      assert.equal(res.entries[0].name, "data.bin");
      assert.equal(res.entries[0].path, target);
      assert.equal(res.entries[0].type, "file");
      assert.equal(sha(fs.readFileSync(target)), sha(data));
      assert.equal(fs.statSync(target).mode & 0o777, 0o644);
      assert.deepEqual(fs.readdirSync(path.dirname(target)), ["data.bin"], "no temp file left");
    });

    test("PostFileStream overwrites an existing file and keeps its mode", async () => {
      const target = path.join(dir, "keep-mode.sh");
      fs.mkdirSync(dir, { recursive: true });
      fs.writeFileSync(target, "old\n");
      fs.chmodSync(target, 0o750);
      const res = await client.postFileStream(chunksOf(target, Buffer.from("new content\n"), MiB), { headers });
      assert.equal(res.uploadedCount, 1);
      assert.equal(fs.readFileSync(target, "utf8"), "new content\n");
      assert.equal(fs.statSync(target).mode & 0o777, 0o750);
    });

    test("PostFileStream with one empty chunk creates an empty file", async () => {
      const target = path.join(dir, "empty.txt");
      const res = await client.postFileStream(chunksOf(target, new Uint8Array(0), MiB), { headers });
      assert.equal(res.uploadedCount, 1);
      assert.equal(fs.statSync(target).size, 0);
    });

    test("PostFileStream errors: no chunks, bad path, path changed, oversized chunk", async () => {
      await expectError(client.postFileStream((async function* () {})(), { headers }),
        Code.InvalidArgument, "no file chunks provided");
      await expectError(client.postFileStream(chunksOf("relative/x", Buffer.from("x"), MiB), { headers }),
        Code.InvalidArgument, "filepath must be a normalized absolute guest path for stream upload");
      const a = path.join(dir, "changed-a.txt");
      await expectError(client.postFileStream((async function* () {
        yield { filepath: a, content: Buffer.from("one") };
        yield { filepath: path.join(dir, "changed-b.txt"), content: Buffer.from("two") };
      })(), { headers }), Code.InvalidArgument, "filepath changed during stream upload");
      assert.ok(!fs.existsSync(a), "a failed upload leaves no target");
      const big = path.join(dir, "too-big.bin");
      await expectError(client.postFileStream(chunksOf(big, randomBytes(MiB + 1), MiB + 1), { headers }),
        Code.ResourceExhausted, "file chunk exceeds maximum size 1048576 bytes");
      assert.ok(!fs.existsSync(big));
      assert.deepEqual(fs.readdirSync(dir).filter((n) => n.startsWith(".conch-upload-")), [], "no temp file left");
    });

    test("GetFileStream streams 1 MiB chunks, path only in the first", async () => {
      fs.mkdirSync(dir, { recursive: true });
      const p = path.join(dir, "get.bin");
      const data = randomBytes(2 * MiB + 4);
      fs.writeFileSync(p, data);
      const chunks = await collect(client.getFileStream({ filepath: p }, { headers }));
      assert.equal(chunks.length, 3);
      assert.equal(chunks[0].filepath, p);
      assert.equal(chunks[1].filepath, "");
      assert.equal(chunks[2].filepath, "");
      assert.deepEqual(chunks.map((c) => c.content.length), [MiB, MiB, 4]);
      assert.equal(sha(Buffer.concat(chunks.map((c) => c.content))), sha(data));

      const p2 = path.join(dir, "get-small.txt");
      fs.writeFileSync(p2, "hello\n");
      const small = await collect(client.getFileStream({ filepath: p2 }, { headers }));
      assert.equal(small.length, 1);
      assert.equal(Buffer.from(small[0].content).toString(), "hello\n");

      const p3 = path.join(dir, "get-empty.txt");
      fs.writeFileSync(p3, "");
      assert.deepEqual(await collect(client.getFileStream({ filepath: p3 }, { headers })), []);
    });

    test("GetFileStream errors", async () => {
      const missing = path.join(dir, "does-not-exist");
      await expectError(collect(client.getFileStream({ filepath: missing }, { headers })),
        Code.NotFound, `file not found: ${missing}`);
      fs.mkdirSync(dir, { recursive: true });
      await expectError(collect(client.getFileStream({ filepath: dir }, { headers })),
        Code.InvalidArgument, `path is a directory: ${dir}`);
      await expectError(collect(client.getFileStream({ filepath: "" }, { headers })),
        Code.InvalidArgument, "filepath is required for stream file retrieval");
    });

    test("ListFiles: depth, order, entry fields", async () => {
      const r = path.join(dir, "list");
      fs.mkdirSync(path.join(r, "sub", "deeper"), { recursive: true });
      fs.writeFileSync(path.join(r, "b.txt"), "12345");
      fs.writeFileSync(path.join(r, "a.txt"), "");
      fs.writeFileSync(path.join(r, "sub", "c.txt"), "c");
      fs.chmodSync(path.join(r, "b.txt"), 0o644);
      fs.chmodSync(path.join(r, "sub"), 0o755);

      const one = await client.listFiles({ path: r }, { headers });
      assert.deepEqual(one.entries.map((e) => e.name), ["a.txt", "b.txt", "sub"]);
      const two = await client.listFiles({ path: r, depth: 2 }, { headers });
      assert.deepEqual(two.entries.map((e) => e.path),
        ["a.txt", "b.txt", "sub", "sub/c.txt", "sub/deeper"].map((n) => path.join(r, n)));
      const b = two.entries[1];
      assert.equal(b.type, "file");
      assert.equal(b.size, 5n);
      assert.equal(b.permissions, "-rw-r--r--");
      assert.equal(b.isDirectory, false);
      assert.match(b.modifiedTime, RFC3339);
      const sub = two.entries[2];
      assert.equal(sub.type, "directory");
      assert.equal(sub.isDirectory, true);
      assert.equal(sub.permissions, "drwxr-xr-x");

      const missing = path.join(r, "nope");
      await expectError(client.listFiles({ path: missing }, { headers }), Code.NotFound, `path not found: ${missing}`);
      await expectError(client.listFiles({ path: "" }, { headers }), Code.InvalidArgument, "path is required");
      await expectError(client.listFiles({ path: "/a/../b" }, { headers }), Code.InvalidArgument,
        "filepath must be a normalized absolute guest path for list files");
    });

    test("SearchFiles: glob on relative path or basename, excludes", async () => {
      const r = path.join(dir, "search");
      fs.mkdirSync(path.join(r, "src", "lib"), { recursive: true });
      for (const f of ["main.py", "src/app.py", "src/lib/util.py", "src/readme.md", "src/lib/test_util.py"])
        fs.writeFileSync(path.join(r, f), f);
      const all = await client.searchFiles({ path: r, pattern: "*.py" }, { headers });
      assert.deepEqual(all.entries.map((e) => e.path).sort(),
        ["main.py", "src/app.py", "src/lib/test_util.py", "src/lib/util.py"].map((n) => path.join(r, n)).sort());
      assert.ok(all.entries.every((e) => e.type === "file" && !e.isDirectory));
      const rel = await client.searchFiles({ path: r, pattern: "src/*.py" }, { headers });
      assert.deepEqual(rel.entries.map((e) => e.path), [path.join(r, "src/app.py")]);
      const ex = await client.searchFiles({ path: r, pattern: "*.py", excludePatterns: ["test_*", "main.py"] }, { headers });
      assert.deepEqual(ex.entries.map((e) => e.path).sort(),
        ["src/app.py", "src/lib/util.py"].map((n) => path.join(r, n)).sort());
      await expectError(client.searchFiles({ path: r, pattern: "" }, { headers }), Code.InvalidArgument, "pattern is required");
      await expectError(client.searchFiles({ path: r, pattern: "[" }, { headers }), Code.InvalidArgument,
        'invalid search pattern "[": syntax error in pattern');
    });

    test("round trip: upload, list, download", async () => {
      const target = path.join(dir, "rt", "file.bin");
      const data = randomBytes(MiB + 4);
      await client.postFileStream(chunksOf(target, data, 256 * 1024), { headers });
      const ls = await client.listFiles({ path: path.dirname(target) }, { headers });
      assert.deepEqual(ls.entries.map((e) => [e.name, e.size]), [["file.bin", BigInt(data.length)]]);
      const chunks = await collect(client.getFileStream({ filepath: target }, { headers }));
      assert.equal(chunks.length, 2);
      assert.equal(sha(Buffer.concat(chunks.map((c) => c.content))), sha(data));
    });
  });
}

test("server still alive after every transport", () => {
  assert.ok(srv.alive());
});
