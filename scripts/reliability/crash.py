#!/usr/bin/env python3
"""The writer and the checker of scripts/crash-test.sh.

    crash.py writer MOUNT WRITER ROUND SEED LOG [SECONDS]
    crash.py check EXPORTED_DIR LOG...

A writer rewrites its files over and over until the mount dies under it (ENOTCONN,
ECONNABORTED) or SECONDS pass: `W<w>-<k>.txt` at the mount root (flat documents) and
`Crash.pkg/w<w>-<k>.dat` in a package. Every version of a file is one self-describing record
of the file's fixed length: a header line naming the file, a sequence number, the length and a
CRC, then bytes derived from the name and the sequence number, so that a reader can tell whether
a stored file is exactly one complete record. A file is rewritten in place (one pwrite of the
whole record at offset 0) or, in the package, through a scratch file (`.#name`) renamed onto it.
Some rewrites are followed by fsync; the writer appends to LOG (outside the mount, O_APPEND)
`begin NAME SEQ` before it writes and `ack NAME SEQ` only after fsync returned 0.

The checker reads the files exported from the store (the mount root's layout: flat documents
as files, Crash.pkg as a folder) and checks every file named in the logs: it holds one complete
record, whose sequence number was begun, and is at least the last acknowledged one.
"""
import errno
import os
import random
import sys
import time
import zlib

DEAD = {errno.ENOTCONN, errno.ECONNABORTED}
SIZES = [700, 9_000, 300_000, 600_000, 70_000]


def file_size(name):
    return SIZES[zlib.crc32(name.encode()) % len(SIZES)]


def record(name, seq):
    size = file_size(name)
    rng = random.Random(f"{name}:{seq}")
    body = rng.randbytes(size)
    header = f"DOCFSREC {name} seq={seq} len={size} crc=".encode()
    header += f"{zlib.crc32(body[:size - len(header) - 9]):08x}\n".encode()
    return header + body[:size - len(header)]


def parse(name, data):
    """The sequence number of a complete record of `name`, or an error string."""
    if not data.startswith(b"DOCFSREC "):
        return f"no record header ({len(data)} bytes: {data[:40]!r})"
    line = data.split(b"\n", 1)[0].decode(errors="replace").split()
    if len(line) != 5 or line[1] != name:
        return f"bad header {line}"
    seq = int(line[2][4:])
    if data != record(name, seq):
        return f"seq {seq}: not the complete record ({len(data)} bytes, record {file_size(name)})"
    return seq


def writer(mount, writer_id, round_number, seed, log_path, seconds):
    rng = random.Random(f"{seed}:{round_number}:{writer_id}")
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def say(line):
        os.write(log, (line + "\n").encode())

    names = [f"W{writer_id}-{k}.txt" for k in range(2)] + [f"Crash.pkg/w{writer_id}-{k}.dat" for k in range(3)]
    seq = round_number * 100_000
    deadline = time.time() + seconds
    try:
        while time.time() < deadline:
            name = rng.choice(names)
            seq += 1
            data = record(name, seq)
            sync = rng.random() < 0.5
            path = os.path.join(mount, name)
            say(f"begin {name} {seq}")
            if name.startswith("Crash.pkg/") and rng.random() < 0.3:
                # Save through a scratch file renamed onto the name (an editor's atomic save).
                scratch = os.path.join(mount, "Crash.pkg", ".#" + os.path.basename(name))
                fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.write(fd, data)
                os.close(fd)
                os.rename(scratch, path)
                if sync:
                    fd = os.open(path, os.O_RDONLY)
                    os.fsync(fd)
                    say(f"ack {name} {seq}")
                    os.close(fd)
            else:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
                n = os.pwrite(fd, data, 0)
                if n != len(data):
                    say(f"error {name} {seq} short write {n}")
                if sync:
                    os.fsync(fd)
                    say(f"ack {name} {seq}")
                os.close(fd)
            if rng.random() < 0.3:
                time.sleep(rng.random() * 0.05)
    except OSError as error:
        if error.errno in DEAD:
            say(f"dead {writer_id} {error.errno}")
            return 0
        say(f"error {writer_id} {error!r}")
        return 3
    return 0


def check(exported, logs):
    begun, acked, errors = {}, {}, []
    for log in logs:
        with open(log) as f:
            for line in f:
                parts = line.split()
                if parts[0] == "begin":
                    begun.setdefault(parts[1], set()).add(int(parts[2]))
                elif parts[0] == "ack":
                    acked[parts[1]] = max(acked.get(parts[1], 0), int(parts[2]))
                elif parts[0] == "error":
                    errors.append(line.strip())
    problems = []
    for name in sorted(begun):
        path = os.path.join(exported, name)
        if not os.path.exists(path):
            if name in acked:
                problems.append(f"{name}: missing, but seq {acked[name]} was acknowledged")
            continue
        with open(path, "rb") as f:
            data = f.read()
        if not data and name not in acked:
            continue  # created, never saved with contents
        result = parse(name, data)
        if isinstance(result, str):
            problems.append(f"{name}: {result}")
        elif result not in begun[name]:
            problems.append(f"{name}: seq {result} was never written")
        elif result < acked.get(name, 0):
            problems.append(f"{name}: seq {result}, older than the acknowledged {acked[name]}")
    scratch = [n for n in os.listdir(os.path.join(exported, "Crash.pkg")) if n.startswith(".#")] \
        if os.path.isdir(os.path.join(exported, "Crash.pkg")) else []
    if scratch:
        problems.append(f"scratch files stored in Crash.pkg: {scratch}")
    acks = sum(1 for _ in acked)
    print(f"checked {len(begun)} files ({sum(len(s) for s in begun.values())} writes, "
          f"{acks} files with acknowledged fsyncs); writer errors: {len(errors)}")
    for line in errors[:10]:
        print("  writer error: " + line)
    for p in problems:
        print("PROBLEM " + p)
    return 1 if problems else 0


def main():
    if len(sys.argv) >= 7 and sys.argv[1] == "writer":
        seconds = float(sys.argv[7]) if len(sys.argv) > 7 else 30
        return writer(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], seconds)
    if len(sys.argv) >= 4 and sys.argv[1] == "check":
        return check(sys.argv[2], sys.argv[3:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
