import DocumentEngine
import Foundation
import PostgresStore
import StoreTestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Locks every mount of a store sees: two `docfs mount` daemons on one store (a store file, and
/// a PostgreSQL database when the tests have a server), driven by `flock(1)`, Python's `fcntl`
/// and `sqlite3`, as two machines' programs would use a shared folder.
@Suite("SharedLocks", .serialized)
struct SharedLockTests {
    let sandbox: Sandbox

    init() throws { sandbox = try Sandbox() }

    /// Two mounts of a new store of `kind`, and the store's argument; unmounted by `body`'s end.
    func withTwoMounts(
        _ kind: StoreKind, options: [String] = [], _ body: (String, String, String) throws -> Void
    ) throws {
        let store: String
        var database: PostgresStore.Configuration?
        switch kind {
        case .postgres:
            let made = try StoreFixture.newDatabase()
            try PostgresStore.dropDatabase(made)
            database = made
            store = made.url
        default:
            store = sandbox.path("shared.docstore")
        }
        defer { if let database { try? PostgresStore.dropDatabase(database) } }
        let created = try sandbox.run(["create", store], prefix: DocfsMountTests.bounded)
        try #require(created.status == 0, "\(created)")
        let one = sandbox.path("one")
        let two = sandbox.path("two")
        for mountpoint in [one, two] {
            try FileManager.default.createDirectory(atPath: mountpoint, withIntermediateDirectories: true)
        }
        defer {
            for mountpoint in [one, two] where Mounts.entry(at: mountpoint) != nil {
                _ = try? sandbox.execute(
                    DocfsMountTests.bounded + ["/usr/bin/fusermount3", "-u", "-z", mountpoint])
            }
        }
        func mount(_ mountpoint: String) throws {
            let mounted = try sandbox.run(
                ["mount", store, mountpoint] + options, prefix: DocfsMountTests.bounded)
            try #require(mounted.status == 0, "\(mounted)\n\(sandbox.daemonLog)")
        }
        // The file is in the store before the second mount starts, which then reads it there:
        // these tests are about locks, not about how soon a new file reaches another mount.
        try mount(one)
        try FileManager.default.createDirectory(
            atPath: one + "/shared.pkg", withIntermediateDirectories: true)
        let made = try shell("printf '0\\n' > \"$1\" && sync \"$1\"", one + "/shared.pkg/counter")
        try #require(made.status == 0, "\(made)")
        try mount(two)
        let seen = waitFor(30) { FileManager.default.fileExists(atPath: two + "/shared.pkg/counter") }
        try #require(seen, "the other mount never saw the file\n\(sandbox.daemonLog)")
        try body(store, one, two)
    }

    func shell(_ script: String, _ arguments: String..., limit: Int = 60) throws -> DocfsResult {
        try sandbox.execute(
            ["/usr/bin/timeout", "--kill-after=5", "\(limit)", "/bin/sh", "-c", script, "sh"] + arguments)
    }

    func python(_ script: String, _ arguments: String..., limit: Int = 60) throws -> DocfsResult {
        try sandbox.execute(
            ["/usr/bin/timeout", "--kill-after=5", "\(limit)", "/usr/bin/python3", "-c", script] + arguments)
    }

    func waitFor(_ limit: Double = 10, _ condition: () -> Bool) -> Bool {
        let start = Date()
        while Date().timeIntervalSince(start) < limit {
            if condition() { return true }
            usleep(20_000)
        }
        return false
    }

    /// Not a lock, but what every test here stands on: a name one mount looked up before it
    /// existed (the kernel caches it as missing for the entry timeout) shows up once another
    /// mount creates it.
    @Test("a file another mount creates where this one looked before shows up", arguments: StoreKind.all)
    func newNameShowsUp(_ kind: StoreKind) async throws {
        try await onOwnThread { [self] in
            try withTwoMounts(kind, options: ["-o", "entry_timeout=60"]) { _, one, two in
                #expect(!FileManager.default.fileExists(atPath: two + "/shared.pkg/later.txt"))
                #expect(
                    FileManager.default.createFile(
                        atPath: one + "/shared.pkg/later.txt", contents: Data("x".utf8)))
                #expect(
                    waitFor(10) { FileManager.default.fileExists(atPath: two + "/shared.pkg/later.txt") },
                    "\(sandbox.daemonLog)")
            }
        }
    }

    @Test(
        "flock excludes across mounts: LOCK_NB fails, a blocking flock waits for the release",
        arguments: StoreKind.all)
    func flockExcludes(_ kind: StoreKind) async throws {
        try await onOwnThread { [self] in
            try withTwoMounts(kind) { _, one, two in
                let held = try shell(
                    """
                    flock -x "$1/shared.pkg/counter" sleep 2 &
                    sleep 0.7
                    if flock -n -x "$2/shared.pkg/counter" true; then echo "not excluded"; fi
                    if flock -n -s "$2/shared.pkg/counter" true; then echo "shared not excluded"; fi
                    start=$(date +%s%N)
                    flock -x "$2/shared.pkg/counter" true
                    end=$(date +%s%N)
                    wait
                    echo "waited $(( (end - start) / 1000000 ))"
                    """, one, two)
                #expect(held.status == 0, "\(held)")
                #expect(!held.stdout.contains("excluded"), "\(held)")
                let waited = held.lines.last.flatMap { Int($0.split(separator: " ").last ?? "") } ?? -1
                #expect(waited >= 800 && waited < 4000, "the blocking flock waited \(waited) ms")
                // Shared locks from both mounts at once.
                let shared = try shell(
                    """
                    flock -s "$1/shared.pkg/counter" sleep 1 &
                    sleep 0.3
                    flock -n -s "$2/shared.pkg/counter" echo both
                    wait
                    """, one, two)
                #expect(shared.stdout.contains("both"), "\(shared)")
            }
        }
    }

    @Test(
        "a counter incremented under flock from two mounts counts every increment", arguments: StoreKind.all)
    func counterUnderFlock(_ kind: StoreKind) async throws {
        let (total, context) = try await onOwnThread { [self] () -> (String?, String) in
            var total: String?
            var context = ""
            try withTwoMounts(kind) { _, one, two in
                let script = """
                    for i in $(seq 150); do
                      flock -x "$1" sh -c 'v=$(cat "$1"); echo $((v+1)) > "$1"' _ "$1" || echo failed
                    done
                    """
                let counted = try shell(
                    """
                    sh -c '\(script.replacingOccurrences(of: "'", with: "'\\''"))' _ "$1/shared.pkg/counter" &
                    sh -c '\(script.replacingOccurrences(of: "'", with: "'\\''"))' _ "$2/shared.pkg/counter"
                    wait
                    cat "$1/shared.pkg/counter"
                    """, one, two, limit: 120)
                #expect(counted.status == 0, "\(counted)")
                #expect(!counted.stdout.contains("failed"), "\(counted)")
                total = counted.lines.last
                context = "\(counted)\n\(sandbox.daemonLog)"
            }
            return (total, context)
        }
        // The last increment's close saves before it returns (the file is locked), so the read
        // after both loops, without a lock, sees it: when that close only queued its save, the
        // read came first in about one run in three and counted 299.
        #expect(total == "300", "\(context)")
    }

    @Test(
        "close-to-open: a file closed on one mount opens with its change on the other",
        arguments: [(StoreKind.postgres, [String]()), (.sqlite, ["-o", "close_to_open"])])
    func closeToOpen(_ kind: StoreKind, options: [String]) async throws {
        guard kind != .postgres || StoreKind.postgresURL != nil else { return }
        try await onOwnThread { [self] in
            try withTwoMounts(kind, options: options) { _, one, two in
                let rounds = try shell(
                    """
                    for i in $(seq 100); do
                      echo "$i" > "$1/shared.pkg/counter"
                      v=$(cat "$2/shared.pkg/counter")
                      [ "$v" = "$i" ] || echo "round $i read $v"
                    done
                    """, one, two, limit: 120)
                #expect(rounds.status == 0 && rounds.stdout.isEmpty, "\(rounds)\n\(sandbox.daemonLog)")
            }
        }
    }

    /// SQLite keeps the database open and locks byte ranges of it (`journal_mode=DELETE`): every
    /// transaction of both processes is in the file, and the file is whole.
    @Test("sqlite3 from two mounts under its own fcntl locks loses no transaction", arguments: StoreKind.all)
    func sqliteFromTwoMounts(_ kind: StoreKind) async throws {
        try await onOwnThread { [self] in
            // A database kept open sees the other mount's writes under its locks only when the
            // kernel takes sizes from the daemon (the default on PostgreSQL).
            try withTwoMounts(kind, options: ["-o", "no_writeback_cache"]) { _, one, two in
                let database = one + "/shared.pkg/counts.sqlite"
                _ = try sqlite(database, "PRAGMA journal_mode=DELETE; CREATE TABLE t(x)")
                #expect(waitFor { FileManager.default.fileExists(atPath: two + "/shared.pkg/counts.sqlite") })
                let writer = """
                    import sqlite3, sys
                    c = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)
                    c.execute("PRAGMA journal_mode=DELETE")
                    failed = 0
                    for i in range(int(sys.argv[2])):
                        try:
                            c.execute("BEGIN IMMEDIATE")
                            c.execute("INSERT INTO t VALUES (?)", (sys.argv[3] + str(i),))
                            c.execute("COMMIT")
                        except Exception as e:
                            failed += 1
                            print("failed:", e)
                            try: c.execute("ROLLBACK")
                            except Exception: pass
                    print("failed", failed)
                    """
                let both = try shell(
                    """
                    python3 -c "$1" "$2/shared.pkg/counts.sqlite" 150 one > "$4/one.out" &
                    python3 -c "$1" "$3/shared.pkg/counts.sqlite" 150 two > "$4/two.out"
                    wait
                    cat "$4/one.out" "$4/two.out"
                    """, writer, one, two, sandbox.path(""), limit: 180)
                #expect(both.lines.filter { $0.hasPrefix("failed") } == ["failed 0", "failed 0"], "\(both)")
                let rows = try sqlite(
                    two + "/shared.pkg/counts.sqlite", "SELECT count(*) FROM t; PRAGMA integrity_check")
                #expect(rows.split(separator: "\n") == ["300", "ok"], "\(rows)\n\(sandbox.daemonLog)")
            }
        }
    }

    @Test(
        "POSIX record locks: ranges conflict across mounts, F_GETLK names the holder's range",
        arguments: StoreKind.all)
    func recordLocks(_ kind: StoreKind) async throws {
        try await onOwnThread { [self] in
            try withTwoMounts(kind) { _, one, two in
                let holder = """
                    import fcntl, os, sys, time
                    fd = os.open(sys.argv[1], os.O_RDWR)
                    fcntl.lockf(fd, fcntl.LOCK_EX, 10, 0)
                    fcntl.lockf(fd, fcntl.LOCK_SH, 10, 20)
                    print("held", flush=True)
                    time.sleep(2)
                    """
                let prober = """
                    import fcntl, os, struct, sys
                    fd = os.open(sys.argv[1], os.O_RDWR)
                    def tries(kind, length, start):
                        try:
                            fcntl.lockf(fd, kind | fcntl.LOCK_NB, length, start)
                            fcntl.lockf(fd, fcntl.LOCK_UN, length, start)
                            return "granted"
                        except OSError:
                            return "refused"
                    print("write 0-9", tries(fcntl.LOCK_EX, 10, 0))
                    print("write 5-14", tries(fcntl.LOCK_EX, 10, 5))
                    print("write 10-19", tries(fcntl.LOCK_EX, 10, 10))
                    print("read 20-29", tries(fcntl.LOCK_SH, 10, 20))
                    print("write 25-34", tries(fcntl.LOCK_EX, 10, 25))
                    probe = struct.pack("hhqqi", fcntl.F_WRLCK, 0, 3, 1, 0)
                    got = struct.unpack("hhqqi", fcntl.fcntl(fd, fcntl.F_GETLK, probe))
                    print("getlk", got[0] == fcntl.F_WRLCK, got[2], got[3])
                    """
                let probed = try shell(
                    """
                    python3 -c "$1" "$3/shared.pkg/counter" > "$5/holder.out" &
                    for i in $(seq 100); do grep -q held "$5/holder.out" 2>/dev/null && break; sleep 0.05; done
                    python3 -c "$2" "$4/shared.pkg/counter"
                    wait
                    """, holder, prober, one, two, sandbox.path(""))
                #expect(
                    probed.lines == [
                        "write 0-9 refused", "write 5-14 refused", "write 10-19 granted",
                        "read 20-29 granted",
                        "write 25-34 refused", "getlk True 0 10",
                    ], "\(probed)\n\(sandbox.daemonLog)")
            }
        }
    }

    /// Linux passes open file description locks to FUSE as record locks whose owner is the open:
    /// two opens conflict even in one process, and the lock goes with the open's release.
    @Test(
        "open file description locks conflict between opens and across mounts, and go with the open",
        arguments: StoreKind.all)
    func descriptionLocks(_ kind: StoreKind) async throws {
        try await onOwnThread { [self] in
            try withTwoMounts(kind) { _, one, two in
                let script = """
                    import fcntl, os, struct, sys, time
                    F_OFD_GETLK, F_OFD_SETLK = 36, 37
                    def lock(fd, cmd, start, length):
                        return fcntl.fcntl(fd, cmd, struct.pack("hhqqi", fcntl.F_WRLCK, 0, start, length, 0))
                    def tries(fd, start, length):
                        try:
                            lock(fd, F_OFD_SETLK, start, length)
                            return "granted"
                        except OSError:
                            return "refused"
                    path, mode = sys.argv[1], sys.argv[2]
                    fd = os.open(path, os.O_RDWR)
                    if mode == "hold":
                        lock(fd, F_OFD_SETLK, 0, 10)
                        print("other open here", tries(os.open(path, os.O_RDWR), 0, 10))
                        print("held", flush=True)
                        time.sleep(2)
                    else:
                        print("other mount", tries(fd, 5, 10))
                    """
                let run = try shell(
                    """
                    python3 -c "$1" "$2/shared.pkg/counter" hold > "$4/holder.out" &
                    for i in $(seq 100); do grep -q held "$4/holder.out" 2>/dev/null && break; sleep 0.05; done
                    python3 -c "$1" "$3/shared.pkg/counter" probe
                    wait
                    cat "$4/holder.out"
                    python3 -c "$1" "$3/shared.pkg/counter" probe
                    """, script, one, two, sandbox.path(""))
                #expect(
                    run.lines == [
                        "other mount refused", "other open here refused", "held", "other mount granted",
                    ],
                    "\(run)\n\(sandbox.daemonLog)")
            }
        }
    }

    @Test("a signal interrupts a wait for another mount's lock, with EINTR", arguments: StoreKind.all)
    func interruptedWait(_ kind: StoreKind) async throws {
        try await onOwnThread { [self] in
            try withTwoMounts(kind) { _, one, two in
                let waiter = """
                    import fcntl, os, signal, sys, time
                    class Alarm(Exception): pass
                    def ring(*_): raise Alarm()
                    signal.signal(signal.SIGALRM, ring)
                    fd = os.open(sys.argv[1], os.O_RDWR)
                    start = time.monotonic()
                    signal.alarm(1)
                    try:
                        fcntl.lockf(fd, fcntl.LOCK_EX)
                        print("granted")
                    except Alarm:
                        print("interrupted after", round(time.monotonic() - start, 1))
                    """
                let run = try shell(
                    """
                    python3 -c 'import fcntl,os,sys,time; fd=os.open(sys.argv[1], os.O_RDWR); fcntl.lockf(fd, fcntl.LOCK_EX); print("held", flush=True); time.sleep(4)' "$2/shared.pkg/counter" > "$4/holder.out" &
                    for i in $(seq 100); do grep -q held "$4/holder.out" 2>/dev/null && break; sleep 0.05; done
                    python3 -c "$1" "$3/shared.pkg/counter"
                    wait
                    """, waiter, one, two, sandbox.path(""))
                #expect(
                    run.lines.last?.hasPrefix("interrupted after 1") == true, "\(run)\n\(sandbox.daemonLog)")
            }
        }
    }

    /// A daemon stopped past its lease (as a machine cut off from the server would be) finds its
    /// locks gone when it runs again: I/O through the descriptor that held one fails with EIO, as
    /// NFS answers after a lost lock, and a new open works.
    ///
    /// PostgreSQL only: a store file has no server to be cut off from, and a stopped process that
    /// holds SQLite's write lock holds every other process's writes, lock requests included.
    @Test(
        "a mount whose lease ended answers EIO on the descriptors that held locks",
        .enabled(if: StoreKind.postgresURL != nil))
    func lostLease() async throws {
        try await onOwnThread { [self] in
            try withTwoMounts(.postgres) { _, one, two in
                let holder = """
                    import errno, fcntl, os, sys, time
                    path, ready, go = sys.argv[1], sys.argv[2], sys.argv[3]
                    fd = os.open(path, os.O_RDWR)
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    open(ready, "w").close()
                    while not os.path.exists(go): time.sleep(0.05)
                    for name, call in (("read", lambda: os.read(fd, 10)), ("fsync", lambda: os.fsync(fd))):
                        try:
                            call()
                            print(name, "ok")
                        except OSError as e:
                            print(name, errno.errorcode[e.errno])
                    again = os.open(path, os.O_RDONLY)
                    print("reopened", os.read(again, 10) != b"")
                    """
                let ready = sandbox.path("ready")
                let go = sandbox.path("go")
                let process = Process()
                process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
                process.arguments = ["-c", holder, one + "/shared.pkg/counter", ready, go]
                let output = Pipe()
                process.standardOutput = output
                try process.run()
                defer {
                    kill(process.processIdentifier, SIGKILL)
                    process.waitUntilExit()
                }
                #expect(waitFor(10) { FileManager.default.fileExists(atPath: ready) })
                let daemon = try #require(sandbox.daemonPID(one))
                kill(daemon, SIGSTOP)
                let taken = try shell("flock -w 20 -x \"$1\" true", two + "/shared.pkg/counter")
                kill(daemon, SIGCONT)
                #expect(taken.status == 0, "the other mount never got the lock: \(taken)")
                // The heartbeat notices at its next look, within two seconds.
                usleep(3_000_000)
                #expect(FileManager.default.createFile(atPath: go, contents: nil))
                process.waitUntilExit()
                let lines = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
                #expect(
                    lines.split(separator: "\n") == ["read EIO", "fsync EIO", "reopened True"],
                    "\(lines)\n\(sandbox.daemonLog)")
            }
        }
    }

    @Test(
        "a killed daemon's locks go when its lease runs out; the other mount then gets them",
        arguments: StoreKind.all)
    func killedHolder(_ kind: StoreKind) async throws {
        try await onOwnThread { [self] in
            try withTwoMounts(kind) { _, one, two in
                // The holder is the process that took the lock, so that ending it ends the test.
                let holder = Process()
                holder.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
                holder.arguments = [
                    "-c",
                    "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); "
                        + "fcntl.flock(fd, fcntl.LOCK_EX); time.sleep(60)",
                    one + "/shared.pkg/counter",
                ]
                try holder.run()
                defer {
                    kill(holder.processIdentifier, SIGKILL)
                    holder.waitUntilExit()
                }
                #expect(
                    waitFor(5) {
                        (try? shell("flock -n -x \"$1\" true", two + "/shared.pkg/counter").status) == 1
                    })
                let daemon = try #require(sandbox.daemonPID(one))
                kill(daemon, SIGKILL)
                let start = Date()
                let taken = try shell("flock -w 20 -x \"$1\" true", two + "/shared.pkg/counter")
                let seconds = Date().timeIntervalSince(start)
                #expect(taken.status == 0, "\(taken)\n\(sandbox.daemonLog)")
                // The lease is 6 s from the holder's last renewal, which is at most 2 s old.
                #expect(seconds > 2 && seconds < 9, "the lock came after \(seconds) s")
                print(
                    "a killed daemon's lock was granted to the other mount after \(String(format: "%.1f", seconds)) s"
                )
            }
        }
    }
}
