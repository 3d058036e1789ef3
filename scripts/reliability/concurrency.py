#!/usr/bin/env python3
"""Many threads in many processes reading and writing the same and different files of a mount.

    concurrency.py MOUNT SEED [PROCESSES] [THREADS] [ITERATIONS] [--expect DIR]

Layout (made by the first process before the others start): `Shared.pkg/shared.bin`, one file
of PROCESSES*THREADS slots of SLOT bytes; `Shared.pkg/p<p>t<t>.txt`, each thread's own file in
the shared package; `Own-p<p>t<t>.pkg/own.txt`, each thread's own package; `Flat-p<p>t<t>.txt`,
each thread's own flat document. Each thread, ITERATIONS times: rewrites its slot of
shared.bin (pwrite), rewrites its own files (truncate+write, or write+ftruncate), reads other
threads' slots and files (which must read in full; a read racing a write may see parts of both), sometimes
fsyncs, lists folders and stats files. Every syscall that takes more than OP_LIMIT seconds is
reported (a deadlock shows up as a stuck process, which the caller's timeout kills).

At the end the main process checks, through the mount, that every slot and file holds its
thread's last record (no lost update); with --expect DIR it also writes the expected final
files to DIR (same layout) so that the caller can compare them with the store.
"""
import os
import random
import sys
import threading
import time
import zlib

SLOT = 40_000  # slots cross the 256 KiB chunks
OP_LIMIT = 20.0


def rec(tag, iteration, size):
    head = f"{tag} iteration {iteration:06d}\n".encode()
    rng = random.Random(f"{tag}:{iteration}")
    return head + rng.randbytes(size - len(head))


def parse(tag, data, size):
    """Iteration of a complete record of `tag`, or None."""
    if len(data) != size or not data.startswith(tag.encode() + b" iteration "):
        return None
    iteration = int(data[len(tag) + 11:len(tag) + 17])
    return iteration if data == rec(tag, iteration, size) else None


def own_size(tag):
    return 500 + zlib.crc32(tag.encode()) % 300_000


class Timed:
    def __init__(self, problems, what):
        self.problems, self.what = problems, what

    def __enter__(self):
        self.start = time.monotonic()

    def __exit__(self, *exc):
        took = time.monotonic() - self.start
        if took > OP_LIMIT:
            self.problems.append(f"{self.what} took {took:.1f} s")


def thread_body(mount, p, t, count, seed, iterations, problems, last):
    rng = random.Random(f"{seed}:{p}:{t}")
    tag = f"p{p}t{t}"
    shared = os.path.join(mount, "Shared.pkg", "shared.bin")
    own = own_files(tag)
    index = slot_index(p, t, count[1])
    others = [(q, u) for q in range(count[0]) for u in range(count[1]) if (q, u) != (p, t)]
    try:
        sfd = os.open(shared, os.O_RDWR)
        for i in range(1, iterations + 1):
            with Timed(problems, f"{tag} pwrite slot"):
                os.pwrite(sfd, rec(f"slot{tag}", i, SLOT), index * SLOT)
            rel = rng.choice(own)
            path = os.path.join(mount, rel)
            data = rec(f"{tag}:{rel}", i, own_size(tag))
            last[rel] = i
            with Timed(problems, f"{tag} rewrite {path}"):
                if rng.random() < 0.5:
                    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
                    os.write(fd, data)
                else:
                    fd = os.open(path, os.O_WRONLY)
                    os.pwrite(fd, data, 0)
                    os.ftruncate(fd, len(data))
                if rng.random() < 0.2:
                    os.fsync(fd)
                os.close(fd)
            if others:
                q, u = rng.choice(others)
                otag = f"p{q}t{u}"
                with Timed(problems, f"{tag} read slot of {otag}"):
                    got = os.pread(sfd, SLOT, slot_index(q, u, count[1]) * SLOT)
                # Linux does not make a read atomic against a concurrent write of the same
                # range (a local ext4 file tears the same way), so only the length is checked
                # here; the final state is checked strictly.
                if len(got) != SLOT:
                    problems.append(f"{tag}: slot of {otag}: {len(got)} bytes read of {SLOT}")
                opath = os.path.join(mount, rng.choice(own_files(otag)))
                with Timed(problems, f"{tag} read {opath}"):
                    with open(opath, "rb") as f:
                        f.read()  # may be mid-rewrite by its owner; only must not fail or hang
            if rng.random() < 0.1:
                with Timed(problems, f"{tag} fsync shared"):
                    os.fsync(sfd)
            if rng.random() < 0.1:
                with Timed(problems, f"{tag} listdir"):
                    os.listdir(mount)
                    os.listdir(os.path.join(mount, "Shared.pkg"))
        os.close(sfd)
    except OSError as error:
        problems.append(f"{tag}: {error!r}")


