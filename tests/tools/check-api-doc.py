#!/usr/bin/python3
"""check-api-doc — docs/api.md names everything the API has (run by `make unit`).

Usage: check-api-doc.py [--proto FILE] [--doc FILE] [--src DIR]... [-v]
Defaults: proto/agent.proto, docs/api.md, --src core server agent fs proc proto reflect net
(relative to the repository root).  Prints each failed check, then
`N passed, N failed`; exits 1 when a check failed.  Debian's python3, no
third-party modules.

Schema checks (from the .proto, parsed here: messages, nested messages,
enums, oneofs, maps, services):
  * service S: a Markdown heading names `pkg.S` (in backticks); its
    section (up to the next heading of the same or a higher level) is S's;
  * rpc S.R: S's section has a heading naming `R`; that RPC's section
    names its request and response types; the doc has the route /pkg.S/R;
  * message M: a heading names `M` (nested: `Outer.Inner`);
  * field f of M: one line of M's section names `f` and its proto3 JSON
    name `jsonName` (protoc's rule: drop each '_', upper-case the letter
    after it), both in backticks — a table row, normally;
  * enum E: a heading names `E`; each value V: E's section names `V`.
  * code C of the rpc_code table (server/rpcerr.c: code_names, code_http):
    one line names `C` and its HTTP status.

Error-text checks.  The C sources (*.c, *.h of the --src dirs, comments
removed, `#define NAME "…"` string macros expanded, adjacent literals
joined) are scanned for string literals that end up in an error message.
A literal is taken when it is
  (A) in a statement that names an error code: an RPC_* constant of the
      rpc_code enum other than RPC_OK (rpc_finish(c, RPC_…, "…"),
      fs_status_set(st, RPC_…, "…", …), `return RPC_…` beside it is not
      enough: the literal must be in that statement);
  (B) an argument, at a message position, of a call to a function defined
      in the sources with a `const char *` parameter named fmt, msg,
      message, reason, context, ctx, what, op, verb, kind or body (the
      parameter and, when it is the last one before `...`, the variadic
      arguments after it): call_fail(c, code, "…"), fs_status_os(st,
      "open file", …), fs_path_check(…, "stream upload", …), h1_fail(s,
      431, "…"), hx_simple(x, 404, type, "…"), dec_fail(d, "…", …);
  (C) formatted or stored into an error buffer: the format and value
      arguments of snprintf/vsnprintf/asprintf/vasprintf whose destination
      is (a member named) err*, *_err, msg, emsg, e, why or reason, and the
      right-hand side of an assignment to such a name (`*msg = "…"`).
Never taken: literals inside LOG_*()/log_*() calls; literals with no
word of two letters outside printf conversions ("%s: %s", "", "..."); the
ALLOW list below (each with its reason).  Each text becomes a pattern: its
printf conversions (%s, %d, %zu, %llu, %.200s, %.*s, %x, %q, …) match any run of
characters, the rest literally; it must match inside one code span
(`…`) or one line of a fenced block of the doc.  So `path not found: %s`
is documented by `path not found: <p>`.
"""
import argparse
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

# Literals the rules above take that are no error text the API sends.
ALLOW = {
    '{"status":"OK","message":"OK"}': "hx_simple's body on success: the /health answer, not an error",
    "output not read": "sink_unauth_over's reason: logged, the connection is closed without an answer",
    "too many streams": "sink_unauth_over's reason: logged, the connection is closed without an answer",
    "document needs more than %zu bytes of memory":
        "proto/json.c's own text; pbjson and connect.c send `message needs more than … to decode` instead",
}

MSG_PARAMS = {"fmt", "msg", "message", "reason", "context", "ctx", "what", "op", "verb", "kind", "body"}
ERRBUF_RE = re.compile(r"^(err\w*|\w+_err|msg|emsg|e|why|reason)$")
PRINTF_FNS = {"snprintf": 0, "vsnprintf": 0, "asprintf": 0, "vasprintf": 0}  # destination index
KEYWORDS = {"if", "while", "for", "switch", "return", "sizeof", "else", "do", "case", "defined",
            "__attribute__", "_Alignas", "alignof", "_Static_assert"}
CONV_RE = re.compile(r"%%|%[-+ #0']*(?:\*|\d+)?(?:\.(?:\*|\d+))?(?:hh|h|ll|l|z|j|t|L)?[diouxXeEfgGcspq]")


# ---------------------------------------------------------------- proto

def proto_tokens(text):
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.findall(r'"(?:[^"\\]|\\.)*"|[A-Za-z_][\w.]*|-?\d+|[{}()<>;=,\[\]]', text)


