#!/usr/bin/env python3
"""The writers and the checker of scripts/power-loss.sh.

    power_loss.py writer MOUNT WRITER ROUND SEED LOG
    power_loss.py check MOUNT STATE ROUND SEED LOG...
    power_loss.py versions DOCFS STORE STATE SEED
    power_loss.py selftest

**Writer** WRITER owns its names: `W<w>-0.txt`, `W<w>-1.txt` and `W<w>-m.txt` at the mount
root (flat documents), `Crash.pkg/w<w>-{0,1,2,m,l}.dat` in a package, and `T<w>-…` in the
Trash (`.Trash-<uid>/files`). It starts by reading what its names hold, fsyncing each file
and the three folders, then runs until the mount dies under it (ENOTCONN, ECONNABORTED, EIO):
- in-place rewrites (one pwrite of the whole record at 0), fsynced 60 % of the time;
- safe-saves: a temporary file, a non-scratch `NAME.tmp-<w>-<k>` or an editor's scratch
  `.#NAME`, written, fsynced, renamed over the name, and the folder fsynced (85 %);
- renames to another of its names (replacing it or not), RENAME_EXCHANGE, unlinks, hard links
  (in the package only), moves into the Trash and back; each followed by the folder's fsync half
  of the time.
Every version of a file is one self-describing record of its family's fixed length: a header
(writer, family, sequence number, length, CRC) and bytes derived from them, so a torn file is
told from a whole one. LOG (outside the mount, O_APPEND) gets one JSON line per operation
before it is tried, and `ack-fsync`/`ack-dir` after an fsync returned.

**What an acknowledgement promises**, and so what the checker expects after the cut:
- `ack-fsync` of a file (not a scratch file): its contents as of the fsync, and (as ext4,
  and as DocFS's fsync saves the document) the names it has then;
- `ack-dir` of a folder: every name of the writer in it (present or absent) as of the fsync,
  and the contents of each file there whose own fsync had returned (a safe-save's new
  contents, also through a scratch file);
- a name holds, after the cut, what it held at its last acknowledgement or anything it held
  after that; a file's contents are a whole record at least as new as its last acknowledged
  one; a file whose name and contents were acknowledged and that no later call removed
  (unlink, a rename over it) is somewhere among the writer's names (a rename is atomic);
- scratch files never come back, and every version the store kept is whole.

**check** reads the names through a fresh mount and checks the above against the round's LOGs;
it also reads every version under `.docfs/versions` newer than STATE remembers. **versions**
checks a seeded sample of new versions through `docfs versions` and `docfs export --at`.
Both print `LOSS <kind> …` lines and exit 1 when something is wrong. **selftest** runs a
writer on a plain folder, checks it is clean, then damages it in each way the checker must see.
"""
import ctypes
import errno
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import zlib

DEAD = {errno.ENOTCONN, errno.ECONNABORTED, errno.EIO}
SIZES = [700, 9_000, 70_000, 200_000, 4_096]
PACKAGE = "Crash.pkg"
TRASH = f".Trash-{os.getuid()}/files"
FOLDERS = ["", PACKAGE, TRASH]
libc = ctypes.CDLL(None, use_errno=True)
EMPTY_SHA = hashlib.sha1(b"").hexdigest()


def size_of(family):
    return SIZES[zlib.crc32(family.encode()) % len(SIZES)]


def record(writer, family, seq):
    size = size_of(family)
    body = random.Random(f"{family}:{seq}").randbytes(size)
    header = f"PLREC w={writer} fam={family} seq={seq} len={size} crc=".encode()
    header += f"{zlib.crc32(body[:size - len(header) - 9]):08x}\n".encode()
    return header + body[:size - len(header)]


