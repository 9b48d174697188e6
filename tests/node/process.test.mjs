// ProcessService through the official Connect client (@connectrpc/connect-node):
// StartProcess (foreground and background), Connect, List, SendSignal and
// their error texts, binary and JSON codecs, over HTTP/1.1 and HTTP/2.
import { after, describe, test } from "node:test";
import assert from "node:assert/strict";

import { Code, createClient } from "@connectrpc/connect";

import { expectError, loadSchema, startServer, tokenHeader, transports } from "./lib/harness.mjs";

const schema = loadSchema();
const srv = await startServer();

after(async () => {
  await srv.stop();
});


// Events as plain tuples; keepalives dropped.
function norm(ev) {
  const e = ev.event;
  switch (e.case) {
    case "start": return ["start", e.value.pid];
    case "data": return ["data", e.value.output.case, Buffer.from(e.value.output.value).toString()];
    case "end": return ["end", e.value.exitCode, e.value.exited, e.value.status, e.value.error];
    case "keepalive": return ["keepalive"];
    default: throw new Error(`unexpected event ${JSON.stringify(ev)}`);
  }
}

async function events(stream) {
  const out = [];
  for await (const ev of stream) {
    const n = norm(ev);
    if (n[0] !== "keepalive") out.push(n);
  }
  return out;
}

function joined(evs, channel) {
  return evs.filter((e) => e[0] === "data" && e[1] === channel).map((e) => e[2]).join("");
}

let seq = 0;