def json_name(name):
    out, up = [], False
    for ch in name:
        if ch == "_":
            up = True
        elif up:
            out.append(ch.upper())
            up = False
        else:
            out.append(ch)
    return "".join(out)


class Proto:
    def __init__(self, text):
        self.package = ""
        self.messages = []  # (name, [(field, number)], [oneof names])
        self.enums = []     # (name, [(value, number)])
        self.services = []  # (name, [(rpc, in, in_stream, out, out_stream)])
        self.t = proto_tokens(text)
        self.i = 0
        self.top()

    def peek(self):
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self, want=None):
        tok = self.peek()
        if tok is None or (want is not None and tok != want):
            raise ValueError("proto: expected %r, got %r (token %d)" % (want, tok, self.i))
        self.i += 1
        return tok

    def skip_statement(self):
        depth = 0
        while True:
            tok = self.take()
            if tok == "{":
                depth += 1
            elif tok == "}":
                depth -= 1
                if depth == 0:
                    return
            elif tok == ";" and depth == 0:
                return

    def skip_options(self):  # [deprecated = true, …]
        if self.peek() == "[":
            while self.take() != "]":
                pass

    def top(self):
        while self.peek() is not None:
            tok = self.peek()
            if tok == "package":
                self.take()
                self.package = self.take()
                self.take(";")
            elif tok == "message":
                self.message("")
            elif tok == "enum":
                self.enum("")
            elif tok == "service":
                self.service()
            else:  # syntax, import, option, extend
                self.skip_statement()

    def field(self, fields):
        tok = self.take()
        if tok in ("repeated", "optional", "required"):
            tok = self.take()
        if tok == "map":
            self.take("<")
            while self.take() != ">":
                pass
        name = self.take()
        self.take("=")
        num = self.take()
        self.skip_options()
        self.take(";")
        fields.append((name, int(num)))

    def message(self, prefix):
        self.take("message")
        name = prefix + self.take()
        self.take("{")
        fields, oneofs = [], []
        entry = (name, fields, oneofs)
        self.messages.append(entry)
        while self.peek() != "}":
            tok = self.peek()
            if tok == "message":
                self.message(name + ".")
            elif tok == "enum":
                self.enum(name + ".")
            elif tok == "oneof":
                self.take()
                oneofs.append(self.take())
                self.take("{")
                while self.peek() != "}":
                    if self.peek() == "option":
                        self.skip_statement()
                    else:
                        self.field(fields)
                self.take("}")
            elif tok in ("option", "reserved", "extensions", "extend"):
                self.skip_statement()
            elif tok == ";":
                self.take()
            else:
                self.field(fields)
        self.take("}")

    def enum(self, prefix):
        self.take("enum")
        name = prefix + self.take()
        self.take("{")
        values = []
        while self.peek() != "}":
            if self.peek() in ("option", "reserved"):
                self.skip_statement()
                continue
            if self.peek() == ";":
                self.take()
                continue
            v = self.take()
            self.take("=")
            num = self.take()
            self.skip_options()
            self.take(";")
            values.append((v, int(num)))
        self.take("}")
        self.enums.append((name, values))

    def service(self):
        self.take("service")
        name = self.take()
        self.take("{")
        rpcs = []
        while self.peek() != "}":
            if self.peek() != "rpc":
                self.skip_statement()
                continue
            self.take("rpc")
            rname = self.take()
            self.take("(")
            ins = self.peek() == "stream" and self.take() == "stream"
            itype = self.take()
            self.take(")")
            self.take("returns")
            self.take("(")
            outs = self.peek() == "stream" and self.take() == "stream"
            otype = self.take()
            self.take(")")
            if self.peek() == "{":
                self.skip_statement()
            else:
                self.take(";")
            rpcs.append((rname, itype, ins, otype, outs))
        self.take("}")
        self.services.append((name, rpcs))


# ---------------------------------------------------------------- the doc