def parse(data):
    """(writer, family, seq) of a whole record; None for empty; a string when torn."""
    if not data:
        return None
    fields = data.split(b"\n", 1)[0].decode(errors="replace").split()
    try:
        assert fields[0] == "PLREC"
        writer, family, seq = int(fields[1][2:]), fields[2][4:], int(fields[3][4:])
    except (AssertionError, IndexError, ValueError):
        return f"no record header ({len(data)} bytes: {data[:40]!r})"
    if data != record(writer, family, seq):
        return f"torn record w{writer} {family} seq {seq} ({len(data)} bytes, whole is {size_of(family)})"
    return (writer, family, seq)


def folder_of(name):
    return os.path.dirname(name)


def is_scratch(name):
    return os.path.basename(name).startswith(".#")


def read_or_none(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


# MARK: - Writer

class Writer:
    def __init__(self, mount, writer, round_number, seed, log_path):
        self.mount, self.w, self.round = mount, writer, round_number
        # The round's seed alone picks the calls, so that `power-loss.sh 1 SEED` replays them.
        self.rng = random.Random(f"{seed}:{writer}")
        self.log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.index = 0
        self.seq = round_number * 1_000_000
        self.next_object = 0
        self.temporaries = 0
        self.names = {}    # name -> object
        self.objects = {}  # object -> {"family", "scratch"}
        w = writer
        self.root_homes = [f"W{w}-0.txt", f"W{w}-1.txt"]
        self.package_homes = [f"{PACKAGE}/w{w}-{k}.dat" for k in range(3)]
        self.aux = {"": f"W{w}-m.txt", PACKAGE: f"{PACKAGE}/w{w}-m.dat"}
        self.link_name = f"{PACKAGE}/w{w}-l.dat"
        self.family_of_home = {**{n: f"w{w}.r{k}" for k, n in enumerate(self.root_homes)},
                               **{n: f"w{w}.p{k}" for k, n in enumerate(self.package_homes)}}

    def say(self, **event):
        event["i"] = self.index
        self.index += 1
        os.write(self.log_fd, (json.dumps(event) + "\n").encode())
        return event["i"]

    def path(self, name):
        return os.path.join(self.mount, name)

    def new_object(self, family, scratch=False):
        self.next_object += 1
        self.objects[self.next_object] = {"family": family, "scratch": scratch}
        return self.next_object

    def mine(self, name):
        # Conflict entries ("W0-1 (conflict 12).txt") are the mount's, named after their document.
        return name.startswith((f"W{self.w}-", f"{PACKAGE}/w{self.w}-", f"{TRASH}/T{self.w}-")) and \
            " (conflict " not in name

    # Operations: each logs itself, then acts; `failed` is logged if the call fails otherwise than
    # by the mount's death (which ends the writer).

    def attempt(self, index, call):
        try:
            call()
            return True
        except OSError as error:
            if error.errno in DEAD:
                raise
            self.say(t="failed", op=index, errno=error.errno, error=str(error))
            return False

    def fsync(self, name):
        index = self.say(t="fsync", name=name)
        fd = None
        def call():
            nonlocal fd
            fd = os.open(self.path(name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        if self.attempt(index, call):
            obj = self.names[name]
            self.say(t="ack-fsync", name=name, obj=obj, seq=self.objects[obj].get("seq"))

    def fsync_folder(self, folder):
        index = self.say(t="fsyncdir", dir=folder)
        def call():
            fd = os.open(self.path(folder) if folder else self.mount, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        if self.attempt(index, call):
            self.say(t="ack-dir", dir=folder)

    def write(self, name, create_family=None, scratch=False, exclusive=False):
        """Writes the next record of the object at `name` (made first when `create_family`)."""
        if create_family is not None:
            obj = self.new_object(create_family, scratch)
            index = self.say(t="create", name=name, obj=obj, fam=create_family, scratch=scratch)
            flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else 0)
            if not self.attempt(index, lambda: os.close(os.open(self.path(name), flags, 0o644))):
                return False
            self.names[name] = obj
        obj = self.names[name]
        self.seq += 1
        data = record(self.w, self.objects[obj]["family"], self.seq)
        index = self.say(t="write", name=name, obj=obj, seq=self.seq)
        def call():
            fd = os.open(self.path(name), os.O_WRONLY)
            try:
                if os.pwrite(fd, data, 0) != len(data):
                    raise OSError(errno.EIO, "short write")
                os.ftruncate(fd, len(data))
            finally:
                os.close(fd)
        if not self.attempt(index, call):
            return False
        self.objects[obj]["seq"] = self.seq
        return True

    def rename(self, source, target, exchange=False):
        index = self.say(t="exchange" if exchange else "rename", src=source, dst=target)
        if exchange:
            call = lambda: self.renameat2(source, target, 2)
        else:
            call = lambda: os.rename(self.path(source), self.path(target))
        if not self.attempt(index, call):
            return False
        moved, replaced = self.names.get(source), self.names.get(target)
        if exchange:
            self.names[source], self.names[target] = replaced, moved
        elif moved != replaced:
            self.names[target] = moved
            del self.names[source]
        return True

    def renameat2(self, source, target, flags):
        if libc.renameat2(-100, self.path(source).encode(), -100, self.path(target).encode(), flags) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))

    def unlink(self, name):
        index = self.say(t="unlink", name=name)
        if self.attempt(index, lambda: os.unlink(self.path(name))):
            del self.names[name]

    def link(self, source, target):
        index = self.say(t="link", src=source, dst=target)
        if self.attempt(index, lambda: os.link(self.path(source), self.path(target))):
            self.names[target] = self.names[source]

    # The workload.

    def start(self):
        """Reads what the writer's names hold, removes leftover temporaries, syncs the rest."""
        # The mount's device: once the dead mount is detached, the path is the bare folder
        # under it, where calls would go on (and leave files the next mount refuses).
        self.device = os.stat(self.mount).st_dev
        seen = {}
        for folder in FOLDERS:
            try:
                entries = sorted(os.listdir(self.path(folder) if folder else self.mount))
            except FileNotFoundError:
                continue
            for entry in entries:
                name = os.path.join(folder, entry) if folder else entry
                if not self.mine(name):
                    continue
                st = os.lstat(self.path(name))
                data = read_or_none(self.path(name)) or b""
                parsed = parse(data)
                family = parsed[1] if isinstance(parsed, tuple) else self.family_of_home.get(name, f"w{self.w}.x")
                key = (folder, st.st_ino) if folder == PACKAGE else name
                if key not in seen:
                    seen[key] = self.new_object(family)
                    self.objects[seen[key]]["seq"] = parsed[2] if isinstance(parsed, tuple) else None
                obj = seen[key]
                self.names[name] = obj
                self.say(t="start", name=name, obj=obj, fam=family,
                         seq=parsed[2] if isinstance(parsed, tuple) else None,
                         sha=hashlib.sha1(data).hexdigest())
        for name in sorted(self.names):
            if ".tmp-" in name:
                self.unlink(name)
        for name in sorted(self.names):
            if folder_of(name) != TRASH:
                self.fsync(name)
        for folder in FOLDERS:
            self.fsync_folder(folder)
        self.say(t="started")

    def names_in(self, folder):
        return sorted(n for n in self.names if folder_of(n) == folder and not is_scratch(n))

    def pick_target(self, folder, source):
        candidates = ([*self.root_homes, self.aux[""]] if folder == "" else
                      [*self.package_homes, self.aux[PACKAGE], self.link_name])
        candidates = [c for c in candidates if c != source]
        return self.rng.choice(candidates)

    def step(self):
        if os.stat(self.mount).st_dev != self.device:
            raise OSError(errno.ENOTCONN, "the mount is gone")
        rng = self.rng
        roll = rng.random()
        folder = rng.choice(["", PACKAGE])
        homes = self.root_homes if folder == "" else self.package_homes
        bound = [n for n in self.names_in(folder)]
        if roll < 0.30:
            name = rng.choice(homes + bound)
            if name in self.names:
                ok = self.write(name)
            else:
                ok = self.write(name, create_family=self.family_of_home.get(name, f"w{self.w}.x"))
                if ok and rng.random() < 0.5:
                    self.fsync_folder(folder)
            if ok and rng.random() < 0.6:
                self.fsync(name)
        elif roll < 0.55:
            name = rng.choice(homes + bound)
            family = self.objects[self.names[name]]["family"] if name in self.names else \
                self.family_of_home.get(name, f"w{self.w}.x")
            scratch = rng.random() < 0.4
            self.temporaries += 1
            base = os.path.basename(name)
            temporary = os.path.join(folder, f".#{base}") if scratch else f"{name}.tmp-{self.w}-{self.temporaries}"
            if temporary in self.names:
                return
            if not self.write(temporary, create_family=family, scratch=scratch, exclusive=True):
                return
            self.fsync(temporary)
            if self.rename(temporary, name) and rng.random() < 0.85:
                self.fsync_folder(folder)
        elif roll < 0.65 and bound:
            source = rng.choice(bound)
            if self.rename(source, self.pick_target(folder, source)) and rng.random() < 0.5:
                self.fsync_folder(folder)
        elif roll < 0.72 and len(bound) >= 2:
            a, b = rng.sample(bound, 2)
            if self.names[a] != self.names[b] and self.rename(a, b, exchange=True) and rng.random() < 0.5:
                self.fsync_folder(folder)
        elif roll < 0.78 and bound:
            self.unlink(rng.choice(bound))
            if rng.random() < 0.5:
                self.fsync_folder(folder)
        elif roll < 0.85 and folder == PACKAGE and bound and self.link_name not in self.names:
            self.link(rng.choice(bound), self.link_name)
            if rng.random() < 0.5:
                self.fsync_folder(folder)
        elif roll < 0.92 and bound:
            source = rng.choice(bound)
            self.temporaries += 1
            origin = "r" if folder == "" else "p"
            if self.rename(source, f"{TRASH}/T{self.w}-{self.round}-{self.temporaries}-{origin}"):
                for touched in ([folder, TRASH] if rng.random() < 0.6 else []):
                    self.fsync_folder(touched)
        elif roll < 1.0:
            trashed = self.names_in(TRASH)
            if not trashed:
                return
            item = rng.choice(trashed)
            back = "" if item.endswith("-r") else PACKAGE
            free = [n for n in ([*self.root_homes, self.aux[""]] if back == "" else
                                [*self.package_homes, self.aux[PACKAGE]]) if n not in self.names]
            if free and self.rename(item, rng.choice(free)):
                for touched in ([back, TRASH] if rng.random() < 0.6 else []):
                    self.fsync_folder(touched)
        if rng.random() < 0.2:
            time.sleep(rng.random() * 0.03)

    def run(self, steps=None):
        try:
            self.start()
            while steps is None or steps > 0:
                self.step()
                steps = None if steps is None else steps - 1
        except OSError as error:
            if error.errno in DEAD:
                self.say(t="dead", errno=error.errno)
                return 0
            self.say(t="error", error=repr(error))
            return 3


# MARK: - Checker

class Replay:
    """One writer's log, replayed: each name's bindings over time, each object's contents."""

    def __init__(self, path):
        with open(path) as f:
            events = [json.loads(line) for line in f if line.strip()]
        failed = {e["op"] for e in events if e["t"] == "failed"}
        self.failures = [e for e in events if e["t"] in ("failed", "error")]
        self.names = {}      # name -> object or None, now
        self.history = {}    # name -> [(index, binding)]
        self.objects = {}    # object -> {"timeline": [content...], "scratch": bool, "start": sha}
        self.snapshots = 0
        self.calls = {}      # index -> the call, for reports
        self.moved_to_trash = {}  # snapshot -> the object moved into the Trash
        self.name_ack = {}   # name -> index of the last acknowledgement of its binding
        self.data_ack = {}   # object -> timeline position acknowledged
        self.pending = {}    # object -> position whose fsync returned, not yet promised
        self.removed = {}    # object -> index of the last call that may have removed it
        self.acks = {"fsync": 0, "dir": 0, "startup": 0}
        self.ops = 0
        self.started = False
        for e in events:
            if e["t"] == "failed" or e["i"] in failed:
                continue
            self.apply(e)

    def bind(self, index, name, obj):
        if name not in self.history:
            self.history[name] = [(-1, None)]
        self.names[name] = obj
        self.history[name].append((index, obj))

    def lose_name(self, index, name):
        obj = self.names.get(name)
        if obj is not None:
            self.removed[obj] = index
        self.bind(index, name, None)

    def apply(self, e):
        t, i = e["t"], e["i"]
        if t in ("create", "rename", "exchange", "unlink", "link"):
            self.calls[i] = " ".join(str(e[k]) for k in ("t", "name", "src", "dst") if k in e)
        if t in ("create", "write", "rename", "exchange", "unlink", "link") and self.started:
            self.ops += 1
        if t == "start":
            first = ("seq", e["seq"]) if e["seq"] is not None else \
                ("empty", None) if e["sha"] == EMPTY_SHA else ("sha", e["sha"])
            self.objects[e["obj"]] = {"timeline": [first], "scratch": False, "sha": e["sha"]}
            self.history[e["name"]] = [(-1, None)]
            self.bind(i, e["name"], e["obj"])
        elif t == "started":
            self.started = True
        elif t == "create":
            self.objects[e["obj"]] = {"timeline": [("empty", None)], "scratch": e["scratch"], "sha": None}
            self.bind(i, e["name"], e["obj"])
        elif t == "write":
            obj = self.names.get(e["name"])
            if obj is not None:
                self.objects[obj]["timeline"].append(("seq", e["seq"]))
        elif t == "rename" and folder_of(e["dst"]) == TRASH and folder_of(e["src"]) != TRASH:
            # The Trash keeps the wrapper as the version that last had it: a snapshot, which
            # later writes through another name of a linked file do not change.
            moved = self.names.get(e["src"])
            if moved is None:
                return
            timeline = self.objects[moved]["timeline"]
            self.snapshots += 1
            snapshot = f"trash-{self.snapshots}"
            self.objects[snapshot] = {"timeline": [timeline[-1]], "scratch": False, "sha": None}
            if self.data_ack.get(moved, -1) == len(timeline) - 1:
                self.data_ack[snapshot] = 0
            self.lose_name(i, e["src"])
            self.bind(i, e["dst"], snapshot)
            self.moved_to_trash[snapshot] = moved
        elif t == "rename":
            moved, replaced = self.names.get(e["src"]), self.names.get(e["dst"])
            if moved != replaced:
                if replaced is not None:
                    self.removed[replaced] = i
                self.bind(i, e["dst"], moved)
                self.bind(i, e["src"], None)
        elif t == "exchange":
            a, b = self.names.get(e["src"]), self.names.get(e["dst"])
            self.bind(i, e["src"], b)
            self.bind(i, e["dst"], a)
        elif t == "unlink":
            self.lose_name(i, e["name"])
        elif t == "link":
            self.bind(i, e["dst"], self.names.get(e["src"]))
        elif t == "ack-fsync":
            self.acks["fsync" if self.started else "startup"] += 1
            obj = self.names.get(e["name"])
            if obj is None:
                return
            position = len(self.objects[obj]["timeline"]) - 1
            if is_scratch(e["name"]):
                self.pending[obj] = max(self.pending.get(obj, 0), position)
                return
            self.data_ack[obj] = max(self.data_ack.get(obj, 0), position)
            for name, bound in self.names.items():
                if bound == obj and not is_scratch(name):
                    self.name_ack[name] = i
        elif t == "ack-dir":
            self.acks["dir" if self.started else "startup"] += 1
            for name in self.history:
                if folder_of(name) == e["dir"] and not is_scratch(name):
                    self.name_ack[name] = i
                    obj = self.names.get(name)
                    if obj is not None and obj in self.pending:
                        self.data_ack[obj] = max(self.data_ack.get(obj, 0), self.pending[obj])

    def last_calls(self, name, count=3):
        """The last calls that changed `name`, for a report."""
        return [self.calls[j] for (j, _) in self.history.get(name, []) if j in self.calls][-count:]

    def allowed(self, name):
        """The bindings `name` may have after the cut."""
        ack = self.name_ack.get(name, -1)
        history = self.history.get(name, [(-1, None)])
        at_ack = [b for (j, b) in history if j <= ack][-1]
        return {at_ack} | {b for (j, b) in history if j > ack}

    def content(self, data):
        """What observed bytes are: ("empty"), ("seq", n), ("sha", hex) or ("torn", why)."""
        parsed = parse(data)
        if parsed is None:
            return ("empty", None)
        if isinstance(parsed, tuple):
            return ("seq", parsed[2])
        sha = hashlib.sha1(data).hexdigest()
        if any(o["sha"] == sha for o in self.objects.values()):
            return ("sha", sha)
        return ("torn", parsed)


def check(mount, state_path, round_number, seed, logs):
    problems, totals = [], {"ops": 0, "fsync": 0, "dir": 0, "startup": 0, "writer_errors": 0}
    for log in logs:
        replay = Replay(log)
        totals["ops"] += replay.ops
        for kind in ("fsync", "dir", "startup"):
            totals[kind] += replay.acks[kind]
        totals["writer_errors"] += len(replay.failures)
        for failure in replay.failures[:5]:
            print(f"  writer error ({os.path.basename(log)}): {failure}")
        seen_objects = set()
        for name in sorted(replay.history):
            data = read_or_none(os.path.join(mount, name))
            if is_scratch(name):
                if data is not None:
                    problems.append(("scratch-stored", name, "a scratch file came back after the cut"))
                continue
            allowed = replay.allowed(name)
            if data is None:
                if None not in allowed:
                    problems.append(("name-gone", name, f"missing; it may hold only objects {sorted(allowed, key=str)}; "
                                     f"its last calls: {replay.last_calls(name)}"))
                continue
            content = replay.content(data)
            if content[0] == "torn":
                acked = sorted({str(replay.objects[o]["timeline"][replay.data_ack[o]]) for o in allowed
                                if o is not None and o in replay.data_ack})
                problems.append(("torn", name, f"{content[1]}; acknowledged before: {acked or 'nothing'}"))
                continue
            candidates = [o for o in allowed if o is not None and content in replay.objects[o]["timeline"]]
            if not candidates:
                if allowed == {None}:
                    problems.append(("resurrected", name, f"holds {content}, but its removal was acknowledged"))
                else:
                    problems.append(("wrong-contents", name, f"holds {content}, which none of the objects "
                                     f"{sorted((o for o in allowed if o is not None), key=str)} it may hold ever had"))
                continue
            for obj in candidates:
                seen_objects.add(obj)
            best = max(max(i for i, c in enumerate(replay.objects[o]["timeline"]) if c == content) -
                       replay.data_ack.get(o, 0) for o in candidates)
            if best < 0:
                obj = candidates[0]
                wanted = replay.objects[obj]["timeline"][replay.data_ack.get(obj, 0)]
                problems.append(("old-contents", name, f"holds {content}, older than the acknowledged {wanted}"))
        # A file whose contents and a name were acknowledged, and that nothing removed since.
        for obj, position in replay.data_ack.items():
            if replay.objects[obj]["timeline"][position] == ("empty", None) or obj in seen_objects:
                continue
            acked_names = [n for n, j in replay.name_ack.items()
                           if [b for (k, b) in replay.history[n] if k <= j][-1] == obj]
            last_ack = max([replay.name_ack[n] for n in acked_names], default=-1)
            if acked_names and replay.removed.get(obj, -2) < last_ack:
                problems.append(("object-lost", f"object {obj}", f"seq {replay.objects[obj]['timeline'][position]} "
                                 f"was acknowledged at {acked_names}, and no name of the writer holds it now"))
    problems += check_versions(mount, state_path)
    acked = totals["fsync"] + totals["dir"]
    print(f"round {round_number} (seed {seed}): {totals['ops']} writes and name changes, {acked} acknowledged "
          f"syncs ({totals['fsync']} fsync, {totals['dir']} of folders; {totals['startup']} at start), "
          f"{len(problems)} problems")
    for kind, name, detail in problems:
        print(f"LOSS {kind} {name}: {detail}")
    with open(state_path + ".stats", "a") as f:
        f.write(json.dumps({"round": round_number, "seed": seed, **totals, "acked": acked,
                            "problems": [p[0] for p in problems]}) + "\n")
    return 1 if problems else 0


def load_state(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return {"versions": 0, "exported": 0}


def whole_version(path):
    """Problems of one kept version (a file, or a package's folder)."""
    problems = []
    files = [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    for file in files:
        parsed = parse(read_or_none(file) or b"")
        if isinstance(parsed, str):
            problems.append(("torn-version", file, parsed))
    return problems


def check_versions(mount, state_path):
    """Every version under .docfs/versions newer than the state's mark is whole."""
    state = load_state(state_path)
    root = os.path.join(mount, ".docfs", "versions")
    problems, newest, read = [], state["versions"], 0
    for document in sorted(os.listdir(root)):
        for entry in os.listdir(os.path.join(root, document)):
            found = re.search(r" v(\d+)", entry)
            if not found or int(found.group(1)) <= state["versions"]:
                continue
            newest = max(newest, int(found.group(1)))
            read += 1
            problems += whole_version(os.path.join(root, document, entry))
    print(f"  read {read} new versions (up to v{newest})")
    state["versions"] = newest
    with open(state_path, "w") as f:
        json.dump(state, f)
    return problems


def cli_versions(docfs, store, state_path, seed):
    """A seeded sample of new versions, through `docfs versions` and `docfs export --at`."""
    state = load_state(state_path)
    rng = random.Random(seed)
    listing = subprocess.run([docfs, "ls", store], capture_output=True, text=True, timeout=60)
    names = [line.split()[-1] for line in listing.stdout.splitlines()[1:] if line.split()]
    fresh = []
    for name in names:
        if not re.match(r"^(W\d+-[01m]\.txt|Crash\.pkg)$", name):
            continue
        out = subprocess.run([docfs, "versions", store, name], capture_output=True, text=True, timeout=60)
        for line in out.stdout.splitlines()[1:]:
            fields = line.replace("*", " ").split()
            if fields and fields[0].isdigit() and int(fields[0]) > state["exported"]:
                fresh.append((name, int(fields[0])))
    problems = []
    with tempfile.TemporaryDirectory() as scratch:
        for name, version in rng.sample(fresh, min(3, len(fresh))):
            target = os.path.join(scratch, f"{version}-{name}")
            out = subprocess.run([docfs, "export", store, name, target, "--at", str(version)],
                                 capture_output=True, text=True, timeout=60)
            if out.returncode != 0:
                problems.append(("export-failed", f"{name} v{version}", out.stderr.strip()[:200]))
            else:
                problems += whole_version(target)
    state["exported"] = max([v for _, v in fresh], default=state["exported"])
    with open(state_path, "w") as f:
        json.dump(state, f)
    print(f"  exported {min(3, len(fresh))} of {len(fresh)} new versions with docfs export --at")
    for kind, name, detail in problems:
        print(f"LOSS {kind} {name}: {detail}")
    return 1 if problems else 0


class PlainWriter(Writer):
    """A writer on a plain folder, whose "Trash" keeps a copy as DocFS's does (a snapshot)."""

    def rename(self, source, target, exchange=False):
        if exchange or folder_of(target) != TRASH or folder_of(source) == TRASH:
            return super().rename(source, target, exchange)
        self.say(t="rename", src=source, dst=target)
        with open(self.path(source), "rb") as f:
            data = f.read()
        with open(self.path(target), "wb") as f:
            f.write(data)
        os.unlink(self.path(source))
        self.names[target] = self.new_object(self.objects[self.names[source]]["family"])
        del self.names[source]
        return True


def selftest():
    """The checker against a plain folder: clean after a run, and each kind of loss is seen."""
    failures = 0
    kinds = ["none", "name-gone", "old-contents", "torn", "resurrected", "scratch-stored", "torn-version",
             "object-lost"]
    for kind in kinds:
        with tempfile.TemporaryDirectory() as folder:
            mount = os.path.join(folder, "mnt")
            for sub in ["", PACKAGE, TRASH, ".docfs/versions/W0-0.txt"]:
                os.makedirs(os.path.join(mount, sub), exist_ok=True)
            log = os.path.join(folder, "w0.log")
            writer = PlainWriter(mount, 0, 1, 7, log)
            writer.run(steps=300)
            acked = [n for n in writer.names if folder_of(n) == "" and not is_scratch(n)]
            target = os.path.join(mount, acked[0]) if acked else None
            if kind == "name-gone" and target:
                writer.fsync_folder("")
                os.unlink(target)
            elif kind == "old-contents" and target:
                obj = writer.names[acked[0]]
                writer.write(acked[0])
                older = writer.seq
                writer.write(acked[0])
                writer.fsync(acked[0])
                with open(target, "wb") as f:
                    f.write(record(0, writer.objects[obj]["family"], older))
            elif kind == "torn" and target:
                with open(target, "r+b") as f:
                    f.truncate(100)
            elif kind == "resurrected":
                writer.unlink(acked[0])
                writer.fsync_folder("")
                with open(target, "wb") as f:
                    f.write(record(0, "w0.r0", writer.seq))
            elif kind == "scratch-stored":
                open(os.path.join(mount, f".#{acked[0]}"), "w").close()
                writer.say(t="create", name=f".#{acked[0]}", obj=999, fam="w0.r0", scratch=True)
            elif kind == "object-lost":
                # A rename both of whose names are gone: the file was in neither place.
                writer.write(acked[0])
                writer.fsync(acked[0])
                free = next(n for n in [*writer.root_homes, writer.aux[""]] if n not in writer.names)
                writer.rename(acked[0], free)
                os.unlink(os.path.join(mount, free))
            elif kind == "torn-version":
                with open(os.path.join(mount, ".docfs/versions/W0-0.txt/2026-01-01 v5.txt"), "wb") as f:
                    f.write(b"PLREC w=0 fam=w0.r0 seq=1 len=700 crc=00000000\nshort")
            with open(os.devnull, "w") as quiet:
                saved, sys.stdout = sys.stdout, quiet
                try:
                    result = check(mount, os.path.join(folder, "state"), 1, 7, [log])
                finally:
                    sys.stdout = saved
            with open(os.path.join(folder, "state.stats")) as f:
                found = json.loads(f.read())["problems"]
            ok = (result == 0 and not found) if kind == "none" else (result == 1 and kind in found)
            print(f"selftest {kind}: {'ok' if ok else 'WRONG'} (found {found or 'nothing'})")
            failures += 0 if ok else 1
    return 1 if failures else 0


def main():
    a = sys.argv
    if len(a) == 7 and a[1] == "writer":
        return Writer(a[2], int(a[3]), int(a[4]), int(a[5]), a[6]).run()
    if len(a) >= 6 and a[1] == "check":
        return check(a[2], a[3], int(a[4]), int(a[5]), a[6:])
    if len(a) == 2 and a[1] == "selftest":
        return selftest()
    if len(a) == 6 and a[1] == "versions":
        return cli_versions(a[2], a[3], a[4], int(a[5]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