def own_files(tag):
    return [f"Shared.pkg/{tag}.txt", f"Own-{tag}.pkg/own.txt", f"Flat-{tag}.txt"]


def slot_index(p, t, threads):
    return p * threads + t


def setup(mount, processes, threads):
    os.makedirs(os.path.join(mount, "Shared.pkg"), exist_ok=True)
    with open(os.path.join(mount, "Shared.pkg", "shared.bin"), "wb") as f:
        f.truncate(processes * threads * SLOT)
    for p in range(processes):
        for t in range(threads):
            tag = f"p{p}t{t}"
            os.makedirs(os.path.join(mount, f"Own-{tag}.pkg"), exist_ok=True)
            for rel in own_files(tag):
                open(os.path.join(mount, rel), "wb").close()


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    expect_dir = None
    if "--expect" in sys.argv:
        expect_dir = sys.argv[sys.argv.index("--expect") + 1]
        args.remove(expect_dir)
    mount, seed = args[0], int(args[1])
    processes = int(args[2]) if len(args) > 2 else 3
    threads = int(args[3]) if len(args) > 3 else 4
    iterations = int(args[4]) if len(args) > 4 else 30
    if len(args) > 5 and args[5] == "child":
        p = int(args[6])
        problems = []
        lasts = [{} for _ in range(threads)]
        workers = [threading.Thread(target=thread_body,
                                    args=(mount, p, t, (processes, threads), seed, iterations, problems, lasts[t]))
                   for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        for line in problems:
            print("PROBLEM " + line)
        for last in lasts:
            for rel, i in last.items():
                print(f"LAST {rel} {i}")
        return 1 if problems else 0

    start = time.monotonic()
    setup(mount, processes, threads)
    import subprocess
    children = [subprocess.Popen([sys.executable, __file__, mount, str(seed), str(processes), str(threads),
                                  str(iterations), "child", str(p)], stdout=subprocess.PIPE, text=True)
                for p in range(processes)]
    status = 0
    last = {}
    for child in children:
        out, _ = child.communicate()
        for line in out.splitlines():
            if line.startswith("LAST "):
                _, rel, i = line.split()
                last[rel] = int(i)
            else:
                print(line)
        if child.returncode != 0:
            status = 1
    # The final state: each thread's last records, read back through the mount.
    problems = []
    with open(os.path.join(mount, "Shared.pkg", "shared.bin"), "rb") as f:
        shared = f.read()
    for p in range(processes):
        for t in range(threads):
            tag = f"p{p}t{t}"
            i = slot_index(p, t, threads)
            got = parse(f"slot{tag}", shared[i * SLOT:(i + 1) * SLOT], SLOT)
            if got != iterations:
                problems.append(f"slot of {tag}: iteration {got}, expected {iterations} (lost update)")
    final = {"Shared.pkg/shared.bin": shared}
    for p in range(processes):
        for t in range(threads):
            tag = f"p{p}t{t}"
            for rel in own_files(tag):
                with open(os.path.join(mount, rel), "rb") as f:
                    data = f.read()
                want = last.get(rel)
                got = parse(f"{tag}:{rel}", data, own_size(tag)) if data else None
                if got != want:
                    problems.append(f"{rel}: iteration {got}, expected {want} (lost update)")
                final[rel] = data
    for line in problems:
        print("PROBLEM " + line)
    if expect_dir:
        for rel, data in final.items():
            os.makedirs(os.path.join(expect_dir, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(expect_dir, rel), "wb") as f:
                f.write(data)
    print(f"concurrency: seed {seed}, {processes} processes x {threads} threads x {iterations} iterations "
          f"in {time.monotonic() - start:.1f} s: {'FAILED' if status or problems else 'ok'}")
    return 1 if status or problems else 0


if __name__ == "__main__":
    sys.exit(main())