class Doc:
    def __init__(self, text):
        self.lines = text.split("\n")
        self.heads = []  # (line index, level, text), outside fenced blocks
        self.spans = []  # code spans and fenced lines: where error texts must be
        fence = False
        for i, line in enumerate(self.lines):
            if re.match(r"^\s*```", line):
                fence = not fence
                continue
            if fence:
                self.spans.append(line)
                continue
            m = re.match(r"^(#{1,6})\s+(.*)$", line)
            if m:
                self.heads.append((i, len(m.group(1)), m.group(2)))
            self.spans.extend(re.findall(r"`([^`]+)`", line))
        self.text = text

    def section(self, name, within=None):
        """Lines of the first section whose heading names `name` (inside
        the section `within`, a (start, end) pair), or None."""
        lo, hi = within if within else (0, len(self.lines))
        for k, (i, level, h) in enumerate(self.heads):
            if i < lo or i >= hi or ("`%s`" % name) not in h:
                continue
            end = hi
            for j, l2, _ in self.heads[k + 1:]:
                if l2 <= level:
                    end = min(j, hi)
                    break
            return (i, end)
        return None

    def has_code(self, rng, word):
        lo, hi = rng
        return any(("`%s`" % word) in l for l in self.lines[lo:hi])

    def line_with(self, rng, words):
        lo, hi = rng
        return any(all(("`%s`" % w) in l for w in words) for l in self.lines[lo:hi])


# ---------------------------------------------------------------- C sources

C_TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|[A-Za-z_]\w*|\d[\w.]*|->|\.\.\.|\S')


