// gRPC server reflection through the official Connect client: the bidi
// ServerReflectionInfo over HTTP/2 (binary and JSON), the schema of
// pb.FileService learnt from it and used to call ListFiles (no agent.proto
// on the client), and bidi over HTTP/1.1 refused as connect-es's own
// handlers refuse it (505, Connection: close).
import { after, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";

import { createFileRegistry, fromBinary } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema, FileDescriptorSetSchema } from "@bufbuild/protobuf/wkt";
import { Code, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";

import { expectError, mkTmp, ROOT, startServer, tokenHeader } from "./lib/harness.mjs";

// only the reflection schema comes from disk
const tmp = mkTmp("conch-node-refl-");
execFileSync("protoc", [`--descriptor_set_out=${path.join(tmp, "r.pb")}`, `-I${path.join(ROOT, "proto")}`,
  "reflection.proto", "reflection_v1alpha.proto"], { stdio: "inherit" });
const reflReg = createFileRegistry(fromBinary(FileDescriptorSetSchema, fs.readFileSync(path.join(tmp, "r.pb"))));
const srv = await startServer();

after(async () => {
  fs.rmSync(tmp, { recursive: true, force: true });
  await srv.stop();
});

async function* requests(list) {
  for (const r of list) yield r;
}

async function collect(stream) {
  const out = [];
  for await (const m of stream) out.push(m);
  return out;
}

for (const pkg of ["v1", "v1alpha"]) {
  const svc = reflReg.getService(`grpc.reflection.${pkg}.ServerReflection`);
  for (const useBinaryFormat of [true, false]) {
    describe(`reflection ${pkg} HTTP/2 ${useBinaryFormat ? "binary" : "JSON"}`, () => {
      const transport = createConnectTransport({ baseUrl: srv.url, httpVersion: "2", useBinaryFormat });
      const client = createClient(svc, transport);
      const opts = { headers: tokenHeader(srv.token) };

      test("list services, then the schema of pb.FileService from reflection calls ListFiles", async () => {
        const out = await collect(client.serverReflectionInfo(requests([
          { messageRequest: { case: "listServices", value: "" } },
          { messageRequest: { case: "fileContainingSymbol", value: "pb.FileService" } },
          { messageRequest: { case: "fileContainingSymbol", value: "pb.Nope" } },
        ]), opts));
        assert.equal(out.length, 3);
        assert.deepEqual(out[0].messageResponse.value.service.map((s) => s.name).sort(), [
          "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection",
          "pb.AgentService", "pb.FileService", "pb.NetworkService", "pb.ProcessService"]);
        const files = out[1].messageResponse.value.fileDescriptorProto.map((b) => fromBinary(FileDescriptorProtoSchema, b));
        assert.deepEqual(files.map((f) => f.name), ["agent.proto"]);
        assert.deepEqual(out[2].messageResponse.case, "errorResponse");
        assert.equal(out[2].messageResponse.value.errorCode, Code.NotFound);

        const reg = createFileRegistry(...files);
        const fsClient = createClient(reg.getService("pb.FileService"), transport);
        const dir = mkTmp("conch-node-refl-ls-");
        fs.writeFileSync(path.join(dir, "x.txt"), "abc");
        try {
          const res = await fsClient.listFiles({ path: dir, depth: 1 }, opts);
          assert.deepEqual(res.entries.map((e) => [e.name, e.size]), [["x.txt", 3n]]);
        } finally {
          fs.rmSync(dir, { recursive: true, force: true });
        }
      });

      test("no token: unauthenticated", async () => {
        await expectError(collect(client.serverReflectionInfo(requests([
          { messageRequest: { case: "listServices", value: "" } }]))), Code.Unauthenticated, "agent token is required");
      });
    });
  }

  test(`reflection ${pkg} over HTTP/1.1 is refused`, async () => {
    const client = createClient(svc, createConnectTransport({ baseUrl: srv.url, httpVersion: "1.1" }));
    await expectError(collect(client.serverReflectionInfo(requests([
      { messageRequest: { case: "listServices", value: "" } }]), { headers: tokenHeader(srv.token) })),
    Code.Unknown, "HTTP 505"); // connect-es's mapping of the status its own handlers send
  });
}
