// Interactive processes (api.md §9) through the official Connect client
// (@connectrpc/connect-node): a `sh -i` terminal on a PTY typed into with
// SendInput and with a StreamInput, resized with Update; a background `cat`
// fed by every input path; the §9 error texts — binary and JSON codecs,
// HTTP/1.1 and HTTP/2.
import { after, describe, test } from "node:test";
import assert from "node:assert/strict";

import { Code, createClient } from "@connectrpc/connect";

import { expectError, loadSchema, startServer, tokenHeader, transports } from "./lib/harness.mjs";

const schema = loadSchema();
const srv = await startServer();

after(async () => {
  await srv.stop();
});

const enc = (s) => Buffer.from(s);

// A foreground StartProcess read in the background; output collected.
function session(client, req, headers) {
  const s = { out: "", events: [], done: false, waiters: [] };
  const notify = () => { for (const w of s.waiters.splice(0)) w(); };
  s.finished = (async () => {
    try {
      for await (const ev of client.startProcess(req, { headers })) {
        const e = ev.event;
        if (e.case === "start") s.pid = e.value.pid;
        if (e.case === "data") s.out += Buffer.from(e.value.output.value).toString("latin1");
        if (e.case === "end") s.end = [e.value.exitCode, e.value.status, e.value.error];
        s.events.push(e.case);
        notify();
      }
    } finally {
      s.done = true;
      notify();
    }
  })();
  s.mark = 0;
  // Wait until pattern appears in the output after the last match.
  s.expect = async (re, ms = 15000) => {
    const deadline = Date.now() + ms;
    for (;;) {
      const m = re.exec(s.out.slice(s.mark));
      if (m) { s.mark += m.index + m[0].length; return m; }
      if (s.done || Date.now() > deadline) throw new Error(`${re} not in ${JSON.stringify(s.out.slice(s.mark))}`);
      await new Promise((r) => { s.waiters.push(r); setTimeout(r, 100); });
    }
  };
  s.started = async () => { while (!s.pid && !s.done) await new Promise((r) => { s.waiters.push(r); setTimeout(r, 50); }); return s.pid; };
  return s;
}

// An async iterable fed by push(); ends on close().
function feed() {
  const q = [];
  let wake = null, closed = false;
  return {
    push(m) { q.push(m); if (wake) { wake(); wake = null; } },
    close() { closed = true; if (wake) { wake(); wake = null; } },
    async *[Symbol.asyncIterator]() {
      for (;;) {
        if (q.length) { yield q.shift(); continue; }
        if (closed) return;
        await new Promise((r) => { wake = r; });
      }
    },
  };
}

let seq = 0;