for (const t of transports(srv.url)) {
  describe(t.name, () => {
    const client = createClient(schema.ProcessService, t.transport);
    const headers = tokenHeader(srv.token);

    test("StartProcess: start, stdout/stderr data, end", async () => {
      const evs = await events(client.startProcess({
        cmd: "sh", args: ["-c", "echo out; echo err >&2; exit 3"], cwd: "/tmp",
      }, { headers }));
      assert.equal(evs[0][0], "start");
      assert.ok(evs[0][1] > 0);
      assert.equal(joined(evs, "stdout"), "out\n");
      assert.equal(joined(evs, "stderr"), "err\n");
      assert.deepEqual(evs.at(-1), ["end", 3, true, "error", "exit status 3"]);
    });

    test("StartProcess: stdin bytes, env, content script", async () => {
      const evs = await events(client.startProcess({
        cmd: "sh", args: ["-c", "cat; echo \"$DEMO_KEY\""], env: { DEMO_KEY: "demo-value" },
        stdin: Buffer.from([0x68, 0x69, 0x0a]),
      }, { headers }));
      assert.equal(joined(evs, "stdout"), "hi\ndemo-value\n");
      assert.deepEqual(evs.at(-1), ["end", 0, true, "exited", ""]);
      const script = await events(client.startProcess({
        cmd: "sh", content: "echo from content; pwd", cwd: "/tmp",
      }, { headers }));
      assert.equal(joined(script, "stdout"), "from content\n/tmp\n");
    });

    test("StartProcess: pty", async () => {
      const evs = await events(client.startProcess({
        cmd: "sh", args: ["-c", "stty size; test -t 0 && echo tty"], pty: { cols: 100, rows: 30 },
      }, { headers }));
      const out = joined(evs, "pty");
      assert.match(out, /30 100/);
      assert.match(out, /tty/);
      assert.deepEqual(evs.at(-1), ["end", 0, true, "exited", ""]);
    });

    test("StartProcess: timeout → DeadlineExceeded", async () => {
      await expectError(events(client.startProcess({ cmd: "sleep", args: ["10"] }, { headers, timeoutMs: 300 })),
        Code.DeadlineExceeded);
    });

    test("StartProcess: validation errors", async () => {
      await expectError(events(client.startProcess({ cmd: "sh", args: ["-c", "true"], content: "x" }, { headers })),
        Code.InvalidArgument, "content and args cannot both be set");
      await expectError(events(client.startProcess({ cmd: "sh", pty: {}, stdin: Buffer.from("x") }, { headers })),
        Code.InvalidArgument, "stdin cannot be used with pty");
      await expectError(events(client.startProcess({ cmd: "sh", pty: { cols: 70000 } }, { headers })),
        Code.InvalidArgument, "invalid pty size: pty cols must not exceed 65535");
      await expectError(events(client.startProcess({ cmd: "" }, { headers })),
        Code.InvalidArgument, "failed to execute process: command is required");
      await expectError(events(client.startProcess({ cmd: "/nonexistent/conch-test-cmd" }, { headers })),
        Code.InvalidArgument);
    });

    test("background: List, Connect, SendSignal", async () => {
      const tag = `node-bg-${process.pid}-${seq++}`;
      // the starting stream: start event first, then it stays open
      const starter = client.startProcess({
        cmd: "sh", args: ["-c", "echo ready; while :; do sleep 0.05; done"], background: true, tag,
      }, { headers });
      const it = starter[Symbol.asyncIterator]();
      const first = norm((await it.next()).value);
      assert.equal(first[0], "start");
      const pid = first[1];

      const list = await client.list({}, { headers });
      const mine = list.processes.find((p) => p.tag === tag);
      assert.ok(mine, "background process listed");
      assert.equal(mine.pid, pid);
      assert.equal(mine.running, true);
      assert.equal(mine.config.cmd, "sh");
      assert.deepEqual(mine.config.args, ["-c", "echo ready; while :; do sleep 0.05; done"]);
      assert.match(mine.startedAt, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);

      await expectError(events(client.startProcess({ cmd: "true", background: true, tag }, { headers })),
        Code.AlreadyExists, `background process tag already exists: ${tag}`);

      // a subscriber by tag sees start, then (after the signal) the end
      const subIt = client.connect({ process: { tag } }, { headers })[Symbol.asyncIterator]();
      assert.deepEqual(norm((await subIt.next()).value), ["start", pid]);
      await expectError(client.sendSignal({ process: { tag }, signal: 0 }, { headers }),
        Code.InvalidArgument, "signal must not be zero");
      const res = await client.sendSignal({ process: { tag }, signal: 15 }, { headers });
      assert.equal(res.$typeName, "pb.SendSignalResponse");
      const subEvs = [];
      for (let r = await subIt.next(); !r.done; r = await subIt.next()) subEvs.push(norm(r.value));
      assert.deepEqual(subEvs.filter((e) => e[0] !== "keepalive").at(-1), ["end", -1, true, "error", "signal: terminated"]);
      // the starter stream ends the same way
      const rest = [];
      for (let r = await it.next(); !r.done; r = await it.next()) rest.push(norm(r.value));
      assert.deepEqual(rest.filter((e) => e[0] === "end"), [["end", -1, true, "error", "signal: terminated"]]);
      // gone from List; a signal now → NotFound.  (The `sleep 0.05` got the
      // SIGTERM too and may still be exiting when sh is reaped: meanwhile the
      // command lingers, listed as not running — api.md §9 — so poll.)
      let later = await client.list({}, { headers });
      for (let i = 0; i < 100 && later.processes.some((p) => p.tag === tag); i++) {
        assert.ok(!later.processes.find((p) => p.tag === tag).running);
        await new Promise((r) => setTimeout(r, 50));
        later = await client.list({}, { headers });
      }
      assert.ok(!later.processes.some((p) => p.tag === tag));
      await expectError(client.sendSignal({ process: { pid }, signal: 9 }, { headers }),
        Code.NotFound, `process pid ${pid} not found`);
    });

    test("offsets, Connect with replay, out_of_range (api.md §9)", async () => {
      const tag = `node-replay-${process.pid}-${seq++}`;
      const script = "printf one; sleep 0.1; printf two; printf E >&2; sleep 0.1; printf three; exit 2";
      // foreground: offset (a bigint) counts each channel's bytes before the event
      const fg = [];
      for await (const ev of client.startProcess({ cmd: "sh", args: ["-c", script] }, { headers }))
        if (ev.event.case === "data") fg.push([ev.event.value.output.case, ev.event.value.offset]);
      assert.deepEqual(fg, [["stdout", 0n], ["stdout", 3n], ["stderr", 0n], ["stdout", 6n]]);
      // background, ended: replay from the middle of stdout, all of stderr, then the end
      const starter = client.startProcess({ cmd: "sh", args: ["-c", script], background: true, tag }, { headers });
      const all = await events(starter);
      assert.deepEqual(all.at(-1), ["end", 2, true, "error", "exit status 2"]);
      const got = [];
      for await (const ev of client.connect({ process: { tag }, replay: { stdout: 4n } }, { headers })) {
        const e = ev.event;
        if (e.case === "data") got.push([e.value.output.case, e.value.offset, Buffer.from(e.value.output.value).toString()]);
        else if (e.case === "end") got.push(["end", e.value.exitCode]);
      }
      // (replayed events may join what was read in pieces: up to 32 KiB each)
      assert.deepEqual(got, [["stdout", 4n, "wothree"], ["stderr", 0n, "E"], ["end", 2]]);
      await expectError(events(client.connect({ process: { tag }, replay: { stderr: 2n } }, { headers })),
        Code.OutOfRange, "replay offset 2 is beyond the stderr output (1 bytes)");
    });

    test("Connect / SendSignal errors", async () => {
      await expectError(events(client.connect({ process: {} }, { headers })),
        Code.InvalidArgument, "process pid or tag is required");
      await expectError(events(client.connect({ process: { tag: "no-such-tag" } }, { headers })),
        Code.NotFound, 'process tag "no-such-tag" not found');
      await expectError(events(client.connect({ process: { pid: 999999 } }, { headers })),
        Code.NotFound, "process pid 999999 not found");
      await expectError(client.sendSignal({ process: { tag: "no-such-tag" }, signal: 15 }, { headers }),
        Code.NotFound, 'process tag "no-such-tag" not found');
      await expectError(client.list({}, {}), Code.Unauthenticated, "agent token is required");
    });
  });
}
