// gzip both ways with the official Connect client (api.md §9): the client
// sends gzip (sendCompression) and accepts it (acceptCompression); answers
// of 1 KiB and more come back gzipped (Content-Encoding for unary,
// Connect-Content-Encoding for streams), smaller ones and a client that
// accepts nothing get identity.  HTTP/1.1 and HTTP/2, both codecs.
import { after, describe, test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";

import { Code, createClient } from "@connectrpc/connect";
import { compressionGzip, createConnectTransport } from "@connectrpc/connect-node";

import { expectError, loadSchema, mkTmp, startServer, tokenHeader } from "./lib/harness.mjs";

const schema = loadSchema();
const srv = await startServer();
const dir = mkTmp("conch-node-gz-");
for (let i = 0; i < 300; i++) fs.writeFileSync(path.join(dir, `file-${String(i).padStart(5, "0")}.txt`), "x");
fs.writeFileSync(path.join(dir, "small"), "s");

after(async () => {
  await srv.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

const OUT = [10, 5000, 200000, 20, 70000, 3].map((n) => String.fromCharCode(97 + (n % 26)).repeat(n)).join("");
const PY = "import sys\nfor n in (10, 5000, 200000, 20, 70000, 3):\n"
  + "    sys.stdout.write(chr(97 + n % 26) * n); sys.stdout.flush()\n";

async function collect(stream) {
  const out = [];
  for await (const m of stream) out.push(m);
  return out;
}

for (const httpVersion of ["1.1", "2"]) {
  for (const useBinaryFormat of [true, false]) {
    const name = `HTTP/${httpVersion} ${useBinaryFormat ? "binary" : "JSON"}`;
    const gz = createConnectTransport({
      baseUrl: srv.url, httpVersion, useBinaryFormat,
      sendCompression: compressionGzip, acceptCompression: [compressionGzip],
    });
    const plain = createConnectTransport({ baseUrl: srv.url, httpVersion, useBinaryFormat, acceptCompression: [] });
    describe(name, () => {
      const fsc = createClient(schema.FileService, gz);
      const psc = createClient(schema.ProcessService, gz);
      const headers = tokenHeader(srv.token);

      test("unary: a big answer comes gzipped, a small one as it is", async () => {
        let enc = "unset";
        const res = await fsc.listFiles({ path: dir }, { headers, onHeader: (h) => { enc = h.get("content-encoding"); } });
        assert.equal(res.entries.length, 301);
        assert.equal(enc, "gzip");
        const st = await fsc.stat({ path: path.join(dir, "small") }, { headers, onHeader: (h) => { enc = h.get("content-encoding"); } });
        assert.equal(st.entry.name, "small");
        assert.equal(enc, null);
      });

      test("unary: a client that accepts no compression gets identity", async () => {
        let enc = "unset";
        const res = await createClient(schema.FileService, plain).listFiles({ path: dir },
          { headers, onHeader: (h) => { enc = h.get("content-encoding"); } });
        assert.equal(res.entries.length, 301);
        assert.equal(enc, null);
      });

      test("unary error with gzip accepted", async () => {
        await expectError(fsc.listFiles({ path: path.join(dir, "nope") }, { headers }), Code.NotFound,
          `path not found: ${path.join(dir, "nope")}`);
      });

      test("server streaming: process output, big events through the pool, in order", async () => {
        let enc = "unset";
        const evs = await collect(psc.startProcess({ cmd: "python3", args: ["-c", PY] },
          { headers, onHeader: (h) => { enc = h.get("connect-content-encoding"); } }));
        assert.equal(enc, "gzip");
        const out = evs.filter((e) => e.event.case === "data").map((e) => Buffer.from(e.event.value.output.value).toString()).join("");
        assert.equal(out, OUT);
        assert.equal(evs.at(-1).event.case, "end");
        assert.equal(evs.at(-1).event.value.exitCode, 0);
      });

      test("client streaming upload sent gzipped, then downloaded gzipped", async () => {
        const data = Buffer.from("conch ".repeat(400000));
        const target = path.join(mkTmp("conch-node-gzup-"), "up.txt");
        const res = await fsc.postFileStream((async function* () {
          for (let off = 0; off < data.length; off += 1 << 20) // chunks of at most 1 MiB
            yield { filepath: target, content: data.subarray(off, off + (1 << 20)) };
        })(), { headers });
        assert.equal(res.uploadedCount, 1);
        assert.ok(fs.readFileSync(target).equals(data));
        const chunks = await collect(fsc.getFileStream({ filepath: target }, { headers }));
        assert.ok(Buffer.concat(chunks.map((c) => Buffer.from(c.content))).equals(data));
        fs.rmSync(path.dirname(target), { recursive: true, force: true });
      });
    });
  }
}
