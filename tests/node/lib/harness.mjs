// Test harness for the official Connect client against conch-init.
//
// loadSchema(): runs protoc (Debian's protobuf-compiler) to get a
//   FileDescriptorSet of proto/agent.proto (+ tests/node/probe.proto, a
//   service the server does not have) and builds a registry from it at run
//   time: no generated code.
// startServer(): spawns `$CONCH_INIT_BIN serve --listen 127.0.0.1:<port>
//   --token <t>` (default ../../build/asan/conch-init) and waits for /health;
//   stop() terminates it and returns its log, failing on a sanitizer report.
// transports(): the four client set-ups every RPC is tested with.
import { spawn, execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import * as fs from "node:fs";
import * as http from "node:http";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";

import assert from "node:assert/strict";

import { createFileRegistry, fromBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { FileDescriptorSetSchema } from "@bufbuild/protobuf/wkt";
import { createConnectTransport } from "@connectrpc/connect-node";

const here = path.dirname(fileURLToPath(import.meta.url));
export const ROOT = path.resolve(here, "..", "..", "..");
export const BIN = process.env.CONCH_INIT_BIN || path.join(ROOT, "build", "asan", "conch-init");

export function loadSchema() {
  const out = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "conch-node-")), "agent.pb");
  execFileSync("protoc", [
    `--descriptor_set_out=${out}`, "--include_imports",
    `-I${ROOT}`, `-I${path.join(ROOT, "tests", "node")}`,
    "proto/agent.proto", "probe.proto",
  ], { stdio: "inherit" });
  const set = fromBinary(FileDescriptorSetSchema, fs.readFileSync(out));
  fs.rmSync(path.dirname(out), { recursive: true, force: true });
  const reg = createFileRegistry(set);
  const need = (kind, name) => {
    const d = kind === "service" ? reg.getService(name) : reg.getMessage(name);
    if (!d) throw new Error(`${kind} ${name} not in the descriptor set`);
    return d;
  };
  return {
    registry: reg,
    FileService: need("service", "pb.FileService"),
    ProcessService: need("service", "pb.ProcessService"),
    Probe: need("service", "pb.ConchProbe"),
    FileChunk: need("message", "pb.FileChunk"),
  };
}

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.unref();
    s.on("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

function healthOk(port) {
  return new Promise((resolve) => {
    const req = http.get({ host: "127.0.0.1", port, path: "/health", timeout: 1000 }, (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode === 200));
    });
    req.on("error", () => resolve(false));
    req.on("timeout", () => { req.destroy(); resolve(false); });
  });
}

const SANITIZER = ["ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"];

export async function startServer({ token = randomBytes(16).toString("hex") } = {}) {
  if (!fs.existsSync(BIN)) throw new Error(`conch-init binary not found: ${BIN} (run make asan)`);
  const port = await freePort();
  const logDir = path.join(ROOT, "build", "test-logs");
  fs.mkdirSync(logDir, { recursive: true });
  const logPath = path.join(logDir, `node-${port}.log`);
  const log = fs.openSync(logPath, "w");
  const args = ["serve", "--listen", `127.0.0.1:${port}`];
  if (token) args.push("--token", token);
  const env = { ...process.env };
  env.ASAN_OPTIONS ??= "detect_leaks=1:abort_on_error=0";
  env.UBSAN_OPTIONS ??= "print_stacktrace=1:halt_on_error=1";
  if (!token) delete env.CONCH_INIT_TOKEN;
  const child = spawn(BIN, args, { stdio: ["ignore", log, log], env });
  let exited = false;
  const exitP = new Promise((resolve) => child.on("exit", (code, sig) => { exited = true; resolve({ code, sig }); }));
  const deadline = Date.now() + 20000;
  while (!(await healthOk(port))) {
    if (exited) throw new Error(`conch-init exited early:\n${fs.readFileSync(logPath, "utf8")}`);
    if (Date.now() > deadline) { child.kill("SIGKILL"); throw new Error("conch-init did not come up"); }
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    port, token, url: `http://127.0.0.1:${port}`, pid: child.pid, logPath,
    alive: () => !exited,
    async stop() {
      if (!exited) {
        child.kill("SIGTERM");
        const t = setTimeout(() => child.kill("SIGKILL"), 20000);
        await exitP;
        clearTimeout(t);
      }
      fs.closeSync(log);
      const text = fs.readFileSync(logPath, "utf8");
      for (const m of SANITIZER) {
        const i = text.indexOf(m);
        if (i >= 0) throw new Error(`sanitizer report in server log:\n${text.slice(Math.max(0, i - 200), i + 6000)}`);
      }
      return text;
    },
  };
}

// Every RPC is exercised with each of these.
export function transports(baseUrl) {
  const out = [];
  for (const httpVersion of ["1.1", "2"]) {
    for (const useBinaryFormat of [true, false]) {
      out.push({
        name: `HTTP/${httpVersion} ${useBinaryFormat ? "binary" : "JSON"}`,
        httpVersion, useBinaryFormat,
        transport: createConnectTransport({ baseUrl, httpVersion, useBinaryFormat }),
      });
    }
  }
  return out;
}

export function tokenHeader(token) {
  return { "conch-init-token": token };
}

export function mkTmp(prefix = "conch-node-") {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

/* Await a call that must fail with this Connect code (and message, when
 * given); returns the ConnectError. */
export async function expectError(promise, code, message) {
  let err;
  try {
    await promise;
  } catch (e) {
    err = ConnectError.from(e);
  }
  assert.ok(err, "the call should have failed");
  assert.equal(err.code, code, `code: got ${Code[err.code]} (${err.rawMessage})`);
  if (message !== undefined) assert.equal(err.rawMessage, message);
  return err;
}