def strip_comments(src):
    """Comments → spaces (newlines kept), strings and chars untouched."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if c == "/" and src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c == "/" and src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            out.append(src[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def c_unescape(lit):
    body = lit[1:-1]
    simple = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "'": "'", "\\": "\\", "0": "\0", "a": "\a"}
    out, i = [], 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nx = body[i + 1]
            if nx == "x":
                m = re.match(r"[0-9a-fA-F]+", body[i + 2:])
                out.append(chr(int(m.group(0), 16)) if m else "x")
                i += 2 + (len(m.group(0)) if m else 0)
                continue
            out.append(simple.get(nx, nx))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


class Source:
    """One C file: (kind, value, line) tokens, string macros expanded."""

    def __init__(self, path, macros):
        self.path = path
        with open(path, encoding="utf-8", errors="replace") as f:
            text = strip_comments(f.read())
        lines = text.split("\n")
        body = []
        k = 0
        while k < len(lines):  # preprocessor lines (with continuations) out
            line = lines[k]
            if line.lstrip().startswith("#"):
                full = line
                while full.endswith("\\") and k + 1 < len(lines):
                    k += 1
                    full = full[:-1] + " " + lines[k]
                    body.append("")
                m = re.match(r'\s*#\s*define\s+([A-Za-z_]\w*)\s+((?:"(?:[^"\\]|\\.)*"\s*|[A-Za-z_]\w*\s*)+)$', full)
                if m and '"' in m.group(2):
                    macros[m.group(1)] = m.group(2)
                body.append("")
            else:
                body.append(line)
            k += 1
        self.toks = []
        for ln, line in enumerate(body, 1):
            for t in C_TOKEN.findall(line):
                self.toks.append([t, ln])

    def expand(self, macros):
        """String macros → their literals, then adjacent literals joined."""
        for _ in range(4):  # macros of macros
            out, changed = [], False
            for t, ln in self.toks:
                if t in macros:
                    for t2 in C_TOKEN.findall(macros[t]):
                        out.append([t2, ln])
                    changed = True
                else:
                    out.append([t, ln])
            self.toks = out
            if not changed:
                break
        out = []
        for t, ln in self.toks:
            if t.startswith('"') and out and out[-1][0].startswith('"'):
                out[-1][0] = out[-1][0][:-1] + t[1:]
            else:
                out.append([t, ln])
        self.toks = out


def paren_end(toks, i):
    """toks[i] is '(': the index of its ')'."""
    depth = 0
    for j in range(i, len(toks)):
        if toks[j][0] == "(":
            depth += 1
        elif toks[j][0] == ")":
            depth -= 1
            if depth == 0:
                return j
    return len(toks) - 1


def split_args(toks, lo, hi):
    """Arguments of a call whose '(' is toks[lo] and ')' toks[hi]."""
    args, cur, depth = [], [], 0
    for t in toks[lo + 1:hi]:
        if t[0] in "([{":
            depth += 1
        elif t[0] in ")]}":
            depth -= 1
        if t[0] == "," and depth == 0:
            args.append(cur)
            cur = []
        else:
            cur.append(t)
    if cur or args:
        args.append(cur)
    return args


def literals(toks):
    return [(t, ln) for t, ln in toks if t.startswith('"')]


def is_decl(prev):
    """The token before `name (`: a type (a declaration or definition) or
    not (a call: after ; { } ( , = return ? : ! && || ) else …)."""
    return prev == "*" or (re.match(r"[A-Za-z_]\w*$", prev) is not None and prev not in ("return", "else", "case"))


def is_log(name):
    return name.startswith("LOG_") or name.startswith("log_")


def scan_sources(dirs):
    files = []
    for d in dirs:
        for base, _, names in os.walk(d):
            for n in sorted(names):
                if n.endswith((".c", ".h")):
                    files.append(os.path.join(base, n))
    macros = {}
    srcs = [Source(p, macros) for p in sorted(files)]
    for s in srcs:
        s.expand(macros)

    # the rpc_code enum, the code table
    codes, table = set(), []
    for s in srcs:
        txt = " ".join(t for t, _ in s.toks)
        m = re.search(r"typedef enum rpc_code \{(.*?)\} rpc_code", txt)
        if m:
            codes |= set(re.findall(r"\b(RPC_[A-Z_]+) =", m.group(1)))
        n = re.search(r"code_names \[ \] = \{(.*?)\}", txt)
        h = re.search(r"code_http \[ \] = \{(.*?)\}", txt)
        if n and h:
            names = [c_unescape(x) for x in re.findall(r'"[^"]*"', n.group(1))]
            nums = re.findall(r"\d+", h.group(1))
            table = list(zip(names, nums))
    codes.discard("RPC_OK")

    # functions with message parameters: name → ([positions], variadic after)
    msgfns = {}
    for s in srcs:
        toks = s.toks
        for i in range(len(toks) - 1):
            name = toks[i][0]
            if toks[i + 1][0] != "(" or not re.match(r"[A-Za-z_]\w*$", name) or name in KEYWORDS or is_log(name):
                continue
            j = paren_end(toks, i + 1)
            nxt = toks[j + 1][0] if j + 1 < len(toks) else ""
            if nxt not in ("{", ";", "__attribute__"):
                continue
            if not is_decl(toks[i - 1][0] if i else ""):
                continue  # a call, not a declaration
            params = split_args(toks, i + 1, j)
            pos, variadic = [], False
            for k, p in enumerate(params):
                words = [t for t, _ in p]
                if words == ["..."]:
                    variadic = bool(pos) and pos[-1] == k - 1
                    continue
                if len(words) >= 4 and words[:3] == ["const", "char", "*"] and words[3] in MSG_PARAMS and len(words) == 4:
                    pos.append(k)
            if pos:
                old = msgfns.get(name)
                msgfns[name] = (sorted(set(pos) | set(old[0] if old else [])), variadic or bool(old and old[1]))

    found = {}  # text → [(path, line, rule)]

    def take(lit, ln, s, rule):
        found.setdefault(c_unescape(lit), []).append((s.path, ln, rule))

    for s in srcs:
        toks = s.toks
        n = len(toks)
        # spans of LOG_*/log_*() argument lists: never taken
        logged = set()
        for i in range(n - 1):
            if is_log(toks[i][0]) and toks[i + 1][0] == "(":
                logged.update(range(i, paren_end(toks, i + 1) + 1))
        # (A) statements naming an error code
        start, depth = 0, 0
        for i in range(n):
            t = toks[i][0]
            if t == "(":
                depth += 1
            elif t == ")":
                depth -= 1
            if (t == ";" and depth <= 0) or t in ("{", "}"):
                stmt = range(start, i)
                if any(toks[k][0] in codes for k in stmt):
                    for k in stmt:
                        if toks[k][0].startswith('"') and k not in logged:
                            take(toks[k][0], toks[k][1], s, "A")
                start = i + 1
                if t != ";":
                    depth = 0
        for i in range(n - 1):
            name = toks[i][0]
            if toks[i + 1][0] != "(" or i in logged:
                continue
            prev = toks[i - 1][0] if i else ""
            j = paren_end(toks, i + 1)
            # (B) calls of message functions (not their declarations)
            if name in msgfns and not is_decl(prev):
                pos, variadic = msgfns[name]
                args = split_args(toks, i + 1, j)
                want = set(pos)
                if variadic and pos:
                    want |= set(range(pos[-1], len(args)))
                for k in want:
                    if k < len(args):
                        for lit, ln in literals(args[k]):
                            take(lit, ln, s, "B")
            # (C) printf into an error buffer
            if name in PRINTF_FNS:
                args = split_args(toks, i + 1, j)
                if not args:
                    continue
                dest = "".join(t for t, _ in args[0])
                m = re.match(r"^[&*]*(?:\w+(?:->|\.))*(\w+)$", dest)
                if m and ERRBUF_RE.match(m.group(1)):
                    for a in args[1:]:
                        for lit, ln in literals(a):
                            take(lit, ln, s, "C")
        # (C) assignments to an error buffer
        for i in range(1, n - 1):
            if toks[i][0] == "=" and toks[i + 1][0].startswith('"') and i + 1 not in logged:
                if ERRBUF_RE.match(toks[i - 1][0]) and toks[i + 2][0] in (";", ","):
                    take(toks[i + 1][0], toks[i + 1][1], s, "C")
    return found, table


def checkable(text):
    rest = CONV_RE.sub(" ", text)
    return re.search(r"[A-Za-z]{2}", rest) is not None


def text_pattern(text):
    text = text.rstrip("\n")
    parts, pos = [], 0
    for m in CONV_RE.finditer(text):
        parts.append(re.escape(text[pos:m.start()]))
        parts.append("%" if m.group(0) == "%%" else ".*?")
        pos = m.end()
    parts.append(re.escape(text[pos:]))
    return re.compile("".join(parts), re.S)


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--proto", default=os.path.join(ROOT, "proto", "agent.proto"))
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "api.md"))
    ap.add_argument("--src", action="append", help="C source directory (repeatable)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every check")
    ap.add_argument("--list", action="store_true", help="print the error texts found in the sources and exit")
    a = ap.parse_args()
    srcdirs = a.src or [os.path.join(ROOT, d) for d in ("core", "server", "agent", "fs", "proc", "proto", "reflect", "net")]

    if a.list:
        found, table = scan_sources(srcdirs)
        for text in sorted(found):
            skip = " (allowed)" if text in ALLOW else "" if checkable(text) else " (not checkable)"
            for path, ln, rule in found[text]:
                print("%s:%d: %s %r%s" % (os.path.relpath(path, ROOT), ln, rule, text, skip))
        return 0
    with open(a.proto, encoding="utf-8") as f:
        proto = Proto(f.read())
    with open(a.doc, encoding="utf-8") as f:
        doc = Doc(f.read())

    passed = failed = 0

    def check(ok, what):
        nonlocal passed, failed
        if ok:
            passed += 1
            if a.verbose:
                print("ok: " + what)
        else:
            failed += 1
            print("check-api-doc: %s: missing %s" % (os.path.relpath(a.doc), what))

    pkg = proto.package + "." if proto.package else ""
    for sname, rpcs in proto.services:
        ssec = doc.section(pkg + sname)
        check(ssec is not None, "service %s%s (a heading naming `%s%s`)" % (pkg, sname, pkg, sname))
        for rname, itype, ins, otype, outs in rpcs:
            rsec = doc.section(rname, ssec) if ssec else None
            route = "/%s%s/%s" % (pkg, sname, rname)
            miss = []
            if rsec is None:
                miss.append("a heading naming `%s` in the %s section" % (rname, sname))
            else:
                for ty in (itype, otype):
                    if not doc.has_code(rsec, ty.split(".")[-1]) and not doc.has_code(rsec, ty):
                        miss.append("`%s` in its section" % ty)
            if route not in doc.text:
                miss.append("its route %s" % route)
            check(not miss, "rpc %s%s.%s (%s)" % (pkg, sname, rname, "; ".join(miss) or "ok"))
    for mname, fields, _ in proto.messages:
        msec = doc.section(mname)
        check(msec is not None, "message %s (a heading naming `%s`)" % (mname, mname))
        for fname, num in fields:
            jname = json_name(fname)
            ok = msec is not None and doc.line_with(msec, [fname, jname])
            check(ok, "field %s.%s (one line of the %s section naming `%s` and `%s`)"
                  % (mname, fname, mname, fname, jname) if jname != fname else
                  "field %s.%s (the %s section naming `%s`)" % (mname, fname, mname, fname))
    for ename, values in proto.enums:
        esec = doc.section(ename)
        check(esec is not None, "enum %s (a heading naming `%s`)" % (ename, ename))
        for v, num in values:
            check(esec is not None and doc.has_code(esec, v), "enum value %s.%s (the %s section naming `%s`)"
                  % (ename, v, ename, v))

    found, table = scan_sources(srcdirs)
    everything = (0, len(doc.lines))
    for name, status in table:
        if name == "ok":
            continue
        check(any(("`%s`" % name) in l and re.search(r"\b%s\b" % status, l) for l in doc.lines),
              "error code %s (a line naming `%s` and HTTP %s)" % (name, name, status))
    for text in sorted(found):
        if text in ALLOW or not checkable(text):
            continue
        pat = text_pattern(text)
        where = found[text][0]
        ok = any(pat.search(span) for span in doc.spans)
        check(ok, "error text %r (%s:%d, rule %s), as code" % (text.rstrip("\n"), os.path.relpath(where[0], ROOT),
                                                               where[1], where[2]))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