for (const t of transports(srv.url)) {
  describe(t.name, () => {
    const client = createClient(schema.ProcessService, t.transport);
    const headers = tokenHeader(srv.token);

    for (const mode of ["SendInput", "StreamInput"]) {
      test(`sh -i on a PTY typed with ${mode}: size, resize + SIGWINCH, Ctrl-C, exit 3`, async () => {
        const s = session(client, { cmd: "sh", args: ["-i"], pty: {}, stdinOpen: true, env: { PS1: "PROMPT> " } },
          headers);
        const pid = await s.started();
        let type, streamDone, f;
        if (mode === "SendInput") {
          type = async (x) => assert.deepEqual(await client.sendInput({
            process: { pid }, input: { input: { case: "pty", value: enc(x) } } }, { headers }), {
            $typeName: "pb.SendInputResponse" });
        } else {
          f = feed();
          f.push({ event: { case: "start", value: { process: { pid } } } });
          streamDone = client.streamInput(f, { headers });
          type = async (x) => f.push({ event: { case: "data", value: { input: { input: { case: "pty", value: enc(x) } } } } });
        }
        await s.expect(/PROMPT> /);
        await type("stty size\n");
        await s.expect(/\r\n24 80\r\n/);
        await s.expect(/PROMPT> /);
        await type("trap 'echo WINCH' WINCH\n");
        await s.expect(/PROMPT> /);
        await client.update({ process: { pid }, pty: { cols: 120, rows: 40 } }, { headers });
        await type("stty size\n");
        await s.expect(/WINCH/);
        s.mark = 0;
        await s.expect(/\r\n40 120\r\n/);
        await s.expect(/PROMPT> /);
        await type("sleep 100\n");
        await new Promise((r) => setTimeout(r, 300));
        await type("\x03");
        await s.expect(/PROMPT> /, 10000);
        await type("echo alive-$((6*7))\n");
        await s.expect(/alive-42/);
        await type("exit 3\n");
        await s.finished;
        assert.deepEqual(s.end, [3, "error", "exit status 3"]);
        if (f) {
          f.close();
          await streamDone;
        }
      });
    }

    test("background cat: one-shot a, SendInput b, StreamInput c…z in 25 messages, CloseStdin", async () => {
      const tag = `node-cat-${process.pid}-${seq++}`;
      const s = session(client, { cmd: "cat", background: true, tag, stdin: enc("a"), stdinOpen: true }, headers);
      await s.started();
      await client.sendInput({ process: { tag }, input: { input: { case: "stdin", value: enc("b") } } }, { headers });
      async function* msgs() {
        yield { event: { case: "start", value: { process: { tag } } } };
        for (let c = 99; c <= 122; c++)
          yield { event: { case: "data", value: { input: { input: { case: "stdin", value: Buffer.from([c]) } } } } };
        yield { event: { case: "keepalive", value: {} } };
        yield { event: { case: "data", value: { input: { input: { case: "stdin", value: Buffer.alloc(0) } } } } };
      }
      await client.streamInput(msgs(), { headers });
      await client.closeStdin({ process: { tag } }, { headers });
      await s.finished;
      assert.equal(s.out, "abcdefghijklmnopqrstuvwxyz");
      assert.deepEqual(s.end, [0, "exited", ""]);
    });

    test("errors of §9", async () => {
      const tag = `node-err-${process.pid}-${seq++}`;
      const s = session(client, { cmd: "sleep", args: ["30"], background: true, tag }, headers);
      const ptyTag = `${tag}-pty`;
      const p = session(client, { cmd: "sleep", args: ["30"], background: true, tag: ptyTag, pty: {} }, headers);
      await s.started();
      await p.started();
      const stdin = (x) => ({ input: { case: "stdin", value: enc(x) } });
      const pty = (x) => ({ input: { case: "pty", value: enc(x) } });
      await expectError(client.sendInput({ input: stdin("x") }, { headers }), Code.InvalidArgument,
        "process pid or tag is required");
      await expectError(client.sendInput({ process: { pid: 999999 }, input: stdin("x") }, { headers }), Code.NotFound,
        "process pid 999999 not found");
      await expectError(client.sendInput({ process: { tag: "nope" }, input: stdin("x") }, { headers }), Code.NotFound,
        'process tag "nope" not found');
      await expectError(client.sendInput({ process: { tag }, input: pty("x") }, { headers }), Code.FailedPrecondition,
        "process has no pty");
      await expectError(client.sendInput({ process: { tag }, input: stdin("x") }, { headers }),
        Code.FailedPrecondition, "process stdin is closed");
      await expectError(client.sendInput({ process: { tag: ptyTag }, input: stdin("x") }, { headers }),
        Code.FailedPrecondition, "process stdin is a pty: send pty input");
      await expectError(client.closeStdin({ process: { tag: ptyTag } }, { headers }), Code.FailedPrecondition,
        "cannot close stdin of a pty process: send Ctrl-D (0x04)");
      await expectError(client.closeStdin({ process: { tag } }, { headers }), Code.FailedPrecondition,
        "process stdin is closed");
      await expectError(client.update({ process: { tag } , pty: { cols: 10 } }, { headers }), Code.FailedPrecondition,
        "process has no pty");
      await expectError(client.update({ process: { tag: ptyTag } }, { headers }), Code.InvalidArgument,
        "pty size is required");
      await expectError(client.update({ process: { tag: ptyTag }, pty: { rows: 70000 } }, { headers }),
        Code.InvalidArgument, "invalid pty size: pty rows must not exceed 65535");
      async function* notStart() {
        yield { event: { case: "data", value: { input: stdin("x") } } };
      }
      await expectError(client.streamInput(notStart(), { headers }), Code.InvalidArgument,
        "first stream input event must be start");
      async function* wrongKind() {
        yield { event: { case: "start", value: { process: { tag: ptyTag } } } };
        yield { event: { case: "data", value: { input: stdin("x") } } };
      }
      await expectError(client.streamInput(wrongKind(), { headers }), Code.FailedPrecondition,
        "process stdin is a pty: send pty input");
      await client.sendSignal({ process: { tag }, signal: 9 }, { headers });
      await client.sendSignal({ process: { tag: ptyTag }, signal: 9 }, { headers });
      await s.finished;
      await p.finished;
    });
  });
}
