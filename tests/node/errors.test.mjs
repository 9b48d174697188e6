// Errors as the official Connect client sees them: auth failures surface as
// Code.Unauthenticated with the exact texts of api.md §4, unknown routes as
// Code.Unimplemented — for unary, server- and client-streaming calls, over
// HTTP/1.1 and HTTP/2 with both codecs.
import { after, describe, test } from "node:test";
import assert from "node:assert/strict";

import { Code, createClient } from "@connectrpc/connect";

import { expectError, loadSchema, mkTmp, startServer, transports } from "./lib/harness.mjs";

const schema = loadSchema();
const srv = await startServer();
const noTokenSrv = await startServer({ token: "" });
const dir = mkTmp("conch-node-err-");

after(async () => {
  await srv.stop();
  await noTokenSrv.stop();
});


async function drain(stream) {
  for await (const _ of stream) { /* nothing */ }
}

// The three call shapes, with the given headers.
function calls(client, headers) {
  return {
    unary: () => client.listFiles({ path: dir }, { headers }),
    serverStream: () => drain(client.getFileStream({ filepath: `${dir}/x` }, { headers })),
    clientStream: () => client.postFileStream((async function* () {
      yield { filepath: `${dir}/upload.txt`, content: Buffer.from("x") };
    })(), { headers }),
  };
}

const cases = [
  ["missing token", {}, "agent token is required"],
  ["empty token", { "conch-init-token": "" }, "agent token is required"],
  ["wrong token", { "conch-init-token": "not-the-token" }, "agent token is invalid"],
  ["token longer than 4096 bytes", { "conch-init-token": "a".repeat(4097) }, "agent token is invalid"],
];

for (const t of transports(srv.url)) {
  describe(t.name, () => {
    const client = createClient(schema.FileService, t.transport);
    for (const [name, headers, text] of cases) {
      for (const [shape, fn] of Object.entries(calls(client, headers))) {
        test(`${name} → Unauthenticated (${shape})`, async () => {
          await expectError(fn(), Code.Unauthenticated, text);
        });
      }
    }

    test("right token in another letter case of the header name is accepted", async () => {
      const res = await client.listFiles({ path: dir }, { headers: { "Conch-Init-Token": srv.token } });
      assert.deepEqual(res.entries, []);
    });

    test("unknown route → Unimplemented", async () => {
      const probe = createClient(schema.Probe, t.transport);
      const headers = { "conch-init-token": srv.token };
      await expectError(probe.missing({ path: "/" }, { headers }), Code.Unimplemented);
      await expectError(drain(probe.missingStream({ filepath: "/etc/hostname" }, { headers })), Code.Unimplemented);
    });
  });

  describe(`${t.name}, server without a token`, () => {
    const nt = transports(noTokenSrv.url).find((x) => x.name === t.name);
    const client = createClient(schema.FileService, nt.transport);
    for (const [shape, fn] of Object.entries(calls(client, { "conch-init-token": "anything" }))) {
      test(`token not initialized → Unauthenticated (${shape})`, async () => {
        await expectError(fn(), Code.Unauthenticated, "agent token is not initialized");
      });
    }
  });
}
