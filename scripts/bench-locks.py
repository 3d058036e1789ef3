#!/usr/bin/env python3
"""B15 of scripts/bench.sh: locks between two mounts of one store, and the workloads on them.

    bench-locks.py uncontended PATH COUNT        median ms of flock LOCK_EX + LOCK_UN on one open
    bench-locks.py alternate PATH_A PATH_B COUNT median ms of a lock + unlock through B right
                                                 after one through A (the lock moves between mounts)
    bench-locks.py handover PATH_A PATH_B COUNT  median ms from A's unlock to the grant of a flock
                                                 that a process on B is blocked in
    bench-locks.py sqlite DB_A DB_B COUNT        two processes, one through each path, COUNT
                                                 transactions each (journal_mode=DELETE, BEGIN
                                                 IMMEDIATE, one INSERT): "TPS LOST" (LOST: rows
                                                 missing, plus 1 when integrity_check is not ok)
    bench-locks.py counter PATH_A PATH_B COUNT   two processes increment a counter file COUNT times
                                                 each under flock -x: "SECONDS LOST"

PATH_A and PATH_B are the same file seen through two mounts (or twice the same path, for one
mount or the native side). Prints one line; exits non-zero when the workload itself fails.
"""
import fcntl
import multiprocessing
import os
import sqlite3
import statistics
import sys
import time


def uncontended(path, count):
    fd = os.open(path, os.O_RDONLY)
    times = []
    for _ in range(count):
        start = time.perf_counter()
        fcntl.flock(fd, fcntl.LOCK_EX)
        fcntl.flock(fd, fcntl.LOCK_UN)
        times.append(time.perf_counter() - start)
    os.close(fd)
    return f"{statistics.median(times) * 1000:.3f}"


def alternate(path_a, path_b, count):
    a, b = os.open(path_a, os.O_RDONLY), os.open(path_b, os.O_RDONLY)
    times = []
    for _ in range(count):
        fcntl.flock(a, fcntl.LOCK_EX)
        fcntl.flock(a, fcntl.LOCK_UN)
        start = time.perf_counter()
        fcntl.flock(b, fcntl.LOCK_EX)
        fcntl.flock(b, fcntl.LOCK_UN)
        times.append(time.perf_counter() - start)
    return f"{statistics.median(times) * 1000:.3f}"


def waiter(path, orders, answers):
    fd = os.open(path, os.O_RDONLY)
    while orders.recv() == "go":
        answers.send("waiting")
        fcntl.flock(fd, fcntl.LOCK_EX)
        answers.send(time.time())
        fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def handover(path_a, path_b, count):
    fd = os.open(path_a, os.O_RDONLY)
    orders_out, orders_in = multiprocessing.Pipe()
    answers_in, answers_out = multiprocessing.Pipe()
    child = multiprocessing.Process(target=waiter, args=(path_b, orders_in, answers_out))
    child.start()
    times = []
    for _ in range(count):
        fcntl.flock(fd, fcntl.LOCK_EX)
        orders_out.send("go")
        answers_in.recv()
        # The waiter is in its flock (parked in the other daemon) well before this is over.
        time.sleep(0.05)
        released = time.time()
        fcntl.flock(fd, fcntl.LOCK_UN)
        granted = answers_in.recv()
        times.append(granted - released)
    orders_out.send("stop")
    child.join()
    os.close(fd)
    return f"{statistics.median(times) * 1000:.3f}"


def transactions(path, writer, count, start_at):
    db = sqlite3.connect(path, timeout=60, isolation_level=None)
    db.execute("PRAGMA journal_mode=DELETE")
    while time.time() < start_at:
        time.sleep(0.001)
    for i in range(count):
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO t (writer, i) VALUES (?, ?)", (writer, i))
        db.execute("COMMIT")
    db.close()


def sqlite_workload(path_a, path_b, count):
    for suffix in ("", "-journal"):
        if os.path.exists(path_a + suffix):
            os.unlink(path_a + suffix)
    db = sqlite3.connect(path_a, isolation_level=None)
    db.execute("PRAGMA journal_mode=DELETE")
    db.execute("CREATE TABLE t (writer INTEGER, i INTEGER)")
    db.close()
    # The second path must show the new file: another mount learns of it within moments.
    deadline = time.time() + 30
    while not os.path.exists(path_b) and time.time() < deadline:
        time.sleep(0.05)
    start_at = time.time() + 0.5
    writers = [multiprocessing.Process(target=transactions, args=(p, w, count, start_at))
               for w, p in enumerate((path_a, path_b))]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    seconds = time.time() - start_at
    if any(w.exitcode != 0 for w in writers):
        print("a writer failed", file=sys.stderr)
        sys.exit(1)
    db = sqlite3.connect(path_a, isolation_level=None)
    rows = db.execute("SELECT count(*) FROM t").fetchone()[0]
    integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
    db.close()
    lost = 2 * count - rows + (0 if integrity == "ok" else 1)
    return f"{2 * count / seconds:.1f} {lost}"


def increments(path, count, start_at):
    while time.time() < start_at:
        time.sleep(0.001)
    for _ in range(count):
        fd = os.open(path, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        with open(path) as f:
            value = int(f.read().strip() or 0)
        with open(path, "w") as f:
            f.write(f"{value + 1}\n")
        os.close(fd)


def counter(path_a, path_b, count):
    with open(path_a, "w") as f:
        f.write("0\n")
        f.flush()
        os.fsync(f.fileno())
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with open(path_b) as f:
                if f.read() == "0\n":
                    break
        except OSError:
            pass
        time.sleep(0.05)
    start_at = time.time() + 0.5
    workers = [multiprocessing.Process(target=increments, args=(p, count, start_at)) for p in (path_a, path_b)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seconds = time.time() - start_at
    if any(w.exitcode != 0 for w in workers):
        print("a worker failed", file=sys.stderr)
        sys.exit(1)
    # Read under the lock, as a process that wants the latest value does.
    fd = os.open(path_b, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    with open(path_b) as f:
        final = int(f.read().strip())
    os.close(fd)
    return f"{seconds:.3f} {2 * count - final}"


def main():
    command, *args = sys.argv[1:]
    count = int(args[-1])
    if command == "uncontended":
        print(uncontended(args[0], count))
    elif command == "alternate":
        print(alternate(args[0], args[1], count))
    elif command == "handover":
        print(handover(args[0], args[1], count))
    elif command == "sqlite":
        print(sqlite_workload(args[0], args[1], count))
    elif command == "counter":
        print(counter(args[0], args[1], count))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
