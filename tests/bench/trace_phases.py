#!/usr/bin/env python3
"""Phases of StartProcess round trips from a `perf trace` text dump
(docs/internals/profile.md).  Not part of `make check`.

  perf trace record -o T.data -p <server pid> &   # then N calls with rtt
  perf trace -i T.data > T.txt 2>&1
  tests/bench/trace_phases.py T.txt agent <connection fd>   # fd: accept4's result in T.txt
  perf trace record -o S.data -- build/bench/spawn -n 200 -w 0
  perf trace -i S.data > S.txt 2>&1; tests/bench/trace_phases.py S.txt spawn

Prints the median of each phase (ms): request read -> clone -> the child's
execve -> its exit_group -> wait4's return / the answer's last writev.
Times are inflated by the tracing: compare runs with each other only.
"""
import re
import statistics as st
import sys

RX = re.compile(r'^\s*([0-9.]+|\?) \(\s*([0-9.]*)\s*(?:ms)?\): (\S+)/(\d+)\s+'
                r'(?:\.\.\. \[continued\]: )?(\w+)\((.*)')


def main():
    path, mode = sys.argv[1], sys.argv[2]
    fd = sys.argv[3] if len(sys.argv) > 3 else None
    calls, cur = [], None
    for line in open(path, errors='replace'):
        m = RX.match(line)
        if not m or m.group(1) == '?':
            continue
        t, dur = float(m.group(1)), m.group(2)
        name, rest = m.group(5), m.group(6)
        cont = '[continued]' in line
        if mode == 'agent':
            if (name == 'read' and rest.startswith('fd: %s,' % fd) and 'count: 65536' in rest
                    and not cont):
                r = line.rsplit('=', 1)[1].strip() if '=' in line else ''
                if r.isdigit() and int(r) > 100:  # a request, not the tail of one
                    if cur:
                        calls.append(cur)
                    cur = {'req': t}
                    continue
            if cur is None:
                continue
            if name == 'clone' and not cont and 'clone' not in cur:
                cur['clone'] = t
            if name == 'execve' and 'exec' not in cur:
                cur['exec'] = t
            if name == 'exit_group' and 'exit' not in cur:
                cur['exit'] = t
            if name == 'wait4' and 'exit' in cur and 'reap' not in cur and dur:
                cur['reap'] = t + float(dur)
            if name == 'writev' and rest.startswith('fd: %s,' % fd) and not cont:
                cur['last_write'] = t
                cur['nwritev'] = cur.get('nwritev', 0) + 1
        else:
            if name in ('clone', 'clone3') and not cont:
                if cur:
                    calls.append(cur)
                cur = {'clone': t}
            if cur is None:
                continue
            if name == 'execve' and 'exec' not in cur:
                cur['exec'] = t
            if name == 'exit_group' and 'exit' not in cur:
                cur['exit'] = t
            if (name == 'wait4' and 'exit' in cur and 'reap' not in cur and dur
                    and not line.rstrip().endswith('...')):
                cur['reap'] = t + float(dur)
    if cur:
        calls.append(cur)
    calls = calls[5:-1]  # the first few warm up; the last may be cut
    if mode == 'agent':
        keys = [('req', 'clone'), ('clone', 'exec'), ('exec', 'exit'), ('exit', 'reap'),
                ('exit', 'last_write'), ('req', 'last_write')]
    else:
        keys = [('clone', 'exec'), ('exec', 'exit'), ('exit', 'reap'), ('clone', 'reap')]
    for a, b in keys:
        v = [c[b] - c[a] for c in calls if a in c and b in c]
        print('%-22s n=%4d median=%.3f ms' % (a + '->' + b, len(v), st.median(v)) if v else a + '->' + b + ' -')
    if mode == 'agent' and calls:
        print('writev per call (median):', st.median([c.get('nwritev', 0) for c in calls]))


if __name__ == '__main__':
    main()
