#!/usr/bin/env python3
"""Summarises a `perf record --call-graph dwarf` profile of a DocFS binary.

    scripts/perf-lines.py PERF.DATA BINARY [TOP]

Prints the share of samples in which each function is on the stack (inclusive), the share in
which it is the innermost frame (self), and the inclusive share of each source line of the
project (Sources/...), which names the call sites that lead to the time.

Used by scripts/profile-daemon.sh. It exists because valgrind 3.19 (Debian 12) cannot read the
DWARF 5 that Swift 6.3 emits and crashes on the async main's dispatch_main, and this VM's perf has
no hardware counters: perf's software clock (cpu-clock) with DWARF unwinding is what works.
"""
import collections
import subprocess
import sys


def demangle(names):
    if not names:
        return []
    result = subprocess.run(["swift", "demangle", "--simplified", "--compact"],
                            input="\n".join(names), capture_output=True, text=True)
    lines = result.stdout.split("\n")
    return lines if len(lines) >= len(names) else names


def main():
    data, binary = sys.argv[1], sys.argv[2]
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    script = subprocess.run(["perf", "script", "-i", data, "-F", "comm,tid,ip,sym,dso"],
                            capture_output=True, text=True).stdout
    samples = [s for s in script.split("\n\n") if s.strip()]
    total = len(samples) or 1
    inclusive, innermost, addresses = collections.Counter(), collections.Counter(), collections.Counter()
    binary_name = binary.rsplit("/", 1)[-1]
    for sample in samples:
        frames = sample.strip().split("\n")[1:]
        seen_functions, seen_addresses = set(), set()
        for depth, frame in enumerate(frames):
            parts = frame.strip().split(" ", 1)
            if len(parts) < 2:
                continue
            ip, rest = parts
            dso = rest[rest.rfind("(") + 1:-1]
            key = (dso.rsplit("/", 1)[-1], rest[:rest.rfind("(")].strip())
            if depth == 0:
                innermost[key] += 1
            if key not in seen_functions:
                seen_functions.add(key)
                inclusive[key] += 1
            if dso.rsplit("/", 1)[-1] == binary_name:
                # A caller's frame holds its return address: one byte back is inside the call.
                address = int(ip, 16) - (0 if depth == 0 else 1)
                if address not in seen_addresses:
                    seen_addresses.add(address)
                    addresses[address] += 1

    print(f"{len(samples)} samples")
    for title, counter in (("inclusive, by function", inclusive), ("self, by function", innermost)):
        print(f"\n== {title} ==")
        items = counter.most_common(top)
        for ((dso, _), count), name in zip(items, demangle([k[1] for k, _ in items])):
            print(f"{100 * count / total:6.1f}%  {dso[:22]:22s} {name[:150]}")

    print("\n== inclusive, by source line of the project ==")
    items = addresses.most_common(600)
    resolved = subprocess.run(["addr2line", "-a", "-i", "-e", binary] + [hex(a) for a, _ in items],
                              capture_output=True, text=True).stdout
    chains, current = {}, None
    for line in resolved.split("\n"):
        if line.startswith("0x"):
            current = int(line, 16)
            chains[current] = []
        elif line and current is not None:
            chains[current].append(line)
    lines = collections.Counter()
    for address, count in items:
        # The innermost frame of the inlining chain that is the project's own code.
        own = [c for c in chains.get(address, []) if "/Sources/" in c]
        if own:
            location = "Sources/" + own[0].split("/Sources/", 1)[1].split(" (")[0]
            lines[location] = max(lines[location], count)
    for location, count in sorted(lines.items(), key=lambda x: -x[1])[:top]:
        print(f"{100 * count / total:6.1f}%  {location}")


if __name__ == "__main__":
    main()
